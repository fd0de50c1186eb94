"""Programmatic mutators over reference specs: the evidence that the checker is right.

Each mutator takes a reference (domain text, problem text) and a ``random.Random`` and returns
a mutated pair, or ``None`` when it does not apply to that spec. Every mutator carries a label:
faithful (semantics preserved) or the finding category the checker must report first.
``run_suite`` runs all of them over specs of several families and ``confusion_table`` summarises
verdicts per family (expected label x first finding).
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable

from omtr.paths import planbench_family
from omtr.pddl.sexpr import SList, Sym, read_sexpr, to_text

log = logging.getLogger(__name__)

FAITHFUL = "faithful"
_KEEP = {"define", "domain", "problem", "and", "or", "not", "imply", "exists", "forall", "when",
         "either", "object", "-", "="}


# ----------------------------------------------------------------------------- tree helpers


def _tree(text: str) -> SList:
    return read_sexpr(text)


def _sec(root: SList, key: str) -> SList | None:
    for s in root[2:]:
        if isinstance(s, list) and s and s[0] == key:
            return s
    return None


def _actions(root: SList) -> list[SList]:
    return [s for s in root[2:] if isinstance(s, list) and s and s[0] == ":action"]


def _field(action: SList, key: str):
    for i in range(2, len(action) - 1):
        if action[i] == key:
            return i + 1
    return None


def _conj(f) -> list:
    if isinstance(f, list) and f and f[0] == "and":
        return list(f[1:])
    return [f] if f is not None else []


def _and(items) -> SList:
    return SList([Sym("and"), *items])


def _typed(items) -> list[tuple[str, str | None]]:
    out, pending, i = [], [], 0
    while i < len(items):
        if items[i] == "-" and i + 1 < len(items):
            t = to_text(items[i + 1])
            out += [(p, t) for p in pending]
            pending = []
            i += 2
        else:
            pending.append(str(items[i]))
            i += 1
    return out + [(p, None) for p in pending]


def _untyped(pairs) -> list:
    out = []
    for name, t in pairs:
        out.append(Sym(name))
        if t is not None:
            out += [Sym("-"), Sym(t)]
    return out


def _walk_atoms(f, fn):
    """Apply ``fn`` to every atom (in place) of a formula."""
    if not isinstance(f, list) or not f:
        return
    h = f[0]
    if h in ("and", "or", "not", "imply", "when"):
        for g in f[1:]:
            _walk_atoms(g, fn)
    elif h in ("exists", "forall"):
        for g in f[2:]:
            _walk_atoms(g, fn)
    elif isinstance(h, str):
        fn(f)


def _all_formulas(droot: SList, proot: SList):
    for a in _actions(droot):
        for key in (":precondition", ":effect"):
            i = _field(a, key)
            if i is not None:
                yield a[i]
    init = _sec(proot, ":init")
    if init is not None:
        yield from init[1:]
    goal = _sec(proot, ":goal")
    if goal is not None:
        yield goal[1]


def _texts(droot, proot) -> tuple[str, str]:
    return to_text(droot), to_text(proot)


def _info(d: str, p: str):
    """Predicates with arity, fluent predicates, unary static atoms, from the normal form."""
    from omtr.faithfulness.normal import normalize

    return normalize(d, p)


# ----------------------------------------------------------------------------- faithful mutators


def rename_all(d: str, p: str, rng: random.Random):
    """Consistent renaming of every name (faithful)."""
    d2, p2, _ = rename_all_with_table(d, p, rng)
    return d2, p2


def rename_all_with_table(d: str, p: str, rng: random.Random) -> tuple[str, str, dict[str, str]]:
    """As :func:`rename_all`, also returning the old -> new name table (to rename plans)."""
    droot, proot = _tree(d), _tree(p)
    names: set[str] = set()

    def collect(x):
        if isinstance(x, list):
            for y in x:
                collect(y)
        elif not x.startswith(":") and x not in _KEEP and not _is_number(x):
            names.add(str(x))

    collect(droot)
    collect(proot)
    pool = list(range(len(names)))
    rng.shuffle(pool)
    table = {}
    for n, k in zip(sorted(names), pool):
        table[n] = ("?v%d" % k) if n.startswith("?") else "s%d" % k

    def ren(x):
        if isinstance(x, list):
            for i, y in enumerate(x):
                x[i] = ren(y)
            return x
        return Sym(table.get(str(x), str(x)), x.line)

    return (*_texts(ren(droot), ren(proot)), table)


def _is_number(x: str) -> bool:
    try:
        float(x)
        return True
    except ValueError:
        return False


def permute_args(d: str, p: str, rng: random.Random):
    droot, proot = _tree(d), _tree(p)
    preds = _sec(droot, ":predicates")
    cands = [e for e in preds[1:] if isinstance(e, list) and len(_typed(e[1:])) >= 2]
    if not cands:
        return None
    decl = rng.choice(cands)
    name, params = decl[0], _typed(decl[1:])
    n = len(params)
    perm = list(range(n))
    while perm == list(range(n)):
        rng.shuffle(perm)
    decl[1:] = _untyped([params[j] for j in perm])

    def fix(atom):
        if atom[0] == name and len(atom) == n + 1:
            args = atom[1:]
            atom[1:] = [args[j] for j in perm]

    for f in _all_formulas(droot, proot):
        _walk_atoms(f, fix)
    return _texts(droot, proot)


def reorder(d: str, p: str, rng: random.Random):
    droot, proot = _tree(d), _tree(p)
    preds = _sec(droot, ":predicates")
    body = preds[1:]
    rng.shuffle(body)
    preds[1:] = body
    acts = _actions(droot)
    others = [s for s in droot[2:] if s not in acts or not isinstance(s, list)]
    others = [s for s in droot[2:] if not (isinstance(s, list) and s and s[0] == ":action")]
    rng.shuffle(acts)
    droot[2:] = others + acts
    for a in acts:
        i = _field(a, ":parameters")
        if i is not None:
            ps = _typed(a[i])
            rng.shuffle(ps)
            a[i] = SList(_untyped(ps))
        for key in (":precondition", ":effect"):
            i = _field(a, key)
            if i is not None and isinstance(a[i], list) and a[i] and a[i][0] == "and":
                items = list(a[i][1:])
                rng.shuffle(items)
                a[i] = _and(items)
    objs = _sec(proot, ":objects")
    if objs is not None:
        ps = _typed(objs[1:])
        rng.shuffle(ps)
        objs[1:] = _untyped(ps)
    init = _sec(proot, ":init")
    items = list(init[1:])
    rng.shuffle(items)
    init[1:] = items
    goal = _sec(proot, ":goal")
    if isinstance(goal[1], list) and goal[1] and goal[1][0] == "and":
        items = list(goal[1][1:])
        rng.shuffle(items)
        goal[1] = _and(items)
    return _texts(droot, proot)


def add_unused_predicate(d: str, p: str, rng: random.Random):
    droot = _tree(d)
    preds = _sec(droot, ":predicates")
    preds.append(SList([Sym("aux-unused-%d" % rng.randrange(1000)), Sym("?a"), Sym("?b")]))
    return to_text(droot), p


def add_universal_type(d: str, p: str, rng: random.Random, *, odd_object: str | None = None):
    """Untyped -> typed with one type for everything (faithful); with ``odd_object``, that object
    gets a different type, so no action accepts it (used by ``retype_object``)."""
    droot, proot = _tree(d), _tree(p)
    if _sec(droot, ":types") is not None or _sec(droot, ":constants") is not None:
        return None
    req = _sec(droot, ":requirements")
    if req is None:
        req = SList([Sym(":requirements")])
        droot.insert(2, req)
    if ":typing" not in req:
        req.append(Sym(":typing"))
    idx = droot.index(req) + 1
    droot.insert(idx, SList([Sym(":types"), Sym("thing"), Sym("other")]))
    preds = _sec(droot, ":predicates")
    for e in preds[1:]:
        if isinstance(e, list):
            e[1:] = _untyped([(v, "thing") for v, _ in _typed(e[1:])])
    for a in _actions(droot):
        i = _field(a, ":parameters")
        if i is not None:
            a[i] = SList(_untyped([(v, "thing") for v, _ in _typed(a[i])]))
    objs = _sec(proot, ":objects")
    if objs is None:
        return None
    objs[1:] = _untyped([(o, "other" if o == odd_object else "thing") for o, _ in _typed(objs[1:])])
    return _texts(droot, proot)


def types_to_predicates(d: str, p: str, rng: random.Random):
    """Typed -> untyped: every declared type becomes a unary predicate (faithful)."""
    droot, proot = _tree(d), _tree(p)
    tsec = _sec(droot, ":types")
    if tsec is None or _sec(droot, ":constants") is not None:
        return None
    parent = {t: (par or "object") for t, par in _typed(tsec[1:])}
    if any(t.startswith("(") for t in parent.values()):
        return None

    def chain(t):
        out = []
        while t and t != "object" and t not in out:
            out.append(t)
            t = parent.get(t, "object")
        return out

    droot.remove(tsec)
    req = _sec(droot, ":requirements")
    if req is not None:
        req[1:] = [r for r in req[1:] if r != ":typing"] or [Sym(":strips")]
    preds = _sec(droot, ":predicates")
    for e in preds[1:]:
        if isinstance(e, list):
            e[1:] = _untyped([(v, None) for v, _ in _typed(e[1:])])
    names = {str(e[0]) for e in preds[1:] if isinstance(e, list)}
    type_pred = {t: (t if t not in names else f"{t}-type") for t in parent}
    for t in parent:
        preds.append(SList([Sym(type_pred[t]), Sym("?x")]))
    for a in _actions(droot):
        i = _field(a, ":parameters")
        if i is None:
            continue
        ps = _typed(a[i])
        if any(t and t.startswith("(") for _, t in ps):
            return None
        a[i] = SList(_untyped([(v, None) for v, _ in ps]))
        extra = [SList([Sym(type_pred[t]), Sym(v)]) for v, t in ps if t and t != "object"]
        j, items = _pre_items(a)
        if j is None:
            a += [Sym(":precondition"), _and(extra)]
        else:
            a[j] = _and(extra + items)
    objs = _sec(proot, ":objects")
    pairs = _typed(objs[1:])
    objs[1:] = _untyped([(o, None) for o, _ in pairs])
    init = _sec(proot, ":init")
    for o, t in pairs:
        for c in chain(t or "object"):
            init.append(SList([Sym(type_pred[c]), Sym(o)]))
    return _texts(droot, proot)


def predicates_to_types(d: str, p: str, rng: random.Random):
    """Untyped -> typed: unary static predicates with nested-or-disjoint extensions become a type
    hierarchy; objects get their most specific type, parameters lose their type preconditions (faithful)."""
    spec = _info(d, p)
    droot, proot = _tree(d), _tree(p)
    if _sec(droot, ":types") is not None or _sec(droot, ":constants") is not None:
        return None
    classes = sorted(s for s in spec.type_like if not s.startswith("type:"))
    if not classes or any(g[0] in classes for g in spec.goal):
        return None
    ext = {c: frozenset(a[1][0] for a in spec.init if a[0] == c) for c in classes}
    for a, b in itertools.combinations(classes, 2):
        if ext[a] == ext[b] or not (ext[a] <= ext[b] or ext[b] <= ext[a] or not (ext[a] & ext[b])):
            return None
    parent = {}
    for c in classes:
        sup = [x for x in classes if x != c and ext[c] < ext[x]]
        parent[c] = min(sup, key=lambda x: len(ext[x])) if sup else "object"

    def most_specific(cs):
        cs = sorted(cs, key=lambda c: len(ext[c]))
        for c, bigger in zip(cs, cs[1:]):
            if not ext[c] <= ext[bigger]:
                return None
        return cs[0]

    for a in _actions(droot):
        i = _field(a, ":parameters")
        ps = _typed(a[i]) if i is not None else []
        j, items = _pre_items(a)
        on_param = defaultdict(list)
        keep = []
        for lit in items:
            if isinstance(lit, list) and lit and str(lit[0]) in classes and len(lit) == 2:
                on_param[str(lit[1])].append(str(lit[0]))
            elif isinstance(lit, list) and lit and lit[0] == "not" and isinstance(lit[1], list) and str(lit[1][0]) in classes:
                return None
            else:
                keep.append(lit)
        newps = []
        for v, _ in ps:
            t = most_specific(on_param.get(v, [])) if on_param.get(v) else "object"
            if t is None:
                return None
            newps.append((v, None if t == "object" else t))
        if any(t is not None for _, t in newps):
            a[i] = SList(_untyped([(v, t or "object") for v, t in newps]))
        if j is not None:
            a[j] = _and(keep)

        def nested(f):
            return isinstance(f, list) and any(
                (isinstance(x, list) and (str(x[0]) in classes if x and isinstance(x[0], str) else False)) or nested(x)
                for x in f)

        if j is not None and nested(a[j]):
            return None
    preds = _sec(droot, ":predicates")
    preds[1:] = [e for e in preds[1:] if not (isinstance(e, list) and str(e[0]) in classes)]
    req = _sec(droot, ":requirements")
    if req is not None and ":typing" not in req:
        req.append(Sym(":typing"))
    tdecl = []
    for c in classes:
        tdecl += [Sym(c), Sym("-"), Sym(parent[c])]
    droot.insert(droot.index(req) + 1 if req is not None else 2, SList([Sym(":types"), *tdecl]))
    objs = _sec(proot, ":objects")
    pairs = []
    for o, _ in _typed(objs[1:]):
        mine = [c for c in classes if o in ext[c]]
        pairs.append((o, most_specific(mine) if mine else "object"))
    objs[1:] = _untyped(pairs)
    init = _sec(proot, ":init")
    init[1:] = [x for x in init[1:] if not (isinstance(x, list) and str(x[0]) in classes)]
    return _texts(droot, proot)


# ----------------------------------------------------------------------------- unfaithful mutators


def _goal_items(proot):
    goal = _sec(proot, ":goal")
    return goal, _conj(goal[1])


def drop_goal_atom(d: str, p: str, rng: random.Random):
    proot = _tree(p)
    goal, items = _goal_items(proot)
    if not items:
        return None
    items.pop(rng.randrange(len(items)))
    goal[1] = _and(items)
    return d, to_text(proot)


def _positions(spec) -> dict[tuple[str, int], list[str]]:
    """Objects seen at each (predicate, position) in init and goal (type-compatible choices)."""
    seen: dict[tuple[str, int], set[str]] = defaultdict(set)
    for s, args in spec.init:
        for i, a in enumerate(args):
            seen[(s, i)].add(a)
    for s, args, _ in spec.goal:
        for i, a in enumerate(args):
            seen[(s, i)].add(a)
    return {k: sorted(v) for k, v in seen.items()}


def add_goal_atom(d: str, p: str, rng: random.Random):
    """A goal atom the reference goal does not imply (a strengthening). An atom that the goal
    already implies (``(free left)`` once every ball is placed) would leave the task unchanged, so
    a candidate is kept only when a reachable state satisfies the goal but not the atom (a witness
    found by ``omtr.faithfulness.goals``; exact enumeration on small tasks)."""
    from omtr.faithfulness.goals import GoalSemantics

    spec = _info(d, p)
    fluents = sorted(s for s in spec.arity if s not in spec.static and not s.startswith("type:"))
    pos = _positions(spec)
    have = {(s, a) for s, a, _ in spec.goal}
    sem = GoalSemantics(spec, (d, p))
    for _ in range(50):
        s = rng.choice(fluents)
        args = tuple(rng.choice(pos.get((s, i), spec.objects)) for i in range(spec.arity[s]))
        if (s, args) not in have and len(set(args)) == len(args):
            if sem.usable and sem.compare(spec.goal, spec.goal | {(s, args, True)}).status != "strengthened":
                continue
            proot = _tree(p)
            goal, items = _goal_items(proot)
            items.append(SList([Sym(s), *map(Sym, args)]))
            goal[1] = _and(items)
            return d, to_text(proot)
    return None


def _with_negative_requirement(d: str) -> str:
    droot = _tree(d)
    req = _sec(droot, ":requirements")
    if req is None:
        req = SList([Sym(":requirements"), Sym(":strips")])
        droot.insert(2, req)
    if ":negative-preconditions" not in req:
        req.append(Sym(":negative-preconditions"))
    return to_text(droot)


def add_implied_goal_atoms(d: str, p: str, rng: random.Random):
    """The goal written out in more words (faithful): up to two literals that the goal implies by
    the domain's invariants (Fast Downward's mutex groups, unit propagation), positive ones first,
    e.g. ``(free g)`` once every ball has a goal room, ``(not (clear b))`` under ``(on a b)``."""
    from omtr.faithfulness.goals import implied_literals

    spec = _info(d, p)
    plus, minus = implied_literals(spec, (d, p))
    picks = [(a, True) for a in rng.sample(plus, min(2, len(plus)))]
    if len(picks) < 2 and minus:
        picks += [(a, False) for a in rng.sample(minus, min(2 - len(picks), len(minus)))]
    if not picks:
        return None
    proot = _tree(p)
    goal, items = _goal_items(proot)
    for (s, args), positive in picks:
        atom = SList([Sym(s), *map(Sym, args)])
        items.insert(rng.randrange(len(items) + 1), atom if positive else SList([Sym("not"), atom]))
    goal[1] = _and(items)
    return (d if all(pos for _, pos in picks) else _with_negative_requirement(d)), to_text(proot)


def _init_swaps(spec) -> list[tuple[str, str]]:
    """Pairs of objects whose exchange maps the initial state onto itself (symmetries of the init);
    objects the domain names as constants are never exchanged."""
    consts = {a[2:] for act in spec.actions.values() for lit in (*act.pre, *act.add, *act.dele)
              for a in lit[1] if isinstance(a, str) and a.startswith("c:")}
    init = set(spec.init)
    sig: dict[str, Counter] = {o: Counter() for o in spec.objects}
    for s, args in init:
        for i, a in enumerate(args):
            sig[a][(s, i)] += 1
    out = []
    for x, y in itertools.combinations(spec.objects, 2):
        if x in consts or y in consts or sig[x] != sig[y]:
            continue
        sw = {x: y, y: x}
        if all((s, tuple(sw.get(a, a) for a in args)) in init for s, args in init):
            out.append((x, y))
    return out


def _rename_goal_objects(p: str, table: dict[str, str]) -> str:
    proot = _tree(p)
    goal = _sec(proot, ":goal")

    def ren(f):
        if isinstance(f, list):
            for i, y in enumerate(f):
                f[i] = ren(y)
            return f
        return Sym(table.get(str(f), str(f)), f.line)

    goal[1] = ren(goal[1])
    return to_text(proot)


def symmetric_goal(d: str, p: str, rng: random.Random):
    """The goal moved by a symmetry of the initial state (faithful): two objects that the initial
    state cannot tell apart exchange their roles in the goal (e.g. two clear blocks on the table,
    two packages at the same place)."""
    spec = _info(d, p)
    goal_objs = {a for _, args, _ in spec.goal for a in args}
    cands = [(x, y) for x, y in _init_swaps(spec) if x in goal_objs or y in goal_objs]
    if not cands:
        return None
    x, y = rng.choice(cands)
    sw = {x: y, y: x}
    if {(s, tuple(sw.get(a, a) for a in args), v) for s, args, v in spec.goal} == set(spec.goal):
        return None
    return d, _rename_goal_objects(p, sw)


def swap_goal_targets(d: str, p: str, rng: random.Random):
    """Two goal atoms of one binary predicate exchange their second arguments, e.g. two balls'
    target rooms (goal drift: ``goal_changed``). The first arguments must be objects the initial
    state tells apart (else the swap is a symmetry), no atom may name an object twice, and each
    goal must accept a reachable state the other rejects (witnesses from ``goals.py``)."""
    spec = _info(d, p)
    swaps = set(_init_swaps(spec))
    goal = sorted((s, args) for s, args, v in spec.goal if v and len(args) == 2)
    cands = []
    for (s1, (x, u)), (s2, (y, v)) in itertools.combinations(goal, 2):
        if s1 != s2 or u == v or x == y or x == v or y == u:
            continue
        if (x, y) in swaps or (y, x) in swaps or (u, v) in swaps or (v, u) in swaps:
            continue
        new = {(s1, (x, v)), (s1, (y, u))}
        if new & {(s, a) for s, a, _ in spec.goal}:
            continue
        cands.append(((s1, x, u), (s1, y, v)))
    rng.shuffle(cands)
    from omtr.faithfulness.goals import GoalSemantics

    sem = GoalSemantics(spec, (d, p))
    for (s, x, u), (_, y, v) in cands[:8]:
        # a swap that makes the goal unreachable (a BlocksWorld cycle) is a strengthening, not a
        # change: keep a swap only when witnesses show that each goal accepts a state the other
        # rejects
        new_goal = (set(spec.goal) - {(s, (x, u), True), (s, (y, v), True)}) | {(s, (x, v), True), (s, (y, u), True)}
        if not sem.usable or sem.compare(spec.goal, new_goal).status == "changed":
            break
    else:
        return None
    proot = _tree(p)
    goal_sec, items = _goal_items(proot)
    for it in items:
        if isinstance(it, list) and len(it) == 3 and str(it[0]).lower() == s:
            a, b = str(it[1]).lower(), str(it[2]).lower()
            if (a, b) == (x, u):
                it[2] = Sym(v)
            elif (a, b) == (y, v):
                it[2] = Sym(u)
    goal_sec[1] = _and(items)
    return d, to_text(proot)


def remove_object(d: str, p: str, rng: random.Random):
    proot = _tree(p)
    objs = _sec(proot, ":objects")
    pairs = _typed(objs[1:])
    if len(pairs) < 2:
        return None
    victim = rng.choice(pairs)[0]
    objs[1:] = _untyped([x for x in pairs if x[0] != victim])
    init = _sec(proot, ":init")
    init[1:] = [a for a in init[1:] if victim not in [str(x) for x in a[1:]]]
    goal, items = _goal_items(proot)

    def mentions(f):
        return any(mentions(x) for x in f) if isinstance(f, list) else str(f) == victim

    goal[1] = _and([g for g in items if not mentions(g)])
    return d, to_text(proot)


def retype_object(d: str, p: str, rng: random.Random):
    spec = _info(d, p)
    classes = sorted(s for s in spec.type_like)
    proot = _tree(p)
    if classes:
        members: dict[str, set[str]] = defaultdict(set)
        for s, (o, *_) in ((s, a) for s, a in spec.init if s in spec.type_like):
            members[o].add(s)
        cands = [o for o, cs in members.items() if len(cs) == 1]
        rng.shuffle(cands)
        for o in cands:
            (old,) = members[o]
            others = [c for c in classes if c != old and not c.startswith("type:")]
            if old.startswith("type:"):
                # declared type: give the object another declared type
                objs = _sec(proot, ":objects")
                types = sorted({t for _, t in _typed(objs[1:]) if t and t != old[5:]})
                if not types:
                    continue
                objs[1:] = _untyped([(x, rng.choice(types) if x == o else t) for x, t in _typed(objs[1:])])
                return d, to_text(proot)
            if not others:
                continue
            new = rng.choice(others)
            init = _sec(proot, ":init")
            for i, a in enumerate(init[1:], 1):
                if a[0] == old and len(a) == 2 and str(a[1]) == o:
                    init[i] = SList([Sym(new), Sym(o)])
            return d, to_text(proot)
    objs = [o for o in spec.objects]
    if not objs:
        return None
    return add_universal_type(d, p, rng, odd_object=rng.choice(objs))


def change_init_atom(d: str, p: str, rng: random.Random):
    spec = _info(d, p)
    pos = _positions(spec)
    cands = sorted(a for a in spec.init if a[1] and a[0] not in spec.type_like and not a[0].startswith("type:"))
    rng.shuffle(cands)
    for s, args in cands:
        i = rng.randrange(len(args))
        choices = [o for o in pos.get((s, i), spec.objects) if o != args[i]]
        rng.shuffle(choices)
        for o in choices:
            new = args[:i] + (o,) + args[i + 1:]
            if (s, new) in spec.init or len(set(new)) != len(new):
                continue
            proot = _tree(p)
            init = _sec(proot, ":init")
            for k, a in enumerate(init[1:], 1):
                if str(a[0]) == s and tuple(str(x) for x in a[1:]) == args:
                    init[k] = SList([Sym(s), *map(Sym, new)])
                    return d, to_text(proot)
    return None


def _pre_items(a):
    i = _field(a, ":precondition")
    return i, (_conj(a[i]) if i is not None else [])


def drop_precondition(d: str, p: str, rng: random.Random):
    droot = _tree(d)
    acts = [a for a in _actions(droot) if _pre_items(a)[1]]
    if not acts:
        return None
    a = rng.choice(acts)
    i, items = _pre_items(a)
    items.pop(rng.randrange(len(items)))
    a[i] = _and(items)
    return to_text(droot), p


def add_precondition(d: str, p: str, rng: random.Random):
    spec = _info(d, p)
    droot = _tree(d)
    preds = {s: n for s, n in spec.arity.items() if not s.startswith("type:")}
    acts = _actions(droot)
    rng.shuffle(acts)
    for a in acts:
        act = spec.actions[str(a[1])]
        if not act.params:
            continue
        for _ in range(40):
            s = rng.choice(sorted(preds))
            n = preds[s]
            if n > len(act.params):
                continue
            idx = rng.sample(range(len(act.params)), n)
            if (s, tuple(idx), True) in act.pre:
                continue
            i, items = _pre_items(a)
            items.append(SList([Sym(s), *(Sym(act.params[j]) for j in idx)]))
            if i is None:
                a += [Sym(":precondition"), _and(items)]
            else:
                a[i] = _and(items)
            return to_text(droot), p
    return None


def swap_effect(d: str, p: str, rng: random.Random):
    droot = _tree(d)
    acts = _actions(droot)
    rng.shuffle(acts)
    for a in acts:
        i = _field(a, ":effect")
        items = _conj(a[i])
        if not items:
            continue
        k = rng.randrange(len(items))
        lit = items[k]
        if isinstance(lit, list) and lit and lit[0] == "not":
            items[k] = lit[1]
        else:
            items[k] = SList([Sym("not"), lit])
        a[i] = _and(items)
        return to_text(droot), p
    return None


def _chain(*fns):
    def run(d, p, rng):
        for fn in fns:
            out = fn(d, p, rng)
            if out is None:
                return None
            d, p = out
        return d, p

    return run


@dataclass(frozen=True)
class Mutator:
    name: str
    fn: Callable
    expected: str  # FAITHFUL or a DriftCategory value
    # reverse: the mutant plays the reference and the original the generated spec (e.g. the
    # reference goal is written out in full and the generated one drops the redundant atoms);
    # applied forward (as ``omtr evaluate``'s mutant policies do) the label holds as well
    reverse: bool = False

    @property
    def faithful(self) -> bool:
        return self.expected == FAITHFUL


MUTATORS: list[Mutator] = [
    Mutator("identity", lambda d, p, rng: (d, p), FAITHFUL),
    Mutator("rename_all", rename_all, FAITHFUL),
    Mutator("permute_args", permute_args, FAITHFUL),
    Mutator("reorder", reorder, FAITHFUL),
    Mutator("add_unused_predicate", add_unused_predicate, FAITHFUL),
    Mutator("add_universal_type", add_universal_type, FAITHFUL),
    Mutator("types_to_predicates", types_to_predicates, FAITHFUL),
    Mutator("predicates_to_types", predicates_to_types, FAITHFUL),
    Mutator("rename_permute_reorder", _chain(permute_args, reorder, rename_all), FAITHFUL),
    Mutator("drop_goal_atom", drop_goal_atom, "goal_weakened"),
    Mutator("add_goal_atom", add_goal_atom, "goal_strengthened"),
    Mutator("remove_object", remove_object, "object_missing"),
    Mutator("retype_object", retype_object, "type_changed"),
    Mutator("change_init_atom", change_init_atom, "init_changed"),
    Mutator("drop_precondition", drop_precondition, "precondition_dropped"),
    Mutator("add_precondition", add_precondition, "precondition_added"),
    Mutator("swap_effect", swap_effect, "effect_changed"),
    Mutator("rename+drop_goal_atom", _chain(drop_goal_atom, rename_all), "goal_weakened"),
    Mutator("rename+drop_precondition", _chain(drop_precondition, rename_all), "precondition_dropped"),
    Mutator("rename+remove_object", _chain(remove_object, rename_all), "object_missing"),
    Mutator("reorder+swap_effect", _chain(swap_effect, reorder), "effect_changed"),
    Mutator("rename+change_init_atom", _chain(change_init_atom, reorder, rename_all), "init_changed"),
    # goals compared by the states they accept
    Mutator("add_implied_goal_atoms", add_implied_goal_atoms, FAITHFUL),
    Mutator("drop_redundant_goal_atoms", add_implied_goal_atoms, FAITHFUL, reverse=True),
    Mutator("symmetric_goal", symmetric_goal, FAITHFUL),
    Mutator("symmetric_goal+implied", _chain(symmetric_goal, add_implied_goal_atoms), FAITHFUL),
    Mutator("rename+symmetric_goal", _chain(symmetric_goal, reorder, rename_all), FAITHFUL),
    Mutator("swap_goal_targets", swap_goal_targets, "goal_changed"),
    Mutator("rename+swap_goal_targets", _chain(swap_goal_targets, reorder, rename_all), "goal_changed"),
]


# ----------------------------------------------------------------------------- families

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics", "gripper")

GRIPPER_DOMAIN = """(define (domain gripper-strips)
  (:requirements :strips)
  (:predicates (room ?r) (ball ?b) (gripper ?g) (at-robby ?r) (at ?b ?r) (free ?g) (carry ?o ?g))
  (:action move :parameters (?from ?to)
    :precondition (and (room ?from) (room ?to) (at-robby ?from))
    :effect (and (at-robby ?to) (not (at-robby ?from))))
  (:action pick :parameters (?obj ?room ?gripper)
    :precondition (and (ball ?obj) (room ?room) (gripper ?gripper) (at ?obj ?room) (at-robby ?room) (free ?gripper))
    :effect (and (carry ?obj ?gripper) (not (at ?obj ?room)) (not (free ?gripper))))
  (:action drop :parameters (?obj ?room ?gripper)
    :precondition (and (ball ?obj) (room ?room) (gripper ?gripper) (carry ?obj ?gripper) (at-robby ?room))
    :effect (and (at ?obj ?room) (free ?gripper) (not (carry ?obj ?gripper)))))
