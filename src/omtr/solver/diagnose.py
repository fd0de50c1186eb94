"""Why a spec that parses has no plan: delete-relaxed reachability over the grounded task.

Used only after the planner failed, to tell an Editor whether the goal is impossible
(``goal_constraint``), an action it needs can never fire (``precondition_effect``), or the task is
relaxed-solvable but still unsolvable (``unreachable_search``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from omtr.pddl.categories import Category
from omtr.pddl.model import COMPARATORS, LOGICAL, Action, Domain, Problem, atoms_of
from omtr.pddl.sexpr import SList, Sym, to_text


@dataclass
class Diagnosis:
    category: Category
    message: str


class _Budget(Exception):
    pass


def _positive_pre(act: Action):
    """Positive atoms of the precondition's top-level conjunction.

    Atoms under ``or``/``not``/quantifiers and numeric comparisons are left out, so matching only
    these over-approximates where the action applies (sound for proving it never does).
    """
    out = []

    def walk(f):
        if not isinstance(f, list) or not f:
            return
        if f.head == "and":
            for g in f[1:]:
                walk(g)
        elif f.head is not None and f.head not in LOGICAL and f.head != "=" and f.head not in COMPARATORS:
            out.append(tuple(f))

    if act.precondition is not None:
        walk(act.precondition)
    return out


_MAX_DISJUNCTS = 16


def _disjuncts(f) -> list[tuple[list[tuple[str, str]], list[tuple]]]:
    """A precondition as a few alternatives, each (existential variables, positive atoms): the
    action applies if any alternative's atoms hold for some value of its variables.

    ``or`` splits, ``exists`` adds variables, ``and`` combines; negations, ``forall``, ``imply``
    and comparisons are dropped, which only widens where the action applies (sound for proving
    that it never does). Beyond a few alternatives the formula counts as always true."""
    if not isinstance(f, list) or not f:
        return [([], [])]
    h = f.head
    if h == "and":
        out = [([], [])]
        for g in f[1:]:
            out = [(v1 + v2, a1 + a2) for v1, a1 in out for v2, a2 in _disjuncts(g)]
            if len(out) > _MAX_DISJUNCTS:
                return [([], [])]
        return out
    if h == "or":
        out = [d for g in f[1:] for d in _disjuncts(g)]
        return out if len(out) <= _MAX_DISJUNCTS and out else [([], [])]
    if h == "exists" and len(f) == 3 and isinstance(f[1], list):
        from omtr.pddl.model import SpecError, parse_typed_list

        try:
            vs = parse_typed_list(f[1], "exists", allow_vars=True)
        except SpecError:
            return [([], [])]
        return [(vs + v, a) for v, a in _disjuncts(f[2])]
    if h is None or h in LOGICAL or h == "=" or h in COMPARATORS:
        return [([], [])]
    return [([], [tuple(f)])]


def _add_effects(act: Action):
    out = []
    for atom, neg, bound in atoms_of(act.effect, effect=True):
        if not neg and atom[0] != "=" and not any(isinstance(t, str) and t in bound for t in atom[1:]):
            out.append(tuple(atom))
    return out


def _rule_schemas(dom: Domain) -> list[Action]:
    """Derived-predicate rules as actions without deletes: the body is the precondition, the head
    the only add effect. Under the delete relaxation a rule behaves exactly like such an action."""
    out = []
    for rule in dom.derived:
        head = SList([Sym(rule.name, rule.line), *(Sym(v, rule.line) for v, _ in rule.parameters)], line=rule.line)
        out.append(Action(name=f"(:derived {rule.name})", parameters=list(rule.parameters),
                          precondition=rule.body, effect=head, line=rule.line))
    return out


def relaxed_reachable(dom: Domain, prob: Problem, *, time_budget_s: float = 2.0):
    """Return (reachable atoms, fired action names) under the delete relaxation, or None if too big."""
    deadline = time.monotonic() + time_budget_s
    objects = {**dom.constants, **prob.objects}
    by_type: dict[str, list[str]] = defaultdict(list)
    for o, t in objects.items():
        for anc in _ancestors(dom, t):
            by_type[anc].append(o)
    facts: set[tuple] = {tuple(a) for a in prob.init if a.head not in ("=", "not")}
    for o, t in objects.items():  # types hold as unary facts
        for anc in _ancestors(dom, t):
            facts.add((anc, o))
    index: dict[str, set[tuple]] = defaultdict(set)
    for f in facts:
        index[f[0]].add(f)
    schemas = []
    for act in [*dom.actions.values(), *_rule_schemas(dom)]:
        adds = _add_effects(act)
        for extra, pre in _disjuncts(act.precondition):
            as_action = Action(act.name, act.parameters + extra, None, act.effect) if extra else act
            schemas.append((as_action, pre, adds))
    fired: set[str] = set()
    changed = True
    try:
        while changed:
            changed = False
            for act, pre, adds in schemas:
                for binding in list(_bindings(act, pre, index, by_type, deadline)):
                    fired.add(act.name)
                    for eff in adds:
                        g = (eff[0],) + tuple(binding.get(t, t) for t in eff[1:])
                        if g not in facts:
                            facts.add(g)
                            index[g[0]].add(g)
                            changed = True
    except _Budget:
        return None
    return facts, fired


def _ancestors(dom: Domain, t: str):
    return dom.ancestors(t)


def _bindings(act: Action, pre, index, by_type, deadline):
    params = dict(act.parameters)
    order = sorted(pre, key=lambda a: len(index.get(a[0], ())))

    def extend(i, binding):
        if time.monotonic() > deadline:
            raise _Budget
        if i == len(order):
            free = [v for v in params if v not in binding]
            if not free:
                yield dict(binding)
                return
            yield from _free(free, 0, binding)
            return
        atom = order[i]
        for fact in index.get(atom[0], ()):
            if len(fact) != len(atom):
                continue
            new = dict(binding)
            ok = True
            for term, val in zip(atom[1:], fact[1:]):
                if term.startswith("?"):
                    if new.setdefault(term, val) != val:
                        ok = False
                        break
                elif term != val:
                    ok = False
                    break
            if ok and all(val in by_type.get(params.get(v, "object"), ()) or params.get(v, "object") == "object" for v, val in new.items() if v in params):
                yield from extend(i + 1, new)

    def _free(free, j, binding):
        if j == len(free):
            yield dict(binding)
            return
        v = free[j]
        for o in by_type.get(params[v], ()):
            if time.monotonic() > deadline:
                raise _Budget
            binding[v] = o
            yield from _free(free, j + 1, binding)
        binding.pop(v, None)

    yield from extend(0, {})


def diagnose_unsolvable(dom: Domain, prob: Problem, hints=()) -> Diagnosis:
    result = relaxed_reachable(dom, prob)
    if result is None:
        return Diagnosis(
            Category.UNREACHABLE_SEARCH,
            "proven unsolvable by the planner (the task is too large for omtr to say which goal atom is at fault)",
        )
    facts, fired = result
    never = sorted(a for a in dom.actions if a not in fired)
    goal_atoms = [
        (tuple(a), neg) for a, neg, bound in atoms_of(prob.goal) if a[0] != "=" and not bound
    ]
    for atom, neg in goal_atoms:
        if neg or atom in facts:
            continue
        text = to_text(list(atom))
        achievers = [
            a.name for a in dom.actions.values() if any(e[0] == atom[0] and len(e) == len(atom) for e in _add_effects(a))
        ]
        if atom[0] in dom.derived_predicates:
            return Diagnosis(
                Category.GOAL_CONSTRAINT,
                f"goal atom {text} can never become true: the body of the derived predicate `{atom[0]}` "
                "is never satisfied for these arguments from this initial state",
            )
        if not achievers:
            return Diagnosis(
                Category.GOAL_CONSTRAINT,
                f"goal atom {text} can never become true: no action adds `{atom[0]}`",
            )
        dead = [a for a in achievers if a in never]
        if dead and len(dead) == len(achievers):
            chain = _dead_chain(dom, dom.actions[dead[0]], facts, never)
            return Diagnosis(
                Category.PRECONDITION_EFFECT,
                f"goal atom {text} needs action {chain}; relax that precondition or make an action achieve it",
            )
        return Diagnosis(
            Category.GOAL_CONSTRAINT,
            f"goal atom {text} can never become true: actions {', '.join('`%s`' % a for a in achievers)} add "
            f"`{atom[0]}` but never with these arguments from this initial state",
        )
    for cat, msg in hints:
        if cat == Category.PRECONDITION_EFFECT:
            return Diagnosis(cat, msg + "; the task is unsolvable")
    extra = f" (actions that can never fire: {', '.join('`%s`' % a for a in never[:5])})" if never else ""
    return Diagnosis(
        Category.UNREACHABLE_SEARCH,
        "proven unsolvable: every goal atom is reachable on its own, but no sequence of actions reaches "
        f"them all together{extra}; check delete effects and mutually exclusive goal atoms",
    )


def _dead_chain(dom: Domain, act: Action, facts, never, seen: frozenset = frozenset()) -> str:
    """Explain why ``act`` never fires, following dead achievers back to the root cause."""
    blocker = _blocking_precondition(act, facts)
    text = f"`{act.name}`, which can never fire"
    if not blocker:
        return text
    text += f": its precondition {blocker} is never true"
    pred = blocker[1:].split()[0].rstrip(")")
    achievers = [a for a in dom.actions.values() if any(e[0] == pred for e in _add_effects(a))]
    seen = seen | {act.name}
    if achievers and all(a.name in never for a in achievers) and achievers[0].name not in seen and len(seen) < 4:
        text += f", because `{pred}` is only added by " + _dead_chain(dom, achievers[0], facts, never, seen)
    return text


def _blocking_precondition(act: Action, facts) -> str | None:
    preds = {f[0] for f in facts}
    for atom in _positive_pre(act):
        if atom[0] not in preds:
            return to_text(list(atom))
    pre = _positive_pre(act)
    return to_text(list(pre[0])) if pre else None
