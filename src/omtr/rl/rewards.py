"""Rewards as plain functions with a contract, registered by name.

An *outcome score* turns the planner's verdicts into numbers::

    score(completions: list[str], *, verdicts: list[Verdict], **columns) -> list[float | None]

``None`` means "no reward": a verdict decided by a limit (time, memory, size; ``verdict.limited``)
says nothing about the spec, so it is logged and skipped, never counted as a failure. Extra
columns (``token_ids``, ``task_ids``, ``roles``, ``nls``: the tasks' English, ``problems``: the
problems extracted from the completions) are passed by name; a score ignores what it
does not need. The trainer builds the paper's role rewards on top of the score:

* Actor: ``R_A = score(y0) + w_J * s_J(x, y0)``;
* Editor: ``R_E = score(y_T) - c * T``, credited to its T steps with discount gamma.

``binary`` is the paper's reward (``b = 1`` iff the planner accepts the spec). ``nontrivial`` is
``binary`` without the cheapest degenerate spec: a solved spec whose plan is empty (its goal already
holds in its own initial state) scores 0. ``shaped`` scores how far up the diagnostic ladder a spec
got. Those three read only the verdict (the plan is the planner's own output). ``grounded`` adds
what the planner cannot see: half of it is ``nontrivial``, half how well the problem's atoms line up
with the facts the task's English states (:func:`omtr.rl.grounding.grounding_score`, from the task's
text and the spec alone). ``supported`` is ``nontrivial`` that pays in full only with the support of
the annotation-free faithfulness signals that apply: an initial state that breaks one of the
domain's mutex invariants (the hand empty and holding a block) scores ``broken_credit`` at most, a
problem whose atoms do not state the English's clauses one to one scores at most half, and a share
``agreement_weight`` of the score can come from how many of the task's other samples state the
same problem (:mod:`omtr.faithfulness.signals`). None of them reads a reference, so all stay
annotation-free. Register more with :func:`register_outcome_score`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from omtr.solver.verdict import Verdict

OutcomeScore = Callable[..., list]

# syntax < object/type < schema < precondition/goal < search < success
LADDER: dict[str, float] = {
    "syntax": 0.0,
    "object_type": 0.2,
    "predicate_schema": 0.4,
    "precondition_effect": 0.6,
    "goal_constraint": 0.6,
    "unreachable_search": 0.8,
    "success": 1.0,
}

OUTCOME_SCORES: dict[str, OutcomeScore] = {}


def register_outcome_score(name: str, fn: OutcomeScore | None = None):
    """Register ``fn`` under ``name`` (usable as a decorator)."""
    def deco(f: OutcomeScore) -> OutcomeScore:
        OUTCOME_SCORES[name] = f
        return f
    return deco(fn) if fn is not None else deco


def outcome(v: Verdict) -> str:
    """``success`` or the verdict's category (``unknown`` if a failure carries none)."""
    if v.success:
        return "success"
    return v.category.value if v.category is not None else "unknown"


@register_outcome_score("binary")
def binary_score(completions: Sequence[str], *, verdicts: Sequence[Verdict], **_) -> list[float | None]:
    """1 when the planner accepts the spec (VAL-checked plan), else 0; None for limited verdicts."""
    return [None if v.limited else (1.0 if v.success else 0.0) for v in verdicts]


@register_outcome_score("nontrivial")
def nontrivial_score(completions: Sequence[str], *, verdicts: Sequence[Verdict], **_) -> list[float | None]:
    """``binary``, except that a solved spec with an empty plan scores 0: its goal holds in its
    initial state, so the spec asks for nothing (an untrained SmolLM2 writes such specs for most
    domain-given tasks: one object named after the domain, a goal copied from the init). None for
    limited verdicts."""
    return [None if v.limited else (1.0 if v.success and v.plan else 0.0) for v in verdicts]


GROUNDING_WEIGHT = 0.5


@register_outcome_score("grounded")
def grounded_score(completions: Sequence[str], *, verdicts: Sequence[Verdict], nls: Sequence[str] | None = None,
                   problems: Sequence[str | None] | None = None, weight: float = GROUNDING_WEIGHT,
                   **_) -> list[float | None]:
    """``(1 - w) * nontrivial + w * grounding`` (w: ``weight``, the trainer's ``grounding_weight``,
    default 0.5): the planner's verdict (a plan needed)
    and the F1 of the task's stated facts against the problem's atoms
    (:func:`omtr.rl.grounding.grounding_score`; the whole score is ``nontrivial`` where the text
    gives nothing to judge by). A degenerate spec the planner solves (one object named after the
    domain, a goal reached in one step) keeps at most ``1 - w``; a spec of the stated task earns 1.
    None for limited verdicts."""
    from omtr.rl.grounding import grounding_score

    base = nontrivial_score(completions, verdicts=verdicts)
    if nls is None or problems is None:
        raise ValueError("the grounded reward needs the tasks' text (nls=) and the problems (problems=)")
    out: list[float | None] = []
    for b, nl, prob in zip(base, nls, problems):
        if b is None:
            out.append(None)
            continue
        g = grounding_score(nl, prob)
        out.append(b if g is None else round((1 - weight) * b + weight * g, 6))
    return out


