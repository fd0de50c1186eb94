"""Answers sized by the task: a PDDL answer's token limit grows with what its statement says.

PlanBench's Logistics states up to 24 names and 31 clauses; under a fixed 768-token limit half of
the small model's answers were cut off before the goal. :func:`omtr.model.grammar.answer_tokens`
sizes the limit from the statement's names and clauses (as the grammar's bounds are sized), both
engines decode up to it, and a task whose answer would not fit the model's context is an error that
names the task."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

from omtr.model.grammar import answer_tokens  # noqa: E402
from omtr.model.scope import given_declarations  # noqa: E402
from omtr.policy import ContextOverflow, Sampling  # noqa: E402
from omtr.statement import statement_objects  # noqa: E402


@pytest.fixture(scope="module")
def planbench():
    from omtr.tasks.planbench import import_planbench
    from omtr.tasks.planbench_data import shipped_root

    return import_planbench(shipped_root())


def _largest(tasks, variant):
    return max((t for t in tasks if t.meta.get("variant") == variant), key=lambda t: len(t.nl))


def _smallest(tasks, variant):
    return min((t for t in tasks if t.meta.get("variant") == variant), key=lambda t: len(t.nl))


def test_the_estimate_grows_with_the_statement_and_ignores_free_english(planbench):
    small = min((t for t in planbench if t.meta.get("variant") == "blocksworld_3"), key=lambda t: len(t.nl))
    big = _largest(planbench, "logistics")
    s = answer_tokens(statement_objects(small.nl), given_declarations(small.reference.domain))
    b = answer_tokens(statement_objects(big.nl), given_declarations(big.reference.domain))
    assert s < 448 < 768 < b  # a three-block task keeps the configured limit; the largest Logistics needs more
    # the full mode adds the domain's share
    assert answer_tokens(statement_objects(big.nl), None) > b
    # no reading of the statement: nothing to size from
    assert answer_tokens(None) == 0 and answer_tokens(["a", "b"]) == 0


def test_the_estimate_covers_every_reference_on_smollm2(planbench):
    """On SmolLM2's tokenizer, every PlanBench reference (every 7th task of each configuration) and
    generated ones fit the estimate with room to spare, in both modes."""
    from transformers import AutoTokenizer

    from omtr.evaluation.spelling import spelled_problem
    from omtr.model.backbone import BackboneError, smollm2_folder
    from omtr.tasks.generators import generate

    try:
        tok = AutoTokenizer.from_pretrained(str(smollm2_folder()))
    except BackboneError as exc:
        pytest.skip(str(exc))
    tasks = planbench[::7]
    for fam in ("blocksworld", "mystery_blocksworld", "gripper", "logistics"):
        tasks += generate(fam, 6, 31, verify=False)
    for t in tasks:
        prob = len(tok.encode(spelled_problem(t).lower()))
        dom = len(tok.encode(t.reference.domain.lower()))
        names = statement_objects(t.nl)
        assert answer_tokens(names, given_declarations(t.reference.domain)) >= 1.3 * prob, t.id
        assert answer_tokens(names, None) >= 1.2 * (prob + dom), t.id


def _generated():
    from omtr.tasks.generators import generate

    return generate("gripper", 1, 12, min_objects=4, max_objects=4, verify=False)[0]


@pytest.fixture(scope="module")
def micro():
    from omtr.model import load_model

    return load_model("micro")


def _prompt(task):
    from omtr.inference.prompts import actor_messages
    from omtr.tasks.training import TrainingTask

    return actor_messages(TrainingTask(task.id, task.family, None, task.nl, domain=task.reference.domain))


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_both_engines_write_past_a_fixed_limit_the_task_exceeds(micro, planbench, engine):
    from omtr.rollout import make_engine

    task = _generated()  # the micro tokenizer spells PlanBench's Logistics prompts in 3,700-4,000 tokens
    names = statement_objects(task.nl)
    eng = make_engine(engine, micro)
    kw = dict(domains=[task.reference.domain], objects=[names], constraint="scoped")
    fixed = eng.generate("actor", [_prompt(task)],
                         Sampling(greedy=True, max_new_tokens=24, fit_statement=False), **kw)[0]
    assert len(fixed.token_ids) == 24 and fixed.finish_reason == "length"
    # sized: the answer goes on past 24 tokens (the random micro model writes until the grammar's
    # bounds close the problem or the statement's limit is reached)
    sized = eng.generate("actor", [_prompt(task)], Sampling(greedy=True, max_new_tokens=24), **kw)[0]
    limit = micro.answer_limits(Sampling(max_new_tokens=24), micro.encode_prompts([_prompt(task)]),
                                "scoped", [given_declarations(task.reference.domain)], micro._objects([names], 1))
    assert limit == [answer_tokens(names, given_declarations(task.reference.domain))]
    assert 24 < len(sized.token_ids) <= limit[0]
    assert sized.token_ids[:24] == fixed.token_ids  # the same answer, not cut off


def test_a_task_too_large_for_the_context_is_an_error_naming_it(micro, planbench, monkeypatch):
    from omtr.inference.episode import run_episodes
    from omtr.tasks.training import TrainingTask

    task = _generated()
    prompt_len = len(micro.encode_prompts([_prompt(task)])[0])
    need = answer_tokens(statement_objects(task.nl), given_declarations(task.reference.domain))
    assert need > 64
    monkeypatch.setattr(micro.lm.config, "max_position_embeddings", prompt_len + need - 8)
    t = TrainingTask(task.id, task.family, None, task.nl, domain=task.reference.domain)

    class NoEnv:
        def solve_many(self, specs):  # pragma: no cover - the error comes before any planner call
            raise AssertionError("no spec should reach the planner")

    with pytest.raises(ContextOverflow, match=task.id) as err:
        run_episodes([t], micro, NoEnv(), budget=1, sampling=Sampling(greedy=True, max_new_tokens=64))
    assert "context" in str(err.value) and "tokens" in str(err.value)