"""


def gripper_problem(n_rooms: int, n_balls: int, rng: random.Random, n_grippers: int = 2) -> str:
    """A small untyped Gripper problem (balls scattered, each with a goal room)."""
    rooms = [f"room{i}" for i in range(n_rooms)]
    balls = [f"ball{i}" for i in range(n_balls)]
    grips = ["left", "right", "middle"][:n_grippers]
    init = [f"(room {r})" for r in rooms] + [f"(ball {b})" for b in balls] + [f"(gripper {g})" for g in grips]
    init += [f"(free {g})" for g in grips] + [f"(at-robby {rng.choice(rooms)})"]
    init += [f"(at {b} {rng.choice(rooms)})" for b in balls]
    goal = [f"(at {b} {rng.choice(rooms)})" for b in balls]
    return (f"(define (problem gripper-{n_rooms}-{n_balls})\n (:domain gripper-strips)\n"
            f" (:objects {' '.join(rooms + balls + grips)})\n (:init {' '.join(init)})\n"
            f" (:goal (and {' '.join(goal)})))\n")


def family_specs(family: str, n: int, seed: int = 0, source: str = "auto") -> list[tuple[str, str, str]]:
    """``n`` reference (id, domain, problem) triples of a family.

    ``source``: ``"generators"`` (``omtr.tasks.generators``, unverified, fast), ``"planbench"``
    (bundled PlanBench files; Gripper uses a small built-in untyped domain), or ``"auto"``
    (generators for the families they know, else the files, e.g. for depots).
    """
    if source in ("auto", "generators"):
        from omtr.tasks.generators import families, generate

        if source == "generators" or family in families():
            tasks = generate(family, n, seed, verify=False)
            return [(t.id, t.reference.domain, t.reference.problem) for t in tasks if t.reference is not None]
    rng = random.Random(seed)
    if family == "gripper":
        return [(f"gripper-{i}", GRIPPER_DOMAIN, gripper_problem(2 + i % 3, 2 + i % 4, rng)) for i in range(n)]
    domain, files = planbench_family(family)
    picks = rng.sample(files, min(n, len(files)))
    return [(f"{family}/{f.stem}", domain, f.read_text()) for f in picks]


# ----------------------------------------------------------------------------- suite


@dataclass
class MutantResult:
    family: str
    spec_id: str
    mutator: str
    expected: str
    got_faithful: bool
    got_first: str
    ms: float

    @property
    def verdict_ok(self) -> bool:
        return self.got_faithful == (self.expected == FAITHFUL)

    @property
    def category_ok(self) -> bool:
        return self.got_first == self.expected

    @property
    def got(self) -> str:
        return FAITHFUL if self.got_faithful else self.got_first


def run_suite(families=FAMILIES, n_per_family: int = 5, seed: int = 0, mutators=None,
              source: str = "auto") -> list[MutantResult]:
    from omtr.faithfulness.checker import check

    rows = []
    for family in families:
        for k, (sid, d, p) in enumerate(family_specs(family, n_per_family, seed, source)):
            for j, mut in enumerate(mutators or MUTATORS):
                rng = random.Random(f"{seed}:{sid}:{mut.name}")
                try:
                    out = mut.fn(d, p, rng)
                except Exception:  # a mutator bug must be visible, not silently skipped
                    log.exception("mutator %s failed on %s", mut.name, sid)
                    raise
                if out is None:
                    continue
                t = time.perf_counter()
                rep = check(out, (d, p), None) if mut.reverse else check((d, p), out, None)
                ms = (time.perf_counter() - t) * 1e3
                rows.append(MutantResult(family, sid, mut.name, mut.expected, rep.faithful,
                                         FAITHFUL if rep.faithful else rep.first_category, ms))
    return rows


def confusion_table(rows: list[MutantResult]) -> dict[str, dict[str, Counter]]:
    """family -> expected label -> Counter(got label)."""
    out: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for r in rows:
        out[r.family][r.expected][r.got] += 1
    return {f: dict(t) for f, t in out.items()}


def accuracy(rows: list[MutantResult]) -> dict[str, dict[str, float]]:
    """family -> {n, verdict_accuracy, first_category_accuracy, mean_ms, max_ms}."""
    by: dict[str, list[MutantResult]] = defaultdict(list)
    for r in rows:
        by[r.family].append(r)
    out = {}
    for f, rs in by.items():
        out[f] = {
            "n": len(rs),
            "verdict_accuracy": sum(r.verdict_ok for r in rs) / len(rs),
            "first_category_accuracy": sum(r.category_ok for r in rs) / len(rs),
            "mean_ms": sum(r.ms for r in rs) / len(rs),
            "max_ms": max(r.ms for r in rs),
        }
    return out


def format_table(rows: list[MutantResult]) -> str:
    lines = []
    acc = accuracy(rows)
    for family, table in confusion_table(rows).items():
        cols = sorted({c for cnt in table.values() for c in cnt})
        a = acc[family]
        lines.append(f"== {family}: {a['n']} mutants, verdict {a['verdict_accuracy']:.1%}, "
                     f"first category {a['first_category_accuracy']:.1%}, "
                     f"mean {a['mean_ms']:.1f} ms, max {a['max_ms']:.1f} ms")
        w = max(len(c) for c in list(table) + cols) + 1
        lines.append("expected \\ got".ljust(w) + " ".join(c[:14].rjust(14) for c in cols))
        for exp in sorted(table):
            lines.append(exp.ljust(w) + " ".join(str(table[exp].get(c, 0) or ".").rjust(14) for c in cols))
    return "\n".join(lines)
