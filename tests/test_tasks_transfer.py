"""Transfer benchmarks: generators write the official layouts, loaders read them, evaluators score them."""

from __future__ import annotations

import json

import pytest

from omtr.tasks.records import TaskFormatError, load_training_tasks, write_tasks
from omtr.tasks.transfer import BENCHMARKS, score_answers
from omtr.tasks.transfer import natural_plan, prontoqa


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_generate_write_official_json_load_and_score_gold(tmp_path, name):
    bench = BENCHMARKS[name]
    raw = bench.generate(60, 3)
    assert raw == bench.generate(60, 3)  # deterministic
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    tasks = bench.load(str(path))
    assert len(tasks) == 60 and len({t.id for t in tasks}) == 60
    assert all(t.family == bench.family and t.reference is None for t in tasks)
    gold = {t.id: t.meta.get("golden_plan") or t.meta["answer"] for t in tasks}
    summary, rows = score_answers(tasks, gold)
    assert summary["accuracy"] == 1.0
    summary, _ = score_answers(tasks, {})
    assert summary["accuracy"] == 0.0
    # gold answers are evaluation-only: the training loader drops them
    write_tasks(tmp_path / "t.jsonl", tasks)
    for t in load_training_tasks(tmp_path / "t.jsonl"):
        assert "answer" not in t.meta and "golden_plan" not in t.meta


def test_prontoqa_hops_distractors_and_normalisation():
    raw = prontoqa.generate(50, 0)
    tasks = prontoqa.to_tasks(raw)
    assert {t.meta["hops"] for t in tasks} == {1, 2, 3, 4, 5}
    assert {t.meta["answer"] for t in tasks} == {"True", "False"}
    ex = raw["example1"]["test_example"]
    assert ex["query"].startswith("True or false: ") and ex["chain_of_thought"]
    # the queried property also appears with the opposite sign (a distractor)
    adj = ex["query"].rstrip(".").split()[-1]
    assert ex["question"].count(adj) >= 2
    t = tasks[0]
    right, wrong = t.meta["answer"], "False" if t.meta["answer"] == "True" else "True"
    assert prontoqa.score(t, f"Let me think... so the answer is {right.upper()}.")
    assert not prontoqa.score(t, f"At first {right}, but then {wrong}.")
    assert not prontoqa.score(t, "I cannot tell.")
    # the official layout also carries in-context examples; the loader takes the test example
    both = {"example1": {"in_context_example0": ex, "test_example": ex}}
    assert prontoqa.to_tasks(both)[0].nl == f"{ex['question']}\n{ex['query']}"
    with pytest.raises(TaskFormatError):
        prontoqa.to_tasks({"e": {"test_example": {"question": "q"}}})


def test_prontoqa_answers_follow_from_the_rules():
    # replay the chain of thought: the entity's concept chain reaches the queried property
    for ex in prontoqa.generate(40, 1).values():
        t = ex["test_example"]
        conclusion = t["chain_of_thought"][-1]  # "Rex is not calm."
        claim = t["query"].split(": ", 1)[1]  # "Rex is calm."
        assert (conclusion == claim) == (t["answer"] == "True")
        for step in t["chain_of_thought"][1::2][: len(t["chain_of_thought"]) // 2 - 1]:
            assert step.split(".")[0] in t["question"]  # every rule used is stated


def test_trip_scoring_follows_the_whole_sequence():
    raw = natural_plan.generate_trip(30, 0)
    tasks = natural_plan.to_tasks(raw, "trip")
    t = tasks[0]
    cities, durs = t.meta["cities"].split("**"), [int(x) for x in t.meta["durations"].split("**")]
    plan = t.meta["golden_plan"]
    assert natural_plan.parse_trip(plan, cities) == list(zip(cities, durs))
    assert natural_plan.score_trip(t, plan.replace("**", ""))  # formatting does not matter
    swapped = plan.replace(cities[0], "TMP").replace(cities[1], cities[0]).replace("TMP", cities[1])
    assert not natural_plan.score_trip(t, swapped)
    assert not natural_plan.score_trip(t, "\n".join(plan.splitlines()[:-1]))  # a city missing
    for ex in raw.values():  # every generated trip has a unique valid order
        assert "prompt_5shot" in ex and ex["prompt_5shot"].count("TASK:") == 6


def test_calendar_gold_is_the_only_free_slot_and_parsing_is_strict():
    raw = natural_plan.generate_calendar(40, 0)
    for key, ex in raw.items():
        day, sh, sm, eh, em = natural_plan.parse_slot(ex["golden_plan"])
        assert (eh * 60 + em) - (sh * 60 + sm) == ex["duration"] * 60
    t = natural_plan.to_tasks(raw, "calendar")[0]
    day, sh, sm, eh, em = natural_plan.parse_slot(t.meta["golden_plan"])
    assert natural_plan.score_calendar(t, f"Here is the proposed time: {day}, {sh:02d}:{sm:02d} - {eh}:{em:02d}")
    assert not natural_plan.score_calendar(t, f"{day}, {sh}:{sm:02d} - {eh + 1}:{em:02d}")
    assert not natural_plan.score_calendar(t, "no time works")
    with pytest.raises(TaskFormatError, match="missing fields"):
        natural_plan.to_tasks({"x": {"prompt_0shot": "p"}}, "calendar")


def test_score_rejects_non_transfer_tasks():
    from omtr.tasks.records import Task

    with pytest.raises(ValueError, match="not a transfer benchmark"):
        score_answers([Task("a", "blocksworld", None, "x")], {})
