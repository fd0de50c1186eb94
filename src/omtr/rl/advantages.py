"""Advantage estimators, registered by name.

An estimator gets the batch's trajectories and returns one advantage (and a return target) per
step. A trajectory is one role's steps of one episode: the Actor's single step, or the Editor's
T steps (rewards zero except the last, ``R_E``, discounted back with ``gamma``).

* ``gae``: a learned value baseline (the trainer's value head), GAE across the steps;
* ``group``: the mean (and spread) of the same role's returns over the samples of one task,
  GRPO-style, no learned parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence



@dataclass
class Trajectory:
    """One role's steps of one episode, with the rewards already computed."""

    group: object  # the task (samples of one task share it)
    role: str
    rewards: list[float]  # per step
    values: list[float] | None = None  # the value head's estimates (gae)


Estimator = Callable[[Sequence[Trajectory], float, float, bool], tuple[list[list[float]], list[list[float]]]]

ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str):
    def deco(fn: Estimator) -> Estimator:
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn
    return deco


@register_estimator("gae")
def gae_estimator(trajs: Sequence[Trajectory], gamma: float, lam: float, scale: bool):
    from omtr.rl.losses import gae

    advs, rets = [], []
    for tr in trajs:
        if tr.values is None:
            raise ValueError("the gae estimator needs value estimates for every trajectory")
        a, r = gae(tr.rewards, tr.values, gamma, lam)
        advs.append(a)
        rets.append(r)
    return advs, rets


@register_estimator("group")
def group_estimator(trajs: Sequence[Trajectory], gamma: float, lam: float, scale: bool):
    """The episode return (sum of rewards) is compared with its group's; the advantage of step t
    is then credited with ``gamma^(T-t)`` like the return itself."""
    from omtr.rl.losses import discounted_credit, group_advantages

    totals = [sum(tr.rewards) for tr in trajs]
    keys = [(tr.role, tr.group) for tr in trajs]
    ep_adv = group_advantages(totals, keys, scale=scale)
    advs = [discounted_credit(a, len(tr.rewards), gamma) for a, tr in zip(ep_adv, trajs)]
    rets = [discounted_credit(t, len(tr.rewards), gamma) for t, tr in zip(totals, trajs)]
    return advs, rets
