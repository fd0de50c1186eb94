"""Annotation-free faithfulness signals: scores of a generated spec that read no reference.

The checker (:mod:`omtr.faithfulness.checker`) says whether a solved spec is the task, but it needs
the task's reference, so it may only grade. The signals here score a spec from what a policy has at
training and inference time: the task's English, the given domain, the spec itself and the task's
other samples. Higher always means "more likely faithful". They are measured against the checker by
``benchmarks/faithfulness_signals.py`` (AUC between faithful and solved-but-unfaithful samples) before
anything uses them.

* :func:`agreement` (TTRL's majority vote, EMPO's semantic-cluster probability, MBR-exec): the share
  of the task's samples whose spec is equivalent to this one, equivalence decided by the checker's own
  machinery with one *generated* spec standing in the reference's place (:func:`equivalent`,
  :func:`equivalence_matrix`).
* :func:`broken_invariants` / :func:`invariant_score`: Fast Downward's translator synthesises mutex
  invariants from the domain's actions alone ("at most one of handempty, holding ?x"); an initial
  state with two atoms of one group is a state no plan of the domain reaches from a sound state.
  The score is minus the number of violated groups.
* :func:`reviewer_score` (Coder-Reviewer reranking): the backbone's log p(statement | problem) minus
  log p(statement), per statement token. :class:`BackboneScorer` computes the log-probabilities with
  the role model's backbone, adapters off; the arithmetic and the prompt are pure functions.
* The Judge's score and the ``grounded`` F1 (:func:`omtr.rl.grounding.grounding_score`) are read
  where they live; the benchmark scores them beside these.

Nothing here takes a task record: every function takes texts (the English, a domain, problems), so a
reference can only arrive if a caller passes one. ``tests/test_faithfulness_signals.py`` holds this
module to the training side's import rule (no ``omtr.tasks`` but ``omtr.tasks.training``, no
``omtr.evaluation``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

log = logging.getLogger(__name__)

STATEMENT_MARK = "[STATEMENT]"
# Coder-Reviewer's reversed prompt: the program first, then the instruction it should come from.
REVIEWER_HEAD = "PDDL problem:\n"
REVIEWER_ASK = "\n\nThe same planning problem, described in English:\n"


# ----------------------------------------------------------------------------- agreement


def equivalent(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two generated specs ``(domain, problem)`` state the same task: the checker's
    comparison (mapping, objects, initial state, goals by the states they accept, action schemas)
    with ``a`` in the reference's place. Specs equal up to layout, comments and case are equivalent
    without a mapping search. Never raises: a spec the checker cannot read is equivalent to nothing."""
    from omtr.faithfulness.checker import check
    from omtr.solver.cache import normalise

    if any(x is None for x in (*a, *b)):
        return False
    if all(normalise(x) == normalise(y) for x, y in zip(a, b)):
        return True
    return bool(check(a, b).faithful)


def equivalence_matrix(specs: Sequence[tuple[str, str] | None],
                       eq: Callable[[tuple[str, str], tuple[str, str]], bool] = equivalent) -> list[list[bool]]:
    """``m[i][j]``: samples i and j are equivalent (a ``None`` spec, e.g. an unsolved sample, is
    equivalent to nothing, itself included). Each unordered pair is compared once, the earlier
    sample in the reference's place; the matrix is symmetric and its diagonal true for every spec."""
    n = len(specs)
    m = [[False] * n for _ in range(n)]
    for i in range(n):
        if specs[i] is None:
            continue
        m[i][i] = True
        for j in range(i + 1, n):
            if specs[j] is not None and eq(specs[i], specs[j]):
                m[i][j] = m[j][i] = True
    return m


def agreement(matrix: Sequence[Sequence[bool]], *, over: Sequence[bool] | None = None) -> list[float | None]:
    """Per sample, the share of the task's samples equivalent to it, itself included (its semantic
    cluster's size over the pool). ``over`` marks the samples that make the pool (default: all);
    a sample outside the pool gets None. With every sample in the pool this is the cluster's share
    of the k samples drawn (unsolved ones count against every cluster)."""
    n = len(matrix)
    pool = [True] * n if over is None else list(over)
    size = sum(pool)
    out: list[float | None] = []
    for i in range(n):
        if not pool[i] or not matrix[i][i]:
            out.append(None)
            continue
        out.append(sum(1 for j in range(n) if pool[j] and matrix[i][j]) / size)
    return out


