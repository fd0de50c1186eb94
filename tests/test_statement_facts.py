"""The statement's facts under scoped decoding: each :init and goal atom over the task's names stands
for one clause of the statement, read from the English alone.

With the names rule alone (test_statement_objects.py) a small model declares the task's objects and
then writes facts of its own making, which the planner solves and the checker never calls faithful.
The facts rule leaves only the predicates to the model. These tests read real generated tasks, check
the tracker's rules on hand-written answers, walk the decoder at random (no dead end, every finished
answer keeps the rule) and check the config switch."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

from omtr.model.grammar import PddlGrammar  # noqa: E402
from omtr.model.limits import GrammarLimits  # noqa: E402
from omtr.model.scope import ScopeTracker, given_declarations  # noqa: E402
from omtr.pddl.model import conjunction_literals, parse_problem  # noqa: E402
from omtr.statement import StatementNames, statement_objects  # noqa: E402
from scope_helpers import walk  # noqa: E402

def _described(family: str, statement: str) -> str:
    """A generated task's own description of its domain, with ``statement`` as the statement."""
    from omtr.tasks.generators import generate

    nl = generate(family, 1, 5, min_objects=2, max_objects=2, verify=False)[0].nl
    return nl[:nl.rfind("[STATEMENT]")] + "[STATEMENT]\n" + statement


BW_NL = _described("blocksworld", (
    "As initial conditions I have that, the blue block is clear, the yellow block is clear, the hand is empty, the "
    "blue block is on top of the orange block, the orange block is on top of the red block, the red block is on the "
    "table and the yellow block is on the table.\nMy goal is to have that the red block is on top of the orange "
    "block and the blue block is on top of the yellow block."))
BW_OK = ("(define (problem p) (:domain blocksworld-4ops) (:objects blue yellow orange red)"
         " (:init (clear blue) (clear yellow) (handempty) (on blue orange) (on orange red) (ontable red) (ontable yellow))"
         " (:goal (and (on red orange) (on blue yellow))))")
GRIPPER_NL = _described("gripper", (
    "As initial conditions I have that, the robot is in room_1, the left gripper is free, the right gripper is "
    "free, ball_1 is in room_1 and ball_2 is in room_1.\nMy goal is to have that ball_1 is in room_1 and ball_2 "
    "is in room_3."))
GRIPPER_OK = ("(define (problem p) (:domain gripper-omtr) (:objects room_1 - room ball_1 ball_2 - ball room_3 - room"
              " left right - gripper) (:init (at-robby room_1) (free left) (free right) (at ball_1 room_1)"
              " (at ball_2 room_1)) (:goal (and (at ball_1 room_1) (at ball_2 room_3))))")


def _domain(family):
    from omtr.tasks.generators import generate

    return generate(family, 1, 5, min_objects=2, max_objects=2, verify=False)[0].reference.domain


@pytest.fixture(scope="module")
def domains():
    return {"blocksworld": _domain("blocksworld"), "gripper": _domain("gripper")}


def _admits(domain, nl, text, limits=None):
    return ScopeTracker(given_declarations(domain), objects=statement_objects(nl), limits=limits).admits(text)


def test_the_facts_are_each_clauses_names_in_order():
    names = statement_objects(BW_NL)
    assert isinstance(names, StatementNames) and names == ["blue", "yellow", "orange", "red"]
    init, goal = names.facts
    assert init == (("blue",), ("yellow",), ("blue", "orange"), ("orange", "red"), ("red",), ("yellow",))
    assert goal == (("red", "orange"), ("blue", "yellow"))
    assert names.nameless == (1, 0)  # "the hand is empty"
    g = statement_objects(GRIPPER_NL)
    assert g.facts == ((("room1",), ("ball1", "room1"), ("ball2", "room1")), (("ball1", "room1"), ("ball2", "room3")))
    assert g.nameless == (2, 0)  # the left and the right gripper are free ("left" is a word of the description)


