"""Extraction of domain and problem from model text (omtr.inference.extract), fuzzed."""

import random
import time

import pytest

from omtr.inference.extract import SpecScanner, extract_spec, extraction_verdict, scan_blocks, spec_complete
from omtr.pddl.categories import Category
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM, GRIPPER_DOMAIN, GRIPPER_PROBLEM

D = BW_DOMAIN.split("\n", 1)[1].strip()  # without the leading comment line
Q = BW_PROBLEM.strip()


def _ok(text, domain=D, problem=Q):
    ex = extract_spec(text)
    assert ex.domain == domain and ex.problem == problem, (ex.domain, ex.problem)
    assert extraction_verdict(ex) is None
    assert spec_complete(text)
    return ex


def test_plain_and_fenced_with_chatter():
    _ok(D + "\n\n" + Q)
    _ok(f"Sure! Here is the domain:\n```pddl\n{D}\n```\nand the problem (as asked):\n```pddl\n{Q}\n```\nDone :)")
    _ok(f"```lisp\n{D}\n\n{Q}\n```")
    _ok(f"{D}{Q}")  # no whitespace between the blocks


def test_case_spacing_and_comments():
    d = D.replace("(define (domain", "( DEFINE\n  (Domain")
    _ok(f"; my domain (see below)\n{d}\n; ) stray paren in a comment\n{Q}", domain=d)
    commented = D.replace("(:requirements :strips)", "(:requirements :strips) ; a comment with ) ( parens")
    _ok(commented + "\n" + Q, domain=commented)


def test_truncated_problem_is_a_syntax_verdict_naming_it():
    ex = extract_spec(D + "\n" + Q[:-10])
    assert ex.domain == D and ex.problem is None
    v = extraction_verdict(ex)
    assert not v.success and v.category == Category.SYNTAX and v.stage == "extract"
    assert "problem block is never closed" in v.message and "missing" in v.message
    assert not spec_complete(D + "\n" + Q[:-10])


def test_missing_block_and_empty_text():
    v = extraction_verdict(extract_spec("I think the answer is:\n" + D))
    assert v.message.startswith("No (define (problem ...)) block was found.")
    v = extraction_verdict(extract_spec(""))
    assert "No (define (domain ...))" in v.message and "no (define (problem ...))" in v.message
    assert extraction_verdict(extract_spec(None)).category == Category.SYNTAX


def test_extra_blocks_and_repetition_take_the_first_pair():
    text = f"{D}\n{Q}\n{GRIPPER_DOMAIN}\n{GRIPPER_PROBLEM}\n{D}\n{Q}\n{D[:50]}"
    ex = _ok(text)
    assert ex.notes and "ignored" in ex.notes[0]
    # a problem written before the domain is still found
    _ok(f"{Q}\n\n{D}")
    # a truncated domain followed by a complete repeat: the complete one is used
    _ok(f"{D[:120]}\n```\n\n{D}\n{Q}")
    _ok(f"{D[:120]}\n{D}\n{Q}")  # no fence: the new header ends the unfinished block


def test_fence_ends_an_unclosed_block():
    blocks = scan_blocks(f"```pddl\n{D[:-3]}\n```\n```pddl\n{Q}\n```")
    assert [(b.kind, b.closed) for b in blocks] == [("domain", False), ("problem", True)]
    assert blocks[0].missing == 3  # the three dropped parentheses


# ----------------------------------------------------------------------------- fuzzing

CHATTER = ["Here is the PDDL.", "```", "```pddl", "(note: untyped)", "))", "((", ";;", "\n", " ", "define",
           "(define", "(define (domain", "(define (problem x", "I hope this helps!", "(:init", ")"]


def _random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 8)):
        r = rng.random()
        if r < 0.25:
            pieces.append(rng.choice([D, Q, GRIPPER_DOMAIN, GRIPPER_PROBLEM]))
        elif r < 0.45:
            src = rng.choice([D, Q])
            pieces.append(src[: rng.randint(0, len(src))])  # truncated
        elif r < 0.6:
            src = rng.choice([D, Q])
            i, j = sorted(rng.sample(range(len(src)), 2))
            pieces.append(src[i:j])  # a random slice
        else:
            pieces.append(rng.choice(CHATTER))
    return rng.choice(["", "\n", " "]).join(pieces)


def test_fuzz_never_raises_and_agrees_with_spec_complete():
    rng = random.Random(1234)
    for _ in range(3000):
        text = _random_text(rng)
        ex = extract_spec(text)
        v = extraction_verdict(ex)
        assert (v is None) == ex.ok
        if v is not None:
            assert v.category == Category.SYNTAX and v.message and not v.success
        for block in (ex.domain, ex.problem):
            if block is not None:
                assert block.lstrip("( \n\t").lower().startswith("define")
                assert block.endswith(")")
        assert spec_complete(text) == ex.ok, text


def test_fuzz_intact_blocks_in_noise_are_found():
    rng = random.Random(99)
    noise = ["Sure.", "```", "```pddl", "Explanation: the robot moves.", "\n\n", "Answer:"]
    for _ in range(500):
        parts = [rng.choice(noise) for _ in range(rng.randint(0, 3))] + [D]
        parts += [rng.choice(noise) for _ in range(rng.randint(0, 3))] + [Q]
        parts += [rng.choice(noise) for _ in range(rng.randint(0, 3))]
        _ok("\n".join(parts))


def test_fuzz_scanner_fed_in_pieces_agrees():
    rng = random.Random(7)
    for _ in range(800):
        text = _random_text(rng)
        scanner, i, fired_at = SpecScanner(), 0, None
        while i < len(text):
            step = rng.randint(1, 6)
            if scanner.feed(text[i:i + step]) and fired_at is None:
                fired_at = i + step
            i += step
        assert scanner.complete == spec_complete(text), text
        if fired_at is not None:  # it fired as soon as the prefix was complete
            assert spec_complete(text[:fired_at])


def test_spec_complete_is_cheap_per_decoding_step():
    text = (D + "\n" + Q[:-5]) * 2  # ~2.5k characters, one block still open
    calls = 2000
    t = time.perf_counter()
    for _ in range(calls):
        spec_complete(text)
    per_call_ms = (time.perf_counter() - t) * 1000 / calls
    assert per_call_ms < 2.0, per_call_ms
    # texts without two headers are rejected by counting alone
    t = time.perf_counter()
    for _ in range(calls):
        spec_complete("(on a b) " * 300)
    assert (time.perf_counter() - t) * 1000 / calls < 0.5
