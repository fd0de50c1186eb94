"""The support verdict: whether an answer's spec is backed by the task's English, without a reference.

A user has no reference: what they see is the spec, the plan and the word ``success``. The planner's
acceptance says the spec is *consistent*, not that it is the *task*. :func:`support` reads what a
policy has at inference time (the task's English, the spec, the plan, optionally the Judge's score)
and never a reference spec, and answers one of:

* ``trivial``: the planner accepted the spec, but it asks for nothing: the plan is empty, or the goal
  already holds in the initial state;
* ``unsupported``: the planner did not accept the spec, or an annotation-free signal speaks against
  it: the initial state breaks a mutex invariant of the domain (:mod:`omtr.faithfulness.signals`),
  the problem declares objects the English never mentions (more of them than the English's names it
  leaves unused), the problem's atoms do not state the English's clauses one to one (where the
  statement is read: :func:`omtr.faithfulness.signals.grounding`, a clause without the atom of the
  predicate its words name, or an atom the English never states; AUC 0.98 between faithful and
  solved-but-unfaithful samples, docs/results/faithfulness-signals-families-2026-12-05.md; in free
  English, a clause the plain reader is sure of without its atom:
  :func:`omtr.faithfulness.signals.plain_unstated`), the
  written domain's predicates or actions carry object names (numbers) in their own names, or, when
  a threshold is given, the Judge's score is below it;
* ``supported``: solved with a non-empty plan and no signal against it.

Each verdict comes with its reasons, one sentence per signal that applies. The Judge's score enters
only with an explicit ``judge_threshold``: the untrained Judge has not been shown to separate
faithful from solved-but-unfaithful specs (docs/model.md), so by default it is reported beside the
verdict, never deciding it.

The module takes texts only (never a task record), like :mod:`omtr.faithfulness.signals`, and every
door of omtr uses it: the episode loop's traces (``omtr infer``, ``omtr evaluate``), the served
model's response and the episode log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

SUPPORTED, UNSUPPORTED, TRIVIAL = "supported", "unsupported", "trivial"
SUPPORT_VALUES = (SUPPORTED, UNSUPPORTED, TRIVIAL)

_WORD = re.compile(r"[a-z0-9]+")
_ALPHA_PART = re.compile(r"[a-z]+")
_DIGIT = re.compile(r"[0-9]")


@dataclass(frozen=True)
class Support:
    """A support verdict (``verdict``: one of :data:`SUPPORT_VALUES`) and its reasons."""

    verdict: str
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {"support": self.verdict, "support_reasons": list(self.reasons)}


def english_words(nl: str) -> set[str]:
    """The English's words, lower case, split at anything not a letter or digit, each also without a
    plural ``s``/``es`` ("balls" -> ball)."""
    out: set[str] = set()
    for w in _WORD.findall((nl or "").lower()):
        out.add(w)
        if len(w) > 3 and w.endswith("es"):
            out.add(w[:-2])
        if len(w) > 2 and w.endswith("s"):
            out.add(w[:-1])
    return out


def mentioned(name: str, words: set[str], joined: set[str]) -> bool:
    """Whether the English mentions an object's name: the whole name (without ``-``/``_``) is one of
    its words or a run of them (``location_0_0``, ``room 1``), or every alphabetic part of the name is
    one of its words (``ball1`` for "two balls", ``left-gripper``; digits are free)."""
    n = name.lower()
    flat = re.sub(r"[^a-z0-9]", "", n)
    if flat in words or flat in joined:
        return True
    parts = _ALPHA_PART.findall(n)
    return bool(parts) and all(p in words or _compound(p, words) for p in parts)


def _compound(part: str, words: set[str]) -> bool:
    """Whether ``part`` is two or more of the English's words run together (``paristruck``: paris,
    truck; ``airporta``: airport, a)."""
    ok = [True] + [False] * len(part)
    for j in range(1, len(part) + 1):
        ok[j] = any(ok[i] and part[i:j] in words for i in range(max(0, j - 24), j) if (i, j) != (0, len(part)))
    return ok[len(part)]


def _runs(nl: str, span: int = 4) -> set[str]:
    ws = _WORD.findall((nl or "").lower())
    out = set()
    for i in range(len(ws)):
        s = ""
        for j in range(i, min(i + span, len(ws))):
            s += ws[j]
            if j > i:  # runs of two words or more (single words are english_words')
                out.add(s)
    return out


def unmentioned_objects(nl: str, objects: Sequence[str], types: dict[str, str] | None = None) -> tuple[list[str], int]:
    """(the problem's objects the English never mentions, how many of the English's own names no
    object of the problem takes). The names are the statement's (:func:`omtr.statement.read_statement`,
    PlanBench's layout or identifiers); free English gives none, so any unmentioned object counts.
    ``types`` (object -> its declared type): an object whose type the English names ("two grippers":
    ``left - gripper``) is mentioned too."""
    from omtr.statement import TEMPLATE_WORDS, read_statement

    reading = read_statement(nl)
    words, joined = english_words(nl), _runs(nl)
    names: set[str] = set()
    if reading.layout != "none":  # sure names: a function word ("a", "the") mentions nothing
        words -= TEMPLATE_WORDS
        names = set(reading.norm_names)
    flat = {o: re.sub(r"[^a-z0-9]", "", o.lower()) for o in objects}
    typed = {o: t for o, t in (types or {}).items() if t and t != "object"}
    if reading.closed and any(flat[o] in names for o in objects):
        # PlanBench's layout, and the problem names its objects as the statement does: every other
        # object must be a word of the task's own text ("the left gripper": `left`), as the decoder's
        # names rule holds them; two names joined (`hoist0-hoist2`) or a made-up word is not
        missing = [o for o in objects if flat[o] not in names and o.lower() not in reading.words]
    else:
        missing = [o for o in objects if flat[o] not in names and not mentioned(o, words, joined)
                   and not (o in typed and mentioned(typed[o], words, joined))]
    unused = sum(1 for n in names if n not in set(flat.values()))
    # an object joining two of the names ("a-b-board") stands for neither: no unused name excuses it
    if any(sum(p in names for p in _ALPHA_PART.findall(o.lower())) >= 2 for o in missing):
        unused = 0
    return missing, unused


def _atom(x) -> tuple | None:
    if isinstance(x, list) and x and all(isinstance(a, str) for a in x):
        return tuple(str(a).lower() for a in x)
    return None


def goal_holds(init: Sequence, goal) -> bool | None:
    """Whether a goal of atoms, ``and`` and ``not`` already holds in ``init`` (None for any other goal)."""
    state = {a for a in (_atom(x) for x in init) if a}

    def ev(g) -> bool | None:
        if not isinstance(g, list) or not g:
            return None
        head = str(g[0]).lower()
        if head == "and":
            vals = [ev(x) for x in g[1:]]
            return None if any(v is None for v in vals) else all(vals)
        if head == "not" and len(g) == 2:
            v = ev(g[1])
            return None if v is None else not v
        a = _atom(g)
        return None if a is None or head in ("or", "imply", "exists", "forall", "=") else a in state

    return ev(goal)


def _atom_str(atom: tuple) -> str:
    return "(" + " ".join(atom) + ")"


def grounding_reason(nl: str, domain: str | None, problem: str | None) -> str | None:
    """Why the problem's atoms and the statement's clauses do not pair one to one
    (:func:`omtr.faithfulness.signals.grounding`: each clause with an atom of the predicate its words
    name, no atom the English never states), or None where they do or the statement is not read
    (free English)."""
    from omtr.faithfulness.signals import grounding

    g = grounding(nl, domain, problem)
    if g is None or g.score >= 1.0:
        return None
    bits = []
    if g.unpaired:
        shown = "; ".join(f"'{t}'" for t in g.unpaired[:3])
        bits.append(f"{len(g.unpaired)} clause(s) of the English without their atom ({shown}"
                    + (", ..." if len(g.unpaired) > 3 else "") + ")")
    if g.unsaid:
        shown = ", ".join(_atom_str(a) for _, a in g.unsaid[:4])
        bits.append(f"{len(g.unsaid)} atom(s) the English never states ({shown}"
                    + (", ..." if len(g.unsaid) > 4 else "") + ")")
    return (f"the problem does not state the task's clauses one to one (typed grounding {g.score:.2f}"
            + (": " + "; ".join(bits) if bits else "") + ")")


def plain_reason(nl: str, domain: str | None, problem: str | None) -> str | None:
    """Why the problem does not state what free English surely says
    (:func:`omtr.faithfulness.signals.plain_unstated`: a clause the plain-English reader read,
    "b is on c", "the hand is empty", "Put a on b", without its atom), or None where every such
    clause has its atom or the text is not plain English."""
    from omtr.faithfulness.signals import plain_unstated

    missing = plain_unstated(nl, domain, problem)
    if not missing:
        return None
    shown = "; ".join(f"'{t}'" for t in missing[:3])
    return (f"the problem does not state {len(missing)} clause(s) of the English that its reading is sure of "
            f"({shown}" + (", ..." if len(missing) > 3 else "") + ")")


def _parsed(problem: str | None):
    if not problem:
        return None
    from omtr.pddl.model import SpecError, parse_problem

    try:
        return parse_problem(problem)
    except (SpecError, RecursionError):
        return None


def spec_checks(nl: str, domain: str | None, problem: str | None, *, parsed=None, domain_written: bool = True,
                context: str = "") -> tuple[str, ...]:
    """The annotation-free signals against a spec that need no planner (one sentence each, empty when
    none applies): a mutex invariant the initial state breaks, objects the English never mentions,
    clauses and atoms that do not pair (or, in free English, a clause the plain reader is sure of
    without its atom), and a written domain whose vocabulary carries object names. ``parsed``: the
    problem already parsed (else it is parsed here; an unreadable problem gets only the domain's
    check). :func:`support` adds the planner's verdict and the plan to these; the Judge's prompt
    shows them (:func:`omtr.inference.prompts.judge_messages`)."""
    prob = parsed if parsed is not None else _parsed(problem)
    against: list[str] = []
    if prob is not None and domain:
        from omtr.faithfulness.signals import domain_invariants, violated_groups

        broken = violated_groups(domain_invariants(domain), [list(a) for a in prob.init])
        if broken:
            shown = "; ".join(" and ".join("(" + " ".join(a) + ")" for a in atoms) for _, _, atoms in broken[:3])
            against.append(f"the initial state breaks {len(broken)} mutex invariant(s) of the domain: {shown}")
    if prob is not None:
        missing, unused = unmentioned_objects(f"{nl}\n{context}" if context else nl, list(prob.objects),
                                              dict(prob.objects))
        if len(missing) > unused:
            against.append(f"{len(missing)} object(s) the English never mentions: {', '.join(missing[:5])}"
                           + (f" (only {unused} of its names are unused)" if unused else ""))
    if prob is not None:
        why = grounding_reason(nl, domain, problem) or plain_reason(nl, domain, problem)
        if why:
            against.append(why)
    if domain_written and domain:
        from omtr.pddl.model import SpecError, parse_domain

        try:
            dom = parse_domain(domain)
        except (SpecError, RecursionError):
            dom = None
        if dom is not None:
            named = sorted(n for n in (*dom.predicates, *dom.actions) if _DIGIT.search(n))
            if named:
                against.append(f"the domain's vocabulary carries object names: {', '.join(named[:4])} "
                               "(a predicate or action is about every object, not one)")
    return tuple(against)


def checks_before_planner(nl: str, domain: str | None, problem: str | None, *,
                          domain_written: bool = True) -> tuple[str, ...]:
    """What the Judge's prompt shows of the annotation-free checks (one sentence each, empty when
    none speaks against the spec): :func:`spec_checks`, and before them a goal that already holds in
    the initial state, or a problem that could not be read. Nothing here asks the planner: the Judge
    scores a spec while the planner runs."""
    prob = _parsed(problem)
    if prob is None:
        return ("the answer holds no readable PDDL problem",)
    first = ("the goal already holds in the initial state",) if goal_holds(prob.init, prob.goal) else ()
    return first + spec_checks(nl, domain, problem, parsed=prob, domain_written=domain_written)


def support(nl: str, domain: str | None, problem: str | None, *, solved: bool, plan: Sequence[str] | None = None,
            category: str | None = None, domain_written: bool = True, judge_score: float | None = None,
            judge_threshold: float | None = None, context: str = "") -> Support:
    """The support verdict of one answer (module doc). ``solved``: the planner accepted the spec (a
    VAL-checked plan); ``plan``: that plan; ``category``: the verdict's category when it failed;
    ``domain_written``: the model wrote the domain (full mode; a given or library domain is not
    checked for names). ``context``: more English that may mention objects, the description of a
    library domain the task was matched to ("a robot with a left and a right gripper")."""
    if not solved:
        why = f"the planner did not accept the spec ({category})" if category else "the planner did not accept the spec"
        return Support(UNSUPPORTED, (why,))
    trivial: list[str] = []
    if not plan:
        trivial.append("the plan is empty: the spec asks for nothing")
    prob = _parsed(problem)
    if prob is not None and plan and goal_holds(prob.init, prob.goal):
        trivial.append("the goal already holds in the initial state")
    if trivial:
        return Support(TRIVIAL, tuple(trivial))
    against = list(spec_checks(nl, domain, problem, parsed=prob, domain_written=domain_written, context=context))
    if judge_threshold is not None and judge_score is not None and judge_score < judge_threshold:
        against.append(f"the Judge's score {judge_score:.2f} is below {judge_threshold:.2f}")
    if against:
        return Support(UNSUPPORTED, tuple(against))
    why = ["solved with a plan; no mutex invariant broken, every object mentioned"
           + (", every clause of the English stated by its atom" if _read(nl) else
              ", every clause of the English read stated by its atom" if _read_plain(nl) else "")]
    if judge_score is not None and judge_threshold is None:
        why.append(f"Judge {judge_score:.2f} (reported, not used: not shown to separate)")
    return Support(SUPPORTED, tuple(why))


def _read(nl: str) -> bool:
    from omtr.statement import read_statement

    return read_statement(nl).layout == "planbench"


def _read_plain(nl: str) -> bool:
    from omtr.statement import read_statement

    r = read_statement(nl)
    return r.layout == "plain" and bool(r.init or r.goal)


__all__ = ["SUPPORTED", "SUPPORT_VALUES", "Support", "TRIVIAL", "UNSUPPORTED", "checks_before_planner", "english_words", "goal_holds", "grounding_reason", "plain_reason",
           "mentioned", "spec_checks", "support", "unmentioned_objects"]
