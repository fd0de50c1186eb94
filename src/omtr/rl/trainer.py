"""The trainer's driver: cycles of rollout -> rewards -> advantages -> validated log -> PPO/Judge update.

Where things are:

- the driver (this module): batch selection, the rollout, the episode log, the run loop, stop
  requests and SIGTERM, the solver pool; :class:`Trainer` and the policies it rolls out with;
- rewards, the batch's records and dynamic sampling's group choice: :mod:`omtr.rl.steps`;
- the update (old and reference log-probabilities, advantages, PPO/Judge losses, the optimizer
  step): :mod:`omtr.rl.update`;
- checkpoints, ``config.json`` and the saved model: :mod:`omtr.rl.checkpoint`;
- metrics, cycle summaries, the curve, MLflow and telemetry: :mod:`omtr.rl.metrics`.

One update, for a batch of ``episodes_per_batch`` episodes (:meth:`Trainer.train_step`):

1. **Rollout.** The episode loop (``omtr.inference.episode.run_episodes``) runs the batch's tasks
   (each ``samples_per_task`` times) at the training temperature: Actor, planner, Judge, Editor.
   With dynamic sampling, groups whose rewards are all equal are replaced by fresh tasks' rollouts.
2. **Rewards** (:func:`omtr.rl.steps.rewarded_items`): ``R_A`` for the Actor's step, ``R_E`` for
   the Editor's steps, from the verdicts' outcome scores.
3. **Reference pass** and 4. **Advantages** (:mod:`omtr.rl.update`).
5. **Episode log.** One parquet row per role step, validated by the episode-log suite; a log that
   fails stops training with the suite's report (nothing already written is lost).
6. **Update** (:mod:`omtr.rl.update`): ``L = L_PPO^A + 0.5 L_PPO^E + 0.3 L_J`` (+ the value head's
   error), Adam.

Checkpoints (:mod:`omtr.rl.checkpoint`) are written at every cycle's end and every
``checkpoint_every_updates`` updates; SIGTERM writes one and stops. A resumed run takes the same
next batch with the same parameters as one never stopped.

Tasks reach the trainer as :class:`omtr.tasks.training.TrainingTask`: there is no reference field
to read.

Data parallelism (a launcher such as ``deepspeed`` or ``torchrun`` started several processes; see
:mod:`omtr.rl.distributed`): the batch stays ``batch_tasks(update)``, each rank rolls out its
contiguous share of its tasks (whole groups), whitening, loss normalisers and metrics are computed
over the whole batch, and the step applies the batch's gradient. Rank 0 alone writes
``config.json``, ``metrics.jsonl``, the MLflow run, the curve and ``model/``; each rank writes and
validates its own episode log (``update-NNNNNN.rank-RRRR.parquet``) and every rank stops if any
log fails. Checkpoints are written by all ranks together. A SIGTERM on any rank stops all of them
at the next update boundary, after a checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from omtr.config import ROLE_NAMES, ConfigError, EpisodeConfig, SolverConfig
from omtr.inference import prompts as P
from omtr.inference.episode import Episode, run_episodes
from omtr.policy import Sampling
from omtr.rl import losses as L
from omtr.rl.advantages import ADVANTAGE_ESTIMATORS
from omtr.rl.checkpoint import CheckpointMixin, _atomic_write, _ckpt_name
from omtr.rl.config import TrainConfig
from omtr.rl.distributed import Collective, init_from_env, shard
from omtr.rl.engine import TrainModules, make_backend
from omtr.rl.memory import LEAN_ROLLOUT_MMAP_THRESHOLD, PhaseMemory, mmap_threshold, trim_heap
from omtr.rl.metrics import MetricsMixin
from omtr.rl.recipe import CollapseGuard, Curriculum, JudgeGate, balanced_sample, object_count
from omtr.rl.rewards import OUTCOME_SCORES
from omtr.rl.steps import GEN_ROLES, JudgeItem, StepItem, rewarded_items, select_groups, step_scores
from omtr.rl.update import UpdateMixin
from omtr.tasks.training import TrainingTask

__all__ = ["EpisodeLogInvalid", "JudgeItem", "RoleRouter", "StepItem", "Trainer", "build_models"]

log = logging.getLogger("omtr.rl")


class EpisodeLogInvalid(RuntimeError):
    """The episode-log suite rejected a log; the message is its report (it names the bad rows)."""


# ---------------------------------------------------------------------------------------- policies

class RoleRouter:
    """A Policy over three separate models (the `separate_models` ablation): each role its own backbone."""

    def __init__(self, models: dict):
        self.models = models

    takes_objects = True

    @property
    def cfg(self):
        """The Actor's model config (its decoding constraint is every role's)."""
        return self.models["actor"].cfg

    def generate(self, role, prompts, sampling, *, stop_when=None, domains=None, objects=None):
        kw = {k: v for k, v in (("domains", domains), ("objects", objects)) if v is not None}
        return self.models[role].generate(role, prompts, sampling, stop_when=stop_when, **kw)

    def judge(self, prompts):
        return self.models["judge"].judge(prompts)


def build_models(cfg: TrainConfig, model=None) -> dict:
    """role -> RoleModel; one shared model under all three names unless ``separate_models``."""
    from omtr.model import RoleModel, build_model
    from omtr.model.roles import MODEL_FILE
    from omtr.config import model_profile

    def one():
        if model is not None:
            return model
        if (Path(cfg.model) / MODEL_FILE).is_file():
            return RoleModel.load(cfg.model, device=cfg.device)
        from omtr.model.backbone import check_backbone_name

        check_backbone_name(cfg.model)
        return build_model(model_profile(cfg.model), device=cfg.device)

    def adjust(m):
        changes = {}
        if cfg.frozen_backbone is not None:
            changes["train_backbone"] = not cfg.frozen_backbone
        if cfg.grammar is not None:
            changes["grammar"] = cfg.grammar
        if cfg.decoding is not None:  # when set, it decides: scoped/plain turn the grammar on, off turns it off
            changes["decoding"] = cfg.decoding
            changes["grammar"] = cfg.decoding != "off"
        if cfg.logprob_chunk is not None:
            changes["logprob_chunk"] = cfg.logprob_chunk
        if cfg.activation_checkpointing is not None:
            changes["activation_checkpointing"] = cfg.activation_checkpointing
        if cfg.checkpoint_layers is not None:
            changes["checkpoint_layers"] = cfg.checkpoint_layers
        if cfg.judge_checks is not None:
            changes["judge_checks"] = cfg.judge_checks
        if cfg.fused_adapters is not None:
            changes["fused_adapters"] = cfg.fused_adapters
        if cfg.pack_rows is not None:
            changes["pack_rows"] = cfg.pack_rows
        if cfg.grammar_limits is not None and dict(cfg.grammar_limits) != dict(m.cfg.grammar_limits):
            changes["grammar_limits"] = dict(cfg.grammar_limits)
            m._grammar = None  # rebuilt with the new bounds on first use
        if changes:
            m.cfg = m.cfg.replace(**changes)
            m._set_trainable()  # re-apply which parameters train under the new setting
            m.apply_adapter_path()
        if m.cfg.train_backbone and cfg.kl_coef > 0:
            m.keep_reference()
        return m

    if cfg.separate_models:
        if model is not None:
            raise ConfigError("separate_models builds its own three models; do not pass one")
        return {r: adjust(one()) for r in ROLE_NAMES}
    m = adjust(one())
    return {r: m for r in ROLE_NAMES}


# ---------------------------------------------------------------------------------------- trainer

class Trainer(UpdateMixin, CheckpointMixin, MetricsMixin):
    """Runs a training run in ``out_dir``; ``resume=True`` continues its latest checkpoint.

    The driver is here; the update, the checkpoints and the metrics come from its bases
    (:mod:`omtr.rl.update`, :mod:`omtr.rl.checkpoint`, :mod:`omtr.rl.metrics`)."""

    def __init__(self, cfg: TrainConfig, tasks: Sequence[TrainingTask], out_dir: str | os.PathLike, *,
                 model=None, env=None, resume: bool = False, quiet: bool = False,
                 outcome_score: Callable | None = None, run_name: str | None = None,
                 probe: Callable | None = None, probe_every: int = 1):
        bad = [t for t in tasks if not isinstance(t, TrainingTask)]
        if bad:
            raise TypeError("the trainer takes TrainingTask records only (omtr.tasks.training.load_training_tasks); "
                            f"got {type(bad[0]).__name__}")
        if not tasks:
            raise ConfigError("no training tasks")
        self.cfg = cfg
        self.tasks = list(tasks)
        self.out = Path(out_dir)
        self.quiet = quiet
        self.env = env
        self.run_name = run_name or self.out.name
        # An evaluation-side callable (omtr.evaluation.probe.FaithfulProbe): called with the refreshed
        # policy and the environment every `probe_every` updates; its numbers are logged, never rewarded.
        self.probe, self.probe_every = probe, max(1, int(probe_every))
        self.score = outcome_score or OUTCOME_SCORES[cfg.reward]
        if outcome_score is None and cfg.reward == "grounded":
            self.score = functools.partial(self.score, weight=cfg.grounding_weight)
        if outcome_score is None and cfg.reward == "supported":
            self.score = functools.partial(self.score, broken_credit=cfg.broken_credit,
                                           grounding=cfg.grounding_support, ungrounded_credit=cfg.ungrounded_credit,
                                           agreement_weight=cfg.agreement_weight)
        self.estimator = ADVANTAGE_ESTIMATORS[cfg.advantage]
        self._stop = threading.Event()
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.coll: Collective = init_from_env(use_deepspeed=bool(cfg.deepspeed))
        if self.coll.active and self.coll.is_main:
            log.info("data parallel over %d ranks: about %d of a batch's %d tasks each", self.coll.world,
                     -(-cfg.tasks_per_batch // self.coll.world), cfg.tasks_per_batch)
            if self.coll.world > cfg.tasks_per_batch:
                log.warning("%d ranks but %d tasks a batch (episodes_per_batch / samples_per_task): %d ranks "
                            "roll out nothing; raise episodes_per_batch or launch fewer processes",
                            self.coll.world, cfg.tasks_per_batch, self.coll.world - cfg.tasks_per_batch)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        # resident memory by phase (omtr.rl.memory), logged with each update's metrics
        self._mem = PhaseMemory(cfg.memory_sample_ms / 1000, enabled=cfg.memory_phases)
        with self._mem.phase("setup"):
            self.models = build_models(cfg, model)
            self.distinct = list({id(m): m for m in self.models.values()}.values())
            from omtr.rollout import make_engine

            # one rollout engine per distinct model; hf is the model itself
            opts = {"prefix_cache": cfg.prefix_cache, "prefix_cache_mb": self.prefix_cache_bound(cfg)} \
                if cfg.rollout_engine == "fast" else {}
            self.engines = {id(m): make_engine(cfg.rollout_engine, m, **opts) for m in self.distinct}
        self.exact_rollout = all(e.exact for e in self.engines.values())
        from omtr.model.precision import resolve_update_dtype

        # the number format of the passes that train (bf16 falls back to fp32 where unsupported)
        self.update_dtype = resolve_update_dtype(cfg.update_dtype, str(self.models["actor"].device))
        self._refresh_s = 0.0
        hidden = self.models["actor"].base_model.config.hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 7)
            value_head = nn.Linear(hidden, len(GEN_ROLES)).to(self.models["actor"].device)
        nn.init.zeros_(value_head.weight)
        nn.init.zeros_(value_head.bias)
        names = {"shared": self.distinct[0]} if len(self.distinct) == 1 else dict(self.models)
        self.modules = TrainModules(names, value_head)
        self.backend = make_backend(self.modules, cfg, self.coll)
        self.value_head = self.backend.mods.value_head
        # counters and data position
        self.update = 0  # updates done
        self.episodes_done = 0
        self.planner_calls = 0
        self.history: list[dict] = []
        self.rollout_task_ids: list[str] = []  # the tasks this rank rolled out in its last update
        # the small-model recipe's state (omtr.rl.recipe): saved with every checkpoint
        self.judge_gate = JudgeGate(cfg.judge_gate_auc, cfg.judge_gate_window)
        self.collapse_guard = CollapseGuard()
        self.curriculum = Curriculum(self.tasks, enabled=cfg.curriculum, start=cfg.curriculum_start,
                                     advance_at=cfg.curriculum_advance_at)
        self.out.mkdir(parents=True, exist_ok=True)
        self._tracker = None
        if resume:
            self._load_latest()
        elif self.coll.is_main:
            self._write_config()

    # ------------------------------------------------------------------ data position
    @property
    def cycle(self) -> int:
        return self.update // self.cfg.updates_per_cycle

    def batch_tasks(self, update: int | None = None) -> list[TrainingTask]:
        """The tasks of update ``update`` (default: the next one): a seeded permutation per cycle,
        walked in order and wrapped around when the cycle needs more tasks than there are. With the
        curriculum, the permutation is of the tasks its current cap admits."""
        u = self.update if update is None else update
        c, k = divmod(u, self.cfg.updates_per_cycle)
        pool = self.curriculum.eligible(self.tasks)  # every task when the curriculum is off
        order = list(range(len(pool)))
        salt = 7919 * (self.curriculum.cap or 0) if self.cfg.curriculum else 0
        random.Random(self.cfg.seed * 1_000_003 + c + salt).shuffle(order)
        n = self.cfg.tasks_per_batch
        return [pool[order[(k * n + i) % len(order)]] for i in range(n)]

    def replacement_tasks(self, n: int, round_: int, exclude: set[str]) -> list[TrainingTask]:
        """Dynamic sampling's ``n`` replacement tasks for rollout round ``round_`` (>= 1) of the next
        update: seeded by update and round, admitted by the curriculum, tasks already rolled out in
        this update avoided while others remain."""
        pool = self.curriculum.eligible(self.tasks)  # every task when the curriculum is off
        fresh = [t for t in pool if t.id not in exclude] or list(pool)
        rng = random.Random(self.cfg.seed * 1_000_003 + 104_729 * (self.update + 1) + round_)
        picked = rng.sample(fresh, min(n, len(fresh)))
        while len(picked) < n:  # fewer tasks than a batch: wrap around
            picked.append(rng.choice(fresh))
        return picked

    def rank_tasks(self, update: int | None = None) -> tuple[int, list[TrainingTask]]:
        """This rank's share of :meth:`batch_tasks` (all of it in one process): the position of its
        first task in the batch, and its tasks. The ranks' shares are disjoint and cover the batch."""
        batch = self.batch_tasks(update)
        share = shard(len(batch), self.coll.rank, self.coll.world)
        return share.start, [batch[i] for i in share]

    def _stop_requested(self) -> bool:
        """The stop flag of every rank together: any rank's SIGTERM stops them all."""
        if self.coll.any(self._stop.is_set()):
            self._stop.set()
        return self._stop.is_set()

    # ------------------------------------------------------------------ public entry
    def request_stop(self) -> None:
        """Stop at the next safe point after writing a checkpoint (what SIGTERM does)."""
        self._stop.set()

    def run(self, *, max_updates: int | None = None) -> str:
        """Train until the last cycle ends (``finished``), ``max_updates`` more updates were made
        (``paused``) or a stop was requested (``stopped``); a checkpoint is written in each case."""
        from omtr.progress import Progress

        total = self.cfg.total_updates
        target = total if max_updates is None else min(total, self.update + max_updates)
        bar = Progress(target - self.update, "updates", quiet=self.quiet, every_s=0.0, logger=log)
        with self._signals(), self._environment() as env, self._tracking():
            while self.update < target:
                if self._stop_requested():
                    break
                metrics = self.train_step(env)
                if metrics is None:  # stopped during the rollout: that batch is taken again on resume
                    break
                bar.update()
                end_of_cycle = self.update % self.cfg.updates_per_cycle == 0
                every = self.cfg.checkpoint_every_updates
                if end_of_cycle:
                    self._end_cycle()
                if end_of_cycle or (every and self.update % every == 0):
                    self.save_checkpoint()
            status = "finished" if self.update >= total else ("stopped" if self._stop_requested() else "paused")
            if not (self._latest_dir() and self._latest_dir().name == _ckpt_name(self.update)):
                self.save_checkpoint()
            if status == "finished" and self.coll.is_main:
                self._finish()
            self.coll.barrier()
        bar.close()
        return status

    # ------------------------------------------------------------------ one update
    def train_step(self, env) -> dict | None:
        cfg = self.cfg
        t0 = time.perf_counter()
        start, mine = self.rank_tasks()
        self.rollout_task_ids = [t.id for t in mine]
        # lean_memory: the rollout's blocks of 1 MiB and more (keys and values, the prefill's activations)
        # get pages of their own, handed back when freed (omtr.rl.memory.LEAN_ROLLOUT_MMAP_THRESHOLD)
        lean_rollout = mmap_threshold(LEAN_ROLLOUT_MMAP_THRESHOLD) if cfg.lean_memory else contextlib.nullcontext()
        with self._mem.phase("rollout"), lean_rollout:
            policy, self._refresh_s = self._rollout_policy()
            gate_open = cfg.use_judge and self.judge_gate.open  # decided on earlier updates' specs
            # Episodes are numbered within the cycle, over the whole batch: this rank's come after the
            # lower ranks' (contiguous shares). Dynamic sampling's replacement rounds number on inside
            # the rank's share, which is `rounds` times wider then.
            rounds = cfg.dynamic_sampling_rounds if cfg.dynamic_sampling else 1
            first = ((self.update % cfg.updates_per_cycle) * cfg.episodes_per_batch + start * cfg.samples_per_task) * rounds
            episodes: list[Episode] = []
            items: list[StepItem] = []
            judge_items: list[JudgeItem] = []
            kept: set = set()  # groups with signal (dynamic sampling)
            batch, rolled = mine, 0
            for r in range(rounds):
                tasks = [t for t in batch for _ in range(cfg.samples_per_task)]
                sampling = Sampling(greedy=False, temperature=cfg.temperature, top_p=cfg.top_p,
                                    max_new_tokens=cfg.max_new_tokens,
                                    seed=cfg.seed * 7919 + self.update + 1_000_003 * self.coll.rank + 7_000_003 * r)
                eps = run_episodes(tasks, policy, env, config=EpisodeConfig(max_repairs=cfg.max_repairs),
                                   budget=cfg.budget, sampling=sampling, batch_size=cfg.rollout_batch_size,
                                   judge=cfg.use_judge) if tasks else []
                its, jits = rewarded_items(eps, first + len(episodes), cfg, self.score, self.update, judge_term=gate_open,
                                           judge_checks=P.judge_checks_on(self.models["judge"]))
                episodes += eps
                items += its
                judge_items += jits
                rolled += len(batch)
                if not cfg.dynamic_sampling:
                    break
                kept |= select_groups(its, len(mine) - len(kept))
                missing = len(mine) - len(kept)
                if missing <= 0 or r == rounds - 1 or self._stop.is_set():
                    break
                batch = self.replacement_tasks(missing, r + 1, {e.task.id for e in episodes})
            if cfg.dynamic_sampling:
                for it in items:
                    it.skip = it.group not in kept
            if cfg.judge_items_per_update and len(judge_items) > cfg.judge_items_per_update:
                judge_items = balanced_sample(judge_items, cfg.judge_items_per_update // max(1, self.coll.world) or 1,
                                              random.Random(cfg.seed * 1_000_003 + 31 * self.update + self.coll.rank))
            offset = sum(self.coll.gather(len(judge_items))[:self.coll.rank])
            for k, j in enumerate(judge_items):
                j.index = offset + k
        if cfg.lean_memory:
            self._release_rollout_memory()
        rollout_s = time.perf_counter() - t0
        log.info("update %d%s: rollout of %d episodes, %d planner calls, %d new tokens in %.1f s%s", self.update + 1,
                 f" (rank {self.coll.rank}/{self.coll.world})" if self.coll.active else "",
                 len(episodes), sum(e.planner_calls for e in episodes),
                 sum(len(s.token_ids) for e in episodes for s in e.steps), rollout_s,
                 f"; {len(kept)} of {rolled} groups with signal" if cfg.dynamic_sampling else "")
        if self._stop_requested():
            return None
        recipe = self._observe_recipe(episodes, gate_open, len(kept), rolled)
        # lean_memory: in the passes that train, blocks of 1 MiB and more go back to the system when freed
        lean = mmap_threshold() if cfg.lean_memory else contextlib.nullcontext()
        with lean:
            t1 = time.perf_counter()
            with self._mem.phase("old_logprobs"):
                if not self.exact_rollout:
                    self._recompute_old(items, judge_items)
                self._reference_pass(items)
            ref_s = time.perf_counter() - t1
            self._advantages(items)
            log_path, validation = self._episode_log(episodes, items, first)
            t2 = time.perf_counter()
            with self._mem.phase("update"):
                stats = self._update(items, judge_items)
        if cfg.lean_memory:
            self._release_update_memory()
        update_s = time.perf_counter() - t2
        engine_kl = None if self.exact_rollout else self._engine_kl()  # the first step's steps counted in the update
        self.update += 1
        batch = self._gather_batch(episodes, items, (rollout_s, ref_s, update_s, validation.get("seconds", 0.0)))
        self.episodes_done += len(batch["episodes"])
        calls = sum(e["calls"] for e in batch["episodes"])
        self.planner_calls += calls
        metrics = self._metrics(batch, stats, calls)
        if engine_kl is not None:
            metrics["engine_kl"] = engine_kl
        if not self.exact_rollout:
            metrics["engine_refresh_s"] = self._refresh_s
        metrics.update(recipe)
        metrics.update(self._memory_metrics())
        self._mem.reset()
        if self.probe is not None and self.coll.is_main and (self.update % self.probe_every == 0
                                                            or self.update == cfg.total_updates):
            metrics.update(self._run_probe(env))
        self.history.append({"update": self.update, "cycle": (self.update - 1) // cfg.updates_per_cycle, **metrics})
        if self.coll.is_main:
            self._log_metrics(metrics, log_path, validation)
        return metrics

    @staticmethod
    def prefix_cache_bound(cfg: TrainConfig) -> float:
        """The fast engine's prefix cache bound in MiB: ``prefix_cache_mb``, or under ``lean_memory``
        ``lean_prefix_cache_mb`` where lower (the bound changes speed, never values)."""
        return min(cfg.prefix_cache_mb, cfg.lean_prefix_cache_mb) if cfg.lean_memory else cfg.prefix_cache_mb

    def _memory_metrics(self) -> dict[str, float]:
        """This update's memory by phase; over several ranks each figure is the largest of any rank
        (the process that needs the most memory is the one that decides whether a run fits), so
        every rank logs and keeps the same history."""
        mem = self._mem.metrics()
        if not self.coll.active:
            return mem
        keys = sorted(set().union(*self.coll.gather(sorted(mem))))
        return dict(zip(keys, self.coll.max([mem.get(k, 0.0) for k in keys])))

    def _rollout_policy(self):
        """The policy the rollouts (and the probe) generate with: the models in eval mode, stale
        engines refreshed to the current parameters; returns it with the seconds the refresh took."""
        for m in self.distinct:
            m.eval()
        refresh_s = sum(e.refresh() for e in self.engines.values() if getattr(e, "_stale", False))
        engines = {r: self.engines[id(m)] for r, m in self.models.items()}
        return (engines["actor"] if len(self.distinct) == 1 else RoleRouter(engines)), refresh_s

    def _release_rollout_memory(self) -> None:
        """After the rollout: drop what only a rollout with the same parameters would read again (the
        engines' prefix caches, the policies' stored generation prefixes; the update moves the
        parameters and a refresh drops them anyway) and hand the freed heap pages back (``lean_memory``)."""
        for e in self.engines.values():
            release = getattr(e, "release_caches", None)
            if release is not None:
                release()
        for m in self.distinct:
            getattr(m, "forget_prefixes", lambda: None)()
        gc.collect()  # what only cycles still hold (the rollout's episodes, generations), freed before the trim
        trim_heap()

    def _release_update_memory(self) -> None:
        """After the update (``lean_memory``): the last optimizer step's gradients (the next update
        zeroes them before its first backward pass, and no checkpoint saves them), what only cycles
        still hold, and glibc's free heap pages (the update's activations and temporaries)."""
        from omtr.model.checkpointing import forget_masks

        self.backend.zero_grad()
        forget_masks()  # the attention mask the last checkpointed pass kept (~20 MB)
        gc.collect()
        trim_heap()

    def _run_probe(self, env) -> dict:
        """The held-out probe on the policy as it now is (engines refreshed after the update)."""
        policy, refresh_s = self._rollout_policy()
        self._refresh_s += refresh_s
        try:
            return {k: float(v) for k, v in self.probe(policy, env).items()}
        except Exception as exc:  # a probe is a measurement: it never stops training
            log.warning("the held-out probe failed after update %d (%s: %s); training goes on", self.update,
                        type(exc).__name__, exc)
            return {}

    # ------------------------------------------------------------------ the recipe's rules
    _groups_with_signal = staticmethod(select_groups)  # the old name (omtr.rl.steps.select_groups)

    def _observe_recipe(self, episodes: list[Episode], gate_open: bool, kept: int, rolled: int) -> dict:
        """Feed this update's rollouts (every rank's) to the Judge gate and the curriculum; returns
        their figures for the metrics."""
        cfg = self.cfg
        # The gate asks whether s_J separates what the reward counts as a success (under
        # `nontrivial`, a spec solved with an empty plan is not one): a Judge that predicts only the
        # planner's acceptance would otherwise open the gate and pull the Actor to degenerate specs.
        actor_ok = self._rewarded(episodes, first_step=True)
        mine = {"judge": [(e.judge_score, ok) for e, ok in zip(episodes, actor_ok)
                          if e.judge_score is not None and e.steps and not e.steps[0].verdict.limited],
                "tasks": [(object_count(e.task), ok) for e, ok in zip(episodes, self._rewarded(episodes))]}
        # Collapse guards: each task's solved Actor specs (with a plan), clustered by equivalence.
        mine["specs"] = [(e.task.id, (e.steps[0].domain, e.steps[0].problem)
                          if e.steps and e.steps[0].verdict.success and e.steps[0].verdict.plan else None)
                         for e in episodes]
        parts = self.coll.gather(mine) if self.coll.active else [mine]
        judged = [x for p in parts for x in p["judge"]]
        out: dict[str, float] = {}
        if cfg.collapse_guards and cfg.samples_per_task > 1:
            groups: dict = {}
            for p in parts:
                for task, spec in p["specs"]:
                    groups.setdefault(task, []).append(spec)
            t0 = time.perf_counter()
            out.update(self.collapse_guard.observe(groups))
            out["collapse_guard_s"] = time.perf_counter() - t0
        if cfg.use_judge:
            out["judge_gate_open"] = float(gate_open)
            self.judge_gate.observe([p for p, _ in judged], [y for _, y in judged])
            auc = self.judge_gate.auc()
            if auc is not None:
                out["judge_gate_auc"] = auc
        if cfg.curriculum:
            cap = self.curriculum.cap
            if self.curriculum.observe([x for p in parts for x in p["tasks"]]):
                log.info("curriculum: tasks of up to %s objects from the next update (was %s)", self.curriculum.cap, cap)
            out["curriculum_cap"] = float(cap if cap is not None else 0)
        if cfg.dynamic_sampling:
            k, n = (self.coll.sum([kept, rolled]) if self.coll.active else (kept, rolled))
            out["groups_with_signal"], out["groups_rolled_out"] = float(k), float(n)
        return out

    def _rewarded(self, episodes: list[Episode], *, first_step: bool = False) -> list[bool]:
        """Whether each episode ended in a success its reward counts in full (with ``first_step``:
        whether the Actor's spec was one): the planner accepted the spec and the outcome score
        gives it 1 (under ``nontrivial`` a solved spec with an empty plan does not count, so
        degenerate specs neither move the curriculum on nor open the Judge gate)."""
        picked = [(n, e.steps[0] if first_step else e.steps[-1]) for n, e in enumerate(episodes) if e.steps]
        if not picked:
            return [False] * len(episodes)
        scores = step_scores(self.score, episodes, picked)
        full = {n: s.verdict.success and (sc or 0.0) >= 1.0 for (n, s), sc in zip(picked, scores)}
        return [full.get(n, False) for n, e in enumerate(episodes)]

    # ------------------------------------------------------------------ episode log
    def _episode_log(self, episodes, items, first) -> tuple[Path | None, dict]:
        from omtr.validation.episodes import rows_from_traces, validate_episode_log, write_episode_log

        cycle = self.cycle
        rows = rows_from_traces(episodes, self.run_name, cycle, first_episode=first)
        by_key = {(it.ep, it.role, it.step): it for it in items}
        for r in rows:
            if r["role"] == "judge":
                if r["judge_score"] is not None and not r["timed_out"]:
                    r["reward"] = L.thresholded_judge_reward(r["judge_score"], r["solver_success"], self.cfg.judge_threshold)
                continue
            it = by_key.get((r["episode"], r["role"], r["step"]))
            if it is not None:
                r["reward"], r["advantage"] = it.reward, it.advantage
        folder = self.out / "episodes" / f"cycle-{cycle:04d}"
        stem = f"update-{self.update:06d}" + (f".rank-{self.coll.rank:04d}" if self.coll.active else "")
        path = folder / f"{stem}.parquet"
        if not rows:  # a rank without tasks (more ranks than the batch has tasks)
            path = None
        else:
            write_episode_log(rows, path)
            self._spec_log(episodes, first, folder / f"{stem}.specs.jsonl")
        if not self.cfg.validate_logs:
            return path, {}
        report = validate_episode_log(path, max_step=max(self.cfg.budget - 1, 1)) if path is not None else None
        ok = report is None or report.success
        if report is not None:
            text = report.describe()
            (folder / f"{stem}.validation.txt").write_text(text + "\n")
        failed = [r for r, good in enumerate(self.coll.gather(ok)) if not good]
        if failed:  # every rank stops before the update, not only the one whose log failed
            raise EpisodeLogInvalid(text if not ok else
                                    f"the episode log of rank(s) {failed} failed validation (see their reports in {folder})")
        if report is None:
            return None, {}
        return path, {"seconds": report.seconds, "text": text, "rows": report.rows}

    def _spec_log(self, episodes, first: int, path: Path) -> None:
        """What each generated step wrote, beside the parquet log (which keeps only its hash): one
        JSON line per step with the parquet row's key (``episode``, ``role``, ``step``), its
        ``spec_hash``, the model's raw ``text`` and the ``domain`` and ``problem`` extracted from it
        (``domain`` null where the task gave it), written atomically."""
        import json

        from omtr.rl.rewards import outcome
        from omtr.validation.episodes import spec_hash

        lines = []
        for n, ep in enumerate(episodes):
            given = ep.mode == "domain-given"
            for s in ep.steps:
                lines.append(json.dumps({
                    "episode": first + n, "task_id": str(ep.task.id), "role": s.role, "step": s.index,
                    "spec_hash": spec_hash(s.domain, s.problem), "text": s.text,
                    "domain": None if given else s.domain, "problem": s.problem,
                    "outcome": outcome(s.verdict),
                    "plan_length": len(s.verdict.plan or []),
                }))
        _atomic_write(path, "".join(line + "\n" for line in lines))

    # ------------------------------------------------------------------ environment and signals
    @contextlib.contextmanager
    def _environment(self):
        if self.cfg.metrics_port is not None and self._telemetry is None and self.coll.is_main:
            from omtr.telemetry import TrainingTelemetry

            self._telemetry = TrainingTelemetry(run_id=self.run_name)
            self._telemetry.serve(self.cfg.metrics_port)
        if self.env is not None:
            yield self.env
            return
        from omtr.solver import SolverPool

        scfg = SolverConfig(time_limit_s=self.cfg.solver_time_limit_s, memory_limit_mb=self.cfg.solver_memory_mb)
        with SolverPool(self.cfg.solver_workers, scfg) as pool:
            yield pool

    @contextlib.contextmanager
    def _signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_term(signum, frame):
            log.warning("SIGTERM: stopping after a checkpoint")
            self._stop.set()

        old = signal.signal(signal.SIGTERM, on_term)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, old)
