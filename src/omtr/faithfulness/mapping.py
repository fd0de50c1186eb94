"""Structural correspondence between a reference and a generated spec (names carry no weight).

Three layers, each chosen by structure, with lexical similarity only to break exact ties:

1. **Predicates** (with an argument permutation each). Predicates are bucketed by a domain-only
   signature (arity, static or not, how often they occur in which role of which action shape);
   candidates permute only within a bucket, so a problem-side mutation never disturbs this layer
   and a domain-side one only widens the bucket it touches. Each candidate's argument orders are
   improved by coordinate ascent on the domain score.
2. **Actions** (with a parameter permutation each): for a predicate candidate, every same-arity
   (reference, generated) action pair gets its best parameter permutation; actions are then
   assigned to maximise matched literals. The predicate candidate with the highest domain score
   wins (ties are decided by the problem layer, then by names).
3. **Objects**: colour refinement (Weisfeiler-Lehman) over the init and goal hypergraphs of both
   specs with one shared palette. Pairs of objects whose colour is unique on both sides are fixed
   (deepest round first) and become anchors; when only ties remain (interchangeable objects), one
   pair from the smallest common colour class is individualised, preferring pairs that agree with
   the anchors, then similar names; a large class of interchangeable objects with nothing to
   prefer is paired in one step. A bounded number of alternative tie choices is tried when the
   result is not exact, then a local repair (swaps, moves to unmapped objects) minimises the
   weighted number of atoms without a counterpart (init atoms weigh 3, goal atoms 2). Refinement
   runs on three views (init+goal, init only, goal+types) and the best result wins; each stops
   early once it reaches the lower bound given by the predicate histograms.

Exact isomorphisms (faithful specs) are found without search in practice; symmetric objects
cost one refinement per tie class, not a permutation search.
"""

from __future__ import annotations

import difflib
import itertools
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from omtr.faithfulness.normal import EQ, NAction, NSpec

log = logging.getLogger(__name__)

MAX_GROUP_CANDIDATES = 120
MAX_PRED_CANDIDATES = 64
MAX_ACTION_PERMS = 720
MAX_PARAM_PERMS = 120
MAX_REFINE_ROUNDS = 10
MAX_TIE_RETRIES = 6
MAX_REPAIR_PASSES = 4
BULK_TIE_SIZE = 4  # tie classes larger than this are paired in one step


@dataclass
class Mapping:
    """Reference name -> generated name, with argument orders.

    ``preds[r] = (g, perm)``: reference atom ``(r x_0 .. x_n)`` corresponds to the generated atom
    whose argument ``perm[i]`` is ``x_i``. ``actions[r] = (g, sigma)``: reference parameter ``i``
    is generated parameter ``sigma[i]``.
    """

    preds: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    actions: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)
    domain_matched: int = 0
    domain_total: tuple[int, int] = (0, 0)
    problem_mismatch: int = 0
    problem_coverage: tuple[int, int] = (0, 0)  # (non-corresponding, all) atoms over mapped objects

    def gen_to_ref_pred(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {g: (r, perm) for r, (g, perm) in self.preds.items()}


def similarity(a: str, b: str) -> float:
    if a == b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b).ratio()


# ----------------------------------------------------------------------------- predicates


def _pred_signature(spec: NSpec) -> dict[str, tuple]:
    feats: dict[str, Counter] = {s: Counter() for s in spec.arity}
    for act in spec.actions.values():
        for s, args, pos in act.pre:
            if s in feats:
                feats[s][("pre", pos, act.arity, len(set(args)))] += 1
        for role, lits in (("add", act.add), ("del", act.dele)):
            for s, args in lits:
                if s in feats:
                    feats[s][(role, act.arity, len(set(args)))] += 1
    # domain-only: whether the goal mentions a predicate is left out, so that a goal written with
    # other (e.g. implied) predicates does not move a predicate into another bucket
    return {s: (spec.arity[s], s in spec.static, tuple(sorted(feats[s].items()))) for s in spec.arity}


def _pred_stats(spec: NSpec) -> dict[str, tuple[int, int]]:
    init = Counter(a[0] for a in spec.init)
    goal = Counter(g[0] for g in spec.goal)
    return {s: (init[s], goal[s]) for s in spec.arity}


