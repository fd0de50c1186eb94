"""Annotation-free faithfulness signals (omtr.faithfulness.signals): each a pure function of texts.

Generated tasks give real domains and problems; their references are read here only to build test
inputs (a sample equal to the reference, one with a changed goal, one holding a block with the hand
empty). The last tests hold the module to the training side's rule: it can reach no reference.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path

import pytest

from omtr.faithfulness import signals as S
from omtr.tasks.generators import generate

SRC = Path(__file__).resolve().parents[1] / "src" / "omtr"


@pytest.fixture(scope="module")
def bw():
    return generate("blocksworld", 1, 9301, split="test", min_objects=3, max_objects=3, verify=False)[0]


def _with_init(problem: str, extra: str) -> str:
    return problem.replace("(:init", "(:init " + extra, 1)


def _goal_of(problem: str) -> str:
    return problem[problem.index("(:goal"):]


# ----------------------------------------------------------------------------- agreement


def test_equivalent_specs_by_layout_names_and_goal_order(bw):
    d, p = bw.reference.domain, bw.reference.problem
    assert S.equivalent((d, p), (d, p))
    assert S.equivalent((d, p), (d, "  " + p.upper().replace("\n", " ")))  # layout and case
    renamed = re.sub(r"\b([abc])\b", lambda m: "blk_" + m.group(1), p.split("(:objects")[1])
    assert S.equivalent((d, p), (d, p.split("(:objects")[0] + "(:objects" + renamed))  # other object names
    assert not S.equivalent((d, p), (d, p.replace(_goal_of(p), "(:goal (and (holding a))))")))
    assert not S.equivalent((d, p), (d, None))


def test_equivalence_matrix_and_agreement():
    calls = []

    def eq(a, b):
        calls.append((a, b))
        return a[1][0] == b[1][0]  # the problem's first letter is its cluster

    specs = [("d", "x1"), ("d", "y1"), None, ("d", "x2"), ("d", "x3"), None, ("d", "y2"), ("d", "z")]
    m = S.equivalence_matrix(specs, eq)
    assert len(calls) == 15  # 6 specs: each unordered pair once
    assert all(m[i][j] == m[j][i] for i in range(8) for j in range(8))
    assert not m[2][2] and m[0][0]
    a = S.agreement(m)
    assert a == [3 / 8, 2 / 8, None, 3 / 8, 3 / 8, None, 2 / 8, 1 / 8]
    solved = [s is not None for s in specs]
    assert S.agreement(m, over=solved) == [3 / 6, 2 / 6, None, 3 / 6, 3 / 6, None, 2 / 6, 1 / 6]
    assert S.agreement([]) == []


def test_agreement_on_real_specs_counts_the_equivalent_ones(bw):
    d, p = bw.reference.domain, bw.reference.problem
    other = p.replace(_goal_of(p), "(:goal (and (holding a))))")
    specs = [(d, p), (d, other), (d, " " + p), None]
    assert S.agreement(S.equivalence_matrix(specs)) == [0.5, 0.25, 0.5, None]


# ----------------------------------------------------------------------------- invariants


def test_blocksworld_invariants_come_from_the_actions(bw):
    invs = S.domain_invariants(bw.reference.domain)
    parts = {frozenset(p for p, _, _ in inv) for inv in invs}
    assert frozenset({"handempty", "holding"}) in parts
    assert S.domain_invariants(bw.reference.domain) is invs  # cached per domain
    assert S.domain_invariants("(not a domain") == ()


def test_the_reference_breaks_no_invariant_the_hack_does(bw):
    d, p = bw.reference.domain, bw.reference.problem
    assert S.broken_invariants(d, p) == 0 and S.invariant_score(d, p) == 0.0
    # the hack: holding a block beside the empty hand
    blocks = re.search(r"\(:objects([^)]*)\)", p).group(1).split()
    x, y = blocks[0], blocks[1]
    one = _with_init(p, f"(holding {x})")
    assert S.broken_invariants(d, one) >= 1
    two = _with_init(p, f"(holding {x}) (holding {y})")
    assert S.broken_invariants(d, two) > S.broken_invariants(d, one)
    assert S.invariant_score(d, two) == -S.broken_invariants(d, two)
    assert S.broken_invariants(d, "(define (problem") is None
    assert S.broken_invariants(d, None) is None


def test_violated_groups_bind_parameters_and_ignore_duplicates():
    invs = ((("handempty", (), None), ("holding", (-1,), 0)),
            (("clear", (0,), None), ("holding", (0,), None), ("on", (-1, 0), 0)))
    assert S.violated_groups(invs, [["handempty"], ["clear", "a"], ["on", "a", "b"], ["ontable", "b"]]) == []
    v = S.violated_groups(invs, [["HandEmpty"], ["holding", "a"], ["holding", "a"], ["on", "c", "b"], ["on", "d", "b"]])
    assert [(k, key) for k, key, _ in v] == [(0, ()), (1, ((0, "b"),))]
    assert v[0][2] == [("handempty",), ("holding", "a")]


def test_gripper_invariants_catch_a_ball_in_two_places():
    t = generate("gripper", 1, 9301, split="test", min_objects=2, max_objects=2, verify=False)[0]
    d, p = t.reference.domain, t.reference.problem
    assert S.broken_invariants(d, p) == 0
    assert S.broken_invariants(d, _with_init(p, "(at ball1 room9)")) == 1  # ball1 in two rooms
    # the robot in two rooms: {at-robby ?r} has no parameter and no nullary atom, so the domain alone
    # cannot tell it from Depots' {clear ?x} (many clear surfaces); it is not counted
    assert S.broken_invariants(d, _with_init(p, "(at-robby room9)")) == 0


def test_an_unparameterised_group_without_a_flag_is_no_mutex():
    """Depots: Fast Downward balances {clear ?x} over all surfaces; a sound state has one clear
    surface per stack, so the group must not call PlanBench's Depots references broken."""
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    depots = import_planbench(shipped_root(), ["depots"])[:20]
    invs = S.domain_invariants(depots[0].reference.domain)
    assert any(not S.counts_in_a_sound_state(parts) for parts in invs)  # the clear group is there, skipped
    assert all(S.broken_invariants(t.reference.domain, t.reference.problem) == 0 for t in depots)
    # ...while a real contradiction still counts: a crate on a pallet and held by a hoist at once
    t = depots[0]
    crate = sorted(o for o in re.findall(r"\bcrate\d+\b", t.reference.problem))[0]
    held = _with_init(t.reference.problem, f"(lifting hoist0 {crate})")
    assert S.broken_invariants(t.reference.domain, held) >= 1


