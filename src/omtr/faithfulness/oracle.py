"""An exact equivalence oracle for small tasks, independent of the checker's goal reasoning.

Evaluation and tests only. ``Oracle`` grounds every action over every tuple of objects, enumerates
the reachable states breadth first, and calls two goals of one task equivalent iff some bijection
of the objects maps the initial state onto itself and the set of reachable states satisfying goal
A onto the set satisfying goal B. ``held_out_pairs`` builds goal pairs on small tasks of the four
families (BlocksWorld and Mystery BlocksWorld with 3-4 blocks, Gripper with 2 rooms and 3 balls, a
two-city Logistics): implied literals added, redundant ones dropped, symmetries of the initial
state, strengthening, weakening, swapped goal targets and unrelated goals, each with the oracle's
verdict. It shares nothing with ``goals.py`` but the normal form (``normal.py``).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

from omtr.faithfulness.mutators import GRIPPER_DOMAIN
from omtr.faithfulness.normal import EQ, normalize



class Oracle:
    """Brute force over one small task: ground actions, reachable states, goal-state sets."""

    def __init__(self, domain: str, problem: str):
        spec = normalize(domain, problem)
        self.objects = list(spec.objects)
        self.static = {a for a in spec.init if a[0] in spec.static}
        self.fluent_syms = {s for s in spec.arity if s not in spec.static}
        init = frozenset(a for a in spec.init if a[0] in self.fluent_syms)
        self.actions = []
        for act in spec.actions.values():
            for args in itertools.product(self.objects, repeat=act.arity):
                def g(t):
                    return tuple(args[x] if isinstance(x, int) else x[2:] for x in t)

                pre = [(s, g(a), p) for s, a, p in act.pre]
                if all(self._static_ok(lit) for lit in pre):
                    fl = [(s, a, p) for s, a, p in pre if s in self.fluent_syms]
                    self.actions.append((fl, [(s, g(a)) for s, a in act.add], [(s, g(a)) for s, a in act.dele]))
        seen, frontier = {init}, [init]
        while frontier:
            nxt = []
            for st in frontier:
                for fl, add, dele in self.actions:
                    if all(((s, a) in st) == p for s, a, p in fl):
                        t = frozenset((st - set(dele)) | set(add))
                        if t not in seen:
                            seen.add(t)
                            nxt.append(t)
            frontier = nxt
        self.init = init
        self.states = seen
        self.fluent_atoms = sorted({a for st in seen for a in st})

    def _static_ok(self, lit) -> bool:
        s, a, p = lit
        if s == EQ:
            return (a[0] == a[1]) == p
        if s in self.fluent_syms:
            return True
        return ((s, a) in self.static) == p

    def holds(self, st, lit) -> bool:
        s, a, p = lit
        if s == EQ:
            return (a[0] == a[1]) == p
        if s not in self.fluent_syms:
            return ((s, a) in self.static) == p
        return ((s, a) in st) == p

    def goal_states(self, goal) -> frozenset:
        return frozenset(st for st in self.states if all(self.holds(st, lit) for lit in goal))

    def automorphisms(self):
        """Every bijection of the objects that maps the initial state (static and fluent) onto itself."""
        full = self.static | self.init
        sig = {o: Counter((s, i) for s, a in full for i, x in enumerate(a) if x == o) for o in self.objects}
        classes: dict[tuple, list[str]] = {}
        for o in self.objects:
            classes.setdefault(tuple(sorted(sig[o].items())), []).append(o)
        groups = list(classes.values())
        for perms in itertools.product(*(itertools.permutations(g) for g in groups)):
            pi = {o: t for g, p in zip(groups, perms) for o, t in zip(g, p)}
            if {(s, tuple(pi[x] for x in a)) for s, a in full} == full:
                yield pi

    def equivalent(self, goal_a, goal_b) -> bool:
        sa, sb = self.goal_states(goal_a), self.goal_states(goal_b)
        if len(sa) != len(sb):
            return False
        for pi in self.automorphisms():
            if frozenset(frozenset((s, tuple(pi[x] for x in a)) for s, a in st) for st in sa) == sb:
                return True
        return False

    def implied(self, goal) -> list[tuple]:
        """Fluent literals true in every reachable state satisfying ``goal``."""
        sg = self.goal_states(goal)
        if not sg:
            return []
        out = []
        for atom in self.fluent_atoms:
            vals = {atom in st for st in sg}
            if len(vals) == 1:
                out.append((atom[0], atom[1], vals.pop()))
        return out


# ----------------------------------------------------------------------------- small tasks


def problem_text(domain_name: str, objects, init, goal) -> str:
    def lit(s, a, p=True):
        body = f"({' '.join([s, *a])})"
        return body if p else f"(not {body})"

    return (f"(define (problem small) (:domain {domain_name}) (:objects {' '.join(objects)})\n"
            f" (:init {' '.join(lit(s, a) for s, a in sorted(init))})\n"
            f" (:goal (and {' '.join(lit(*g) for g in sorted(goal))})))\n")


def with_negative_goals(domain: str) -> str:
    if ":negative-preconditions" in domain:
        return domain
    return domain.replace("(:requirements", "(:requirements :negative-preconditions", 1)


def blocksworld_task(benchmarks, n, mystery=False):
    sub = "blocksworld/mystery" if mystery else "blocksworld"
    d = (benchmarks / "planbench" / "instances" / sub / "generated_domain.pddl").read_text()
    blocks = [f"b{i}" for i in range(n)]
    names = ({"clear": "province", "ontable": "planet", "handempty": "harmony"} if mystery else
             {"clear": "clear", "ontable": "ontable", "handempty": "handempty"})
    init = {(names["handempty"], ())} | {(names["clear"], (b,)) for b in blocks} | {(names["ontable"], (b,)) for b in blocks}
    dname = "mystery-4ops" if mystery else "blocksworld-4ops"
    return d, dname, blocks, init


def _gripper(_benchmarks):
    objs = ["r0", "r1", "ball0", "ball1", "ball2", "left", "right"]
    init = {("room", ("r0",)), ("room", ("r1",)), ("gripper", ("left",)), ("gripper", ("right",)),
            ("free", ("left",)), ("free", ("right",)), ("at-robby", ("r0",))}
    init |= {("ball", (b,)) for b in objs[2:5]} | {("at", (b, "r0")) for b in objs[2:5]}
    return GRIPPER_DOMAIN, "gripper-strips", objs, init


def _logistics(benchmarks):
    d = (benchmarks / "planbench" / "instances" / "logistics" / "generated_domain.pddl").read_text()
    objs = ["c0", "c1", "l00", "l01", "l10", "l11", "t0", "t1", "a0", "p0", "p1"]
    init = {("city", ("c0",)), ("city", ("c1",)), ("truck", ("t0",)), ("truck", ("t1",)),
            ("airplane", ("a0",)), ("obj", ("p0",)), ("obj", ("p1",))}
    for c in "01":
        for k in "01":
            init |= {("location", (f"l{c}{k}",)), ("in-city", (f"l{c}{k}", f"c{c}"))}
        init.add(("airport", (f"l{c}0",)))
    init |= {("at", ("t0", "l00")), ("at", ("t1", "l10")), ("at", ("a0", "l00")), ("at", ("p0", "l01")),
             ("at", ("p1", "l11"))}
    dname = d[d.index("(domain") + 7:].split(")")[0].strip()
    return d, dname, objs, init


FAMILIES = {
    "blocksworld3": lambda b: blocksworld_task(b, 3),
    "blocksworld4": lambda b: blocksworld_task(b, 4),
    "mystery4": lambda b: blocksworld_task(b, 4, mystery=True),
    "gripper": _gripper,
    "logistics": _logistics,
}


def held_out_pairs(family: str, benchmarks: Path, seed: int, n_tasks: int = 4):
    """(domain, reference problem, generated problem, kind, oracle) tuples."""
    rng = random.Random(seed)
    d, dname, objs, base_init = FAMILIES[family](benchmarks)
    d = with_negative_goals(d)
    base = Oracle(d, problem_text(dname, objs, base_init, []))
    static = base.static
    states = sorted(base.states, key=lambda s: sorted(s))
    out = []
    for _ in range(n_tasks):
        init = set(rng.choice(states)) | static
        oracle = Oracle(d, problem_text(dname, objs, init, []))
        reach = sorted(oracle.states, key=lambda s: sorted(s))

        def random_goal():
            st = sorted(rng.choice(reach))
            k = rng.randint(1, min(4, len(st)))
            return {(s, a, True) for s, a in rng.sample(st, k)}

        def fluent_literal():
            s, a = rng.choice(oracle.fluent_atoms)
            return (s, a, rng.random() < 0.7)

        for _ in range(3):
            goal = random_goal()
            implied = [lit for lit in oracle.implied(goal) if lit not in goal]
            kinds = []
            if implied:
                extra = set(rng.sample(implied, min(len(implied), rng.randint(1, 3))))
                kinds.append(("implied_added", goal, goal | extra))
                kinds.append(("redundant_dropped", goal | extra, goal))
            syms = [pi for pi in oracle.automorphisms() if any(k != v for k, v in pi.items())]
            if syms:
                pi = rng.choice(syms)
                moved = {(s, tuple(pi[x] for x in a), p) for s, a, p in goal}
                kinds.append(("symmetric", goal, moved))
                if implied:
                    kinds.append(("symmetric_implied", goal, moved | {(s, tuple(pi[x] for x in a), p) for s, a, p in extra}))
            lit = fluent_literal()
            if lit not in goal:
                kinds.append(("literal_added", goal, goal | {lit}))
            if len(goal) >= 2:
                kinds.append(("literal_dropped", goal, goal - {rng.choice(sorted(goal))}))
            binary = sorted(g for g in goal if len(g[1]) == 2)
            if len(binary) >= 2:
                (s1, (x, u), _), (s2, (y, v), _) = rng.sample(binary, 2)
                if s1 == s2 and u != v:
                    swapped = (goal - {(s1, (x, u), True), (s2, (y, v), True)}) | {(s1, (x, v), True), (s1, (y, u), True)}
                    kinds.append(("targets_swapped", goal, swapped))
            kinds.append(("other_goal", goal, random_goal()))
            for kind, ga, gb in kinds:
                if ga == gb:
                    continue
                pa = problem_text(dname, objs, init, ga)
                pb = problem_text(dname, objs, init, gb)
                out.append((d, pa, pb, kind, oracle.equivalent(ga, gb)))
    return out