def _group_candidates(refs, gens, rstats, gstats) -> list[list[tuple[str, str | None]]]:
    """Injective partial assignments ref -> gen (or None), best (by statistics, names) first."""
    slots = list(gens) + [None] * max(0, len(refs) - len(gens))

    def cost(assign):
        c = 0.0
        for r, g in assign:
            if g is None:
                c += 1000
            else:
                c += sum(abs(x - y) for x, y in zip(rstats[r], gstats[g])) - 0.01 * similarity(r, g)
        return c

    n_perm = 1
    for i in range(len(refs)):
        n_perm *= len(slots) - i
    if n_perm <= MAX_GROUP_CANDIDATES:
        cands = [list(zip(refs, p)) for p in itertools.permutations(slots, len(refs))]
        cands.sort(key=cost)
        return cands
    # too many: one greedy assignment
    left = list(gens)
    assign = []
    for r in refs:
        best = min(left, key=lambda g: cost([(r, g)]), default=None)
        if best is not None:
            left.remove(best)
        assign.append((r, best))
    return [assign]


def _pred_candidates(ref: NSpec, gen: NSpec) -> list[dict[str, str | None]]:
    rsig, gsig = _pred_signature(ref), _pred_signature(gen)
    rstats, gstats = _pred_stats(ref), _pred_stats(gen)
    rb: dict[tuple, list[str]] = defaultdict(list)
    gb: dict[tuple, list[str]] = defaultdict(list)
    for s in sorted(ref.arity):
        rb[rsig[s]].append(s)
    for s in sorted(gen.arity):
        gb[gsig[s]].append(s)
    groups = []
    left_r: dict[int, list[str]] = defaultdict(list)
    left_g: dict[int, list[str]] = defaultdict(list)
    for key, rs in rb.items():
        gs = gb.get(key, [])
        if len(gs) == len(rs):
            groups.append((rs, gs))
        else:
            left_r[key[0]].extend(rs)
    for key, gs in gb.items():
        if len(rb.get(key, [])) != len(gs):
            left_g[key[0]].extend(gs)
    for ar in sorted(set(left_r) | set(left_g)):
        if left_r.get(ar):
            groups.append((left_r[ar], left_g.get(ar, [])))
    per_group = [_group_candidates(rs, gs, rstats, gstats) for rs, gs in groups]
    out = []
    for combo in itertools.product(*per_group):
        out.append({r: g for assign in combo for r, g in assign})
        if len(out) >= MAX_PRED_CANDIDATES:
            break
    return out or [{}]


# ----------------------------------------------------------------------------- actions


def _canon(args) -> tuple:
    return tuple("c" if isinstance(a, str) and a.startswith("c:") else a for a in args)


def _translate_action(act: NAction, ginv: dict) -> tuple[list, list, list]:
    """Generated action literals in reference symbols (args still generated parameter indices)."""

    def tr(sym, args):
        if sym == EQ:
            return EQ, _canon(args)
        hit = ginv.get(sym)
        if hit is None:
            return "\x00" + sym, _canon(args)
        r, perm = hit
        return r, _canon(tuple(args[perm[i]] for i in range(len(perm))))

    pre = [(*tr(s, a), pos) for s, a, pos in act.pre]
    add = [tr(s, a) for s, a in act.add]
    dele = [tr(s, a) for s, a in act.dele]
    return pre, add, dele


def _ref_sets(act: NAction):
    return (
        {(s, _canon(a), p) for s, a, p in act.pre},
        {(s, _canon(a)) for s, a in act.add},
        {(s, _canon(a)) for s, a in act.dele},
    )


def _remap(args, tau):
    return tuple(tau[a] if isinstance(a, int) and a < len(tau) else a for a in args)


def _pair_score(rsets, gtrans, arity: int, only=None) -> tuple[int, tuple[int, ...]]:
    rpre, radd, rdel = rsets
    gpre, gadd, gdel = gtrans
    best = (-1, tuple(range(arity)))
    perms = [only] if only is not None else itertools.permutations(range(arity))
    for n, sigma in enumerate(perms):
        if n >= MAX_PARAM_PERMS:
            break
        tau = [0] * arity  # generated index -> reference index
        for i, j in enumerate(sigma):
            tau[j] = i
        m = sum(1 for s, a, p in gpre if (s, _remap(a, tau), p) in rpre)
        m += sum(1 for s, a in gadd if (s, _remap(a, tau)) in radd)
        m += sum(1 for s, a in gdel if (s, _remap(a, tau)) in rdel)
        if m > best[0]:
            best = (m, tuple(sigma))
    return best


