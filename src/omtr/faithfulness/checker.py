"""The reference checker: is a solver-successful generated spec the task the reference states?

``check(reference, generated, plan)`` normalises both specs (see ``normal.py``), finds a
structural mapping (``mapping.py``), compares objects and types, initial state and action schemas
under that mapping, compares the goals by the reachable states they accept (``goals.py``) when the
initial states correspond, and replays the plan in the reference model (``replay.py``).
It never raises on bad generated input: anything unusable becomes an ``unmappable`` finding.
Evaluation only — nothing here may feed a training signal.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from omtr.faithfulness.mapping import Mapping, find_mapping
from omtr.faithfulness.normal import EQ, NormalizeError, NSpec, display, normalize

log = logging.getLogger(__name__)

MIN_COVERAGE = 0.5  # below this share of matched structure there is no meaningful mapping


class DriftCategory(str, enum.Enum):
    """Closed vocabulary of findings, in the order the checker reports them."""

    UNMAPPABLE = "unmappable"
    OBJECT_MISSING = "object_missing"
    OBJECT_EXTRA = "object_extra"
    TYPE_CHANGED = "type_changed"
    INIT_CHANGED = "init_changed"
    GOAL_WEAKENED = "goal_weakened"
    GOAL_STRENGTHENED = "goal_strengthened"
    GOAL_CHANGED = "goal_changed"
    GOAL_UNDECIDED = "goal_undecided"
    ACTION_MISSING = "action_missing"
    ACTION_EXTRA = "action_extra"
    PRECONDITION_DROPPED = "precondition_dropped"
    PRECONDITION_ADDED = "precondition_added"
    EFFECT_CHANGED = "effect_changed"
    PLAN_INVALID_UNDER_REFERENCE = "plan_invalid_under_reference"

    def __str__(self) -> str:
        return self.value


_ORDER = {c: i for i, c in enumerate(DriftCategory)}


@dataclass(frozen=True)
class Finding:
    category: DriftCategory
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"category": self.category.value, "detail": self.detail}


@dataclass
class FaithfulnessReport:
    faithful: bool
    findings: list[Finding] = field(default_factory=list)
    mapping: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    elapsed_ms: float = 0.0

    @property
    def categories(self) -> list[str]:
        return [f.category.value for f in self.findings]

    @property
    def first_category(self) -> str | None:
        return self.findings[0].category.value if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "faithful": self.faithful,
            "findings": [f.to_dict() for f in self.findings],
            "mapping": self.mapping,
            "notes": self.notes,
            "plan": self.plan,
            "elapsed_ms": round(self.elapsed_ms, 3),
        }


def _texts(spec, what: str) -> tuple[str, str]:
    """Accept ReferenceSpec-like objects, Task-like objects, (domain, problem) pairs or dicts."""
    if spec is None:
        raise NormalizeError(what, "missing")
    ref = getattr(spec, "reference", None)
    if ref is not None and not isinstance(spec, (tuple, list, dict)):
        spec = ref
    if isinstance(spec, dict):
        return spec.get("domain"), spec.get("problem")
    if isinstance(spec, (tuple, list)) and len(spec) == 2:
        return spec[0], spec[1]
    if hasattr(spec, "domain") and hasattr(spec, "problem"):
        return spec.domain, spec.problem
    raise NormalizeError(what, f"expected (domain, problem) texts, got {type(spec).__name__}")


def _lit_text(sym, args, pos=True, names=None) -> str:
    def nm(a):
        if isinstance(a, int):
            return names[a] if names and a < len(names) else f"#{a}"
        if isinstance(a, str) and a.startswith("c:"):
            return a[2:]
        return str(a)

    body = " ".join([display(sym) if sym != EQ else "=", *(nm(a) for a in args)]).strip()
    return f"({body})" if pos else f"(not ({body}))"


def _unmappable(detail: str, started: float, notes=None) -> FaithfulnessReport:
    return FaithfulnessReport(
        faithful=False,
        findings=[Finding(DriftCategory.UNMAPPABLE, detail)],
        notes=list(notes or []),
        plan={"checked": False},
        elapsed_ms=(time.perf_counter() - started) * 1e3,
    )


def check(task_reference, generated_spec, generated_plan=None, *, validate_with_val: bool = False) -> FaithfulnessReport:
    """Compare a generated spec (and its plan) with the task's reference. Never raises."""
    started = time.perf_counter()
    try:
        return _check(task_reference, generated_spec, generated_plan, started, validate_with_val)
    except NormalizeError as exc:
        return _unmappable(str(exc), started)
    except Exception as exc:  # noqa: BLE001 - garbage must become a report, not a crash
        log.exception("faithfulness check failed unexpectedly")
        return _unmappable(f"checker could not process the spec: {type(exc).__name__}: {exc}", started)