# ----------------------------------------------------------------------------- reviewer


class FakeScorer:
    """log p(continuation | context): -1 per token, +0.5 per token the context also holds."""

    def __init__(self):
        self.calls = []

    def logprobs(self, contexts, continuation):
        self.calls.append((list(contexts), continuation))
        words = continuation.split()
        return [(sum(-1.0 + (0.5 if w in c.split() else 0.0) for w in words), len(words)) for c in contexts]


def test_statement_and_reviewer_prompt():
    nl = "A domain.\n[STATEMENT]\nold\n[STATEMENT]\nAs initial conditions I have that, a is clear."
    assert S.statement_of(nl) == "As initial conditions I have that, a is clear."
    assert S.statement_of("no mark here") == "no mark here"
    assert S.reviewer_context("(define (problem p))").startswith(S.REVIEWER_HEAD + "(define (problem p))")
    assert S.reviewer_context(None) == S.REVIEWER_HEAD + S.REVIEWER_ASK


def test_reviewer_score_is_per_token_gain_over_the_statement_alone():
    assert S.reviewer_score(-10.0, -14.0, 4) == 1.0
    assert S.reviewer_score(-1.0, -1.0, 0) is None
    assert S.reviewer_score(-math.inf, -1.0, 3) is None
    nl = "Blocks.\n[STATEMENT]\nred on blue"
    fake = FakeScorer()
    out = S.reviewer_likelihoods(fake, nl, ["(on red blue)", None, "(on red blue) red on blue"])
    assert out[1] is None and out[2] > out[0] >= 0.0
    assert len(fake.calls) == 1 and len(fake.calls[0][0]) == 3  # one prior, one per problem
    assert S.reviewer_likelihoods(fake, nl, [None, None]) == [None, None]