def _param_sigs(sets, arity: int) -> list[tuple]:
    pre, add, dele = sets
    sig: list[list] = [[] for _ in range(arity)]
    for role, lits in (("pre", pre), ("add", add), ("del", dele)):
        for lit in lits:
            sym, args = lit[0], lit[1]
            sign = lit[2] if role == "pre" else True
            for pos, a in enumerate(args):
                if isinstance(a, int) and a < arity:
                    sig[a].append((role, sign, sym, pos))
    return [tuple(sorted(x)) for x in sig]


def _perfect_sigma(rsets, gtrans, arity: int) -> tuple[int, ...] | None:
    """A parameter permutation under which the two actions are identical, found by matching
    per-parameter signatures (fast path; None when there is none or it is ambiguous to test)."""
    total_r = sum(len(x) for x in rsets)
    if total_r != sum(len(x) for x in gtrans):
        return None
    rs, gs = _param_sigs(rsets, arity), _param_sigs(gtrans, arity)
    if sorted(rs) != sorted(gs):
        return None
    options = [[j for j in range(arity) if gs[j] == rs[i]] for i in range(arity)]
    tried = 0
    for sigma in itertools.product(*options):
        if len(set(sigma)) != arity:
            continue
        tried += 1
        if tried > MAX_PARAM_PERMS:
            return None
        m, _ = _pair_score(rsets, gtrans, arity, only=sigma)
        if m == total_r:
            return tuple(sigma)
    return None


def _assign(pairs: dict[tuple[str, str], int], refs: list[str], gens: list[str]) -> tuple[int, dict[str, str | None]]:
    slots = list(gens) + [None] * max(0, len(refs) - len(gens))
    n_perm = 1
    for i in range(len(refs)):
        n_perm *= len(slots) - i
    if n_perm <= MAX_ACTION_PERMS:
        best = (-1, {})
        for p in itertools.permutations(slots, len(refs)):
            tot = sum(pairs.get((r, g), 0) for r, g in zip(refs, p) if g is not None)
            if tot > best[0]:
                best = (tot, dict(zip(refs, p)))
        return best
    out, used, tot = {}, set(), 0
    for (r, g), v in sorted(pairs.items(), key=lambda kv: -kv[1]):
        if r not in out and g not in used:
            out[r] = g
            used.add(g)
            tot += v
    return tot, {r: out.get(r) for r in refs}


def _domain_score(ref: NSpec, gen: NSpec, pmap: dict[str, tuple[str, tuple[int, ...]]]):
    ginv = {g: (r, perm) for r, (g, perm) in pmap.items()}
    gtrans = {n: _translate_action(a, ginv) for n, a in gen.actions.items()}
    rsets = {n: _ref_sets(a) for n, a in ref.actions.items()}
    by_arity_r: dict[int, list[str]] = defaultdict(list)
    by_arity_g: dict[int, list[str]] = defaultdict(list)
    for n, a in ref.actions.items():
        by_arity_r[a.arity].append(n)
    for n, a in gen.actions.items():
        by_arity_g[a.arity].append(n)
    total = 0
    amap: dict[str, tuple[str, tuple[int, ...]]] = {}
    for ar, refs in by_arity_r.items():
        gens = by_arity_g.get(ar, [])
        # fast path: every reference action has an identical generated partner
        if len(gens) == len(refs):
            fast: dict[str, tuple[str, tuple[int, ...]]] = {}
            left = list(gens)
            for r in refs:
                for g in left:
                    sigma = _perfect_sigma(rsets[r], gtrans[g], ar)
                    if sigma is not None:
                        fast[r] = (g, sigma)
                        left.remove(g)
                        break
                else:
                    break
            if len(fast) == len(refs):
                amap.update(fast)
                total += sum(sum(len(x) for x in rsets[r]) for r in refs)
                continue
        scores, sigmas = {}, {}
        for r in refs:
            for g in gens:
                m, sigma = _pair_score(rsets[r], gtrans[g], ar)
                scores[(r, g)] = m + 1  # +1: an action pair beats no pair
                sigmas[(r, g)] = sigma
        tot, assign = _assign(scores, refs, gens)
        for r, g in assign.items():
            if g is not None:
                amap[r] = (g, sigmas[(r, g)])
                total += scores[(r, g)] - 1
    return total, amap