def _check(task_reference, generated_spec, plan, started, validate_with_val) -> FaithfulnessReport:
    try:
        rd, rp = _texts(task_reference, "reference")
        ref = normalize(rd, rp)
    except NormalizeError as exc:
        return _unmappable(f"reference {exc}", started)
    gd, gp = _texts(generated_spec, "generated")
    try:
        gen = normalize(gd, gp)
    except NormalizeError as exc:
        return _unmappable(f"generated {exc}", started)
    if ref.complex_goal or any(a.complex for a in ref.actions.values()):
        log.debug("reference uses disjunction/quantifiers/conditional effects: compared as literal sets")

    mapping = find_mapping(ref, gen)
    notes = [f"generated: {n}" for n in gen.notes]
    part_failure = _coverage_failure(ref, gen, mapping)
    if part_failure:
        report = _unmappable(part_failure, started, notes)
        report.mapping = _mapping_dict(ref, gen, mapping)
        return report

    findings: list[Finding] = []
    findings += _object_findings(ref, gen, mapping)
    findings += _state_findings(ref, gen, mapping, (rd, rp), notes)
    findings += _action_findings(ref, gen, mapping)
    findings.sort(key=lambda f: _ORDER[f.category])

    plan_info: dict[str, Any] = {"checked": False}
    if plan is not None:
        from omtr.faithfulness.replay import replay_plan

        plan_info = replay_plan(ref, gen, mapping, plan, reference_texts=(rd, rp), use_val=validate_with_val)
        if not plan_info.get("valid"):
            findings.append(Finding(DriftCategory.PLAN_INVALID_UNDER_REFERENCE, plan_info.get("detail", "")))
    return FaithfulnessReport(
        faithful=not findings,
        findings=findings,
        mapping=_mapping_dict(ref, gen, mapping),
        notes=notes,
        plan=plan_info,
        elapsed_ms=(time.perf_counter() - started) * 1e3,
    )


def _mapping_dict(ref: NSpec, gen: NSpec, m: Mapping) -> dict[str, Any]:
    preds, types = {}, {}
    for r, (g, perm) in sorted(m.preds.items()):
        if r.startswith("type:") or g.startswith("type:"):
            types[display(r)] = display(g)
        else:
            preds[r] = {"name": display(g), "argument_order": list(perm)}
    return {
        "objects": dict(sorted(m.objects.items())),
        "predicates": preds,
        "types": types,
        "actions": {r: {"name": g, "parameter_order": list(s)} for r, (g, s) in sorted(m.actions.items())},
    }


def _coverage_failure(ref: NSpec, gen: NSpec, m: Mapping) -> str | None:
    parts = []
    rt, gt = m.domain_total
    if rt + gt:
        dcov = 2 * m.domain_matched / (rt + gt)
        if dcov < MIN_COVERAGE:
            parts.append(f"action schemas: only {dcov:.0%} of precondition/effect literals correspond")
    if not gen.actions and ref.actions:
        parts.append("action schemas: the generated domain has no actions")
    bad, total = m.problem_coverage
    if total:
        pcov = 1 - bad / total
        if pcov < MIN_COVERAGE:
            parts.append(f"problem: only {pcov:.0%} of init/goal atoms correspond under the best object mapping")
    if ref.objects and len(m.objects) < MIN_COVERAGE * len(ref.objects):
        parts.append(f"objects: {len(m.objects)} of {len(ref.objects)} reference objects have a counterpart")
    if ref.arity and len(m.preds) < MIN_COVERAGE * len(ref.arity):
        rsig = sorted(ref.arity.values())
        gsig = sorted(gen.arity.values())
        parts.append(f"predicates: arities {rsig} in the reference vs {gsig} generated")
    if not parts:
        return None
    return "no structural mapping between generated and reference vocabularies: " + "; ".join(parts)


# ----------------------------------------------------------------------------- comparisons


def _gen_to_ref(gen: NSpec, m: Mapping):
    ginv = m.gen_to_ref_pred()
    oinv = {g: r for r, g in m.objects.items()}

    def atom(sym, args):
        if sym == EQ:
            r, perm = EQ, tuple(range(len(args)))
        elif sym in ginv:
            r, perm = ginv[sym]
        else:
            return ("gen:" + sym, tuple(oinv.get(a, "gen:" + a) for a in args))
        return (r, tuple(oinv.get(args[perm[i]], "gen:" + args[perm[i]]) for i in range(len(perm))))

    return atom