@pytest.mark.parametrize("family", ["blocksworld", "gripper"])
def test_every_generated_tasks_facts_match_its_reference(family):
    """On real generated tasks the clause keys are the reference's atoms over named objects, part by
    part (a sanity check of the reading; the rule never sees a reference)."""
    from omtr.statement import _norm
    from omtr.tasks.generators import generate

    for t in generate(family, 6, 17, min_objects=2, max_objects=4, verify=False):
        names = statement_objects(t.nl)
        init, goal = names.facts
        prob = parse_problem(t.reference.problem)
        named_init = [a for a in prob.init if len(a) > 1]
        named_goal = [a for a, _pos in conjunction_literals(prob.goal) if len(a) > 1]
        # a clause with names per reference atom with arguments; Gripper's nameless clauses are the
        # grippers' (free left), BlocksWorld's the hand's (handempty), which has none
        assert len(init) == len(named_init) - (names.nameless[0] if family == "gripper" else 0), t.nl[-400:]
        assert len(goal) == len(named_goal), t.nl[-400:]
        assert all(len(k) in (1, 2) and all(n in {_norm(x) for x in names} for n in k) for k in init + goal)


def test_the_tasks_own_problem_is_admitted(domains):
    assert _admits(domains["blocksworld"], BW_NL, BW_OK)
    assert _admits(domains["gripper"], GRIPPER_NL, GRIPPER_OK)
    # "the blue block is clear" names its predicate: another one is refused under the predicates rule,
    # and stays the model's choice without it
    wrong = BW_OK.replace("(clear blue)", "(ontable blue)")
    assert not _admits(domains["blocksworld"], BW_NL, wrong)
    free = statement_objects(BW_NL).view(predicates=False)
    assert ScopeTracker(given_declarations(domains["blocksworld"]), objects=free).admits(wrong)


@pytest.mark.parametrize("change", [
    ("(on orange red) ", ""),                                          # a clause without its atom
    ("(handempty)", "(handempty) (on red blue)"),                      # an atom for no clause
    ("(on blue orange)", "(on orange blue)"),                          # the clause's names in another order
    ("(and (on red orange) (on blue yellow))", "(on red orange)"),     # a goal of one fact for two clauses
    (" (on blue yellow)", ""),                                         # a goal clause without its atom
    ("(on red orange) (on blue yellow)", "(on red orange) (on blue yellow) (clear red)"),  # a goal fact of its own
    ("(:objects blue yellow orange red)", "(:objects blue yellow orange red green)"),  # a name the English never says
    ("(:objects blue yellow orange red)", "(:objects blue yellow orange red hand)"),   # a word of the text, not needed
    ("(:objects blue yellow orange red)", "(:objects blue yellow orange red blue-red)"),  # two names joined
])
def test_a_problem_that_leaves_the_statement_is_refused(domains, change):
    old, new = change
    text = BW_OK.replace(old, new)
    assert text != BW_OK
    assert not _admits(domains["blocksworld"], BW_NL, text)


def test_clauses_without_names_get_atoms_over_the_problems_own_objects(domains):
    d = domains["gripper"]
    assert not _admits(d, GRIPPER_NL, GRIPPER_OK.replace("(free right)", "(free right) (carry ball_1 left)"))
    # two clauses without names: a third atom over no name has no clause
    third = GRIPPER_OK.replace("left right - gripper", "left right - gripper hall - room").replace(
        "(free right)", "(free right) (at-robby hall)")
    assert not _admits(d, GRIPPER_NL, third)
    # :objects cannot close without objects for the clauses that name nothing (the grippers)
    t = ScopeTracker(given_declarations(d), objects=statement_objects(GRIPPER_NL))
    t.feed_text("(define (problem p) (:domain gripper-omtr) (:objects room_1 - room ball_1 ball_2 - ball room_3 - room")
    assert not t.admits(")")
    assert t.admits(" left right - gripper)")
    # while they lack objects, an object of its own takes a type that gives them an atom
    assert not t.admits(" ball_9 - ball")
    assert not t.admits(" left - ball")
    # "the left gripper is free" names its predicate: a room (at-robby) does not stand in for the
    # gripper that (free ?) needs (SmolLM2 declared "ball - room balls - room" and no gripper)
    assert not t.admits(" ball - room")
    # the reading is sure of the names (PlanBench's layout): an object of its own is a word of the
    # task's text, no more of them than the clauses without names need
    assert not t.admits(" g1 - gripper")
    assert not t.admits(" left right room - gripper")
    assert t.admits(" left - gripper right - gripper)")
    # at the grammar's bound on objects the list has to close, and the rule yields
    full = GrammarLimits(objects=4)
    t = ScopeTracker(given_declarations(d), objects=statement_objects(GRIPPER_NL), limits=full)
    t.feed_text("(define (problem p) (:domain gripper-omtr) (:objects room_1 - room ball_1 ball_2 - ball room_3 - room")
    assert t.admits(")")
    # but objects of its own left untyped at the bound take the type their clauses need first
    t = ScopeTracker(given_declarations(d), objects=statement_objects(GRIPPER_NL), limits=GrammarLimits(objects=6))
    t.feed_text("(define (problem p) (:domain gripper-omtr) (:objects room_1 - room ball_1 ball_2 - ball room_3 - room"
                " ball balls")
    assert not t.admits(")")
    assert t.admits(" - gripper)") and not t.admits(" - room)")


