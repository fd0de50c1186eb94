"""The demonstration shown in a given domain's vocabulary (omtr.inference.demo_vocab)."""

import re

import pytest

from omtr.faithfulness.checker import check
from omtr.inference import prompts as P
from omtr.inference.demo_vocab import in_given_vocabulary
from omtr.solver import solve_many
from omtr.tasks.generators import generate

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics", "gripper")


@pytest.fixture(scope="module")
def given():
    return {fam: generate(fam, 1, seed=11, verify=False, min_objects=2, max_objects=3)[0].with_given_domain()
            for fam in FAMILIES}


def _predicates(domain: str) -> set[str]:
    block = domain[domain.index("(:predicates"):]
    block = block[: block.index("(:action")]
    return set(re.findall(r"\(([a-z][\w-]*)", block)) - {":predicates"}


@pytest.mark.parametrize("fam", FAMILIES)
def test_rewritten_demonstration_means_the_same_task(given, fam):
    """The rewrite is a renaming: the faithfulness checker finds the rewritten problem over the
    given domain equivalent to the demonstration as written, and the planner solves it."""
    demo, task = P.DEMOS[fam], given[fam]
    new = P.demo_for(fam, task.domain)
    assert new is not demo and new.domain == task.domain.strip()
    report = check((demo.domain, demo.problem), (new.domain, new.problem))
    assert report.faithful, report
    (v,) = solve_many([(new.domain, new.problem)])
    assert v.success, (v.category, v.message)
    name = re.search(r"\(domain\s+([^\s)]+)", task.domain).group(1)
    assert f"(:domain {name})" in new.problem
    # every predicate the problem uses is one of the given domain's
    used = set(re.findall(r"\(([a-z][\w-]*)", new.problem.split("(:init", 1)[1])) - {"and", "not"}
    assert used and used <= _predicates(task.domain), (used, _predicates(task.domain))


def test_blocksworld_demonstration_uses_the_given_names_and_argument_order(given):
    new = P.demo_for("blocksworld", given["blocksworld"].domain)
    assert "(handempty)" in new.problem and "(ontable white)" in new.problem
    assert "hand-empty" not in new.problem and "on-table" not in new.problem
    assert "(on green white)" in new.problem and "(on white green)" in new.problem
    assert new.nl == P.DEMOS["blocksworld"].nl  # its English has no domain names to rename


def test_argument_orders_follow_the_given_domain(given):
    """A given domain whose binary predicate takes its arguments the other way round gets the
    demonstration's atoms with their arguments swapped."""
    dom = given["blocksworld"].domain
    flipped = re.sub(r"\(on (\?\w+) (\?\w+)\)", r"(on \2 \1)", dom)
    assert flipped != dom
    new = P.demo_for("blocksworld", flipped)
    assert "(on white green)" in new.problem.split("(:goal")[0]  # init: green is on white
    assert check((P.DEMOS["blocksworld"].domain, P.DEMOS["blocksworld"].problem), (new.domain, new.problem)).faithful


def test_mystery_text_takes_the_given_words(given):
    new = P.demo_for("mystery_blocksworld", given["mystery_blocksworld"].domain)
    assert "province object p" in new.nl and "object q craves object p" in new.nl
    assert "Attack object:" in new.nl  # the first letter's case is kept
    assert not re.search(r"\bspark\b|\blinks\b", new.nl)
    assert "(craves q p)" in new.problem


def test_other_domains_and_garbage_keep_the_demonstration(given):
    demo = P.DEMOS["blocksworld"]
    assert P.demo_for("blocksworld", given["gripper"].domain) is demo  # not the same domain up to renaming
    assert P.demo_for("blocksworld", P.GENERIC.domain) is demo
    assert in_given_vocabulary(demo, "(define (domain broken") is demo
    assert in_given_vocabulary(demo, "not pddl at all") is demo
    # a domain with one action fewer is not a renaming either
    dom = given["blocksworld"].domain
    cut = dom[: dom.index("(:action put-down")] + ")"
    assert P.demo_for("blocksworld", cut) is demo
    assert P.demo_for("blocksworld") is demo and P.demo_for("blocksworld", None) is demo


def test_actor_prompt_shows_the_rewritten_demonstration(given):
    task = given["blocksworld"]
    msgs = P.actor_messages(task)
    assert msgs[1]["content"] == P.with_domain(P.DEMOS["blocksworld"].nl, task.domain.strip())
    assert "(handempty)" in msgs[2]["content"]
    # the full mode is unchanged
    full = generate("blocksworld", 1, seed=11, verify=False, min_objects=2, max_objects=3)[0]
    assert P.actor_messages(full)[2]["content"] == P.DEMOS["blocksworld"].answer


def test_baselines_show_the_same_demonstration(given):
    from omtr.inference.baselines import demo_messages

    task = given["gripper"]
    assert demo_messages("gripper", given=True, domain=task.domain) == P.actor_messages(task)[1:3]
    assert demo_messages("gripper") == [{"role": "user", "content": P.DEMOS["gripper"].nl},
                                        {"role": "assistant", "content": P.DEMOS["gripper"].answer}]
