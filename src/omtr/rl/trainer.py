"""The trainer: cycles of rollout -> rewards -> advantages -> validated log -> PPO/Judge update.

One update, for a batch of ``episodes_per_batch`` episodes:

1. **Rollout.** The episode loop (``omtr.inference.episode.run_episodes``) runs the batch's tasks
   (each ``samples_per_task`` times) at the training temperature: Actor, planner, Judge, Editor.
2. **Rewards.** An outcome score (``binary`` or ``shaped``, :mod:`omtr.rl.rewards`) of each
   verdict; ``R_A = b0 + 0.3 s_J`` for the Actor's step; ``R_E = b_T - 0.1 T`` for the Editor's
   steps. A verdict decided by a limit gets no reward (logged, skipped).
3. **Reference pass.** The reference policy's log-probabilities of every sampled token (the KL
   term), and the prompt's last hidden state, which the value head reads.
4. **Advantages** by the estimator the config names (``gae`` or ``group``).
5. **Episode log.** One parquet row per role step, validated by the episode-log suite; a log that
   fails stops training with the suite's report (nothing already written is lost).
6. **Update.** ``L = L_PPO^A + 0.5 L_PPO^E + 0.3 L_J`` (+ the value head's error), Adam.

Checkpoints (model, optimizer, RNG states, counters, data position) are written at every cycle's
end and every ``checkpoint_every_updates`` updates; SIGTERM writes one and stops. A resumed run
takes the same next batch with the same parameters as one never stopped.

Tasks reach the trainer as :class:`omtr.tasks.training.TrainingTask`: there is no reference field
to read.

Data parallelism (a launcher such as ``deepspeed`` or ``torchrun`` started several processes; see
:mod:`omtr.rl.distributed`): the batch stays ``batch_tasks(update)``, each rank rolls out its
contiguous share of its tasks (whole groups), whitening, loss normalisers and metrics are computed
over the whole batch, and the step applies the batch's gradient. Rank 0 alone writes
``config.json``, ``metrics.jsonl``, the MLflow run, the curve and ``model/``; each rank writes and
validates its own episode log (``update-NNNNNN.rank-RRRR.parquet``) and every rank stops if any
log fails. Checkpoints are written by all ranks together (DeepSpeed's is collective; each rank's
RNG states beside it), ``latest`` by rank 0 after the others finished. A SIGTERM on any rank stops
all of them at the next update boundary, after a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from omtr.config import ROLE_NAMES, ConfigError, EpisodeConfig, SolverConfig
from omtr.inference import prompts as P
from omtr.inference.episode import Episode, run_episodes
from omtr.inference.policy import Sampling
from omtr.rl import losses as L
from omtr.rl.advantages import ADVANTAGE_ESTIMATORS, Trajectory
from omtr.rl.config import TrainConfig
from omtr.rl.distributed import Collective, init_from_env, merge_weighted_means, shard
from omtr.rl.distributed import whiten as whiten_over_ranks
from omtr.rl.engine import TrainModules, make_backend
from omtr.rl.recipe import Curriculum, JudgeGate, groups_with_signal, object_count
from omtr.rl.rewards import OUTCOME_SCORES, actor_reward, editor_reward, outcome
from omtr.tasks.training import TrainingTask

log = logging.getLogger("omtr.rl")

GEN_ROLES = ("actor", "editor")
STATE_FILE = "state.pt"
LATEST = "latest"


class EpisodeLogInvalid(RuntimeError):
    """The episode-log suite rejected a log; the message is its report (it names the bad rows)."""


# ---------------------------------------------------------------------------------------- policies

class RoleRouter:
    """A Policy over three separate models (the `separate_models` ablation): each role its own backbone."""

    def __init__(self, models: dict):
        self.models = models

    def generate(self, role, prompts, sampling, *, stop_when=None, domains=None):
        if domains is None:
            return self.models[role].generate(role, prompts, sampling, stop_when=stop_when)
        return self.models[role].generate(role, prompts, sampling, stop_when=stop_when, domains=domains)

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
        if cfg.grammar_limits is not None and dict(cfg.grammar_limits) != dict(m.cfg.grammar_limits):
            changes["grammar_limits"] = dict(cfg.grammar_limits)
            m._grammar = None  # rebuilt with the new bounds on first use
        if changes:
            m.cfg = m.cfg.replace(**changes)
            m._set_trainable()  # re-apply which parameters train under the new setting
        if m.cfg.train_backbone and cfg.kl_coef > 0:
            m.keep_reference()
        return m

    if cfg.separate_models:
        if model is not None:
            raise ConfigError("separate_models builds its own three models; do not pass one")
        return {r: adjust(one()) for r in ROLE_NAMES}
    m = adjust(one())
    return {r: m for r in ROLE_NAMES}


# ---------------------------------------------------------------------------------------- records

@dataclass
class StepItem:
    """One generated step, with everything the update needs."""

    ep: int  # episode number within the cycle
    group: tuple  # (update, task position): the samples of one task
    role: str
    step: int
    prompt: list
    tokens: list[int]
    old_logprobs: list[float]
    outcome: str
    limited: bool
    judge_score: float | None
    reward: float | None = None
    advantage: float | None = None
    ret: float | None = None
    value: float | None = None
    ref_logprobs: list[float] | None = None
    domain: str | None = None  # the task's given domain (domain-given mode): the masks replay with it
    skip: bool = False  # dynamic sampling: its group carries no signal (rewarded and logged, not trained on)
    feature: torch.Tensor | None = field(default=None, repr=False)


@dataclass
class JudgeItem:
    prompt: list
    label: bool
    index: int = 0  # position among the batch's Judge items (all ranks), for the minibatch split


# ---------------------------------------------------------------------------------------- trainer

class Trainer:
    """Runs a training run in ``out_dir``; ``resume=True`` continues its latest checkpoint."""

    def __init__(self, cfg: TrainConfig, tasks: Sequence[TrainingTask], out_dir: str | os.PathLike, *,
                 model=None, env=None, resume: bool = False, quiet: bool = False,
                 outcome_score: Callable | None = None, run_name: str | None = None):
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
        self.score = outcome_score or OUTCOME_SCORES[cfg.reward]
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
        self.models = build_models(cfg, model)
        self.distinct = list({id(m): m for m in self.models.values()}.values())
        from omtr.rollout import make_engine

        # one rollout engine per distinct model; hf is the model itself
        self.engines = {id(m): make_engine(cfg.rollout_engine, m) for m in self.distinct}
        self.exact_rollout = all(e.exact for e in self.engines.values())
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
        pool = self.curriculum.eligible(self.tasks) if self.cfg.curriculum else self.tasks
        order = list(range(len(pool)))
        salt = 7919 * (self.curriculum.cap or 0) if self.cfg.curriculum else 0
        random.Random(self.cfg.seed * 1_000_003 + c + salt).shuffle(order)
        n = self.cfg.tasks_per_batch
        return [pool[order[(k * n + i) % len(order)]] for i in range(n)]

    def replacement_tasks(self, n: int, round_: int, exclude: set[str]) -> list[TrainingTask]:
        """Dynamic sampling's ``n`` replacement tasks for rollout round ``round_`` (>= 1) of the next
        update: seeded by update and round, admitted by the curriculum, tasks already rolled out in
        this update avoided while others remain."""
        pool = self.curriculum.eligible(self.tasks) if self.cfg.curriculum else self.tasks
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
        for m in self.distinct:
            m.eval()
        self._refresh_s = sum(e.refresh() for e in self.engines.values() if getattr(e, "_stale", False))
        engines = {r: self.engines[id(m)] for r, m in self.models.items()}
        policy = engines["actor"] if len(self.distinct) == 1 else RoleRouter(engines)
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
            its, jits = self._items(eps, first + len(episodes), judge_term=gate_open)
            episodes += eps
            items += its
            judge_items += jits
            rolled += len(batch)
            if not cfg.dynamic_sampling:
                break
            kept |= self._groups_with_signal(its, len(mine) - len(kept))
            missing = len(mine) - len(kept)
            if missing <= 0 or r == rounds - 1 or self._stop.is_set():
                break
            batch = self.replacement_tasks(missing, r + 1, {e.task.id for e in episodes})
        if cfg.dynamic_sampling:
            for it in items:
                it.skip = it.group not in kept
        offset = sum(self.coll.gather(len(judge_items))[:self.coll.rank])
        for k, j in enumerate(judge_items):
            j.index = offset + k
        rollout_s = time.perf_counter() - t0
        log.info("update %d%s: rollout of %d episodes, %d planner calls, %d new tokens in %.1f s%s", self.update + 1,
                 f" (rank {self.coll.rank}/{self.coll.world})" if self.coll.active else "",
                 len(episodes), sum(e.planner_calls for e in episodes),
                 sum(len(s.token_ids) for e in episodes for s in e.steps), rollout_s,
                 f"; {len(kept)} of {rolled} groups with signal" if cfg.dynamic_sampling else "")
        if self._stop_requested():
            return None
        recipe = self._observe_recipe(episodes, gate_open, len(kept), rolled)
        t1 = time.perf_counter()
        engine_kl = None if self.exact_rollout else self._recompute_old(items)
        self._reference_pass(items)
        ref_s = time.perf_counter() - t1
        self._advantages(items)
        log_path, validation = self._episode_log(episodes, items, first)
        t2 = time.perf_counter()
        stats = self._update(items, judge_items)
        update_s = time.perf_counter() - t2
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
        self.history.append({"update": self.update, "cycle": (self.update - 1) // cfg.updates_per_cycle, **metrics})
        if self.coll.is_main:
            self._log_metrics(metrics, log_path, validation)
        return metrics

    # ------------------------------------------------------------------ rewards
    def _items(self, episodes: list[Episode], first: int, *, judge_term: bool | None = None
               ) -> tuple[list[StepItem], list[JudgeItem]]:
        """The episodes' steps with their rewards (``R_A`` with ``s_J`` when ``judge_term``, default
        ``use_judge``), numbered from ``first``; and the Judge's labelled Actor specs. A verdict
        decided by a limit scores 0 (``limited_reward=zero``, the paper) or nothing (``skip``)."""
        cfg = self.cfg
        if judge_term is None:
            judge_term = cfg.use_judge
        steps = [(n, s) for n, ep in enumerate(episodes) for s in ep.steps]
        scores = self.score([s.text for _, s in steps], verdicts=[s.verdict for _, s in steps],
                            token_ids=[s.token_ids for _, s in steps], roles=[s.role for _, s in steps],
                            task_ids=[episodes[n].task.id for n, _ in steps])
        if cfg.limited_reward == "zero":
            scores = [0.0 if sc is None and s.verdict.limited else sc for (_, s), sc in zip(steps, scores)]
        score_of = {(n, s.index): sc for (n, s), sc in zip(steps, scores)}
        items: list[StepItem] = []
        judge_items: list[JudgeItem] = []
        for n, ep in enumerate(episodes):
            group = (self.update, (first + n) // cfg.samples_per_task)
            prev = None
            T = len(ep.steps) - 1
            r_e = editor_reward(score_of[(n, T)], T, cfg.editor_step_penalty) if T > 0 else None
            given = ep.mode == "domain-given"
            for s in ep.steps:
                if s.role == "actor":
                    prompt = P.actor_messages(ep.task)
                    reward = actor_reward(score_of[(n, 0)], s.judge_score if judge_term else None,
                                          cfg.judge_reward_weight)
                    if cfg.use_judge and not s.verdict.limited:
                        judge_items.append(JudgeItem(
                            P.judge_messages(ep.task, P.spec_text(s.domain, s.problem, s.text, given=given)),
                            s.verdict.success))
                else:
                    spec = P.spec_text(prev.domain, prev.problem, prev.text, given=given)
                    cat = prev.verdict.category.value if prev.verdict.category else None
                    prompt = P.editor_messages(ep.task, spec, cat, prev.verdict.message)
                    reward = None if r_e is None else (r_e if s.index == T else 0.0)
                items.append(StepItem(ep=first + n, group=group, role=s.role, step=s.index, prompt=prompt,
                                      tokens=list(s.token_ids), old_logprobs=list(s.logprobs),
                                      domain=ep.task.domain,
                                      outcome=outcome(s.verdict), limited=s.verdict.limited,
                                      judge_score=s.judge_score, reward=reward))
                prev = s
        return items, judge_items

    # ------------------------------------------------------------------ the recipe's rules
    @staticmethod
    def _groups_with_signal(items: list[StepItem], want: int) -> set:
        """Up to ``want`` groups (in rollout order) whose samples' returns differ for some role."""
        returns: dict[tuple, float] = {}
        for it in items:
            if it.reward is not None and it.tokens:
                returns[(it.role, it.group, it.ep)] = returns.get((it.role, it.group, it.ep), 0.0) + it.reward
        signal = groups_with_signal(((role, g), ret) for (role, g, _), ret in returns.items())
        groups = list(dict.fromkeys(it.group for it in items))
        return set([g for g in groups if any((role, g) in signal for role in GEN_ROLES)][:max(0, want)])

    def _observe_recipe(self, episodes: list[Episode], gate_open: bool, kept: int, rolled: int) -> dict:
        """Feed this update's rollouts (every rank's) to the Judge gate and the curriculum; returns
        their figures for the metrics."""
        cfg = self.cfg
        mine = {"judge": [(e.judge_score, e.actor_success) for e in episodes
                          if e.judge_score is not None and e.steps and not e.steps[0].verdict.limited],
                "tasks": [(object_count(e.task), e.success) for e in episodes]}
        parts = self.coll.gather(mine) if self.coll.active else [mine]
        judged = [x for p in parts for x in p["judge"]]
        out: dict[str, float] = {}
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

    # ------------------------------------------------------------------ PPO's old log-probs
    @torch.no_grad()
    def _recompute_old(self, items: list[StepItem]) -> float | None:
        """A non-exact engine sampled the tokens: the log-probabilities that enter the PPO ratio as
        "old" are the policy's own on those tokens, under the same masks (verl's recompute). Returns
        the mean over tokens of ``log p_engine - log p_policy``, an estimate of KL(engine || policy)
        on the rollout's tokens (the engine's samples); None when there are no tokens."""
        diff, n = 0.0, 0
        for role in GEN_ROLES:
            todo = [it for it in items if it.role == role and it.tokens and not it.skip]
            model = self.models[role]
            model.eval()
            for chunk in _chunks(todo, self.cfg.micro_batch_size):
                lp, mask = model.token_logprobs(role, [it.prompt for it in chunk], [it.tokens for it in chunk],
                                                temperature=self.cfg.temperature, **_domains(chunk))
                for b, it in enumerate(chunk):
                    k = len(it.tokens)
                    new = lp[b, :k].tolist()
                    diff += sum(e - p for e, p in zip(it.old_logprobs, new))
                    n += k
                    it.old_logprobs = new
        if self.coll.active:
            diff, n = self.coll.sum([diff, n])
        return diff / n if n else None

    # ------------------------------------------------------------------ reference pass / values
    @torch.no_grad()
    def _reference_pass(self, items: list[StepItem]) -> None:
        need_values = self.cfg.advantage == "gae"
        if self.cfg.kl_coef <= 0 and not need_values:
            return
        for role in GEN_ROLES:
            todo = [it for it in items if it.role == role and it.reward is not None and it.tokens and not it.skip]
            model = self.models[role]
            for chunk in _chunks(todo, self.cfg.micro_batch_size):
                with _capture_hidden(model) as cap, model.reference():
                    ref, mask = model.token_logprobs(role, [it.prompt for it in chunk], [it.tokens for it in chunk],
                                                     temperature=self.cfg.temperature, **_domains(chunk))
                hidden = cap["hidden"]
                for b, it in enumerate(chunk):
                    n = len(it.tokens)
                    it.ref_logprobs = ref[b, :n].tolist()
                    it.feature = hidden[b, -(n + 1)].float().detach().clone()
                    if need_values:
                        it.value = float(self.value_head(it.feature.to(self.value_head.weight.dtype))[GEN_ROLES.index(role)])

    def _advantages(self, items: list[StepItem]) -> None:
        cfg = self.cfg
        trajs, members = [], []
        by_ep: dict[tuple, list[StepItem]] = {}
        for it in items:
            if it.reward is not None and it.tokens and not it.skip:
                by_ep.setdefault((it.ep, it.role), []).append(it)
        for (_, role), its in by_ep.items():
            its.sort(key=lambda i: i.step)
            values = [i.value if i.value is not None else 0.0 for i in its] if cfg.advantage == "gae" else None
            trajs.append(Trajectory(its[0].group, role, [i.reward for i in its], values))
            members.append(its)
        if trajs:  # the groups of `group` are whole on every rank (shares are whole tasks)
            advs, rets = self.estimator(trajs, cfg.editor_gamma, cfg.gae_lambda, cfg.group_scale)
            for its, a, r in zip(members, advs, rets):
                for i, ai, ri in zip(its, a, r):
                    i.advantage, i.ret = ai, ri
        if cfg.whiten_advantages:
            for role in GEN_ROLES:  # over the whole batch: every rank takes part, with or without items
                its = [i for i in items if i.role == role and i.advantage is not None]
                values = [i.advantage for i in its]
                white = whiten_over_ranks(values, self.coll) if self.coll.active else L.whiten(values)
                for i, w in zip(its, white):
                    i.advantage = w

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

    # ------------------------------------------------------------------ the update
    def _update(self, items: list[StepItem], judge_items: list[JudgeItem]) -> dict:
        """The batch's optimizer steps. Every loss term is a mean over the batch's items of one kind
        (on all ranks): a micro-batch's loss is weighted by its share of that batch-wide count, and
        the backend sums the ranks' gradients, so the step's gradient is the whole batch's."""
        cfg = self.cfg
        coll = self.coll
        for m in self.distinct:
            m.train()
        train = [it for it in items if it.advantage is not None and it.tokens]
        stats: dict[str, list[float]] = {}

        def add(key, value, n=1):
            stats.setdefault(key, []).extend([float(value)] * n)

        local_eps = {it.ep for it in train} | {j.index for j in judge_items}
        n_eps = len(set().union(*coll.gather(local_eps))) if coll.active else len(local_eps)
        parts = max(1, min(cfg.minibatches, n_eps or 1))
        tokens_done = 0
        judge_scores: list[float] = []
        for _epoch in range(cfg.ppo_epochs):
            for part in range(parts):
                part_items = [it for it in train if (it.ep % parts) == part]
                part_judge = [j for j in judge_items if j.index % parts == part] if cfg.use_judge else []
                vals = ([it for it in part_items if it.feature is not None and it.ret is not None]
                        if cfg.advantage == "gae" else [])
                local = [sum(it.role == "actor" for it in part_items), sum(it.role == "editor" for it in part_items),
                         len(part_judge), len(vals)]
                n_actor, n_editor, n_judge, n_vals = coll.sum(local) if coll.active else local
                counts = {"actor": n_actor, "editor": n_editor}
                jobs = []
                for role, weight in (("actor", cfg.actor_weight), ("editor", cfg.editor_weight)):
                    its = [it for it in part_items if it.role == role]
                    jobs += [("ppo", role, weight * len(c) / counts[role], c) for c in _chunks(its, cfg.micro_batch_size)]
                jobs += [("judge", "judge", cfg.judge_weight * len(c) / n_judge, c)
                         for c in _chunks(part_judge, cfg.micro_batch_size)]
                if vals:
                    jobs.append(("value", "value", cfg.value_weight * len(vals) / n_vals, vals))
                if not (n_actor or n_editor or n_judge or n_vals):
                    continue  # no rank has anything to learn from in this part
                self.backend.zero_grad()
                for j, (kind, role, weight, chunk) in enumerate(jobs):
                    last = j == len(jobs) - 1
                    if kind == "ppo":
                        loss, st = self._ppo_loss(role, chunk)
                        tokens_done += st.pop("tokens")
                        for k, v in st.items():
                            add(k, v, len(chunk))
                    elif kind == "judge":
                        s = self.models["judge"].judge_scores([ji.prompt for ji in chunk])
                        tokens_done += sum(len(x) for x in self.models["judge"].encode_prompts([ji.prompt for ji in chunk]))
                        labels = torch.tensor([float(ji.label) for ji in chunk], device=s.device)
                        loss, bce, band = L.judge_loss(s, labels, cfg.band_weight)
                        judge_scores += s.detach().float().tolist()
                        add("judge_loss", loss.item(), len(chunk))
                        add("judge_bce", bce.item(), len(chunk))
                        add("judge_band", band.item(), len(chunk))
                    else:
                        feats = torch.stack([it.feature for it in chunk]).to(self.value_head.weight.dtype)
                        idx = torch.tensor([GEN_ROLES.index(it.role) for it in chunk], device=feats.device)
                        v = self.value_head(feats).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
                        target = torch.tensor([it.ret for it in chunk], dtype=v.dtype, device=v.device)
                        loss = ((v - target) ** 2).mean()
                        add("value_loss", loss.item(), len(chunk))
                    self.backend.backward(loss * weight, last=last)
                add("grad_norm", self.backend.step())  # the same on every rank (the reduced gradient)
                self._forget_prefixes()
        if coll.active:
            out = merge_weighted_means(stats, coll)
            out["update_tokens"] = coll.sum([tokens_done])[0]
        else:
            out = {k: sum(v) / len(v) for k, v in stats.items() if v}
            out["update_tokens"] = tokens_done
        return out

    def _forget_prefixes(self) -> None:
        """Stored prompt prefixes are stale after a step (DeepSpeed may update parameters in
        ways their version counters do not see)."""
        for m in {id(m): m for m in self.models.values()}.values():
            getattr(m, "forget_prefixes", lambda: None)()
        for e in getattr(self, "engines", {}).values():
            e.mark_stale()  # the engine takes the new weights before the next rollout

    def _ppo_loss(self, role: str, chunk: list[StepItem]) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        model = self.models[role]
        logp, mask = model.token_logprobs(role, [it.prompt for it in chunk], [it.tokens for it in chunk],
                                          temperature=cfg.temperature, **_domains(chunk))
        old = _pad([it.old_logprobs for it in chunk], logp.shape[1], logp)
        adv = torch.tensor([it.advantage for it in chunk], dtype=logp.dtype, device=logp.device)
        pg, clip_frac = L.ppo_clip_loss(logp, old, adv, mask, cfg.ppo_clip)
        loss = pg
        st = {f"{role}_pg_loss": pg.item(), f"{role}_clip_frac": clip_frac.item(),
              f"{role}_entropy": -L.seq_mean(logp.detach(), mask).item()}
        if all(it.ref_logprobs is not None for it in chunk):
            ref = _pad([it.ref_logprobs for it in chunk], logp.shape[1], logp)
            kl = L.seq_mean(L.kl_k3(logp, ref), mask)
            st[f"{role}_kl"] = kl.item()
            if cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * kl
        prompt_tokens = sum(len(p) for p in model.encode_prompts([it.prompt for it in chunk]))
        st["tokens"] = prompt_tokens + int(mask.sum())
        return loss, st

    # ------------------------------------------------------------------ the Judge on labelled data
    def judge_step(self, prompts: list, labels: list[bool]) -> float:
        """One optimizer step of L_J alone on fixed labelled data; returns the loss before the step."""
        self.backend.zero_grad()
        m = self.models["judge"]
        m.train()
        s = m.judge_scores(prompts)
        loss, _, _ = L.judge_loss(s, torch.tensor([float(b) for b in labels]), self.cfg.band_weight)
        self.backend.backward(loss, last=True)
        self.backend.step()
        self._forget_prefixes()
        return float(loss)

    # ------------------------------------------------------------------ metrics
    def _gather_batch(self, episodes: list[Episode], items: list[StepItem], times: tuple) -> dict:
        """What the metrics need of this rank's episodes and steps, as plain records, from every
        rank (rank order, so the batch's episodes in batch order); the times of every rank."""
        eps = [{"success": e.success, "actor_success": e.actor_success,
                "final": outcome(e.final.verdict) if e.final is not None else None,
                "judge": (e.judge_score, e.actor_success)
                if e.judge_score is not None and not e.steps[0].verdict.limited else None,
                "calls": e.planner_calls, "gen_tokens": sum(len(s.token_ids) for s in e.steps),
                "actor_prompt_tokens": [s.prompt_tokens for s in e.steps if s.role == "actor"]}
               for e in episodes]
        its = [(it.role, it.ep, it.step, it.reward, it.outcome, it.limited, len(it.tokens)) for it in items]
        mine = {"episodes": eps, "items": its, "times": tuple(times)}
        parts = self.coll.gather(mine)
        return {"episodes": [e for p in parts for e in p["episodes"]],
                "items": [i for p in parts for i in p["items"]],
                "times": [p["times"] for p in parts]}

    def _metrics(self, batch: dict, stats: dict, calls: int) -> dict:
        """The update's figures over the whole batch (every rank's episodes); times are the
        slowest rank's (the update waits for it)."""
        episodes, items = batch["episodes"], batch["items"]
        rollout_s, ref_s, update_s, validation_s = (max(t[k] for t in batch["times"]) for k in range(4))
        n = max(1, len(episodes))
        m: dict[str, float] = {}
        ra = [r for role, _, _, r, *_ in items if role == "actor" and r is not None]
        last_editor: dict[int, tuple] = {}
        for it in items:
            role, ep, step = it[:3]
            if role == "editor" and (ep not in last_editor or step > last_editor[ep][2]):
                last_editor[ep] = it
        re_ = [it[3] for it in last_editor.values() if it[3] is not None]
        m["reward_actor"] = _mean(ra)
        m["reward_editor"] = _mean(re_)
        m["success_rate"] = sum(e["success"] for e in episodes) / n
        m["actor_success_rate"] = sum(e["actor_success"] for e in episodes) / n
        m["limited_steps"] = float(sum(it[5] for it in items))
        finals = [e["final"] for e in episodes if e["final"] is not None]
        first = [it[4] for it in items if it[0] == "actor"]
        for cat in ("success", "syntax", "object_type", "predicate_schema", "precondition_effect",
                    "goal_constraint", "unreachable_search"):
            m[f"share_final_{cat}"] = finals.count(cat) / max(1, len(finals))
            m[f"share_actor_{cat}"] = first.count(cat) / max(1, len(first))
        m["mean_ladder_actor"] = _mean([_ladder(o) for o in first])
        scored = [e["judge"] for e in episodes if e["judge"] is not None]
        if scored:
            ps, ys = [p for p, _ in scored], [y for _, y in scored]
            m["judge_ece"] = L.expected_calibration_error(ps, ys)
            m["judge_brier"] = L.brier_score(ps, ys)
            auc = L.binary_auc(ps, ys)
            if auc is not None:
                m["judge_auc"] = auc
            m["reward_judge"] = _mean([L.thresholded_judge_reward(p, y, self.cfg.judge_threshold) for p, y in scored])
            m["judge_mean_score"] = _mean(ps)
        for k, v in stats.items():
            if k != "update_tokens":
                m[k] = v
        gen_tokens = sum(e["gen_tokens"] for e in episodes)
        m["gen_tokens"] = float(gen_tokens)
        m["rollout_tokens_per_s"] = gen_tokens / rollout_s if rollout_s > 0 else 0.0
        m["update_tokens_per_s"] = stats.get("update_tokens", 0) / update_s if update_s > 0 else 0.0
        m["len_actor"] = _mean([it[6] for it in items if it[0] == "actor"])
        m["len_editor"] = _mean([it[6] for it in items if it[0] == "editor"])
        m["prompt_tokens_actor"] = _mean([t for e in episodes for t in e["actor_prompt_tokens"]])
        m["rollout_s"], m["reference_s"], m["update_s"] = rollout_s, ref_s, update_s
        m["validation_s"] = validation_s
        m["planner_calls"] = float(calls)
        m["calls_per_episode"] = calls / n
        m["episodes_total"] = float(self.episodes_done)
        m["planner_calls_total"] = float(self.planner_calls)
        if self.coll.active:
            m["ranks"] = float(self.coll.world)
        return {k: float(v) for k, v in m.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}

    # ------------------------------------------------------------------ checkpoints
    def _ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def _latest_dir(self) -> Path | None:
        p = self._ckpt_root() / LATEST
        if not p.is_file():
            return None
        d = self._ckpt_root() / p.read_text().strip()
        return d if d.is_dir() else None

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in self.backend.mods.trainable_named()}

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/update-NNNNNN`` and point ``latest`` at it. With several ranks every
        rank calls this (DeepSpeed's save is collective, and each rank keeps its RNG states);
        rank 0 makes the folder, and renames it and writes ``latest`` after all ranks are done."""
        coll = self.coll
        root = self._ckpt_root()
        name = _ckpt_name(self.update)
        tmp = root / f".{name}.tmp"
        if coll.is_main:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        coll.barrier()
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        client = {
            "counters": {"update": self.update, "episodes": self.episodes_done, "planner_calls": self.planner_calls},
            "data_position": {"cycle": self.cycle, "update_in_cycle": self.update % self.cfg.updates_per_cycle,
                              "next_tasks": [t.id for t in self.batch_tasks()] if self.update < self.cfg.total_updates else []},
            "rng": rng,
            "history": self.history,
            "recipe": {"judge_gate": self.judge_gate.state_dict(), "curriculum": self.curriculum.state_dict()},
            "config": self.cfg.to_dict(),
        }
        if self.backend.name == "deepspeed":
            self.backend.save(tmp, client)  # collective
        elif coll.is_main:
            torch.save({"params": self.trainable_state(), "backend": self.backend.state_dict(), **client},
                       tmp / STATE_FILE)
        if coll.active:
            torch.save(rng, tmp / _rng_file(coll.rank))
        coll.barrier()
        final = root / name
        if coll.is_main:
            info = {k: client[k] for k in ("counters", "data_position")}
            info["world_size"] = coll.world
            (tmp / "trainer.json").write_text(json.dumps(info, indent=2) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            _atomic_write(root / LATEST, name)
            kept = sorted(d for d in root.iterdir() if d.is_dir() and d.name.startswith("update-"))
            for d in kept[:-self.cfg.keep_checkpoints]:
                shutil.rmtree(d, ignore_errors=True)
            log.info("checkpoint %s (update %d, cycle %d)", final, self.update, self.cycle)
        coll.barrier()
        return final

    def _load_latest(self) -> None:
        d = self._latest_dir()
        if d is None:
            raise FileNotFoundError(f"{self.out}: no checkpoint to resume (checkpoints/{LATEST} is missing); "
                                    "start the run without --resume")
        if self.backend.name == "deepspeed":
            state = self.backend.load(d)
        else:
            state = torch.load(d / STATE_FILE, map_location="cpu", weights_only=False)
            params = dict(self.backend.mods.trainable_named())
            missing = set(params) ^ set(state["params"])
            if missing:
                raise ValueError(f"checkpoint {d} does not match this model: {sorted(missing)[:3]} ...")
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(state["params"][n].to(p.device, p.dtype))
            self.backend.load_state_dict(state["backend"])
        c = state["counters"]
        self.update, self.episodes_done, self.planner_calls = c["update"], c["episodes"], c["planner_calls"]
        rng = state["rng"]
        if self.coll.active:
            own = d / _rng_file(self.coll.rank)
            if own.is_file():
                rng = torch.load(own, map_location="cpu", weights_only=False)
            else:
                log.warning("%s holds no RNG states of rank %d (written by a run with another world size); "
                            "this rank starts from rank 0's", d, self.coll.rank)
        random.setstate(rng["python"])
        torch.set_rng_state(rng["torch"])
        self.history = list(state.get("history", []))
        recipe = state.get("recipe") or {}
        self.judge_gate.load_state_dict(recipe.get("judge_gate") or {})
        self.curriculum.load_state_dict(recipe.get("curriculum") or {})
        log.info("resumed from %s: update %d of %d", d, self.update, self.cfg.total_updates)

    def _write_config(self) -> None:
        _atomic_write(self.out / "config.json", json.dumps(self.cfg.to_dict(), indent=2) + "\n")

    # ------------------------------------------------------------------ cycle end / finish
    def _end_cycle(self) -> None:
        c = self.cycle - 1
        rows = [h for h in self.history if h.get("cycle") == c]
        if rows:
            keys = sorted({k for r in rows for k in r if k not in ("update", "cycle")})
            summary = {f"cycle_{k}": _mean([r[k] for r in rows if k in r]) for k in keys}
            self._tracker_log(summary, step=c)
        if not self.coll.is_main:
            return
        if self.cfg.save_model_every_cycle:
            self.save_model()
        self._curve()

    def save_model(self) -> Path:
        if len(self.distinct) == 1:
            return self.distinct[0].save(self.out / "model")
        for r in ROLE_NAMES:
            self.models[r].save(self.out / f"model-{r}")
        return self.out

    def _finish(self) -> None:
        if not (self.out / "model").exists() and self.cfg.save_model_every_cycle:
            self.save_model()
        (self.out / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in self.history))
        self._curve()
        if self._tracker is not None:
            self._tracker.artifact(self.out / "metrics.jsonl")

    def _curve(self) -> None:
        if not self.history:
            return
        from omtr.rl.curves import training_curve

        png = training_curve(self.history, self.out / "training_curve.png")
        if self._tracker is not None:
            self._tracker.artifact(png)

    # ------------------------------------------------------------------ tracking
    @contextlib.contextmanager
    def _tracking(self):
        if not self.cfg.mlflow or not self.coll.is_main:  # one MLflow writer: rank 0
            yield
            return
        from omtr.rl.tracking import Tracker

        self._tracker = Tracker(self.out, self.cfg, self.run_name)
        try:
            yield
        finally:
            self._tracker.close()
            self._tracker = None

    def _tracker_log(self, metrics: dict, step: int) -> None:
        if self._tracker is not None:
            self._tracker.metrics(metrics, step)

    def _log_metrics(self, metrics: dict, log_path: Path | None, validation: dict) -> None:
        log.info("update %d/%d: success %.2f, R_A %.3f, judge loss %s, %s gen tok/s, %s update tok/s",
                 self.update, self.cfg.total_updates, metrics.get("success_rate", 0.0),
                 metrics.get("reward_actor", float("nan")), f"{metrics['judge_loss']:.3f}" if "judge_loss" in metrics else "-",
                 f"{metrics['rollout_tokens_per_s']:.1f}", f"{metrics['update_tokens_per_s']:.1f}")
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"update": self.update, **metrics}) + "\n")
        if self._tracker is not None:
            self._tracker.metrics(metrics, self.update)
            folder = self.out / "episodes" / f"cycle-{(self.update - 1) // self.cfg.updates_per_cycle:04d}"
            stem = f"update-{self.update - 1:06d}"
            logs = sorted(folder.glob(f"{stem}.rank-*.parquet")) if self.coll.active else [log_path]
            for p in logs:  # every rank's log (all were written and validated before the update)
                if p is None:
                    continue
                self._tracker.artifact(p, f"episodes/{p.parent.name}")
                v = p.with_suffix(".validation.txt")
                if v.exists():
                    self._tracker.artifact(v, f"episodes/{p.parent.name}")
        if self._telemetry is not None:
            cats = {k[len("share_final_"):]: int(round(v * 1000)) for k, v in metrics.items() if k.startswith("share_final_")}
            self._telemetry.record(step=self.update, rewards={r: metrics[f"reward_{r}"] for r in ROLE_NAMES
                                                               if f"reward_{r}" in metrics},
                                   success_rate=metrics.get("success_rate"), categories=cats,
                                   judge_auc=metrics.get("judge_auc"), judge_ece=metrics.get("judge_ece"),
                                   kl={r: metrics[f"{r}_kl"] for r in GEN_ROLES if f"{r}_kl" in metrics},
                                   tokens_per_s=metrics.get("rollout_tokens_per_s"),
                                   episodes=self.cfg.episodes_per_batch, planner_calls=int(metrics["planner_calls"]))

    _telemetry = None

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


# ---------------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def _capture_hidden(model):
    """Capture the decoder's last hidden states of the next forward pass (policy or reference)."""
    cap: dict = {}
    hooks = []
    for lm in (model.base_model, getattr(model, "_reference_lm", None)):
        if lm is None:
            continue
        decoder = getattr(lm, lm.base_model_prefix)

        def hook(mod, args, out):
            cap["hidden"] = out[0] if isinstance(out, tuple) else out.last_hidden_state

        hooks.append(decoder.register_forward_hook(hook))
    try:
        yield cap
    finally:
        for h in hooks:
            h.remove()


def _domains(chunk: list[StepItem]) -> dict:
    """``domains=`` for token log-probs when a step of the chunk had a given domain: the masks
    (problem-only grammar, scoped to the domain) replay as they were sampled."""
    if all(it.domain is None for it in chunk):
        return {}
    return {"domains": [it.domain for it in chunk]}


def _pad(rows: list[list[float]], length: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((len(rows), length), dtype=like.dtype, device=like.device)
    for b, r in enumerate(rows):
        if r:
            out[b, :len(r)] = torch.tensor(r[:length], dtype=like.dtype)
    return out


def _chunks(xs: list, n: int):
    return [xs[i:i + n] for i in range(0, len(xs), n)]


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _ladder(o: str) -> float:
    from omtr.rl.rewards import LADDER

    return LADDER.get(o, 0.0)


def _ckpt_name(update: int) -> str:
    return f"update-{update:06d}"


def _rng_file(rank: int) -> str:
    return f"rng-rank-{rank:04d}.pt"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
