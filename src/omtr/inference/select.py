"""Choosing among sampled specs by an annotation-free signal: the ``--select`` mode of inference.

``greedy`` (the default) is the episode loop as it always ran (:func:`omtr.inference.episode.run_episodes`:
the Actor's greedy spec, then Editor repairs while it fails, at most K planner calls).

``invariants`` spends the same budget of K planner calls on Actor samples and returns the one the
signal prefers (issue 35; the signals are measured in ``docs/results/faithfulness-signals-2026-12-03.md``,
where broken mutex invariants separate faithful from solved-but-unfaithful samples with AUC 0.96):

1. Candidate 0 is the Actor's greedy spec (one planner call). If the planner solves it with a
   non-empty plan and its initial state breaks none of the domain's mutex invariants
   (:func:`omtr.faithfulness.signals.broken_invariants` is 0; the given domain in the domain-given
   mode, the spec's own domain in the full mode), the episode stops there: one call, the greedy
   answer, exactly what ``greedy`` returns when its Actor succeeds.
2. Otherwise the Actor samples again at temperature :data:`SAMPLE_TEMPERATURE` (0.7), one planner
   call per sample, until a sample is solved (with a plan) and unbroken or K calls are spent.
3. The answer is the best candidate by, in order: solved with a non-empty plan; solved at all (an
   empty plan: the goal already holds); fewest broken invariant groups (unknown counts as worst);
   agreement with the other solved candidates (:func:`omtr.faithfulness.signals.agreement` over the
   checker-equivalence of generated specs, computed only when at least two solved candidates are
   still tied and there are at most :data:`AGREEMENT_MAX` of them); earliest drawn.

``supported`` is ``invariants`` with the whole support verdict (:func:`omtr.faithfulness.support.support`)
in place of the invariant check alone: a candidate stops the episode only when it is ``supported``
(solved with a plan, no broken invariant, no object the English never mentions, and, where the
statement is read, its atoms state the English's clauses one to one: typed grounding 1, AUC 0.98
between faithful and solved-but-unfaithful samples in
``docs/results/faithfulness-signals-families-2026-12-05.md``), and the best candidate ranks a
supported one first, then fewest broken groups, then the highest typed grounding.

No Editor runs under selection: every planner call goes to an Actor sample. The Editor repairs a
spec from the planner's diagnostic, and what makes a failing spec pass is most often a changed
initial state, the very hack the invariant check is there to refuse; independent samples are what
the signals were measured on. Every candidate is one planner call (an answer without a spec is a
call too, as in the loop), so ``planner_calls`` counts them all.

Nothing here reads a reference: the signals read the English, the domain and the specs. Each
episode records its choice (:attr:`SelectedEpisode.selection`, the ``selection`` block of its JSON
line): the candidates, each one's verdict, plan length and broken count, the chosen index and why.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from omtr.config import ConfigError
from omtr.faithfulness.signals import TRANSLATOR
from omtr.inference.episode import Episode, Environment, Step, run_episodes
from omtr.policy import Policy, Sampling

log = logging.getLogger(__name__)

GREEDY = "greedy"
INVARIANTS = "invariants"
SUPPORTED = "supported"
SELECT_MODES = (GREEDY, INVARIANTS, SUPPORTED)
DEFAULT_SELECT = GREEDY
SAMPLE_TEMPERATURE = 0.7
AGREEMENT_MAX = 6  # solved candidates still tied beyond which agreement is not computed (pairs grow as n^2)

# Fast Downward's translator keeps global state: one invariant synthesis at a time in this process
# (the lock is shared with the decoder's init_invariants rule, omtr.model.scope.invariants).
_TRANSLATOR = TRANSLATOR


def check_select(mode, *, what: str = "select") -> str:
    """``mode`` if it is one of :data:`SELECT_MODES`, else a :class:`ConfigError` naming ``what``
    (the flag or field the value came from) and the values it may take."""
    if not isinstance(mode, str) or mode not in SELECT_MODES:
        raise ConfigError(f"{what} must be one of {', '.join(SELECT_MODES)}; got {mode!r}")
    return mode


@dataclass
class SelectedEpisode(Episode):
    """An episode of the ``invariants`` mode: ``steps`` are the candidates in the order drawn (all
    the Actor's: 0 greedy, then samples), and ``selected`` is the one the episode answers with. The
    answer (``final``, ``success``, the JSON's domain, problem and plan) is that candidate, which need
    not be the last one drawn."""

    selected: int = 0
    selection: dict = field(default_factory=dict)
    select_mode: str = INVARIANTS

    @property
    def final(self) -> Step | None:
        return self.steps[self.selected] if self.steps else None

    @property
    def success(self) -> bool:
        return bool(self.steps) and self.steps[self.selected].verdict.success

    @property
    def repairs(self) -> int:
        return 0  # no Editor under selection

    @property
    def done(self) -> bool:
        return bool(self.selection)

    def to_json(self, *, tokens: bool = False) -> dict:
        out = super().to_json(tokens=tokens)
        out["selection"] = dict(self.selection)
        return out


@dataclass
class _Assessed:
    solved: bool  # the planner's verdict
    with_plan: bool  # solved with a non-empty plan
    broken: int | None  # broken mutex groups of a solved candidate's initial state; None: unknown / not solved
    invariants: str  # how ``broken`` was read: "checked", "none in the domain", "unreadable", "not solved"
    verdict: str | None = None  # the support verdict (``supported`` mode only): supported, unsupported, trivial
    grounding: float | None = None  # typed grounding (``supported`` mode, a statement that is read); None: not read
    reasons: tuple = ()  # the support verdict's reasons

    @property
    def accepted(self) -> bool:
        return self.with_plan and self.broken == 0 and self.verdict in (None, "supported")


def assess(step: Step, episode: Episode | None = None, mode: str = INVARIANTS) -> _Assessed:
    """A candidate's verdict and, when solved, how many of its domain's mutex groups its initial
    state breaks (the domain is the step's: the given one in the domain-given mode, the spec's own
    in the full mode). A domain from which no invariant is synthesised breaks nothing (0, noted).
    Under ``supported`` (with the candidate's ``episode``), a solved candidate also gets its support
    verdict (:meth:`Episode.support_of`: every annotation-free signal, objects the English never
    mentions and the clauses' grounding included) and its typed grounding."""
    a = _assess_invariants(step)
    if mode != SUPPORTED or episode is None or not a.solved:
        return a
    from omtr.faithfulness.signals import typed_grounding

    sup = episode.support_of(step, judge_score=step.judge_score)
    g = typed_grounding(episode.task.nl, step.domain, step.problem) if step.domain and step.problem else None
    return replace(a, verdict=sup.verdict, grounding=g, reasons=tuple(sup.reasons))


def _assess_invariants(step: Step) -> _Assessed:
    v = step.verdict
    solved = bool(v.success)
    with_plan = solved and bool(v.plan)
    if not solved or not step.domain or not step.problem:
        return _Assessed(solved, with_plan, None, "not solved")
    from omtr.faithfulness.signals import broken_invariants, domain_invariants

    with _TRANSLATOR:
        try:
            invs = domain_invariants(step.domain)
            if not invs:
                return _Assessed(solved, with_plan, 0, "none in the domain")
            n = broken_invariants(step.domain, step.problem)
        except Exception as exc:  # the translator on a domain the planner accepted: never fatal here
            log.warning("invariant synthesis failed (%s: %s); the candidate's broken count is unknown",
                        type(exc).__name__, exc)
            return _Assessed(solved, with_plan, None, "unreadable")
    return _Assessed(solved, with_plan, n, "checked" if n is not None else "unreadable")


def choose_candidate(steps: Sequence[Step], assessed: Sequence[_Assessed], *,
                     agreement_max: int = AGREEMENT_MAX,
                     equivalence: Callable | None = None) -> tuple[int, str, list[float | None] | None]:
    """``(index, reason, agreement)``: the best candidate by (solved with a plan, solved, fewest broken
    groups, agreement with the other solved candidates, earliest); ``agreement`` is the per-candidate
    share when it was computed (None otherwise)."""
    if not steps:
        raise ValueError("no candidates to choose from")
    unknown = 1 << 30

    def base(i: int) -> tuple:
        a = assessed[i]
        return (a.with_plan, a.solved, a.verdict == "supported", -(a.broken if a.broken is not None else unknown),
                -1.0 if a.grounding is None else a.grounding)

    best = max(base(i) for i in range(len(steps)))
    tied = [i for i in range(len(steps)) if base(i) == best]
    agree = None
    solved = [a.solved for a in assessed]
    if len(tied) > 1 and best[1] and len(tied) <= agreement_max:
        from omtr.faithfulness import signals as S

        specs = [(s.domain, s.problem) if ok else None for s, ok in zip(steps, solved)]
        t = time.perf_counter()
        m = S.equivalence_matrix(specs) if equivalence is None else S.equivalence_matrix(specs, equivalence)
        agree = S.agreement(m, over=solved)
        log.debug("agreement over %d solved candidates in %.2f s", sum(solved), time.perf_counter() - t)
        top = max(agree[i] or 0.0 for i in tied)
        pick = min(i for i in tied if (agree[i] or 0.0) == top)
    else:
        pick = min(tied)
    a = assessed[pick]
    who = "the greedy spec" if pick == 0 else f"sample {pick}"
    if a.accepted and a.verdict == "supported":
        reason = f"{who} is solved with a plan and supported: " + "; ".join(a.reasons)
    elif a.accepted:
        reason = f"{who} is solved with a plan and breaks no mutex invariant"
        if a.invariants == "none in the domain":
            reason = f"{who} is solved with a plan (the domain yields no mutex invariant to check)"
    elif not a.solved:
        reason = "no candidate was solved: the greedy spec" if pick == 0 else f"no candidate was solved: {who}"
    else:
        what = ("an empty plan" if not a.with_plan else
                f"{a.broken} broken mutex group(s)" if a.broken else
                f"{a.verdict}: " + "; ".join(a.reasons) if a.verdict and a.broken is not None else
                f"{a.broken} broken mutex group(s)" if a.broken is not None else "an initial state the check cannot read")
        reason = (f"no candidate solved and {'supported' if a.verdict else 'unbroken'}; "
                  f"{who} has the best left: {what}")
        if agree is not None:
            reason += f", tie among {len(tied)} broken equally, broken by agreement {agree[pick]:.2f}"
        elif len(tied) > 1:
            reason += f", the earliest of {len(tied)} tied"
    return pick, reason, agree


def run_selected(
    tasks: Iterable,
    policy: Policy,
    env: Environment,
    *,
    budget: int,
    sampling: Sampling | None = None,
    batch_size: int | None = None,
    judge: bool = True,
    on_episode: Callable[[Episode], None] | None = None,
    temperature: float = SAMPLE_TEMPERATURE,
    agreement_max: int = AGREEMENT_MAX,
    mode: str = INVARIANTS,
) -> list[SelectedEpisode]:
    """The ``invariants`` or ``supported`` mode (``mode``) on ``tasks``: see the module docstring. ``sampling`` is the greedy
    decoding of candidate 0 (its ``max_new_tokens``, ``top_p`` and ``seed`` carry over to the samples;
    sample round r is seeded ``seed + r`` when a seed is given). Rounds are batched across the tasks
    still open, each through :func:`run_episodes` with a budget of one call (the Actor alone).
    ``on_episode`` is called as each episode is decided. Returns the episodes in task order."""
    if budget < 1:
        raise ConfigError(f"the planner-call budget must be at least 1 (the Actor's spec), got {budget}")
    if not 0 < temperature:
        raise ConfigError(f"the sampling temperature must be above 0, got {temperature}")
    sampling = sampling or Sampling()
    greedy = replace(sampling, greedy=True)
    tasks = list(tasks)
    first = run_episodes(tasks, policy, env, budget=1, sampling=greedy, batch_size=batch_size, judge=judge)
    episodes = [SelectedEpisode(task=e.task, budget=budget, steps=list(e.steps), wall_ms=e.wall_ms, rules=e.rules,
                                reading=e.reading) for e in first]
    if mode not in (INVARIANTS, SUPPORTED):
        raise ConfigError(f"selection mode must be {INVARIANTS} or {SUPPORTED}; got {mode!r}")
    for ep in episodes:
        ep.select_mode = mode
    assessed: list[list[_Assessed]] = [[assess(e.steps[0], e, mode)] for e in episodes]
    drawn: list[list[str]] = [["greedy"] for _ in episodes]
    open_ = []
    for i, ep in enumerate(episodes):
        if assessed[i][0].accepted or budget == 1:
            _decide(ep, assessed[i], drawn[i], agreement_max, on_episode)
        else:
            open_.append(i)
    for r in range(1, budget):
        if not open_:
            break
        seed = None if sampling.seed is None else sampling.seed + r
        hot = replace(sampling, greedy=False, temperature=temperature, seed=seed)
        round_eps = run_episodes([episodes[i].task for i in open_], policy, env, budget=1, sampling=hot,
                                 batch_size=batch_size, judge=judge)
        still = []
        for i, e in zip(open_, round_eps):
            ep, step = episodes[i], e.steps[0]
            step.index = len(ep.steps)
            ep.steps.append(step)
            step.planner_calls = len(ep.steps)
            ep.wall_ms += e.wall_ms
            assessed[i].append(assess(step, ep, mode))
            drawn[i].append(f"t={temperature:g}" + (f" seed={seed}" if seed is not None else ""))
            if assessed[i][-1].accepted or len(ep.steps) >= budget:
                _decide(ep, assessed[i], drawn[i], agreement_max, on_episode)
            else:
                still.append(i)
        open_ = still
    return episodes


def _decide(ep: SelectedEpisode, assessed: list[_Assessed], drawn: list[str], agreement_max: int,
            on_episode: Callable[[Episode], None] | None) -> None:
    t = time.perf_counter()
    pick, reason, agree = choose_candidate(ep.steps, assessed, agreement_max=agreement_max)
    ep.selected = pick
    ep.selection = {
        "mode": ep.select_mode,
        "candidates": len(ep.steps),
        "selected": pick,
        "reason": reason,
        "stopped_early": assessed[-1].accepted and len(ep.steps) < ep.budget,
        "accepted": assessed[pick].accepted,
        "broken": [a.broken for a in assessed],
        "solved": [a.solved for a in assessed],
        "plan_lengths": [len(s.verdict.plan or []) if a.solved else None for s, a in zip(ep.steps, assessed)],
        "invariants": [a.invariants for a in assessed],
        **({"support": [a.verdict for a in assessed], "grounding": [a.grounding for a in assessed]}
           if ep.select_mode == SUPPORTED else {}),
        "agreement": None if agree is None else [None if x is None else round(x, 4) for x in agree],
        "drawn": list(drawn),
        "choose_ms": round((time.perf_counter() - t) * 1000, 3),
    }
    log.debug("episode %s: %d candidate(s), chose %d (%s)", ep.task.id, len(ep.steps), pick, reason)
    if on_episode is not None:
        on_episode(ep)


def run_with_select(select: str, tasks: Iterable, policy: Policy, env: Environment, *, budget: int | None = None,
                    sampling: Sampling | None = None, batch_size: int | None = None, judge: bool = True,
                    on_episode: Callable[[Episode], None] | None = None, config=None,
                    abstain: bool = False) -> list[Episode]:
    """The episode loop under ``select``: ``greedy`` is :func:`run_episodes` unchanged (Editor repairs
    included); ``invariants`` is :func:`run_selected` (no Editor) at the same budget. ``abstain``: an
    answer that is not ``supported`` is answered as no spec (:attr:`Episode.abstained`)."""
    check_select(select)
    if select == GREEDY:
        return run_episodes(tasks, policy, env, config=config, budget=budget, sampling=sampling,
                            batch_size=batch_size, judge=judge, on_episode=on_episode, abstain=abstain)
    if budget is None:
        from omtr.config import EpisodeConfig

        budget = (config or EpisodeConfig()).planner_call_budget

    def decided(ep: Episode) -> None:
        ep.abstain = abstain
        if on_episode is not None:
            on_episode(ep)

    episodes = run_selected(tasks, policy, env, budget=budget, sampling=sampling, batch_size=batch_size,
                            judge=judge, on_episode=decided, mode=select)
    for ep in episodes:
        ep.abstain = abstain
    return episodes


def selection_summary(records: Sequence[dict]) -> dict | None:
    """What selection did over episode JSON lines (None when no line carries a ``selection``):
    how often the greedy spec was kept, the candidates drawn, how many answers were accepted
    (solved, a plan, nothing broken) and how many chosen answers break an invariant."""
    sel = [r["selection"] for r in records if isinstance(r.get("selection"), dict) and r["selection"]]
    if not sel:
        return None
    n = len(sel)
    chosen_broken = [s["broken"][s["selected"]] for s in sel if s["solved"][s["selected"]]]
    index_counts: dict[str, int] = {}
    for s in sel:
        index_counts[str(s["selected"])] = index_counts.get(str(s["selected"]), 0) + 1
    return {
        "mode": sel[0].get("mode", INVARIANTS),
        "episodes": n,
        "candidates_per_task": round(sum(s["candidates"] for s in sel) / n, 3),
        "greedy_kept": sum(s["selected"] == 0 for s in sel),
        "stopped_at_greedy": sum(s["candidates"] == 1 and s["accepted"] for s in sel),
        "accepted": sum(bool(s["accepted"]) for s in sel),
        "chosen_solved_broken": sum(1 for b in chosen_broken if b),
        "chosen_solved_unknown": sum(1 for b in chosen_broken if b is None),
        "agreement_used": sum(s.get("agreement") is not None for s in sel),
        "selected_index": dict(sorted(index_counts.items(), key=lambda kv: int(kv[0]))),
    }


__all__ = ["AGREEMENT_MAX", "DEFAULT_SELECT", "GREEDY", "INVARIANTS", "SAMPLE_TEMPERATURE", "SELECT_MODES", "SUPPORTED",
           "SelectedEpisode", "assess", "check_select", "choose_candidate", "run_selected", "run_with_select",
           "selection_summary"]
