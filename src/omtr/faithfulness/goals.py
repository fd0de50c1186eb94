"""Goals compared by the states they accept, not by how they are written.

Two conjunctive goals of the same task (same initial state and actions, read in the reference
vocabulary) are equivalent when the sets of *reachable* states that satisfy them are equal. A goal
literal ``l`` is *implied* by a goal ``G`` when every reachable state that satisfies ``G`` also
satisfies ``l``; ``G_A`` and ``G_B`` are equivalent iff each implies every literal of the other.

Three sources decide implication, cheapest first (``GoalSemantics.compare``):

1. **Exact reasoning** when the reachable state space is small: the ground task is enumerated
   breadth first (``MAX_STATES`` states and ``MAX_STATE_WORK`` state x action tests at most); the
   sets of goal states are then compared directly, and a goal that differs from the reference
   goal only by a symmetry of the initial state (an automorphism of the objects that keeps the
   initial state and maps one set of goal states onto the other) is recognised.
2. **Invariants** (sound for any size): Fast Downward's translator synthesises lifted mutex
   invariants ("at most one of these atoms is true"); they are instantiated over the relaxed
   reachable atoms, and a group whose initial state has exactly one true atom and whose every
   ground action that deletes a member also adds one is an "exactly one" group. Unit propagation
   over these groups completes a goal with the literals it implies (e.g. a full BlocksWorld tower
   implies ``(clear top)`` and ``(handempty)``; all balls placed implies ``(free g)``).
3. **Witnesses** (sound refutation for any size): a reachable state that satisfies ``G`` but not
   ``l`` proves that ``G`` does not imply ``l``. Witnesses come from the initial state and from a
   bounded greedy best-first search (additive heuristic) towards ``G`` and towards ``G and not l``.

When neither an implication nor a witness settles a literal, the comparison is *undecided* and the
checker says so (``goal_undecided``), which never counts as faithful.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import itertools
import logging
import time
from dataclasses import dataclass, field

from omtr.faithfulness.normal import EQ, NSpec

log = logging.getLogger(__name__)

MAX_GROUND_ACTIONS = 50_000  # larger ground tasks get no semantic goal comparison (literal sets)
SMALL_GROUND_ACTIONS = 150  # up to this many ground actions, enumeration is tried before invariants
MAX_STATES = 20_000  # exact reasoning: reachable states enumerated up to this many ...
MAX_STATE_WORK = 300_000  # ... and up to this many (state x ground action) applicability tests
MAX_AUTOMORPHISM_NODES = 20_000  # backtracking nodes when looking for a symmetry of the init
WITNESS_EVALS = 3_000  # heuristic evaluations per witness search
WITNESS_SECONDS = 2.0  # wall clock per witness search ...
COMPARE_SECONDS = 5.0
MAX_KEPT_STATES = 20_000  # reachable states kept per reference as witnesses for later literals  # ... and for all witness searches of one goal comparison


# ----------------------------------------------------------------------------- ground task


@dataclass
class Ground:
    """The reference task grounded over its objects, states as bit masks over fluent atoms."""

    objects: list[str]
    atoms: list[tuple]  # relaxed-reachable fluent atoms (sym, args)
    index: dict[tuple, int]
    static_atoms: frozenset  # init atoms over static symbols
    fluent_syms: frozenset
    init: int
    acts: list[tuple[int, int, int, int]]  # (pos, neg, add, dele) masks
    act_pre: list[list[int]] = field(default_factory=list)  # positive fluent preconditions (atom ids)
    act_add: list[list[int]] = field(default_factory=list)
    fixed_objects: frozenset = frozenset()  # domain constants used by actions (symmetries fix them)

    def goal_masks(self, lits) -> tuple[int, int, bool]:
        """(positive mask, negative mask, satisfiable) for a conjunction of ground literals."""
        pos = neg = 0
        ok = True
        for sym, args, p in lits:
            if sym == EQ:
                holds = len(args) == 2 and args[0] == args[1]
                ok &= holds == p
            elif sym not in self.fluent_syms:
                ok &= ((sym, tuple(args)) in self.static_atoms) == p
            else:
                i = self.index.get((sym, tuple(args)))
                if i is None:  # never reachable: false in every reachable state
                    ok &= not p
                elif p:
                    pos |= 1 << i
                else:
                    neg |= 1 << i
        return pos, neg, ok and not (pos & neg)

    def successors(self, s: int):
        for k, (pos, neg, add, dele) in enumerate(self.acts):
            if s & pos == pos and not s & neg:
                yield k, (s & ~dele) | add


def _ground(spec: NSpec) -> Ground | None:
    static_syms = {s for s in spec.arity if s in spec.static}
    static_atoms = frozenset(a for a in spec.init if a[0] in static_syms)
    fluent_syms = frozenset(s for s in spec.arity if s not in static_syms)
    objects = list(spec.objects)
    by_sym: dict[str, set] = {}
    for s, args in static_atoms:
        by_sym.setdefault(s, set()).add(args)
    fixed = set()

    raw: list[tuple[list, list, list, list]] = []
    for act in spec.actions.values():
        if act.complex:
            return None
        n = act.arity
        cand = [set(objects) for _ in range(n)]
        checks: list[list] = [[] for _ in range(n)]
        fl_pre = []
        for sym, args, pos in act.pre:
            args = tuple(a[2:] if isinstance(a, str) and a.startswith("c:") else a for a in args)
            fixed.update(a for a in args if isinstance(a, str))
            if any(isinstance(a, str) and a.startswith("v:") for a in args):
                return None
            if sym != EQ and sym in static_syms and pos and len(args) == 1 and isinstance(args[0], int):
                cand[args[0]] &= {a[0] for a in by_sym.get(sym, ())}
                continue
            if sym == EQ or sym in static_syms:
                idx = [a for a in args if isinstance(a, int)]
                checks[max(idx) if idx else 0].append((sym, args, pos))
            else:
                fl_pre.append((sym, args, pos))
        effs = []
        for lits, is_add in ((act.add, True), (act.dele, False)):
            for sym, args in lits:
                args = tuple(a[2:] if isinstance(a, str) and a.startswith("c:") else a for a in args)
                fixed.update(a for a in args if isinstance(a, str))
                effs.append((sym, args, is_add))
        order = [sorted(c) for c in cand]

        def sub(args, b):
            return tuple(b[a] if isinstance(a, int) else a for a in args)

        def holds(sym, args, pos, b):
            g = sub(args, b)
            if sym == EQ:
                return (len(g) == 2 and g[0] == g[1]) == pos
            return ((sym, g) in static_atoms) == pos

        binding: list[str] = []

        def rec(i):
            if i == n:
                yield tuple(binding)
                return
            for o in order[i]:
                binding.append(o)
                if all(holds(s, a, p, binding) for s, a, p in checks[i]):
                    yield from rec(i + 1)
                binding.pop()

        if n == 0 and not all(holds(s, a, p, ()) for s, a, p in checks[0]):
            continue
        for b in rec(0):
            raw.append(([(s, sub(a, b)) for s, a, p in fl_pre if p], [(s, sub(a, b)) for s, a, p in fl_pre if not p],
                        [(s, sub(a, b)) for s, a, add in effs if add], [(s, sub(a, b)) for s, a, add in effs if not add]))
            if len(raw) > MAX_GROUND_ACTIONS:
                return None

    # relaxed reachability prunes actions and atoms
    reached = {a for a in spec.init if a[0] in fluent_syms}
    live = [False] * len(raw)
    changed = True
    while changed:
        changed = False
        for k, (pp, _, add, _) in enumerate(raw):
            if not live[k] and all(a in reached for a in pp):
                live[k] = True
                changed = True
                reached.update(add)
    atoms = sorted(reached)
    index = {a: i for i, a in enumerate(atoms)}

    def mask(lits):
        m = 0
        for a in lits:
            i = index.get(a)
            if i is not None:
                m |= 1 << i
        return m

    acts, act_pre, act_add = [], [], []
    for k, (pp, pn, add, dele) in enumerate(raw):
        if not live[k]:
            continue
        dele = [d for d in dele if d not in add]  # add after delete
        acts.append((mask(pp), mask(pn), mask(add), mask(dele)))
        act_pre.append(sorted({index[a] for a in pp}))
        act_add.append(sorted({index[a] for a in add}))
    init = mask(a for a in spec.init if a[0] in fluent_syms)
    return Ground(objects, atoms, index, static_atoms, fluent_syms, init, acts, act_pre, act_add,
                  frozenset(o for o in fixed if o in set(objects)))


# ----------------------------------------------------------------------------- invariants


_INVARIANTS: dict[str, tuple] = {}


def _fd_invariants(domain_text: str, problem_text: str) -> tuple:
    """Fast Downward's lifted mutex invariants of a domain: ((pred, args, omitted), ...) per
    invariant, ``args`` with -1 at the counted position. Empty when the translator cannot read it.
    They depend on the domain only (the problem is needed to parse), so they are cached per domain."""
    hit = _INVARIANTS.get(domain_text)
    if hit is None:
        if len(_INVARIANTS) > 64:
            _INVARIANTS.clear()
        hit = _INVARIANTS[domain_text] = _synthesise_invariants(domain_text, problem_text)
    return hit


from omtr.solver.invariants import synthesise_invariants as _synthesise_invariants  # noqa: E402,F401


def _groups(ground: Ground, invariants) -> list[tuple[int, bool]]:
    """Instantiated mutex groups over reachable atoms: (mask, exactly_one)."""
    groups: dict[tuple, int] = {}
    for k, parts in enumerate(invariants):
        by_pred = {p: args for p, args, _ in parts}
        for i, (sym, args) in enumerate(ground.atoms):
            pargs = by_pred.get(sym)
            if pargs is None or len(pargs) != len(args):
                continue
            params: dict[int, str] = {}
            ok = True
            for v, a in zip(pargs, args):
                if v == -1:
                    continue
                if params.setdefault(v, a) != a:
                    ok = False
            if ok:
                key = (k, tuple(sorted(params.items())))
                groups[key] = groups.get(key, 0) | (1 << i)
    out = []
    for m in set(groups.values()):
        on = bin(ground.init & m).count("1")
        if on > 1:
            continue  # the invariant's balance only keeps "at most one" when the init starts there
        if m & (m - 1) == 0 and not on:
            continue
        exactly = on == 1 and all(
            (add & m) for _, _, add, dele in ground.acts if dele & m)
        out.append((m, exactly))
    return out


def _propagate(pos: int, neg: int, groups) -> tuple[int, int, bool]:
    """Unit propagation over mutex groups: the literals a goal implies; ok=False when the goal
    is unsatisfiable in every reachable state."""
    changed = True
    while changed:
        changed = False
        if pos & neg:
            return pos, neg, False
        for m, exactly in groups:
            on = pos & m
            if on:
                if on & (on - 1):
                    return pos, neg, False
                rest = m & ~on
                if rest & ~neg:
                    neg |= rest
                    changed = True
            elif exactly:
                left = m & ~neg
                if not left:
                    return pos, neg, False
                if left & (left - 1) == 0:
                    pos |= left
                    changed = True
    return pos, neg, True


# ----------------------------------------------------------------------------- witnesses


def _hadd(ground: Ground, s: int, pre_of, goal_pos: list[int], goal_neg: list[int], alt) -> float:
    n = len(ground.atoms)
    inf = float("inf")
    cost = [inf] * n
    heap = []
    for i in range(n):
        if s >> i & 1:
            cost[i] = 0
            heap.append((0, i))
    unsat = [len(p) for p in ground.act_pre]
    acc = [0] * len(ground.acts)
    for k, p in enumerate(ground.act_pre):
        if not p:
            for q in ground.act_add[k]:
                if cost[q] > 1:
                    cost[q] = 1
                    heap.append((1, q))
    heapq.heapify(heap)
    while heap:
        c, i = heapq.heappop(heap)
        if c > cost[i]:
            continue
        for k in pre_of[i]:
            unsat[k] -= 1
            acc[k] += c
            if unsat[k] == 0:
                nc = acc[k] + 1
                for q in ground.act_add[k]:
                    if nc < cost[q]:
                        cost[q] = nc
                        heapq.heappush(heap, (nc, q))
    h = 0.0
    for i in goal_pos:
        h += cost[i]
    for i in goal_neg:
        if s >> i & 1:  # to falsify a true atom, make another atom of its exactly-one group true
            h += min((cost[j] for j in alt.get(i, ())), default=1)
    return h


def _witness_search(ground: Ground, pos: int, neg: int, alt, seen_states: list[int],
                    seconds: float = WITNESS_SECONDS) -> int | None:
    """Greedy best-first search for a reachable state satisfying (pos, neg); bounded."""
    if ground.init & pos == pos and not ground.init & neg:
        return ground.init
    pre_of: list[list[int]] = [[] for _ in ground.atoms]
    for k, p in enumerate(ground.act_pre):
        for i in p:
            pre_of[i].append(k)
    gp = [i for i in range(len(ground.atoms)) if pos >> i & 1]
    gn = [i for i in range(len(ground.atoms)) if neg >> i & 1]
    start = time.perf_counter()
    h0 = _hadd(ground, ground.init, pre_of, gp, gn, alt)
    if h0 == float("inf"):
        return None
    tick = itertools.count()
    heap = [(h0, next(tick), ground.init)]
    closed = {ground.init}
    evals = 0
    while heap:
        _, _, s = heapq.heappop(heap)
        for _, t in ground.successors(s):
            if t in closed:
                continue
            closed.add(t)
            if len(seen_states) < MAX_KEPT_STATES:
                seen_states.append(t)
            if t & pos == pos and not t & neg:
                return t
            evals += 1
            if evals > WITNESS_EVALS or time.perf_counter() - start > seconds:
                return None
            h = _hadd(ground, t, pre_of, gp, gn, alt)
            if h < float("inf"):
                heapq.heappush(heap, (h, next(tick), t))
    return None


# ----------------------------------------------------------------------------- symmetries


def _find_automorphism(objects, fixed, init_atoms, xa, xb):
    """A permutation ``sigma`` of ``objects`` (fixing ``fixed``) with sigma(init) = init and
    sigma(xb) = xa, where ``xa``/``xb`` are sets of tagged ground atoms; None if there is none
    (or the search budget runs out: then the second value is False)."""
    src = {("i", *a) for a in init_atoms} | set(xb)
    dst = {("i", *a) for a in init_atoms} | set(xa)
    if len(src) != len(dst):
        return None, True

    def signature(atoms):
        sig = {o: [] for o in objects}
        for a in atoms:
            for p, o in enumerate(a[2]):
                if o in sig:
                    sig[o].append((a[0], a[1], p))
        return {o: tuple(sorted(v)) for o, v in sig.items()}

    ssig, dsig = signature(src), signature(dst)
    occ: dict[str, list] = {o: [] for o in objects}
    for a in src:
        for o in a[2]:
            if o in occ:
                occ[o].append(a)
    order = sorted(objects, key=lambda o: (o not in fixed, len({x for x in objects if dsig[x] == ssig[o]}), o))
    sigma: dict[str, str] = {}
    used: set[str] = set()
    nodes = [0]

    def consistent(o):
        for a in occ[o]:
            if all(x in sigma for x in a[2]) and (a[0], a[1], tuple(sigma[x] for x in a[2])) not in dst:
                return False
        return True

    def rec(i):
        if i == len(order):
            return True
        nodes[0] += 1
        if nodes[0] > MAX_AUTOMORPHISM_NODES:
            raise TimeoutError
        o = order[i]
        opts = [o] if o in fixed else [t for t in objects if t not in used and dsig[t] == ssig[o]]
        for t in opts:
            sigma[o] = t
            used.add(t)
            if consistent(o) and rec(i + 1):
                return True
            del sigma[o]
            used.discard(t)
        return False

    try:
        return (dict(sigma) if rec(0) else None), True
    except TimeoutError:
        return None, False


# ----------------------------------------------------------------------------- comparison


@dataclass
class GoalVerdict:
    """``status``: equivalent | weakened | strengthened | changed | undecided.

    ``missing``: reference goal literals the generated goal does not imply (it accepts states that
    violate them); ``extra``: generated literals the reference goal does not imply; ``undecided``:
    literals neither proved implied nor refuted. ``symmetry`` maps reference objects to reference
    objects (an automorphism of the initial state) when the goals are equal only up to it."""

    status: str
    method: str
    missing: list = field(default_factory=list)
    extra: list = field(default_factory=list)
    undecided: list = field(default_factory=list)
    symmetry: dict[str, str] | None = None


class GoalSemantics:
    """Goal reasoning for one reference task (built once, cached per reference text)."""

    def __init__(self, ref: NSpec, texts: tuple[str, str] | None):
        self.ref = ref
        self._ground_built = False
        self._ground = None
        self._texts = texts
        self._groups = None
        self._states = None
        self._exact_tried = False
        self._seen: list[int] = []
        self._found: list[int] = []
        self._deadline = 0.0

    @property
    def ground(self) -> Ground | None:
        if not self._ground_built:
            self._ground_built = True
            self._ground = None if self.ref.complex_goal else _ground(self.ref)
        return self._ground

    @property
    def usable(self) -> bool:
        return self.ground is not None

    # -- exact
    def states(self) -> list[int] | None:
        """Every reachable state, or None above the cut-off."""
        if not self._exact_tried:
            self._exact_tried = True
            g = self.ground
            budget = MAX_STATE_WORK // max(1, len(g.acts))
            limit = min(MAX_STATES, budget)
            seen = {g.init}
            frontier = [g.init]
            while frontier:
                nxt = []
                for s in frontier:
                    for _, t in g.successors(s):
                        if t not in seen:
                            seen.add(t)
                            nxt.append(t)
                            if len(seen) > limit:
                                return None
                frontier = nxt
            self._states = list(seen)
        return self._states

    # -- invariants
    def groups(self):
        if self._groups is None:
            invs = _fd_invariants(*self._texts) if self._texts else ()
            self._groups = _groups(self.ground, invs)
        return self._groups

    def _alt(self):
        alt: dict[int, list[int]] = {}
        for m, exactly in self.groups():
            if not exactly:
                continue
            ids = [i for i in range(len(self.ground.atoms)) if m >> i & 1]
            for i in ids:
                alt.setdefault(i, []).extend(j for j in ids if j != i)
        return alt

    def _witness(self, pos: int, neg: int) -> int | None:
        for s in itertools.chain((self.ground.init,), self._found, self._seen):
            if s & pos == pos and not s & neg:
                return s
        left = self._deadline - time.perf_counter()
        if left <= 0:
            return None
        t = _witness_search(self.ground, pos, neg, self._alt(), self._seen, min(WITNESS_SECONDS, left))
        if t is not None:
            self._found.append(t)
        return t

    # -- the comparison
    def compare(self, goal_a, goal_b) -> GoalVerdict:
        """Compare two conjunctions of ground literals in the reference vocabulary."""
        la, lb = sorted(set(goal_a), key=str), sorted(set(goal_b), key=str)
        self._deadline = time.perf_counter() + COMPARE_SECONDS
        if len(self.ground.acts) <= SMALL_GROUND_ACTIONS and self.states() is not None:
            return self._exact(la, lb, self.states())  # small task: enumerate, no translator call
        if self._equal_by_invariants(la, lb):
            return GoalVerdict("equivalent", "invariants")
        states = self.states()
        if states is not None:
            return self._exact(la, lb, states)
        sym = self._symmetry_by_invariants(la, lb)
        if sym is not None:
            return GoalVerdict("equivalent", "invariants", symmetry=sym)
        return self._bounded(la, lb)

    def _symmetry_by_invariants(self, la, lb):
        """Above the enumeration cut-off: an automorphism of the initial state that maps the
        invariant closure of goal B onto that of goal A, accepted only when the moved goal B and
        goal A then imply each other by the invariants (sound)."""
        g = self.ground
        groups = self.groups()
        tagged = []
        for lits in (la, lb):
            p, n, ok = g.goal_masks(lits)
            if not ok:
                return None
            p, n, ok = _propagate(p, n, groups)
            if not ok:
                return None
            tagged.append({("p", *a) for i, a in enumerate(g.atoms) if p >> i & 1}
                          | {("n", *a) for i, a in enumerate(g.atoms) if n >> i & 1})
        init_atoms = set(g.static_atoms) | {a for i, a in enumerate(g.atoms) if g.init >> i & 1}
        sigma, _ = _find_automorphism(g.objects, g.fixed_objects, init_atoms, tagged[0], tagged[1])
        if sigma is None or all(k == v for k, v in sigma.items()):
            return None
        moved = [(s, tuple(sigma.get(x, x) for x in args), v) for s, args, v in lb]
        return sigma if self._equal_by_invariants(la, moved) else None

    def _equal_by_invariants(self, la, lb) -> bool:
        """Each goal implies every literal of the other by unit propagation over the invariants
        (cheap, sound, any size)."""
        g = self.ground
        groups = self.groups()
        closures = []
        for lits in (la, lb):
            p, n, ok = g.goal_masks(lits)
            closures.append(_propagate(p, n, groups) if ok else (p, n, False))
        (pa, na, oka), (pb, nb, okb) = closures
        if not oka or not okb:
            return not oka and not okb  # both unsatisfiable: both accept no state

        def covered(p, n, lits):
            lp, ln, lok = g.goal_masks(lits)
            return lok and lp & ~p == 0 and ln & ~n == 0

        return covered(pa, na, lb) and covered(pb, nb, la)

    def _exact(self, la, lb, states) -> GoalVerdict:
        g = self.ground
        pa, na, oka = g.goal_masks(la)
        pb, nb, okb = g.goal_masks(lb)
        sa = {s for s in states if oka and s & pa == pa and not s & na}
        sb = {s for s in states if okb and s & pb == pb and not s & nb}
        if sa == sb:
            return GoalVerdict("equivalent", "exact")
        sym, complete = self._symmetry(sa, sb)
        if sym is not None:
            return GoalVerdict("equivalent", "exact", symmetry=sym)

        def holds_all(S, lit):
            p, n, ok = g.goal_masks([lit])
            return all(ok and s & p == p and not s & n for s in S)

        missing = [lit for lit in la if not holds_all(sb, lit)]
        extra = [lit for lit in lb if not holds_all(sa, lit)]
        if not complete:
            # a symmetry might still make them equal: say so instead of guessing
            return GoalVerdict("undecided", "exact (symmetry search cut off)", missing, extra,
                               sorted(set(missing) | set(extra), key=str))
        status = "weakened" if sa < sb else "strengthened" if sb < sa else "changed"
        return GoalVerdict(status, "exact", missing, extra)

    def _closure(self, S) -> set:
        g = self.ground
        if not S:
            return {("unsat", "", ())}
        allon = ~0
        anyon = 0
        for s in S:
            allon &= s
            anyon |= s
        out = set()
        for i, a in enumerate(g.atoms):
            if allon >> i & 1:
                out.add(("p", *a))
            elif not anyon >> i & 1:
                out.add(("n", *a))
        return out

    def _symmetry(self, sa, sb):
        """(An automorphism of the initial state mapping the goal states of B onto those of A, or
        None; whether the search was complete)."""
        if len(sa) != len(sb):
            return None, True
        g = self.ground
        init_atoms = set(g.static_atoms) | {a for i, a in enumerate(g.atoms) if g.init >> i & 1}
        sigma, complete = _find_automorphism(g.objects, g.fixed_objects, init_atoms,
                                            self._closure(sa), self._closure(sb))
        if sigma is None or all(k == v for k, v in sigma.items()):
            return None, complete
        # the closures determine the goal-state sets within the reachable states; verify anyway
        idx = g.index

        def image(s):
            t = 0
            for i, (sym, args) in enumerate(g.atoms):
                if s >> i & 1:
                    j = idx.get((sym, tuple(sigma[a] for a in args)))
                    if j is None:
                        return None
                    t |= 1 << j
            return t

        if {image(s) for s in sb} != sa:
            return None, complete
        return sigma, True

    def _bounded(self, la, lb) -> GoalVerdict:
        """Invariant closure for implications, witness states for refutations."""
        g = self.ground
        pa, na, oka = g.goal_masks(la)
        pb, nb, okb = g.goal_masks(lb)
        groups = self.groups()
        if oka:
            pa, na, oka = _propagate(pa, na, groups)
        if okb:
            pb, nb, okb = _propagate(pb, nb, groups)

        def implied(p, n, ok, lit) -> bool | None:
            if not ok:
                return True  # no reachable state satisfies the goal: it implies everything
            lp, ln, lok = g.goal_masks([lit])
            if not lok:
                # the literal is false in every reachable state: implied only by an unreachable goal
                return None if self._witness(p, n) is None else False
            if lp & ~p == 0 and ln & ~n == 0:
                return True
            # a witness satisfies the goal but not the literal
            for s in itertools.chain((g.init,), self._found, self._seen):
                if s & p == p and not s & n and not (s & lp == lp and not s & ln):
                    return False
            if lp & n or ln & p:  # the goal contradicts the literal: any goal state refutes it
                return None if self._witness(p, n) is None else False
            w = self._witness(p | ln, n | lp) if lp & (lp - 1) == 0 and ln & (ln - 1) == 0 else None
            return False if w is not None else None

        missing, extra, unknown = [], [], []
        for lit in la:
            r = implied(pb, nb, okb, lit)
            (missing if r is False else unknown if r is None else []).append(lit)
        for lit in lb:
            r = implied(pa, na, oka, lit)
            (extra if r is False else unknown if r is None else []).append(lit)
        method = "invariants" if not (missing or extra or unknown) else "invariants+witness"
        # a refuted literal proves the goals differ even when others stay undecided; the
        # category then names the direction that is proved
        if missing and extra:
            return GoalVerdict("changed", method, missing, extra, unknown)
        if missing:
            return GoalVerdict("weakened", method, missing, extra, unknown)
        if extra:
            return GoalVerdict("strengthened", method, missing, extra, unknown)
        if unknown:
            return GoalVerdict("undecided", method, missing, extra, unknown)
        return GoalVerdict("equivalent", method)


_CACHE: dict[tuple[str, str], GoalSemantics] = {}


def semantics_for(ref: NSpec, texts: tuple[str, str] | None) -> GoalSemantics:
    """One ``GoalSemantics`` per reference text (evaluation checks many specs against one task)."""
    if texts is None:
        return GoalSemantics(ref, None)
    hit = _CACHE.get(texts)
    if hit is None:
        if len(_CACHE) > 32:
            _CACHE.clear()
        hit = _CACHE[texts] = GoalSemantics(ref, texts)
    return hit


def implied_literals(ref: NSpec, texts: tuple[str, str]) -> tuple[list[tuple], list[tuple]]:
    """(positive, negative) ground atoms that the goal of ``ref`` implies by the invariants alone
    and does not state (used by the mutation suite to write a goal out in other words)."""
    sem = GoalSemantics(ref, texts)
    g = sem.ground
    if g is None:
        return [], []
    pos, neg, ok = g.goal_masks(ref.goal)
    if not ok:
        return [], []
    p2, n2, ok = _propagate(pos, neg, sem.groups())
    if not ok:
        return [], []
    stated = {(s, tuple(a)) for s, a, _ in ref.goal}
    plus = [a for i, a in enumerate(g.atoms) if (p2 & ~pos) >> i & 1 and a not in stated]
    minus = [a for i, a in enumerate(g.atoms) if (n2 & ~neg) >> i & 1 and a not in stated]
    return plus, minus