def _lexical(pmap, amap) -> float:
    return sum(similarity(r, g) for r, (g, _) in pmap.items()) + sum(
        similarity(r, g) for r, (g, _) in amap.items()
    )


def map_domain(ref: NSpec, gen: NSpec) -> list[tuple[int, dict, dict]]:
    """Best (domain score, predicate map, action map) candidates, best first (ties kept)."""
    results = []
    ceiling = min(_domain_totals(ref, gen))
    for cand in _pred_candidates(ref, gen):
        pmap = {r: (g, tuple(range(ref.arity[r]))) for r, g in cand.items() if g is not None}
        score, amap = _domain_score(ref, gen, pmap)
        # coordinate ascent on argument orders (nothing to gain once every literal matches)
        improved = score < ceiling
        while improved:
            improved = False
            for r in sorted(pmap):
                ar = ref.arity[r]
                if ar < 2 or ar > 4:
                    continue
                g, cur = pmap[r]
                for perm in itertools.permutations(range(ar)):
                    if perm == cur:
                        continue
                    trial = dict(pmap)
                    trial[r] = (g, perm)
                    s2, a2 = _domain_score(ref, gen, trial)
                    if s2 > score:
                        pmap, score, amap, improved = trial, s2, a2, True
                        cur = perm
                if score >= ceiling:
                    improved = False
                    break
        results.append((score, pmap, amap))
    results.sort(key=lambda t: (-t[0], -_lexical(t[1], t[2])))
    return results


# ----------------------------------------------------------------------------- objects


def _ref_atoms(spec: NSpec) -> set:
    out = {("i", s, a) for s, a in spec.init}
    out |= {("g+" if p else "g-", s, a) for s, a, p in spec.goal}
    return out


def _gen_atoms(spec: NSpec, ginv: dict) -> set:
    def tr(sym, args):
        if sym == EQ:
            return EQ, args
        hit = ginv.get(sym)
        if hit is None:
            return "\x00" + sym, args
        r, perm = hit
        return r, tuple(args[perm[i]] for i in range(len(perm)))

    out = {("i", *tr(s, a)) for s, a in spec.init}
    out |= {("g+" if p else "g-", *tr(s, a)) for s, a, p in spec.goal}
    return out


