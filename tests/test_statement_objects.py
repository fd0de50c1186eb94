"""The statement's names as objects: read from the English alone, declared first under scoped decoding.

A problem whose objects are not the task's (one object named after the domain, ``ball_red`` for
``ball_1``) can never be faithful; the scope rules make the problem declare the names its statement
uses before any of its own. These tests read real generated tasks, check the tracker's rules, and
decode with the micro model through both rollout engines and the episode loop (the random walks
with required names are in test_model_scope.py, beside the other walks)."""

import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

from omtr.model.scope import ScopeTracker, given_declarations  # noqa: E402
from omtr.pddl.model import parse_problem  # noqa: E402
from omtr.solver import examples  # noqa: E402
from omtr.statement import statement_objects  # noqa: E402

GRIPPER_NL = ("A robot with a left and a right gripper carries balls between rooms; a gripper is free when it "
              "holds no ball, and the robot is in one room at a time.\n[STATEMENT]\nAs initial conditions I have "
              "that, the robot is in room_1, the left gripper is free, ball_1 is in room_1 and ball_2 is in room_2.\n"
              "My goal is to have that ball_1 is in room_2.")
HEAD = "(define (problem p) (:domain gripper-typed) (:objects "


def _tracker(text: str, objects, given=None) -> ScopeTracker:
    t = ScopeTracker(given or given_declarations(examples.GRIPPER_DOMAIN), objects=objects)
    t.feed_text(text)
    return t


# ------------------------------------------------------------------ reading the names


@pytest.mark.parametrize("family", ["blocksworld", "gripper", "logistics", "mystery_blocksworld"])
def test_the_names_are_the_statements_own_spellings(family):
    from omtr.tasks.generators import generate

    for t in generate(family, 4, 31, min_objects=2, max_objects=4, verify=False):
        names = statement_objects(t.nl)
        assert names, t.nl[-300:]
        stmt = t.nl[t.nl.rfind("[STATEMENT]"):].lower()
        assert len(set(names)) == len(names)
        words = re.findall(r"[a-z0-9][a-z0-9_\-]*", stmt)
        assert all(n in words for n in names)
        assert names == sorted(names, key=words.index)  # in order of first use
        ref = set(parse_problem(t.reference.problem).objects)
        # every name is an object of the task (the reference may spell it otherwise: ``a`` for
        # "the red block", ``room1`` for ``room_1``): as many names as reference objects at most
        assert len(names) <= len(ref)


def test_text_without_a_statement_names_nothing():
    # free English: the plain reader's names (issue 43), colours before a noun among them
    assert statement_objects("move the red block onto the blue block") == ["red", "blue"]
    assert statement_objects("move the block onto the table") is None
    # words of the domain's description are not names
    assert statement_objects("My hand is empty or holds a block.\n[STATEMENT]\n"
                             "As initial conditions I have that, the hand is empty.") is None
    assert statement_objects(GRIPPER_NL) == ["room_1", "ball_1", "ball_2", "room_2"]


# ------------------------------------------------------------------ the scope rules


def test_the_names_come_first_and_the_list_cannot_close_without_them():
    names = ["room_1", "ball_1", "ball_2", "room_2"]
    t = _tracker(HEAD, names)
    assert t.admits("room_1") and t.admits("ball_2 ")
    assert not t.admits("hall ") and not t.admits("ball_red")
    t = _tracker(HEAD + "room_1 room_2 - room ball_1", names)
    assert not t.admits(")")  # ball_2 is missing
    assert not t.admits(" ball_1 ")  # nothing twice
    assert not t.admits(" left")  # a name of its own only after all of the statement's
    t = _tracker(HEAD + "room_1 room_2 - room ball_1 ball_2 - ball", names)
    assert t.admits(")") and t.admits(" left right - gripper)")
    # without the names nothing of this is required
    t = _tracker(HEAD, None)
    assert t.admits("hall - room)")


def test_a_group_named_after_a_type_takes_that_type():
    names = ["room_1", "ball_1", "ball_2", "room_2"]
    t = _tracker(HEAD + "ball_1 ball_2 - ", names)
    assert t.admits("ball ") and not t.admits("room ") and not t.admits("gripper ")
    t = _tracker(HEAD + "ball_1", names)  # one group, one type: room_1 cannot join ball_1
    assert not t.admits(" room_1 ") and t.admits(" ball_2 ") and t.admits(" - ball")
    t = _tracker(HEAD + "ball_1 ball_2 - ball room_1 room_2 - ", names)
    assert t.admits("room)") and not t.admits("ball")


def test_names_that_do_not_fit_the_grammar_are_not_required():
    t = _tracker(HEAD, ["1st", "Ball_1", "x" * 200, "ball_1"])
    assert t.required == ("ball_1",)
    many = [f"ball_{i}" for i in range(40)]
    assert _tracker(HEAD, many, given=given_declarations(examples.GRIPPER_DOMAIN)).required == ()  # over the bound


# ------------------------------------------------------------------ with a model


@pytest.fixture(scope="module")
def micro():
    from omtr.model import load_model

    return load_model("micro")