def clusters(specs: Sequence[tuple[str, str] | None],
             eq: Callable[[tuple[str, str], tuple[str, str]], bool] = equivalent) -> list[int | None]:
    """Semantic clusters of a task's samples: ``out[i]`` is the cluster number of sample i (clusters
    numbered by first appearance; None for a ``None`` spec). Each sample is compared with one
    representative per cluster (the cluster's first sample), not with every sample: n x clusters
    checks at most, where :func:`equivalence_matrix` makes n^2 / 2."""
    reps: list[tuple[str, str]] = []
    out: list[int | None] = []
    for spec in specs:
        if spec is None or any(x is None for x in spec):
            out.append(None)
            continue
        for k, rep in enumerate(reps):
            if eq(rep, spec):
                out.append(k)
                break
        else:
            reps.append(spec)
            out.append(len(reps) - 1)
    return out


# ----------------------------------------------------------------------------- invariants


from omtr.solver.invariants import (TRANSLATOR, atom_groups, counts_in_a_sound_state,  # noqa: E402,F401
                                 domain_invariants, violated_groups)


def broken_invariants(domain: str, problem: str | None) -> int | None:
    """How many of ``domain``'s mutex groups the problem's initial state breaks (two or more true
    atoms: the hand empty and holding a block; one block held and on another). None when the
    problem does not parse or the domain yields no invariants."""
    invs = domain_invariants(domain)
    if not invs or not problem:
        return None
    from omtr.pddl.model import SpecError, parse_problem

    try:
        prob = parse_problem(problem)
    except (SpecError, RecursionError):
        return None
    return len(violated_groups(invs, [list(a) for a in prob.init]))


def invariant_score(domain: str, problem: str | None) -> float | None:
    """Minus :func:`broken_invariants` (higher is better: 0 for an initial state that breaks none)."""
    n = broken_invariants(domain, problem)
    return None if n is None else float(-n)


# ----------------------------------------------------------------------------- reviewer likelihood


def statement_of(nl: str) -> str:
    """The task's own statement: the text after its last ``[STATEMENT]`` line (all of it when there
    is none); the domain's description before it is the same for every task of a family."""
    at = nl.rfind(STATEMENT_MARK)
    return (nl[at + len(STATEMENT_MARK):] if at >= 0 else nl).strip()


def reviewer_context(problem: str | None) -> str:
    """The text the statement is scored after: the problem, then the request to describe it
    (``None``: the same request with no problem, for log p(statement) alone)."""
    return f"{REVIEWER_HEAD}{(problem or '').strip()}{REVIEWER_ASK}"


def reviewer_score(cond_logp: float, prior_logp: float, n_tokens: int) -> float | None:
    """(log p(statement | problem) - log p(statement)) / statement tokens: the nats per token the
    problem explains of the statement. None without tokens."""
    if n_tokens <= 0 or not all(map(math.isfinite, (cond_logp, prior_logp))):
        return None
    return (cond_logp - prior_logp) / n_tokens