def test_init_closes_only_when_every_clause_has_its_atom(domains):
    t = ScopeTracker(given_declarations(domains["blocksworld"]), objects=statement_objects(BW_NL))
    head = BW_OK[:BW_OK.find("(:init") + len("(:init")]
    t.feed_text(head + " (clear blue)")
    assert not t.admits(")")
    assert t.admits(" (on blue orange")
    assert not t.admits(" (on blue red")           # no clause names blue, red
    assert not t.admits(" (clear blue)")           # written already
    t.feed_text(" (clear yellow) (handempty)")
    assert not t.admits(" (handempty")             # the one clause without names has its atom


def test_without_the_names_rule_or_facts_nothing_changes(domains):
    d = domains["blocksworld"]
    free = BW_OK.replace("(on orange red) ", "")
    plain = list(statement_objects(BW_NL))  # the names without the facts
    assert ScopeTracker(given_declarations(d), objects=plain).admits(free)
    assert not ScopeTracker(given_declarations(d), objects=statement_objects(BW_NL)).admits(free)


def test_random_walks_under_the_facts_rule_never_dead_end_and_keep_it(domains):
    """Uniform random walks through the combined mask reach corners no model would: the tracker
    never leaves a step without a token (no fallback), and every finished problem has one atom per
    named clause, with the clause's names in order, in each part."""
    from omtr.model.backbone import build_micro_tokenizer
    from omtr.statement import _norm

    tok = build_micro_tokenizer(1024)
    g = PddlGrammar(tok, len(tok), GrammarLimits(name_len=8, objects=8, init=16, goal=8))
    for domain, nl in ((domains["blocksworld"], BW_NL), (domains["gripper"], GRIPPER_NL)):
        names = statement_objects(nl)
        init_keys, goal_keys = names.facts
        finished = 0
        for seed in range(16):
            text, done, st = walk(g, seed, given=given_declarations(domain), objects=names, max_steps=2500)
            assert not st.scope_left and st.fallbacks == 0, text
            if not done:
                continue
            finished += 1
            prob = parse_problem(text)
            nm = {_norm(n) for n in names}

            def keys(atoms):
                out = []
                for a in atoms:
                    k = tuple(_norm(x) if _norm(x) in nm else None for x in a[1:])
                    if any(k):
                        out.append(k)
                return sorted(out)

            assert keys(prob.init) == sorted(init_keys), text
            assert keys([a for a, _pos in conjunction_literals(prob.goal)]) == sorted(goal_keys), text
        assert finished >= 8


def test_the_config_switch_and_the_replay_keep_the_facts():
    import dataclasses

    from omtr.config import ModelConfig
    from omtr.model.roles import RoleModel

    names = statement_objects(BW_NL)
    m = RoleModel.__new__(RoleModel)
    m.cfg = ModelConfig()
    assert m.cfg.statement_facts
    got = m._objects([names], 1)[0]
    assert got.facts == names.facts  # passed on with the facts (generation and the update's replay alike)
    m.cfg = dataclasses.replace(ModelConfig(), statement_facts=False)
    got = m._objects([names], 1)[0]
    assert list(got) == list(names) and got.facts is None and got.require  # the names rule alone
    m.cfg = dataclasses.replace(ModelConfig(), statement_objects=False)
    got = m._objects([names], 1)[0]
    # the names no longer required: they only size the grammar's bounds for the statement
    assert list(got) == list(names) and got.facts is None and not got.require
    from omtr.model.scope import ScopeTracker, given_declarations

    assert ScopeTracker(given_declarations(_domain("blocksworld")), objects=got).required == ()