class _ObjectMatcher:
    def __init__(self, robjs, ratoms, gobjs, gatoms, view=None):
        """``view(atom) -> bool`` selects the atoms colour refinement looks at (all by default);
        scoring, tie preferences and repair always use all atoms."""
        self.robjs, self.gobjs = list(robjs), list(gobjs)
        self.ratoms, self.gatoms = ratoms, gatoms
        self.rocc = self._occ(self.robjs, ratoms)
        self.gocc = self._occ(self.gobjs, gatoms)
        # no mapping can do better than the difference of the (section, predicate) histograms
        hist = Counter((a[0], a[1]) for a in ratoms)
        hist.subtract(Counter((a[0], a[1]) for a in gatoms))
        self.lower_bound = sum(abs(n) * (1 if key[0] != "i" else 10) for key, n in hist.items())
        if view is None:
            self.rview, self.gview = self.rocc, self.gocc
        else:
            self.rview = self._occ(self.robjs, {a for a in ratoms if view(a)})
            self.gview = self._occ(self.gobjs, {a for a in gatoms if view(a)})

    @staticmethod
    def _occ(objs, atoms):
        occ = {o: [] for o in objs}
        for atom in atoms:
            for pos, o in enumerate(atom[2]):
                if o in occ:
                    occ[o].append((atom, pos))
        return occ

    def _refine(self, fixed: dict[str, str]):
        inv = {g: r for r, g in fixed.items()}
        cr = {o: (hash(("A", o)) if o in fixed else 0) for o in self.robjs}
        cg = {o: (hash(("A", inv[o])) if o in inv else 0) for o in self.gobjs}
        hr = {o: [c] for o, c in cr.items()}
        hg = {o: [c] for o, c in cg.items()}
        prev = len(set(cr.values()) | set(cg.values()))
        for _ in range(MAX_REFINE_ROUNDS):
            ncr = {o: self._step(o, self.rview, cr) for o in self.robjs}
            ncg = {o: self._step(o, self.gview, cg) for o in self.gobjs}
            cr, cg = ncr, ncg
            for o, c in cr.items():
                hr[o].append(c)
            for o, c in cg.items():
                hg[o].append(c)
            n = len(set(cr.values()) | set(cg.values()))
            if n == prev:
                break
            prev = n
        return hr, hg

    @staticmethod
    def _step(o, occ, col):
        sig = sorted((a[0], a[1], pos, tuple(col.get(x, -1) for x in a[2])) for a, pos in occ[o])
        return hash((col[o], tuple(sig)))

    # -- scoring
    def _fwd(self, atom, m):
        return (atom[0], atom[1], tuple(m.get(x, "\x01" + x) for x in atom[2]))

    @staticmethod
    def _w(atom) -> int:
        # an init atom out of correspondence costs more than a goal atom, so that between equally
        # small explanations the one that keeps the initial state intact wins: a goal-only edit
        # (e.g. two balls' target rooms swapped) is then blamed on the goal, and the goal is
        # compared by the states it accepts under a mapping that keeps the task's init
        return 1 if atom[0] != "i" else 10

    def mismatch(self, m: dict[str, str]) -> int:
        """Weighted count of atoms without a counterpart under ``m`` (0 iff isomorphic)."""
        inv = {g: r for r, g in m.items()}
        miss = sum(self._w(a) for a in self.ratoms if self._fwd(a, m) not in self.gatoms)
        extra = sum(self._w(a) for a in self.gatoms if self._fwd(a, inv) not in self.ratoms)
        return miss + extra

    def count(self, m: dict[str, str]) -> int:
        """Unweighted number of atoms without a counterpart under ``m``."""
        inv = {g: r for r, g in m.items()}
        return (sum(1 for a in self.ratoms if self._fwd(a, m) not in self.gatoms)
                + sum(1 for a in self.gatoms if self._fwd(a, inv) not in self.ratoms))

    def mapped_coverage(self, m: dict[str, str]) -> tuple[int, int]:
        """(non-corresponding, all) atoms among those whose objects all have a counterpart."""
        inv = {g: r for r, g in m.items()}
        ra = [a for a in self.ratoms if all(x in m for x in a[2])]
        ga = [a for a in self.gatoms if all(x in inv for x in a[2])]
        bad = sum(1 for a in ra if self._fwd(a, m) not in self.gatoms)
        bad += sum(1 for a in ga if self._fwd(a, inv) not in self.ratoms)
        return bad, len(ra) + len(ga)

    def _local(self, m, inv, rs, gs) -> int:
        ra = {a for r in rs for a, _ in self.rocc.get(r, ())}
        ga = {a for g in gs for a, _ in self.gocc.get(g, ())}
        return sum(self._w(a) for a in ra if self._fwd(a, m) not in self.gatoms) + sum(
            self._w(a) for a in ga if self._fwd(a, inv) not in self.ratoms
        )

    def _pair_gain(self, fixed, inv, r, g) -> int:
        """Determined atoms of r (and of g) that would correspond if r -> g. Disagreements are not
        subtracted: whichever object takes g inherits them, so they do not tell candidates apart."""
        m = dict(fixed)
        m[r] = g
        iv = dict(inv)
        iv[g] = r
        score = 0
        for a, _ in self.rocc[r]:
            if all(x in m for x in a[2]) and self._fwd(a, m) in self.gatoms:
                score += 1
        for a, _ in self.gocc[g]:
            if all(x in iv for x in a[2]) and self._fwd(a, iv) in self.ratoms:
                score += 1
        return score

    # -- search
    def run(self) -> dict[str, str]:
        best, ties = self._individualise({}, [])
        best_mis = self.mismatch(best)
        if best_mis > self.lower_bound and ties:
            # bounded backtracking: alternative choices at the first tie points
            tried = 0
            for prefix, alts in ties[:3]:
                for alt in alts[:MAX_TIE_RETRIES]:
                    if tried >= MAX_TIE_RETRIES:
                        break
                    tried += 1
                    m, _ = self._individualise(dict(prefix), [], first=alt)
                    mis = self.mismatch(m)
                    if mis < best_mis:
                        best, best_mis = m, mis
                    if best_mis <= self.lower_bound:
                        break
        if best_mis > self.lower_bound:
            best = self._repair(best)
        return self._polish(best)

    def _polish(self, m: dict[str, str]) -> dict[str, str]:
        """Among equally good mappings prefer identical names (lexical tie-break only): swap two
        images, or move one to the same-named free object, when no atom correspondence is lost."""
        m = dict(m)
        gset = set(self.gobjs)
        for r1 in sorted(m):
            g1 = m[r1]
            if g1 == r1 or r1 not in gset:
                continue
            inv = {g: r for r, g in m.items()}
            r2 = inv.get(r1)
            t = dict(m)
            if r2 is None:
                t[r1] = r1
                rs, gs = {r1}, {g1, r1}
            else:
                t[r1], t[r2] = r1, g1
                rs, gs = {r1, r2}, {g1, r1}
            tinv = {g: r for r, g in t.items()}
            if self._local(t, tinv, rs, gs) <= self._local(m, inv, rs, gs):
                m = t
        return m

    def _individualise(self, fixed, ties, first=None):
        if first is not None:
            fixed[first[0]] = first[1]
        while True:
            used = set(fixed.values())
            free_r = [r for r in self.robjs if r not in fixed]
            free_g = [g for g in self.gobjs if g not in used]
            if not free_r or not free_g:
                return fixed, ties
            hr, hg = self._refine(fixed)
            rounds = len(next(iter(hr.values())))
            progress = False
            for k in range(rounds - 1, 0, -1):
                cr, cg = defaultdict(list), defaultdict(list)
                for r in free_r:
                    cr[hr[r][k]].append(r)
                for g in free_g:
                    cg[hg[g][k]].append(g)
                pairs = [(rs[0], cg[c][0]) for c, rs in cr.items() if len(rs) == 1 and len(cg.get(c, ())) == 1]
                if pairs:
                    fixed.update(pairs)
                    progress = True
                    break
            if progress:
                continue
            # only ties (or diverged colours) left: individualise one pair
            inv = {g: r for r, g in fixed.items()}
            choice = None
            for k in range(rounds - 1, -1, -1):
                cr, cg = defaultdict(list), defaultdict(list)
                for r in free_r:
                    cr[hr[r][k]].append(r)
                for g in free_g:
                    cg[hg[g][k]].append(g)
                common = [c for c in cr if c in cg]
                if not common:
                    continue
                c = min(common, key=lambda c: (len(cr[c]) * len(cg[c]), min(cr[c])))
                r = min(cr[c])
                if k == rounds - 1 and len(cr[c]) == len(cg[c]) > BULK_TIE_SIZE:
                    gains = {self._pair_gain(fixed, inv, r, g) for g in cg[c]}
                    if len(gains) == 1:
                        # a large class of interchangeable objects with nothing to prefer: pair
                        # them all at once (same names first); the result is verified by scoring
                        rs, gs = sorted(cr[c]), sorted(cg[c])
                        same = [x for x in rs if x in set(gs)]
                        rest_r = [x for x in rs if x not in set(same)]
                        rest_g = [x for x in gs if x not in set(same)]
                        fixed.update({x: x for x in same})
                        fixed.update(zip(rest_r, rest_g))
                        choice = ()
                        break
                scored = sorted(
                    cg[c], key=lambda g: (-self._pair_gain(fixed, inv, r, g), -similarity(r, g), g)
                )
                choice = (r, scored[0])
                if len(scored) > 1:
                    ties.append((dict(fixed), [(r, g) for g in scored[1:]]))
                break
            if choice is None:  # cannot happen (round 0 is shared), but never loop forever
                return fixed, ties
            if choice:
                fixed[choice[0]] = choice[1]

    def _repair(self, m: dict[str, str]) -> dict[str, str]:
        """Local search: swap images, or move an image to/from an unmapped object, while the
        number of non-corresponding atoms drops."""
        m = dict(m)
        for _ in range(MAX_REPAIR_PASSES):
            inv = {g: r for r, g in m.items()}
            bad = sorted({x for a in self.ratoms if self._fwd(a, m) not in self.gatoms for x in a[2] if x in m}
                         | {inv[x] for a in self.gatoms if self._fwd(a, inv) not in self.ratoms
                            for x in a[2] if x in inv})
            improved = False
            for r1 in bad:
                if r1 not in m:
                    continue
                inv = {g: r for r, g in m.items()}
                moves = [("swap", r2) for r2 in m if r2 != r1]
                moves += [("gen", g) for g in self.gobjs if g not in inv]
                moves += [("ref", r) for r in self.robjs if r not in m]
                for kind, x in moves:
                    g1 = m[r1]
                    t = dict(m)
                    if kind == "swap":
                        g2 = m[x]
                        t[r1], t[x] = g2, g1
                        rs, gs = {r1, x}, {g1, g2}
                    elif kind == "gen":
                        t[r1] = x
                        rs, gs = {r1}, {g1, x}
                    else:
                        del t[r1]
                        t[x] = g1
                        rs, gs = {r1, x}, {g1}
                    before = self._local(m, inv, rs, gs)
                    tinv = {g: r for r, g in t.items()}
                    after = self._local(t, tinv, rs, gs)
                    if after < before:
                        m, inv = t, tinv
                        improved = True
                        if r1 not in m:
                            break
            if not improved:
                break
        return m


