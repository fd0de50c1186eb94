"""Multi-role RL from planner feedback: PPO for the Actor and the Editor, the Judge's calibrated loss.

``TrainConfig`` (``omtr.rl.config``) holds every default; ``Trainer`` (``omtr.rl.trainer``) runs
cycles of rollout -> rewards -> advantages -> update. Training code reads tasks only through
``omtr.tasks.training`` (no reference PDDL can reach it).
"""

from omtr.rl.config import TRAIN_PROFILES, TrainConfig, train_profile

__all__ = ["TRAIN_PROFILES", "TrainConfig", "train_profile"]