@pytest.mark.parametrize("config", ["mystery_blocksworld", "logistics"])
def test_random_walks_on_planbench_text_never_dead_end(config):
    """The same walks on PlanBench's own text, with the small profile's bounds: one-letter names
    (Mystery's "object a"), names the description uses in examples and static facts it never states
    (Logistics). Every finished problem declares the statement's names and has an atom per clause;
    atoms beyond the clauses are static facts only."""
    from collections import Counter

    from omtr.config import SMALL_GRAMMAR_LIMITS
    from omtr.model.backbone import build_micro_tokenizer
    from omtr.statement import _norm
    from omtr.tasks.planbench import import_config
    from omtr.tasks.planbench_data import shipped_root

    task = min(import_config(shipped_root(), config), key=lambda t: len(t.nl))
    tok = build_micro_tokenizer(1024)
    g = PddlGrammar(tok, len(tok), GrammarLimits(**SMALL_GRAMMAR_LIMITS))
    given = given_declarations(task.reference.domain)
    names = statement_objects(task.nl)
    assert names.facts is not None
    static = set(given.predicates) - set(given.fluents)
    finished = 0
    for seed in range(12):
        text, done, st = walk(g, seed, given=given, objects=names, max_steps=4000)
        assert not st.scope_left and st.fallbacks == 0, text
        if not done:
            continue
        finished += 1
        prob = parse_problem(text)
        assert set(names) <= set(prob.objects)
        nm = {_norm(n) for n in names}
        for atoms, want in ((prob.init, names.facts[0]), ([a for a, _ in conjunction_literals(prob.goal)], names.facts[1])):
            got = Counter(tuple(_norm(str(x)) for x in a[1:]) for a in atoms
                          if any(_norm(str(x)) in nm for x in a[1:]))
            assert not Counter(want) - got, text  # every clause has its atom
            extra = [a for a in atoms if str(a[0]) not in static and any(_norm(str(x)) in nm for x in a[1:])
                     and tuple(_norm(str(x)) for x in a[1:]) not in want]
            assert not extra, text  # beyond the clauses, static facts only
    assert finished >= 6