def _object_findings(ref: NSpec, gen: NSpec, m: Mapping) -> list[Finding]:
    out = []
    mapped_g = set(m.objects.values())
    def facts(o, spec):
        n = sum(1 for a in spec.init if o in a[1])
        return f" ({n} initial fact{'s' if n != 1 else ''} about it)" if n else ""

    for r in ref.objects:
        if r not in m.objects:
            out.append(Finding(DriftCategory.OBJECT_MISSING,
                               f"reference object {r} has no counterpart in the generated problem{facts(r, ref)}"))
    for g in gen.objects:
        if g not in mapped_g:
            out.append(Finding(DriftCategory.OBJECT_EXTRA,
                               f"generated object {g} has no counterpart in the reference{facts(g, gen)}"))
    return out


def _name(sym: str) -> str:
    return display(sym[4:]) + " (generated only)" if sym.startswith("gen:") else display(sym)


def _state_findings(ref: NSpec, gen: NSpec, m: Mapping, texts=None, notes=None) -> list[Finding]:
    tr = _gen_to_ref(gen, m)
    out: list[Finding] = []
    g_init = {tr(s, a) for s, a in gen.init}
    r_init = set(ref.init)
    type_like = ref.type_like | {"gen:" + s for s in gen.type_like}
    ginv = m.gen_to_ref_pred()
    type_like |= {ginv[s][0] for s in gen.type_like if s in ginv}
    # atoms about objects without a counterpart are explained by object_missing / object_extra
    missing = sorted(a for a in r_init - g_init if all(x in m.objects for x in a[1]))
    extra = sorted(a for a in g_init - r_init if not any(x.startswith("gen:") for x in a[1]))
    by_obj: dict[str, list[str]] = {}
    for sym, args in missing:
        if sym in type_like:
            by_obj.setdefault(args[0], []).append(f"lost {_name(sym)}")
    for sym, args in extra:
        if sym in type_like:
            by_obj.setdefault(args[0], []).append(f"gained {_name(sym)}")
    for o, changes in sorted(by_obj.items()):
        g = m.objects.get(o, o)
        out.append(Finding(DriftCategory.TYPE_CHANGED, f"object {o} (generated {g}): " + ", ".join(changes)))
    miss_f = [a for a in missing if a[0] not in type_like]
    extra_f = [a for a in extra if a[0] not in type_like]
    if miss_f or extra_f:
        parts = []
        if miss_f:
            parts.append("missing " + ", ".join(_lit_text(_name(s) if s.startswith("gen:") else s, a) for s, a in miss_f[:6]))
        if extra_f:
            parts.append("extra " + ", ".join(_lit_text(_name(s) if s.startswith("gen:") else s, a) for s, a in extra_f[:6]))
        out.append(Finding(DriftCategory.INIT_CHANGED, "initial state differs: " + "; ".join(parts)))
    if notes is None:
        notes = []

    g_goal = {(*tr(s, a), p) for s, a, p in gen.goal}
    r_goal = set(ref.goal)
    if g_goal == r_goal:
        return out
    init_same = not (missing or extra) and not object_diff(ref, gen, m)
    if init_same and texts is not None and not gen.complex_goal and not any(
            s.startswith("gen:") or any(x.startswith("gen:") for x in a) for s, a, _ in g_goal):
        from omtr.faithfulness.goals import semantics_for

        sem = semantics_for(ref, texts)
        if sem.usable:
            return out + _semantic_goal_findings(sem.compare(r_goal, g_goal), m, notes)
    gmiss, gextra = sorted(r_goal - g_goal), sorted(g_goal - r_goal)
    if gmiss or gextra:
        if gmiss and not gextra:
            out.append(Finding(DriftCategory.GOAL_WEAKENED, f"reference goal literal(s) missing: {_fmt_goal(gmiss)}"))
        elif gextra and not gmiss:
            out.append(Finding(DriftCategory.GOAL_STRENGTHENED, f"generated goal adds: {_fmt_goal(gextra)}"))
        else:
            out.append(Finding(DriftCategory.GOAL_CHANGED, f"goal missing {_fmt_goal(gmiss)}; adds {_fmt_goal(gextra)}"))
    return out


def _fmt_goal(lits) -> str:
    lits = sorted(lits)
    return ", ".join(_lit_text(_name(s) if s.startswith("gen:") else s, a, p) for s, a, p in lits[:6])


def object_diff(ref: NSpec, gen: NSpec, m: Mapping) -> bool:
    return len(m.objects) != len(ref.objects) or len(m.objects) != len(gen.objects)