class BackboneScorer:
    """Sums of token log-probabilities under a role model's backbone with its adapters off (no role
    vectors: the plain causal LM), in batches, no gradients.

    ``logprobs(contexts, continuation)`` -> ``[(sum log p(continuation | context), tokens), ...]``.
    Context and continuation are tokenised apart and joined, so every context scores the very same
    continuation tokens."""

    def __init__(self, model, *, batch_size: int = 8, max_context_tokens: int = 1024):
        self.model, self.batch_size, self.max_context = model, batch_size, max_context_tokens
        self.tokenizer = model.tokenizer

    def _lm_context(self):
        lm = getattr(self.model, "lm", None)
        return lm.disable_adapter() if hasattr(lm, "disable_adapter") else contextlib.nullcontext()

    def _net(self):
        return getattr(self.model, "base_model", None) or self.model

    def logprobs(self, contexts: Sequence[str], continuation: str) -> list[tuple[float, int]]:
        import torch

        tok = self.tokenizer
        cont = tok(continuation, add_special_tokens=False)["input_ids"]
        if not cont:
            return [(0.0, 0)] * len(contexts)
        ctxs = [tok(c, add_special_tokens=False)["input_ids"][-self.max_context:] for c in contexts]
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        out: list[tuple[float, int]] = []
        dev = next(self._net().parameters()).device
        with torch.no_grad(), self._lm_context():
            for s in range(0, len(ctxs), self.batch_size):
                chunk = [bos + c + cont for c in ctxs[s:s + self.batch_size]]
                T = max(len(x) for x in chunk)
                pad = tok.pad_token_id if tok.pad_token_id is not None else 0
                ids = torch.full((len(chunk), T), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), T), dtype=torch.long)
                for i, x in enumerate(chunk):  # right padding: the continuation ends each row's tokens
                    ids[i, :len(x)] = torch.tensor(x)
                    mask[i, :len(x)] = 1
                logits = self._net()(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits.float()
                logp = torch.log_softmax(logits[:, :-1], dim=-1)
                for i, x in enumerate(chunk):
                    start = len(x) - len(cont)
                    tgt = torch.tensor(cont, device=dev)
                    rows = logp[i, start - 1:len(x) - 1]
                    out.append((float(rows.gather(-1, tgt.unsqueeze(-1)).sum()), len(cont)))
        return out


def reviewer_likelihoods(scorer, nl: str, problems: Sequence[str | None]) -> list[float | None]:
    """:func:`reviewer_score` of each problem for the task ``nl``: one log p(statement) alone, one
    log p(statement | problem) per problem (``None`` problems score None). ``scorer`` has
    :meth:`BackboneScorer.logprobs`."""
    statement = statement_of(nl)
    idx = [i for i, p in enumerate(problems) if p]
    if not statement or not idx:
        return [None] * len(problems)
    res = scorer.logprobs([reviewer_context(None)] + [reviewer_context(problems[i]) for i in idx], statement)
    prior, n = res[0]
    out: list[float | None] = [None] * len(problems)
    for i, (lp, k) in zip(idx, res[1:]):
        out[i] = reviewer_score(lp, prior, k)
    return out


# ----------------------------------------------------------------------------- clause by clause


# The per-clause reviewer's prompt: one atom of the problem, then the clause it should say in English.
CLAUSE_HEAD = "PDDL fact: "
CLAUSE_ASK = "\nThe same fact in English: "


@dataclass(frozen=True)
class ClauseAtoms:
    """One clause of the statement and the atoms a problem wrote for it: ``part`` (``init`` or
    ``goal``), the clause's text, its names in order (``key``; empty for a clause that names nothing),
    the predicate its words name in the given domain (``predicate``; None where the words do not
    settle it) and ``atoms``, the problem's atoms of that part over the same names (any order; for a
    clause without names, the part's atoms over no name of the statement), each as ``(pred, arg...)``."""

    part: str
    text: str
    key: tuple
    predicate: str | None
    atoms: tuple


def _problem_atoms(problem: str | None):
    """(init atoms, positive goal atoms) of a problem, lower case; None when it does not parse."""
    if not problem:
        return None
    from omtr.pddl.model import SpecError, conjunction_literals, parse_problem

    try:
        prob = parse_problem(problem)
    except (SpecError, RecursionError):
        return None
    goal = [a for a, neg in (conjunction_literals(prob.goal) or []) if not neg]
    low = lambda atoms: [tuple(str(x).lower() for x in a) for a in atoms]  # noqa: E731
    return low(prob.init), low(goal)


def _domain_predicates(domain: str | None) -> tuple[dict, frozenset]:
    """(predicates, name -> arguments; the static ones among them: changed by no action's effect)."""
    if not domain:
        return {}, frozenset()
    from omtr.pddl.model import SpecError, atoms_of, parse_domain

    try:
        dom = parse_domain(domain)
    except (SpecError, RecursionError):
        return {}, frozenset()
    preds = {k.lower(): v for k, v in dom.predicates.items()}
    fluents = {str(atom[0]).lower() for act in dom.actions.values() for atom, _, _ in atoms_of(act.effect, effect=True)}
    return preds, frozenset(preds) - fluents


def _atom_key(atom: tuple, names) -> tuple | None:
    """The atom's arguments as statement names: ``()`` for an atom over no name (``(handempty)``,
    ``(free left)``), None for one that names some of its arguments but not all."""
    from omtr.statement import name_of

    key = tuple(name_of(a, names) for a in atom[1:])
    if all(k is None for k in key):
        return ()
    return None if any(k is None for k in key) else key


def statement_atoms(nl: str, domain: str | None, problem: str | None) -> tuple[list[ClauseAtoms], list[tuple]] | None:
    """Each clause of the task's statement with the problem's atoms for it (:class:`ClauseAtoms`),
    and the problem's atoms, as ``(part, atom)``. Read from the English (:func:`omtr.statement.read_statement`),
    the given domain's predicate names and the problem alone. None when the statement is not in
    PlanBench's layout or the problem does not parse."""
    from omtr.statement import clause_predicate, read_statement

    reading = read_statement(nl)
    if reading.layout != "planbench":
        return None
    got = _problem_atoms(problem)
    if got is None:
        return None
    init, goal = got
    if not any(c.says_something for c in reading.goal):  # no goal sentence: one pool
        init, goal = init + goal, []
    names, (preds, _) = reading.norm_names, _domain_predicates(domain)
    parts = {"init": init, "goal": goal}
    out = []
    for part, clauses in (("init", reading.init), ("goal", reading.goal)):
        keyed = [(a, _atom_key(a, names)) for a in parts[part]]
        for c in clauses:
            if not c.key and not c.says_something:
                continue
            mine = tuple(a for a, k in keyed if k is not None and sorted(k) == sorted(c.key))
            out.append(ClauseAtoms(part, c.text, c.key, clause_predicate(c, preds), mine))
    return out, [("init", a) for a in init] + [("goal", a) for a in goal]


@dataclass(frozen=True)
class Grounding:
    """How a problem's atoms pair with the statement's clauses (:func:`grounding`): ``score`` the F1
    in [0, 1]; ``unpaired`` the clauses (their English) with no atom of theirs; ``unsaid`` the atoms
    (as ``(part, atom)``) no clause states."""

    score: float
    unpaired: tuple = ()
    unsaid: tuple = ()


def _problem_types(problem: str | None) -> dict[str, str]:
    from omtr.pddl.model import SpecError, parse_problem

    try:
        return {o.lower(): str(t).lower() for o, t in parse_problem(problem or "").objects.items()}
    except (SpecError, RecursionError):
        return {}


def _type_words(domain: str | None, typ: str) -> set[str]:
    """A type and its ancestors in the given domain, each also split at ``-``/``_`` (``truck``,
    ``vehicle``): the words a clause may use to say an object is of that type."""
    from omtr.pddl.model import SpecError, parse_domain

    names = {typ}
    try:
        dom = parse_domain(domain or "")
    except (SpecError, RecursionError):
        dom = None
    if dom is not None:
        todo = [typ]
        while todo:
            for parent in dom.types.get(todo.pop(), ()):
                if parent not in names and parent != "object":
                    names.add(parent)
                    todo.append(parent)
    return {w for n in names for w in (n, *re.split(r"[-_]", n)) if w and w != "object"}


def grounding(nl: str, domain: str | None, problem: str | None) -> Grounding | None:
    """The pairing behind :func:`typed_grounding`, with what is left over: None where the statement
    is not in PlanBench's layout or says nothing; a score of 0 for a problem that does not parse."""
    from omtr.statement import read_statement

    reading = read_statement(nl)
    if reading.layout != "planbench":
        return None
    got = statement_atoms(nl, domain, problem)
    if got is None:
        return Grounding(0.0)
    clauses, atoms = got
    if not clauses and not atoms:
        return None
    names = reading.norm_names
    objects = _problem_types(problem)
    if objects and names and not any(re.sub(r"[^a-z0-9]", "", o) in names for o in objects):
        return None  # its own names for every object (PlanBench's `a` for "the red block"): no pairing to read
    said = {c.predicate.lower() for c in clauses if c.predicate}
    static = _domain_predicates(domain)[1] - said  # the domain's structure the English leaves out
    atoms = [(p, a) for p, a in atoms if a[0] not in static]  # (Logistics' (truck truck_0)): no clause to pair with
    free = {part: [a for p, a in atoms if p == part] for part in ("init", "goal")}
    paired: set[int] = set()
    credit = 0.0
    for exact in (True, False):  # exact pairings first, then the same names in another order
        for i, c in enumerate(clauses):
            if i in paired:
                continue
            for a in c.atoms:
                if a not in free[c.part] or (c.predicate is not None and a[0] != c.predicate.lower()):
                    continue
                ordered = c.key == _atom_key(a, names)
                if exact and not ordered:
                    continue
                free[c.part].remove(a)
                credit += 1.0 if ordered else 0.5
                paired.add(i)
                break
    # A clause that gives one object a type ("location_0_0 is an airport") is stated by the object's
    # declaration in a typed domain (``location_0_0 - airport``), not by an atom: it pairs with that
    # declaration, which counts on the atoms' side too.
    declared = 0
    types = objects if any(i not in paired and len(c.key) == 1 for i, c in enumerate(clauses)) else {}
    if types:
        by_norm = {re.sub(r"[^a-z0-9]", "", o): t for o, t in types.items()}
        for i, c in enumerate(clauses):
            if i in paired or len(c.key) != 1 or c.part != "init":
                continue
            typ = by_norm.get(c.key[0])
            words = {w for w in re.findall(r"[a-z0-9_-]+", c.text.lower()) if re.sub(r"[^a-z0-9]", "", w) != c.key[0]}
            if typ and typ != "object" and _type_words(domain, typ) & words:
                paired.add(i)
                credit += 1.0
                declared += 1
    # The other side of the type clauses: where the English gives objects a type ("location_0_0 is an
    # airport"), an object declared of that type (or one below it) that no clause gives it is a type
    # the English never states (``location_0_1 - airport``: an airport the task does not have).
    untold = _untold_types(reading, objects, domain)
    score = round(2.0 * credit / (len(clauses) + len(atoms) + declared + len(untold)), 6)
    unpaired = tuple(c.text for i, c in enumerate(clauses) if i not in paired)
    unsaid = tuple((part, a) for part in ("init", "goal") for a in free[part]) + tuple(("init", u) for u in untold)
    return Grounding(score, unpaired, unsaid)


def _untold_types(reading, objects: dict[str, str], domain: str | None) -> list[tuple[str, str]]:
    """Typed declarations the English never states, as ``(type, object)``: a type that one-name
    :init clauses give their objects by the type's own name (:func:`omtr.statement.type_claims`:
    "location_0_0 is an airport"), declared (itself or a type below it) for an object no such clause
    names."""
    from omtr.statement import type_claims

    if not objects:
        return []
    claimed = type_claims(reading.init, _domain_types(domain), _domain_predicates(domain)[0])
    out = []
    for o, t in sorted(objects.items()):
        if t == "object":
            continue
        own = re.sub(r"[^a-z0-9]", "", o)
        above = {t} | {p for p in _type_words(domain, t) if p in claimed}
        out.extend((typ, o) for typ in sorted(above & set(claimed)) if own not in claimed[typ])
    return out


def _domain_types(domain: str | None) -> set[str]:
    from omtr.pddl.model import SpecError, parse_domain

    try:
        return {str(t).lower() for t in parse_domain(domain or "").types}
    except (SpecError, RecursionError):
        return set()


def _types_fit(args, key: tuple, names, domain: str | None, problem: str | None, nouns=None) -> bool:
    """Can a predicate of arguments ``args`` (``(variable, type)`` pairs) take the objects that stand
    for the names ``key``? A name the English gives a noun that is a type of the domain ("ball b1",
    ``nouns``: :attr:`omtr.statement.Reading.nouns`) is of that type, whatever the problem declares
    (a problem that writes ``b1 - room`` does not make "ball b1 is in room r2" a clause of no
    predicate); another is of the types the problem declares for it (some object of its name whose
    type is the argument's or below it). True where the types are not known."""
    from omtr.statement import name_of

    objects = _problem_types(problem)
    nouns = dict(nouns or ())
    typed = _domain_types(domain) if nouns else set()
    for (_, want), name in zip(args, key):
        want = str(want or "object").lower()
        if want == "object":
            continue
        noun = nouns.get(name)
        if noun in typed:
            if want != noun and want not in _type_words(domain, noun):
                return False
            continue
        if not objects:
            continue
        mine = [t for o, t in objects.items() if name_of(o, names) == name]
        if mine and not any(t == want or want in _type_words(domain, t) for t in mine):
            return False
    return True


def plain_unstated(nl: str, domain: str | None, problem: str | None) -> tuple[str, ...] | None:
    """Free English (:func:`omtr.statement.read_plain`, layout ``plain``): the clauses the reader is
    sure of that the problem's atoms do not state, as their English; None where the text is not in
    that layout or the problem does not parse. One-sided, as the reading is: plain English never
    states a whole initial state, so an atom no clause states counts for nothing. A clause counts
    where the decoder's facts rule binds it (:mod:`omtr.model.scope.facts`): a goal clause or an
    :init clause over two names (an atom of its part over its names in that order, of the
    predicate its words name where they name one: "b sits on c", "Move ball1 to west"), one over one
    name whose words name a predicate of the given domain ("z is on the table": ``(ontable z)``), and
    one that names nothing whose words name a predicate of no argument ("the hand is empty":
    ``(handempty)``)."""
    from omtr.statement import clause_predicate, read_statement

    reading = read_statement(nl)
    if reading.layout != "plain" or not (reading.init or reading.goal):
        return None
    got = _problem_atoms(problem)
    if got is None:
        return None
    names, (preds, _) = reading.norm_names, _domain_predicates(domain)
    missing = []
    for part, clauses, atoms in (("init", reading.init, got[0]), ("goal", reading.goal, got[1])):
        keyed = [(a[0], _atom_key(a, names)) for a in atoms]
        for c in clauses:
            want = clause_predicate(c, preds) if preds else None
            if not c.key:
                if want is None or preds.get(want):
                    continue  # not a clause the reading is sure of (or its predicate takes arguments)
                ok = any(p == want for p, _ in keyed)
            else:
                if len(c.key) == 1 and want is None:
                    continue  # one name, no predicate named: what it says is not sure
                if want is not None and not _types_fit(preds[want], c.key, names, domain, problem, reading.nouns):
                    continue  # "pallet p1 is in depot0": `in` takes a crate and a truck, so not this clause's
                ok = any(k == c.key and (want is None or p == want) for p, k in keyed)
                if ok and c.single and want is not None:
                    # "the robot is in room r1": the robot is in no other place too
                    ok = not any(p == want and k != c.key for p, k in keyed)
            if not ok:
                missing.append(c.text)
    return tuple(missing)


def typed_grounding(nl: str, domain: str | None, problem: str | None) -> float | None:
    """The statement-vs-atoms F1 of :func:`omtr.rl.grounding.grounding_score` with predicates: a clause
    pairs with one atom of its part over its names (1 in the clause's order, 0.5 in another) and, where
    the clause's words name a predicate of the given domain (:func:`omtr.statement.clause_predicate`:
    "is on the table": ``ontable``; "object b craves object c": ``craves``; "the hand is empty":
    ``handempty``), of that predicate; a clause without names pairs with an atom over no name.
    ``2 * paired / (clauses + atoms)``, in [0, 1]: an atom the English never says (an extra
    ``(clear b)``), a clause without its atom and an atom of another predicate each cost. Atoms of a
    static predicate (no action changes it) that no clause names count neither way: the domain's
    structure, which PlanBench's English leaves out (Logistics' ``(truck truck_0)``). A clause that
    gives one object a type ("location_0_0 is an airport") pairs with that object's declaration of
    the type (or a subtype) in a typed domain. None where the statement is not in PlanBench's
    layout or the problem names none of its objects as the statement does (PlanBench's own problems
    call "the red block" ``a``: the pairing cannot be read, and the renaming is the checker's to
    judge, with a reference); 0 for a problem that does not parse. Every PlanBench reference and every generator
    family's scores 1 (tests/test_faithfulness_signals.py)."""
    g = grounding(nl, domain, problem)
    return None if g is None else g.score


def _atom_text(atom: tuple) -> str:
    return "(" + " ".join(atom) + ")"


def clause_context(atoms: Sequence[tuple]) -> str:
    """The text a clause is scored after: the atom(s) written for it, then the request to say it in
    English (no atoms: the same request alone, for log p(clause))."""
    return f"{CLAUSE_HEAD}{' '.join(_atom_text(a) for a in atoms)}{CLAUSE_ASK}"


def clause_likelihoods(scorer, nl: str, domain: str | None,
                       problems: Sequence[str | None]) -> list[dict[str, float] | None]:
    """The reviewer likelihood clause by clause: per problem, for each clause of the statement, the
    best over the atoms written for it (:func:`statement_atoms`) of
    (log p(clause | atom) - log p(clause)) per clause token, the backbone with adapters off; a clause
    with no atom gains 0. Returns ``{"mean", "min"}`` over the clauses per problem (None for a
    ``None`` problem, one that does not parse, or a statement not in PlanBench's layout). Each
    (clause, atom) pair is scored once for all the problems: ``scorer`` has
    :meth:`BackboneScorer.logprobs`."""
    read = [statement_atoms(nl, domain, p) if p else None for p in problems]
    wanted: dict[str, set] = {}
    for got in read:
        for c in (got[0] if got else []):
            wanted.setdefault(c.text, set()).update(c.atoms)
    gains: dict[tuple[str, tuple], float] = {}
    for text, atoms in wanted.items():
        if not text:
            continue
        ordered = sorted(atoms)
        res = scorer.logprobs([clause_context(())] + [clause_context((a,)) for a in ordered], text)
        prior, n = res[0]
        for a, (lp, _) in zip(ordered, res[1:]):
            g = reviewer_score(lp, prior, n)
            if g is not None:
                gains[(text, a)] = g
    out: list[dict[str, float] | None] = []
    for got in read:
        if not got or not got[0]:
            out.append(None)
            continue
        per = [max([gains[(c.text, a)] for a in c.atoms if (c.text, a) in gains], default=0.0) for c in got[0]]
        out.append({"mean": round(sum(per) / len(per), 6), "min": round(min(per), 6)})
    return out


# ----------------------------------------------------------------------------- choosing by a signal


def choose(scores: Sequence[float | None], eligible: Sequence[bool]) -> list[float]:
    """Selection weights over a task's samples: uniform over the eligible samples with the highest
    score (ties share; a None score ranks below any number); all zero when none is eligible. The
    expected outcome of picking by the signal is ``sum(w * outcome)``."""
    cand = [i for i, e in enumerate(eligible) if e]
    if not cand:
        return [0.0] * len(scores)
    key = [(-math.inf if scores[i] is None else float(scores[i])) for i in cand]
    best = max(key)
    top = [i for i, k in zip(cand, key) if k == best]
    w = [0.0] * len(scores)
    for i in top:
        w[i] = 1.0 / len(top)
    return w


__all__ = ["BackboneScorer", "ClauseAtoms", "agreement", "plain_unstated", "broken_invariants", "choose", "clause_context",
           "clause_likelihoods", "clusters", "counts_in_a_sound_state", "domain_invariants", "equivalence_matrix",
           "equivalent", "invariant_score", "reviewer_context", "reviewer_likelihoods", "reviewer_score",
           "statement_atoms", "statement_of", "typed_grounding", "violated_groups", "Grounding", "grounding"]