def test_static_facts_the_english_leaves_out_are_unary_named_and_one_per_object():
    """PlanBench's Logistics never states (truck truck_0) or (obj package_0); the facts rule lets
    :init hold such a fact beside the clauses: unary, one per object, the one its name holds."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.tasks.planbench import import_config
    from omtr.tasks.planbench_data import shipped_root

    task = min(import_config(shipped_root(), "logistics"), key=lambda t: len(t.nl))
    d = given_declarations(task.reference.domain)
    names = statement_objects(task.nl)
    from omtr.model.scope_check import _tokens, canonical

    ok = canonical(_tokens(spelled_problem(task).lower()))[0]  # as the grammar spaces it: no " )" in a list
    head = ok[:ok.index("(:init") + len("(:init")]
    t = ScopeTracker(d, objects=names)
    t.feed_text(head)
    assert t.admits(" (truck truck_0)") and t.admits(" (obj package_0)") and t.admits(" (location location_0_0)")
    assert not t.admits(" (truck city_0)")  # its name says city
    # a name that holds no static predicate takes only those no declared name holds: the packages
    # take obj, never truck, airplane, city or location (the trucks', planes', cities', places')
    assert not t.admits(" (truck package_0)") and not t.admits(" (airplane package_0)")
    assert not t.admits(" (location package_0)") and not t.admits(" (city package_0)")
    assert not t.admits(" (city location_0_0)")  # "location_0_0 is an airport" names its predicate
    # the statement states each airport ("location_0_0 is an airport"): an airport it does not
    # state is no fact it left out (SmolLM2 wrote (airport package_0) for (obj package_0))
    assert not t.admits(" (airport package_0)") and not t.admits(" (airport location_0_1)")
    assert not t.admits(" (in-city truck_0 city_0)")  # a binary static fact must be a clause
    t.feed_text(" (truck truck_0)")
    assert not t.admits(" (obj truck_0)")  # one per object
    # the name's own fact stands beside the clauses: "location_0_0 is an airport" keeps its atom
    t.feed_text(" (location location_0_0)")
    assert t.admits(" (airport location_0_0)")
    assert ScopeTracker(d, objects=names).admits(ok)


def _logistics_task():
    """A generated Logistics task (typed: ``airport - location``) and its reference spelled as its
    English spells it; its English says which locations are airports ("location_0_0 is an airport")."""
    from omtr.evaluation.spelling import spelled_problem
    from omtr.tasks.generators import generate

    t = generate("logistics", 1, 7, split="test", verify=False)[0]
    return t, spelled_problem(t)


def _objects_as(problem: str, types: dict) -> str:
    """``problem`` with its ``:objects`` rewritten as ``types`` (name -> type), one group per type."""
    import re as _re

    groups: dict[str, list] = {}
    for o, t in types.items():
        groups.setdefault(t, []).append(o)
    body = " ".join(" ".join(os_) + f" - {t}" for t, os_ in groups.items())
    return _re.sub(r"\(:objects [^)]*\)", f"(:objects {body})", problem, count=1)


def test_the_types_the_english_gives_go_to_those_names_only():
    """The main job's model (2026-12-05) declared every generated Logistics location an airport:
    solved, and the checker's `type_changed` (an airplane flies to a location the task never calls an
    airport). Where the English gives names a type by the type's own name, the type (or one below it)
    goes to those names only, and each of them takes it. The names rule alone stands aside."""
    from omtr.model.scope_check import check_spec

    t, p = _logistics_task()
    given = t.reference.domain
    assert check_spec(t.nl, p, given=given).admitted
    types = {o.lower(): str(ty).lower() for o, ty in parse_problem(p).objects.items()}
    airports = [o for o, ty in types.items() if ty == "airport"]
    plain = [o for o, ty in types.items() if ty == "location"]
    assert airports and plain and all(f"{o} is an airport" in t.nl for o in airports)
    assert not any(f"{o} is an airport" in t.nl for o in plain)

    every = _objects_as(p, {**types, **{o: "airport" for o in plain}})  # what the model wrote
    got = check_spec(t.nl, every, given=given)
    assert not got.admitted and got.rule == "statement_facts"
    assert got.at < every.index("(:init")  # refused in :objects, where the type is written
    one = _objects_as(p, {**types, plain[0]: "airport"})
    assert not check_spec(t.nl, one, given=given).admitted
    lost = _objects_as(p, {**types, airports[0]: "location"})  # an airport the English names, declared plain
    assert not check_spec(t.nl, lost, given=given).admitted
    # without the facts rule the names rule alone admits it, as before
    assert check_spec(t.nl, every, given=given, statement_facts=False).admitted


def test_random_walks_on_typed_logistics_never_dead_end_and_keep_the_types():
    """Random walks through the combined mask on a generated Logistics task: no step without a token,
    and every finished problem gives the airport type to the English's airports only."""
    from omtr.model.backbone import build_micro_tokenizer

    t, _ = _logistics_task()
    tok = build_micro_tokenizer(1024)
    g = PddlGrammar(tok, len(tok), GrammarLimits(name_len=12, objects=20, init=32, goal=12))
    names = statement_objects(t.nl)
    told = {n for n in names if f"{n} is an airport" in t.nl}
    assert told
    finished = 0
    for seed in range(6):
        text, done, st = walk(g, seed, given=given_declarations(t.reference.domain), objects=names, max_steps=4000)
        assert not st.scope_left and st.fallbacks == 0, text
        if not done:
            continue
        finished += 1
        objs = {o.lower(): str(ty).lower() for o, ty in parse_problem(text).objects.items()}
        assert {o for o, ty in objs.items() if ty == "airport"} == told, text
    assert finished >= 2