BROKEN_CREDIT = 0.0
UNGROUNDED_CREDIT = 0.5


@register_outcome_score("supported")
def supported_score(completions: Sequence[str], *, verdicts: Sequence[Verdict],
                    problems: Sequence[str | None] | None = None, domains: Sequence[str | None] | None = None,
                    task_ids: Sequence | None = None, broken_credit: float = BROKEN_CREDIT,
                    agreement_weight: float = 0.0, nls: Sequence[str] | None = None, grounding: bool = True,
                    ungrounded_credit: float = UNGROUNDED_CREDIT, **_) -> list[float | None]:
    """``nontrivial`` with the support of the signals that separate faithful from solved-but-unfaithful
    specs without a reference (``benchmarks/faithfulness_signals.py``: AUC 0.96 for broken invariants):

    * a solved spec (with a plan) whose initial state breaks none of its domain's mutex invariants
      (:func:`omtr.faithfulness.signals.broken_invariants`, from the domain's actions alone) scores 1;
      one that breaks any scores ``broken_credit`` (default 0: the planner's acceptance of a state no
      plan of the domain can reach earns nothing). A domain without invariants, or a problem the
      reader cannot parse, gives the signal nothing to say: the spec keeps its ``nontrivial`` score;
    * where the task's statement is read (PlanBench's layout, which the generators share) and
      ``grounding`` is on, an unbroken solved spec scores 1 only when its atoms state the statement's
      clauses one to one (:func:`omtr.faithfulness.signals.typed_grounding` = 1: each clause by an
      atom of the predicate its words name, no atom the English never states; AUC 0.98 between
      faithful and solved-but-unfaithful samples, every PlanBench and generator reference scores 1);
      below that it scores ``ungrounded_credit * typed_grounding`` (default 0.5: at most half, more
      the closer it comes). ``nls`` are the tasks' English; without them this part stands aside;
    * with ``agreement_weight`` w > 0, a supported spec scores ``(1 - w) + w * a``, ``a`` the share of
      its task's samples in this call (same ``task_ids``) that state an equivalent problem and are
      supported too (:func:`omtr.faithfulness.signals.agreement`; a lone sample agrees with itself).

    Failures score 0 and limited verdicts None, as under ``nontrivial``. ``domains`` are the specs'
    domains (the given one in domain-given mode)."""
    from omtr.faithfulness.signals import broken_invariants, typed_grounding

    if problems is None or domains is None:
        raise ValueError("the supported reward needs the specs' problems (problems=) and domains (domains=)")
    base = nontrivial_score(completions, verdicts=verdicts)
    support: list[float | None] = []
    texts = list(nls) if nls is not None else [None] * len(base)
    for b, dom, prob, nl in zip(base, domains, problems, texts):
        if b is None or b <= 0:
            support.append(b)
            continue
        n = broken_invariants(dom or "", prob)
        if n:
            support.append(float(broken_credit))
            continue
        g = typed_grounding(nl, dom, prob) if grounding and nl is not None else None
        support.append(1.0 if g is None or g >= 1.0 else round(ungrounded_credit * g, 6))
    if agreement_weight <= 0 or task_ids is None:
        return support
    from omtr.faithfulness.signals import agreement, equivalence_matrix

    out = list(support)
    groups: dict = {}
    for i, t in enumerate(task_ids):
        groups.setdefault(t, []).append(i)
    for idx in groups.values():
        full = [support[i] is not None and support[i] >= 1.0 for i in idx]
        if not any(full):
            continue
        specs = [(domains[i], problems[i]) if ok else None for i, ok in zip(idx, full)]
        shares = agreement(equivalence_matrix(specs))
        for i, ok, a in zip(idx, full, shares):
            if ok and a is not None:
                out[i] = round((1 - agreement_weight) + agreement_weight * a, 6)
    return out


@register_outcome_score("shaped")
def shaped_score(completions: Sequence[str], *, verdicts: Sequence[Verdict], **_) -> list[float | None]:
    """The diagnostic ladder: syntax 0, object/type 0.2, schema 0.4, precondition/goal 0.6,
    search (proven unsolvable) 0.8, success 1; None for limited verdicts."""
    return [None if v.limited else LADDER.get(outcome(v), 0.0) for v in verdicts]


def actor_reward(score: float | None, judge_score: float | None, weight: float) -> float | None:
    """R_A = b0 + w * s_J (s_J left out when there is no Judge)."""
    if score is None:
        return None
    return score + (weight * judge_score if judge_score is not None else 0.0)


def editor_reward(final_score: float | None, repairs: int, penalty: float) -> float | None:
    """R_E = b_T - c * T for an episode with T > 0 Editor steps."""
    if final_score is None:
        return None
    return final_score - penalty * repairs