def map_objects(ref: NSpec, gen: NSpec, pmap: dict) -> tuple[dict[str, str], int, tuple[int, int]]:
    """Object mapping, its mismatch, and (mismatch, total) over fully mapped atoms."""
    ginv = {g: (r, perm) for r, (g, perm) in pmap.items()}
    ratoms, gatoms = _ref_atoms(ref), _gen_atoms(gen, ginv)
    type_like = ref.type_like
    # Views for colour refinement: everything; the initial state alone (exact when only the goal
    # changed); the goal with the type atoms (exact when only the initial state changed).
    views = [None, lambda a: a[0] == "i", lambda a: a[0] != "i" or a[1] in type_like]
    goal_hist = Counter((a[0], a[1]) for a in ratoms if a[0] != "i")
    goal_hist.subtract(Counter((a[0], a[1]) for a in gatoms if a[0] != "i"))
    init_hist = Counter(a[1] for a in ratoms if a[0] == "i")
    init_hist.subtract(Counter(a[1] for a in gatoms if a[0] == "i"))
    if any(goal_hist.values()) and not any(init_hist.values()):
        # the goals are written differently (more, fewer or other literals) over the same kind of
        # initial state: refine on the initial state first, which the goal cannot scramble
        views = [views[1], views[0], views[2]]
    best = None
    for view in views:
        matcher = _ObjectMatcher(ref.objects, ratoms, gen.objects, gatoms, view)
        m = matcher.run()
        mis = matcher.mismatch(m)
        if best is None or mis < best[1]:
            best = (m, mis, matcher.mapped_coverage(m))
        if mis <= matcher.lower_bound:
            break
    if best[1] and set(ref.objects) == set(gen.objects):
        # Names intact: when keeping every name explains the difference with no more atoms than
        # the best mapping (which prefers the initial state intact), the names decide where the
        # edit was made, e.g. a ball moved in the init that an exchange of two rooms and two balls
        # would otherwise turn into a goal edit. Names still only break ties in atom counts.
        same = {o: o for o in ref.objects}
        if same != best[0] and matcher.count(same) <= matcher.count(best[0]):
            best = (same, matcher.mismatch(same), matcher.mapped_coverage(same))
    return best


def find_mapping(ref: NSpec, gen: NSpec, max_ties: int = 4) -> Mapping:
    cands = map_domain(ref, gen)
    top = cands[0][0]
    tied = [c for c in cands if c[0] == top][:max_ties]
    best = None
    for score, pmap, amap in tied:
        objs, mis, cov = map_objects(ref, gen, pmap)
        key = (mis, -_lexical(pmap, amap))
        if best is None or key < best[0]:
            best = (key, Mapping(pmap, amap, objs, score, _domain_totals(ref, gen), mis, cov))
        if mis == 0:
            break
    return best[1]


def _domain_totals(ref: NSpec, gen: NSpec) -> tuple[int, int]:
    def tot(s):
        return sum(len(a.pre) + len(a.add) + len(a.dele) for a in s.actions.values())

    return tot(ref), tot(gen)