def test_backbone_scorer_on_micro_matches_a_plain_forward():
    torch = pytest.importorskip("torch")
    from omtr.model import build_model

    torch.manual_seed(0)
    m = build_model("micro")
    m.eval()
    sc = S.BackboneScorer(m, batch_size=2)
    res = sc.logprobs(["short", "a much longer context here", "mid one"], " the end")
    tok = m.tokenizer
    cont = tok(" the end", add_special_tokens=False)["input_ids"]
    assert all(n == len(cont) for _, n in res)
    # the same number from an unbatched, unpadded forward
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    ids = bos + tok("a much longer context here", add_special_tokens=False)["input_ids"] + cont
    with torch.no_grad(), m.lm.disable_adapter():
        lp = torch.log_softmax(m.base_model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    want = sum(float(lp[len(ids) - len(cont) - 1 + j, t]) for j, t in enumerate(cont))
    assert res[1][0] == pytest.approx(want, abs=1e-3)
    assert all(v < 0 for v, _ in res)


# ----------------------------------------------------------------------------- clause by clause


def _planbench(family):
    """The shortest PlanBench task of a family, its reference problem spelled as the English spells it."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.tasks.planbench import import_config
    from omtr.tasks.planbench_data import shipped_root

    t = min(import_config(shipped_root(), family), key=lambda t: len(t.nl))
    return t.nl, t.reference.domain, spelled_problem(t).lower()


def _swap(problem, old, new):
    assert old in problem, (old, problem)
    return problem.replace(old, new, 1)


@pytest.mark.parametrize("family,extra,drop", [
    # an atom the English never says, and the atom of a clause to drop
    ("blocksworld", "(clear {})", "(handempty)"),
    ("mystery_blocksworld", "(pain {})", "(harmony)"),
    ("logistics", "(airport {})", "(airport "),
    ("depots", "(lifting {0} {0})", "(available "),
])
def test_typed_grounding_on_planbench_text(family, extra, drop):
    from omtr.pddl.model import parse_domain
    from omtr.statement import read_statement

    nl, d, p = _planbench(family)
    assert S.typed_grounding(nl, d, p) == 1.0  # the task's own problem: every clause has its atom, no atom more
    names = sorted(read_statement(nl).norm_names)
    # a predicate swapped: the clause's words name another predicate, so it loses its pairing
    c = next(c for c in S.statement_atoms(nl, d, p)[0] if len(c.key) == 1 and c.atoms and c.predicate)
    other = sorted(k.lower() for k, v in parse_domain(d).predicates.items() if len(v) == 1 and k.lower() != c.predicate)
    a = next(a for a in c.atoms if a[0] == c.predicate)
    wrong = _swap(p, "(" + " ".join(a) + ")", f"({other[0]} {a[1]})")
    assert S.typed_grounding(nl, d, wrong) < 1.0
    more = p.replace("(:init", "(:init " + extra.format(names[0]), 1)
    assert S.typed_grounding(nl, d, more) < 1.0
    i = p.index(drop, p.index("(:init"))
    less = p[:i] + p[p.index(")", i) + 1:]
    assert S.typed_grounding(nl, d, less) < 1.0
    assert S.typed_grounding(nl, d, "(define (problem") == 0.0
    assert S.typed_grounding("no statement here", d, p) is None


def test_statement_atoms_pair_each_clause_with_its_atoms():
    nl, d, p = _planbench("mystery_blocksworld")
    clauses, atoms = S.statement_atoms(nl, d, p)
    said = {c.text: c for c in clauses}
    c = next(c for t, c in said.items() if "craves" in t)
    assert c.predicate == "craves" and len(c.key) == 2 and c.atoms == (("craves",) + c.key,)
    assert said["harmony"].predicate == "harmony" and ("harmony",) in said["harmony"].atoms
    assert {part for part, _ in atoms} == {"init", "goal"}
    assert all(c.text and not c.text.startswith(("as initial", "is to have")) for c in clauses)


class ClauseScorer:
    """log p(clause | context): -1 per clause word, +0.5 for each word the context's atom spells."""

    def __init__(self):
        self.calls = []

    def logprobs(self, contexts, continuation):
        self.calls.append((list(contexts), continuation))
        words = continuation.split()
        return [(sum(-1.0 + (0.5 if w in re.findall(r"[a-z0-9_]+", c.split(S.CLAUSE_HEAD)[-1]) else 0.0)
                     for w in words), len(words)) for c in contexts]


def test_clause_likelihoods_score_each_clause_against_its_atoms():
    nl, d, p = _planbench("mystery_blocksworld")
    c = next(c for c in S.statement_atoms(nl, d, p)[0] if c.predicate == "craves")
    own = "(" + " ".join(c.atoms[0]) + ")"
    swapped = _swap(p, own, "(" + " ".join(("province",) + c.atoms[0][1:2]) + ")")
    fake = ClauseScorer()
    out = S.clause_likelihoods(fake, nl, d, [p, None, swapped, p])
    assert out[1] is None and out[0] == out[3]
    assert out[0]["mean"] > out[2]["mean"] and out[0]["min"] > out[2]["min"]
    assert out[2]["min"] == 0.0  # the craves clause has no atom over its names left: it gains nothing
    texts = [cont for _, cont in fake.calls]
    assert len(texts) == len(set(texts))  # each clause scored once for all the problems
    for ctxs, _ in fake.calls:
        assert ctxs[0] == S.clause_context(()) and len(ctxs) == len(set(ctxs))
    assert S.clause_likelihoods(fake, "no statement", d, [p]) == [None]


def test_clause_likelihoods_on_micro_run_end_to_end():
    torch = pytest.importorskip("torch")
    from omtr.model import build_model

    torch.manual_seed(0)
    m = build_model("micro")
    m.eval()
    nl, d, p = _planbench("blocksworld")
    out = S.clause_likelihoods(S.BackboneScorer(m, batch_size=4), nl, d, [p, None])
    assert out[1] is None and all(math.isfinite(out[0][k]) for k in ("mean", "min"))
    assert out[0]["min"] <= out[0]["mean"]


# ----------------------------------------------------------------------------- choosing


def test_choose_takes_the_best_eligible_and_shares_ties():
    assert S.choose([0.2, 0.9, 0.9, 0.5], [True, True, True, True]) == [0.0, 0.5, 0.5, 0.0]
    assert S.choose([0.2, 0.9, None, 0.5], [True, False, True, True]) == [0.0, 0.0, 0.0, 1.0]
    assert S.choose([None, None], [True, True]) == [0.5, 0.5]
    assert S.choose([1.0, 2.0], [False, False]) == [0.0, 0.0]


# ----------------------------------------------------------------------------- no reference


def test_signals_module_cannot_reach_a_reference():
    """The training side's import rule (tests/test_tasks_records.py) holds here too: no omtr.tasks
    but omtr.tasks.training, no evaluation package; and no function takes a task or a reference."""
    tree = ast.parse((SRC / "faithfulness" / "signals.py").read_text(encoding="utf-8"))
    mods = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.append(node.module)
        elif isinstance(node, ast.Import):
            mods.extend(a.name for a in node.names)
    bad = [m for m in mods if (m.startswith("omtr.tasks") and m != "omtr.tasks.training")
           or m.startswith("omtr.evaluation")]
    assert not bad, bad
    for name in S.__all__:
        obj = getattr(S, name)
        fn = obj.__init__ if inspect.isclass(obj) else obj
        params = set(inspect.signature(fn).parameters)
        assert not params & {"task", "reference", "ref", "task_reference"}, (name, params)


def test_typed_grounding_scores_every_reference_one_and_reads_type_clauses():
    """Every PlanBench reference (every 25th task of each family, spelled as its English spells it)
    and every generator family's references score 1. Generated Logistics states its airports as a
    type ("location_0_0 is an airport"): the declaration `location_0_0 - airport` is that clause's
    pairing; declared as a plain location, the clause has none."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.tasks.generators import generate
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    tasks = import_planbench(shipped_root())[::25]
    for fam in ("blocksworld", "mystery_blocksworld", "gripper", "logistics"):
        tasks += generate(fam, 4, 7, verify=False)
    assert {t.family for t in tasks} >= {"blocksworld", "mystery_blocksworld", "logistics", "depots", "gripper"}
    low = [(t.id, S.typed_grounding(t.nl, t.reference.domain, spelled_problem(t))) for t in tasks]
    assert all(g == 1.0 for _, g in low), [x for x in low if x[1] != 1.0]
    t = generate("logistics", 1, 7, verify=False)[0]
    p = spelled_problem(t)
    airport = next(w for w in t.nl.split("As initial conditions")[1].split(", ") if w.endswith("is an airport"))
    name = airport.split()[0]
    i = p.index(name, p.index("(:objects"))
    retyped = p[:i] + p[i:].replace(" - airport", " - location", 1)  # its group declared plain locations
    assert retyped != p
    g = S.grounding(t.nl, t.reference.domain, retyped)
    assert g.score < 1.0 and airport.strip() in g.unpaired


def test_typed_grounding_stands_aside_for_a_problem_in_its_own_names():
    """PlanBench's own problems call "the red block" `a`: no pairing can be read (None), rather than
    a score that would call the faithful reference unfaithful; one statement name used is enough to read it."""
    from omtr.tasks.planbench import import_config
    from omtr.tasks.planbench_data import shipped_root

    t = min(import_config(shipped_root(), "blocksworld"), key=lambda t: len(t.nl))
    assert S.typed_grounding(t.nl, t.reference.domain, t.reference.problem) is None
    nl, d, p = _planbench("blocksworld")
    assert S.typed_grounding(nl, d, p) == 1.0


def test_typed_grounding_counts_a_type_the_english_never_gives():
    """The other side of the type clauses: generated Logistics says which locations are airports; a
    location declared an airport that no clause calls one (what the main job's model wrote on
    2026-12-05, solved, `type_changed` for the checker) is an unstated fact: the score drops below 1
    and the pairing names it, so the support verdict is no longer `supported`."""
    import re as _re

    from omtr.evaluation.spelling import spelled_problem
    from omtr.faithfulness.support import grounding_reason
    from omtr.tasks.generators import generate

    t = generate("logistics", 1, 7, verify=False)[0]
    p = spelled_problem(t)
    assert S.typed_grounding(t.nl, t.reference.domain, p) == 1.0
    m = _re.search(r"(\S+) - location", p)
    plain = m.group(1)
    assert f"{plain} is an airport" not in t.nl
    hacked = p.replace(f"{plain} - location", f"{plain} - airport", 1)
    g = S.grounding(t.nl, t.reference.domain, hacked)
    assert g.score < 1.0 and ("init", ("airport", plain)) in g.unsaid
    assert grounding_reason(t.nl, t.reference.domain, p) is None
    assert plain in (grounding_reason(t.nl, t.reference.domain, hacked) or "")