def _semantic_goal_findings(v, m: Mapping, notes: list[str]) -> list[Finding]:
    """Findings from a comparison of the goals by the reachable states they accept (goals.py)."""
    if v.status == "equivalent":
        if v.symmetry:
            # the goals agree up to a symmetry of the initial state: use the mapping that shows it
            inv = {b: a for a, b in v.symmetry.items()}
            m.objects = {r: m.objects[inv[r]] for r in m.objects}
            notes.append("goal equal to the reference goal up to a symmetry of the initial state "
                         f"({v.method} reasoning); object mapping chosen accordingly")
        else:
            notes.append(f"goal written differently from the reference goal but accepts the same reachable "
                         f"states ({v.method} reasoning)")
        return []
    parts = []
    if v.missing:
        parts.append(f"reference goal literal(s) no longer required: {_fmt_goal(v.missing)}")
    if v.extra:
        parts.append(f"generated goal requires more: {_fmt_goal(v.extra)}")
    if v.undecided:
        parts.append(f"undecided within the reasoning limits: {_fmt_goal(v.undecided)}")
    detail = "; ".join(parts) + f" ({v.method} reasoning)"
    cat = {"weakened": DriftCategory.GOAL_WEAKENED, "strengthened": DriftCategory.GOAL_STRENGTHENED,
           "changed": DriftCategory.GOAL_CHANGED, "undecided": DriftCategory.GOAL_UNDECIDED}[v.status]
    return [Finding(cat, detail)]


def _action_findings(ref: NSpec, gen: NSpec, m: Mapping) -> list[Finding]:
    out: list[Finding] = []
    ginv = m.gen_to_ref_pred()
    used = set()
    for rname, ract in ref.actions.items():
        if rname not in m.actions:
            out.append(Finding(DriftCategory.ACTION_MISSING,
                               f"reference action {rname}/{ract.arity} has no counterpart in the generated domain"))
            continue
        gname, sigma = m.actions[rname]
        used.add(gname)
        gact = gen.actions[gname]
        tau = {j: i for i, j in enumerate(sigma)}

        def targ(a):
            if isinstance(a, int):
                return tau.get(a, a)
            if isinstance(a, str) and a.startswith("c:"):
                inv = {g: r for r, g in m.objects.items()}
                return "c:" + inv.get(a[2:], "gen:" + a[2:])
            return a

        def tlit(sym, args):
            if sym == EQ:
                return EQ, tuple(targ(a) for a in args)
            if sym in ginv:
                r, perm = ginv[sym]
                return r, tuple(targ(args[perm[i]]) for i in range(len(perm)))
            return "gen:" + sym, tuple(targ(a) for a in args)

        gpre = {(*tlit(s, a), p) for s, a, p in gact.pre}
        gadd = {tlit(s, a) for s, a in gact.add}
        gdel = {tlit(s, a) for s, a in gact.dele}
        names = ract.params
        label = f"action {rname} (generated {gname})"

        def fmt(lits, signed=True):
            return ", ".join(
                _lit_text(_name(x[0]) if x[0].startswith("gen:") else x[0], x[1], x[2] if signed else True, names)
                for x in sorted(lits, key=str)
            )

        dropped, added = ract.pre - gpre, gpre - ract.pre
        if dropped:
            out.append(Finding(DriftCategory.PRECONDITION_DROPPED, f"{label}: precondition {fmt(dropped)} dropped"))
        if added:
            out.append(Finding(DriftCategory.PRECONDITION_ADDED, f"{label}: precondition {fmt(added)} added"))
        if gadd != ract.add or gdel != ract.dele:
            parts = []
            if ract.add - gadd:
                parts.append(f"add {fmt(ract.add - gadd, False)} missing")
            if gadd - ract.add:
                parts.append(f"adds {fmt(gadd - ract.add, False)}")
            if ract.dele - gdel:
                parts.append(f"delete {fmt(ract.dele - gdel, False)} missing")
            if gdel - ract.dele:
                parts.append(f"deletes {fmt(gdel - ract.dele, False)}")
            out.append(Finding(DriftCategory.EFFECT_CHANGED, f"{label}: " + "; ".join(parts)))
    for gname, gact in gen.actions.items():
        if gname not in used:
            out.append(Finding(DriftCategory.ACTION_EXTRA,
                               f"generated action {gname}/{gact.arity} has no counterpart in the reference"))
    return out


def report_to_json(report: FaithfulnessReport) -> dict[str, Any]:
    return report.to_dict()


__all__ = ["DriftCategory", "FaithfulnessReport", "Finding", "check", "report_to_json"]