def _given_prompts(n=2):
    from omtr.inference.prompts import actor_messages
    from omtr.tasks.training import TrainingTask

    return [actor_messages(TrainingTask(f"t{i}", "gripper", None, GRIPPER_NL, domain=examples.GRIPPER_DOMAIN))
            for i in range(n)]


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_both_engines_declare_the_names_and_the_replay_is_exact(micro, engine):
    from omtr.policy import Sampling
    from omtr.rollout import make_engine

    prompts = _given_prompts()
    names = statement_objects(GRIPPER_NL)
    domains = [examples.GRIPPER_DOMAIN] * len(prompts)
    eng = make_engine(engine, micro)
    assert eng.takes_objects
    s = Sampling(greedy=False, temperature=1.0, max_new_tokens=160, seed=3)
    gens = eng.generate("actor", prompts, s, domains=domains, objects=[names] * len(prompts), constraint="scoped")
    for g in gens:
        head = g.text[g.text.find("(:objects"):]
        declared = head[:head.find(")")]
        assert all(n in declared.split() for n in names), g.text
    lp, mask = micro.token_logprobs("actor", prompts, [g.token_ids for g in gens], domains=domains,
                                    objects=[names] * len(prompts), constraint="scoped")
    tol = 1e-4 if engine == "hf" else 0.5  # the fast engine's int8 weights are near the policy, not equal
    for b, g in enumerate(gens):
        assert torch.allclose(lp[b, :len(g.token_ids)], torch.tensor(g.logprobs), atol=tol)
    # the replay without the names differs on these tokens: the names are part of the masks
    free, _ = micro.token_logprobs("actor", prompts, [g.token_ids for g in gens], domains=domains, constraint="scoped")
    assert (free[mask] < lp[mask] - 1e-4).any()


def test_the_config_switch_turns_the_rule_off(micro):
    import dataclasses

    from omtr.policy import Sampling

    prompts = _given_prompts(1)
    old = micro.cfg
    try:
        micro.cfg = dataclasses.replace(old, statement_objects=False)
        assert micro._objects([["ball_1"]], 1) == [None]  # names without a reading: nothing to size either
        got = micro._objects([statement_objects(GRIPPER_NL)], 1)[0]
        assert not got.require  # the statement's names only size the grammar's bounds
    finally:
        micro.cfg = old
    assert micro._objects([["ball_1"]], 1) == [("ball_1",)]
    with pytest.raises(ValueError, match="object-name lists"):
        micro.generate("actor", prompts, Sampling(greedy=True, max_new_tokens=4), objects=[["a"], ["b"]])


def test_the_episode_loop_passes_each_statements_names(micro):
    from omtr.inference.episode import run_episodes
    from omtr.policy import Sampling
    from omtr.solver import SolverPool
    from omtr.tasks.training import TrainingTask

    seen = []

    class Spy:
        takes_objects = True

        def __init__(self, inner):
            self.inner = inner

        def generate(self, role, prompts, sampling, **kw):
            seen.append(kw.get("objects"))
            return self.inner.generate(role, prompts, sampling, **kw)

        def judge(self, prompts):
            return self.inner.judge(prompts)

    task = TrainingTask("g1", "gripper", None, GRIPPER_NL, domain=examples.GRIPPER_DOMAIN)
    with SolverPool(1) as pool:
        eps = run_episodes([task], Spy(micro), pool, budget=1, judge=False,
                           sampling=Sampling(greedy=True, max_new_tokens=120))
    assert seen and seen[0] == [statement_objects(GRIPPER_NL)]
    prob = eps[0].steps[0].problem or eps[0].steps[0].text
    assert "room_1" in prob and "ball_2" in prob


def test_every_episode_records_the_rules_it_ran_under(micro):
    """The rule set an episode's answers ran under reaches its trace, the episode log and
    metrics.json, counted per set."""
    import dataclasses

    from omtr.evaluation.metrics import compute_metrics
    from omtr.inference.episode import decoding_rules, run_episodes
    from omtr.policy import Sampling
    from omtr.solver import SolverPool
    from omtr.statement import read_statement
    from omtr.tasks.training import TrainingTask
    from omtr.validation.episodes import rows_from_traces

    free = GRIPPER_NL[:GRIPPER_NL.rfind("[STATEMENT]")] + "Move every ball to the other room."
    tasks = [TrainingTask("g1", "gripper", None, GRIPPER_NL, domain=examples.GRIPPER_DOMAIN),
             TrainingTask("g2", "gripper", None, free, domain=examples.GRIPPER_DOMAIN)]
    with SolverPool(1) as pool:
        eps = run_episodes(tasks, micro, pool, budget=1, judge=False, sampling=Sampling(greedy=True, max_new_tokens=40))
    assert [e.rules for e in eps] == ["scoped+objects+facts+predicates", "scoped"]  # the free English: the rules stand aside
    assert [e.to_json()["rules"] for e in eps] == ["scoped+objects+facts+predicates", "scoped"]
    assert "stand aside" in eps[1].to_json()["reading"]  # the trace says why
    rows = rows_from_traces(eps, "run", 0)
    assert {r["task_id"]: r["rules"] for r in rows} == {"g1": "scoped+objects+facts+predicates", "g2": "scoped"}
    m = compute_metrics([e.to_json() for e in eps], bootstrap=20)
    assert m["overall"]["rules"] == {"scoped+objects+facts+predicates": 1, "scoped": 1}
    reading = read_statement(GRIPPER_NL)
    old = micro.cfg
    try:
        micro.cfg = dataclasses.replace(old, decoding="plain")
        assert decoding_rules(micro, reading) == "plain"
        micro.cfg = dataclasses.replace(old, statement_facts=False)
        assert decoding_rules(micro, reading) == "scoped+objects"
    finally:
        micro.cfg = old
    assert decoding_rules(object(), reading) == "off"  # a policy without omtr's decoder
