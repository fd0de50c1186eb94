"""The episode loop (paper Algorithm 1), batched across episodes; used by inference and training.

For each task ``x``: the Actor writes ``y0``; the environment verifies it; the Judge scores
``(x, y0)``; while the latest spec fails and fewer than ``K - 1`` repairs were made, the Editor
rewrites it from the *latest* spec and diagnostic. An Actor spec that succeeds ends the episode
with no Editor step. ``K`` (the budget) counts verifications: every step's spec is one call of
``E``, including an answer from which no spec could be extracted (``E`` then answers ``syntax``
without starting a planner).

Batching: many episodes advance together. Episodes waiting for the same role are generated in
one ``policy.generate`` call (up to ``batch_size``), and that batch's specs go to the environment
in one ``solve_many`` call, submitted on a background thread, so the solver pool (or a remote
fleet) plans while the model scores the Actor's specs with the Judge and generates the next batch.

Tasks are read through their ``id``, ``nl``, ``family`` and given ``domain`` only; a task that
carries a reference is reduced to its training view first, so reference PDDL never reaches a prompt
or a trace.

The domain-given mode: a task with a given ``domain`` is one episode of the same loop in which every
answer is a problem. Its prompts show the domain (``omtr.inference.prompts``), the policy is handed
the batch's domains (``generate(..., domains=[...])``: the role model decodes a problem alone,
scoped to the given domain), extraction takes the problem and pairs it with the given domain, and
the environment verifies (given domain, problem). Episodes of the two modes are generated in
separate batches (each mode has its own stop rule). ``Episode.mode`` (``full`` | ``domain-given``)
is in every trace and episode log.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

from omtr.config import ConfigError, EpisodeConfig
from omtr.inference import prompts as P
from omtr.inference.extract import extract_spec, extraction_verdict, problem_complete, spec_complete
from omtr.policy import ContextOverflow, Generation, Policy, Sampling
from omtr.solver.verdict import Verdict
from omtr.statement import read_statement, statement_objects
from omtr.tasks.training import TrainingTask, task_mode

log = logging.getLogger(__name__)


class Environment(Protocol):
    """What the loop needs from ``E``: a ``SolverPool``, the fleet client, or a test double."""

    def solve_many(self, specs: Sequence[tuple[str, str]]) -> list[Verdict]: ...


@dataclass
class Step:
    """One turn of an episode: the Actor's (index 0) or an Editor's (1, 2, ...)."""

    role: str
    index: int
    text: str  # the model's raw answer
    domain: str | None
    problem: str | None
    verdict: Verdict
    judge_score: float | None = None
    planner_calls: int = 0  # calls of E so far in this episode, this one included
    prompt_tokens: int = 0
    token_ids: list[int] = field(default_factory=list, repr=False)  # kept in memory for PPO
    logprobs: list[float] = field(default_factory=list, repr=False)
    finish_reason: str = ""
    notes: list[str] = field(default_factory=list)  # extraction notes
    times: dict[str, float] = field(default_factory=dict)  # ms; "batch" is the generation batch size

    def to_json(self, *, tokens: bool = False) -> dict:
        out = {
            "role": self.role, "index": self.index, "domain": self.domain, "problem": self.problem,
            "text": self.text, "verdict": self.verdict.to_json(), "judge_score": self.judge_score,
            "planner_calls": self.planner_calls, "prompt_tokens": self.prompt_tokens,
            "new_tokens": len(self.token_ids), "finish_reason": self.finish_reason, "notes": self.notes,
            "times": {k: round(v, 3) for k, v in self.times.items()},
        }
        if tokens:
            out["token_ids"], out["logprobs"] = list(self.token_ids), list(self.logprobs)
        return out


@dataclass
class Episode:
    """All steps for one task; ``success`` is the last step's verdict."""

    task: TrainingTask
    budget: int
    steps: list[Step] = field(default_factory=list)
    wall_ms: float = 0.0
    rules: str = ""  # the decoding rules its answers ran under (omtr.model.scope_check.rules_label)
    reading: str = ""  # what the statement's reading made of the English, and why a rule stood aside
    abstain: bool = False  # answer no spec rather than one whose support verdict is not `supported`
    _support: object = field(default=None, repr=False, compare=False)

    @property
    def done(self) -> bool:
        return bool(self.steps) and (self.steps[-1].verdict.success or len(self.steps) >= self.budget)

    @property
    def mode(self) -> str:
        """``domain-given`` when the task came with its domain (the model writes the problem only), else ``full``."""
        return task_mode(self.task)

    @property
    def success(self) -> bool:
        return bool(self.steps) and self.steps[-1].verdict.success

    @property
    def actor_success(self) -> bool:
        """b0: the Actor's own spec succeeded."""
        return bool(self.steps) and self.steps[0].verdict.success

    @property
    def planner_calls(self) -> int:
        return len(self.steps)

    @property
    def repairs(self) -> int:
        return max(0, len(self.steps) - 1)

    @property
    def judge_score(self) -> float | None:
        return self.steps[0].judge_score if self.steps else None

    @property
    def final(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    @property
    def domain_source(self) -> str:
        """Where the answer's domain came from: ``given`` (with the task), ``library:NAME`` (matched
        from the domain library, :mod:`omtr.tasks.library`) or ``written`` (by the model)."""
        src = (self.task.meta or {}).get("domain_source")
        return str(src) if src else ("given" if self.task.domain else "written")

    @property
    def domain_reason(self) -> str:
        return str((self.task.meta or {}).get("domain_reason") or "")

    @property
    def support(self):
        """The final answer's support verdict (:func:`omtr.faithfulness.support.support`: supported,
        unsupported or trivial, with reasons), read from the English and the spec alone."""
        f = self.final
        if self._support is None or self._support[0] is not f:
            self._support = f, self.support_of(f)
        return self._support[1]

    def support_of(self, f: "Step | None", *, judge_score: float | None = None):
        """The support verdict of one step's spec (any candidate, not only the answer) for this task."""
        from omtr.faithfulness.support import support

        v = f.verdict if f is not None else None
        return support(
            self.task.nl, f.domain if f else None, f.problem if f else None,
            solved=bool(v and v.success), plan=(v.plan if v else None),
            category=(v.category.value if v is not None and v.category else None),
            domain_written=self.mode == "full",
            judge_score=self.judge_score if f is self.final and judge_score is None else judge_score,
            context=str((self.task.meta or {}).get("domain_description") or ""))

    @property
    def abstained(self) -> bool:
        """Asked to abstain (``abstain``) and the answer is not supported: no spec is answered."""
        return self.abstain and bool(self.steps) and self.support.verdict != "supported"

    def to_json(self, *, tokens: bool = False) -> dict:
        final = self.final
        sup = self.support if self.steps else None
        out = {
            "id": self.task.id, "family": self.task.family, "mode": self.mode, "success": self.success,
            "support": sup.verdict if sup else None, "support_reasons": list(sup.reasons) if sup else [],
            "domain_source": self.domain_source, "domain_reason": self.domain_reason,
            "actor_success": self.actor_success, "planner_calls": self.planner_calls,
            "repairs": self.repairs, "budget": self.budget, "judge_score": self.judge_score,
            "final_category": final.verdict.category.value if final and final.verdict.category else None,
            "domain": final.domain if final else None, "problem": final.problem if final else None,
            "plan": final.verdict.plan if final else [], "wall_ms": round(self.wall_ms, 3), "rules": self.rules,
            "reading": self.reading,
            "steps": [s.to_json(tokens=tokens) for s in self.steps],
        }
        if self.abstained:  # no spec rather than an unsupported or trivial one; the steps keep what was tried
            out.update(domain=None, problem=None, plan=[], abstained=True)
        return out


def decoding_rules(policy, reading) -> str:
    """The decoding rules a policy's answers to a task run under: ``off`` for a policy without
    omtr's decoder (an API model, a replay), else :func:`omtr.model.scope_check.rules_label` of its
    config and the statement's reading (:func:`omtr.statement.read_statement`)."""
    cfg = getattr(policy, "cfg", None)
    if not getattr(policy, "takes_objects", False) or cfg is None or not hasattr(cfg, "constraint"):
        return "off"
    from omtr.model.scope_check import rules_label

    return rules_label(cfg.constraint, reading, getattr(cfg, "statement_objects", True),
                       getattr(cfg, "statement_facts", True), getattr(cfg, "statement_predicates", True))


def _training_view(task) -> TrainingTask:
    if isinstance(task, TrainingTask):
        return task
    if hasattr(task, "for_training"):  # an evaluation Task: drop the reference before anything reads it
        return task.for_training()
    return TrainingTask(str(task.id), getattr(task, "family", None), None, task.nl,
                        domain=getattr(task, "domain", None) or None)


def run_episodes(
    tasks: Iterable,
    policy: Policy,
    env: Environment,
    *,
    config: EpisodeConfig | None = None,
    budget: int | None = None,
    sampling: Sampling | None = None,
    batch_size: int | None = None,
    judge: bool = True,
    on_episode: Callable[[Episode], None] | None = None,
    abstain: bool = False,
) -> list[Episode]:
    """Run one episode per task; returns them in task order.

    ``abstain``: an episode whose final answer is not ``supported`` (:attr:`Episode.support`) answers
    no spec (its JSON's ``domain``, ``problem`` and ``plan`` are empty, ``abstained`` true; the steps
    keep what was tried).

    ``budget`` is K, the most calls of E per episode (default ``config.planner_call_budget``, the
    paper's 6: the Actor plus at most ``H_max = 5`` Editor repairs). ``batch_size`` caps how many
    episodes are generated together (default: all that are waiting). ``on_episode`` is called once
    per episode as soon as it ends (e.g. to append it to a trace file).
    """
    config = config or EpisodeConfig()
    budget = config.planner_call_budget if budget is None else budget
    if budget < 1:
        raise ConfigError(f"the planner-call budget must be at least 1 (the Actor's spec), got {budget}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    sampling = sampling or Sampling()
    episodes = [Episode(_training_view(t), budget, abstain=abstain) for t in tasks]
    for ep in episodes:
        reading = read_statement(ep.task.nl)
        ep.rules, ep.reading = decoding_rules(policy, reading), reading.why
    runner = _Runner(episodes, policy, env, sampling, batch_size, judge, on_episode)
    runner.run()
    return episodes


class _Runner:
    def __init__(self, episodes, policy, env, sampling, batch_size, judge, on_episode):
        self.episodes, self.policy, self.env = episodes, policy, env
        self.sampling, self.batch_size, self.use_judge, self.on_episode = sampling, batch_size, judge, on_episode
        self.ready: deque[int] = deque(range(len(episodes)))
        self.inflight: dict[cf.Future, tuple[list[int], list[Step], float]] = {}
        self.t0 = time.perf_counter()
        self.started = {i: self.t0 for i in range(len(episodes))}

    # ------------------------------------------------------------------ main loop
    def run(self) -> None:
        with cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="omtr-episode-solve") as pool:
            try:
                while self.ready or self.inflight:
                    if self.ready:
                        self._generate_batch(pool)
                        self._harvest(block=False)
                    else:
                        self._harvest(block=True)
            except BaseException:
                for fut in self.inflight:
                    fut.cancel()
                raise

    def _role(self, i: int) -> str:
        return "actor" if not self.episodes[i].steps else "editor"

    def _mode(self, i: int) -> str:
        return self.episodes[i].mode

    def _take_batch(self) -> tuple[str, list[int]]:
        role, mode = self._role(self.ready[0]), self._mode(self.ready[0])
        batch, rest = [], deque()
        while self.ready:
            i = self.ready.popleft()
            if self._role(i) == role and self._mode(i) == mode and (
                    self.batch_size is None or len(batch) < self.batch_size):
                batch.append(i)
            else:
                rest.append(i)
        self.ready = rest
        return role, batch

    def _generate_batch(self, pool: cf.ThreadPoolExecutor) -> None:
        role, batch = self._take_batch()
        prompts = [self._prompt(role, i) for i in batch]
        given = self._mode(batch[0]) == "domain-given"
        t = time.perf_counter()
        # a policy that answers by task id (a replay of fixed attempts) gets the ids beside the prompts
        by_id = {"task_ids": [self.episodes[i].task.id for i in batch]} if getattr(self.policy, "routes_by_id", False) else {}
        if getattr(self.policy, "takes_objects", False):  # the scope rules' statement names (omtr's role model)
            by_id["objects"] = [statement_objects(self.episodes[i].task.nl) for i in batch]
        try:
            if given:  # the batch's given domains: the policy writes (and scopes) a problem for each
                gens = self.policy.generate(role, prompts, self.sampling, stop_when=problem_complete,
                                            domains=[self.episodes[i].task.domain for i in batch], **by_id)
            else:
                gens = self.policy.generate(role, prompts, self.sampling, stop_when=spec_complete, **by_id)
        except ContextOverflow as exc:  # name the task the answer would not fit for
            task = self.episodes[batch[exc.row]].task.id if exc.row is not None and exc.row < len(batch) else "?"
            raise ContextOverflow(f"task {task!r}: {exc}", row=exc.row) from None
        gen_ms = (time.perf_counter() - t) * 1000
        if len(gens) != len(batch):
            raise RuntimeError(f"the policy returned {len(gens)} generations for {len(batch)} prompts")
        steps = [self._step(role, i, g, gen_ms, len(batch)) for i, g in zip(batch, gens)]

        to_solve = [(i, s) for i, s in zip(batch, steps) if s.domain is not None and s.problem is not None]
        if to_solve:
            fut = pool.submit(self.env.solve_many, [(s.domain, s.problem) for _, s in to_solve])
            self.inflight[fut] = ([i for i, _ in to_solve], [s for _, s in to_solve], time.perf_counter())
        if role == "actor" and self.use_judge:  # runs while the environment plans
            t = time.perf_counter()
            checks = P.judge_checks_on(self.policy)
            scores = self.policy.judge([
                P.judge_messages(self.episodes[i].task, P.spec_text(s.domain, s.problem, s.text, given=given),
                                 checks=checks, domain=s.domain, problem=s.problem)
                for i, s in zip(batch, steps)
            ])
            judge_ms = (time.perf_counter() - t) * 1000
            for s, score in zip(steps, scores):
                s.judge_score, s.times["judge_ms"] = float(score), judge_ms
        for i, s in zip(batch, steps):  # answers without a spec: E's verdict is already known
            if s.domain is None or s.problem is None:
                self._advance(i, s)

    def _prompt(self, role: str, i: int):
        ep = self.episodes[i]
        if role == "actor":
            return P.actor_messages(ep.task)
        last = ep.steps[-1]
        spec = P.spec_text(last.domain, last.problem, last.text, given=ep.mode == "domain-given")
        category = last.verdict.category.value if last.verdict.category else None
        return P.editor_messages(ep.task, spec, category, last.verdict.message)

    def _step(self, role: str, i: int, g: Generation, gen_ms: float, batch: int) -> Step:
        ex = extract_spec(g.text, self.episodes[i].task.domain)
        verdict = extraction_verdict(ex)
        times = {"generate_ms": gen_ms, "batch": float(batch), **g.timings}
        return Step(
            role=role, index=len(self.episodes[i].steps), text=g.text, domain=ex.domain, problem=ex.problem,
            verdict=verdict if verdict is not None else Verdict(success=False, stage="pending"),
            prompt_tokens=g.prompt_tokens, token_ids=list(g.token_ids), logprobs=list(g.logprobs),
            finish_reason=g.finish_reason, notes=ex.notes, times=times,
        )

    def _harvest(self, *, block: bool) -> None:
        if not self.inflight:
            return
        done, _ = cf.wait(list(self.inflight), timeout=None if block else 0, return_when=cf.FIRST_COMPLETED)
        for fut in done:
            idx, steps, t_submit = self.inflight.pop(fut)
            verdicts = fut.result()
            if len(verdicts) != len(steps):
                raise RuntimeError(f"the environment returned {len(verdicts)} verdicts for {len(steps)} specs")
            solve_ms = (time.perf_counter() - t_submit) * 1000
            for i, s, v in zip(idx, steps, verdicts):
                s.verdict, s.times["solve_ms"] = v, solve_ms
                self._advance(i, s)

    def _advance(self, i: int, step: Step) -> None:
        ep = self.episodes[i]
        ep.steps.append(step)
        step.planner_calls = len(ep.steps)
        step.times["at_ms"] = (time.perf_counter() - self.t0) * 1000
        if ep.done:
            ep.wall_ms = (time.perf_counter() - self.started[i]) * 1000
            if self.on_episode is not None:
                self.on_episode(ep)
        else:
            self.ready.append(i)


def _count(xs) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def summarize(episodes: Sequence[Episode]) -> dict:
    """Solved counts, calls per task and the categories of first and final verdicts."""
    n = len(episodes)
    solved = sum(e.success for e in episodes)
    calls = [e.planner_calls for e in episodes]

    def cats(which: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in episodes:
            if not e.steps:
                continue
            v = e.steps[which].verdict
            key = "success" if v.success else (v.category.value if v.category else "unknown")
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))

    scores = [e.judge_score for e in episodes if e.judge_score is not None]
    support = _count(e.support.verdict for e in episodes if e.steps and e.success)
    return {
        "tasks": n,
        "solved": solved,
        "solve_rate": round(solved / n, 4) if n else 0.0,
        # planner successes apart from supported ones: a trivial or unsupported success is no answer
        "supported": support.get("supported", 0),
        "solved_trivial": support.get("trivial", 0),
        "solved_unsupported": support.get("unsupported", 0),
        "abstained": sum(e.abstained for e in episodes),
        "domain_sources": _count(e.domain_source.split(":")[0] for e in episodes),
        "actor_solved": sum(e.actor_success for e in episodes),
        "repaired": sum(e.success and not e.actor_success for e in episodes),
        "planner_calls": sum(calls),
        "calls_per_task": round(sum(calls) / n, 3) if n else 0.0,
        "calls_per_solved_task": round(sum(e.planner_calls for e in episodes if e.success) / solved, 3) if solved else None,
        "modes": _count(e.mode for e in episodes),
        "first_categories": cats(0),
        "final_categories": cats(-1),
        "mean_judge_score": round(sum(scores) / len(scores), 4) if scores else None,
    }
