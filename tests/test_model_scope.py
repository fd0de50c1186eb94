"""Scoped decoding: what the scope rules admit never fails lint on names, arities or types.

The soundness tests walk the decoder at random (every step picks uniformly among the tokens the
combined mask admits), so they reach corners no model would, and lint every answer with omtr's
real reader and checker."""

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

import numpy as np  # noqa: E402

from omtr.config import ConfigError, ModelConfig  # noqa: E402
from omtr.model.grammar import PddlGrammar, scoped_tokens  # noqa: E402
from omtr.model.limits import GrammarLimits  # noqa: E402
from omtr.model.scope import GivenDomainError, ScopeTracker, given_declarations  # noqa: E402
from omtr.solver import examples  # noqa: E402
from omtr.solver.lint import lint  # noqa: E402
from scope_helpers import walk as _walk  # noqa: E402

TIGHT = GrammarLimits(name_len=8, ws=2, types=2, predicates=3, predicate_args=2, actions=2, parameters=2,
                      literals=3, objects=4, init=4, goal=3, atom_args=2)
NAME_ERRORS = ("object_type", "predicate_schema")


@pytest.fixture(scope="module")
def tokenizer():
    from omtr.model.backbone import build_micro_tokenizer

    return build_micro_tokenizer(1024)


@pytest.fixture(scope="module")
def tight(tokenizer):
    return PddlGrammar(tokenizer, len(tokenizer), TIGHT)


def _category(domain, problem):
    r = lint(domain, problem)
    return None if r.error is None else r.error.category.value


def _split(text):
    i = text.find("(define (problem")
    return (text[:i], text[i:]) if i > 0 else (text, "")


def test_random_walks_of_the_scoped_decoder_never_fail_on_names(tight):
    cats = {}
    for seed in range(150):
        text, finished, st = _walk(tight, seed)
        assert not st.scope_left and st.fallbacks == 0, (seed, text[-200:])
        cat = _category(*_split(text))
        cats[cat] = cats.get(cat, 0) + 1
        assert cat not in NAME_ERRORS, (seed, lint(*_split(text)).error.message, text)
        if cat == "syntax":
            assert not finished, (seed, text)  # syntax only for an answer cut off
    assert cats.get(None, 0) > 50, cats  # most walks give a spec the planner may run


def test_random_walks_under_a_given_domain_write_problems_that_lint(tokenizer):
    g = PddlGrammar(tokenizer, len(tokenizer), GrammarLimits(name_len=8, objects=6, init=6, goal=3))
    for domain in (examples.BW_DOMAIN, examples.GRIPPER_DOMAIN):
        given = given_declarations(domain)
        ok = 0
        for seed in range(40):
            text, finished, st = _walk(g, seed, given=given)
            assert text.startswith("(define (problem"), text[:60]
            assert not st.scope_left and st.fallbacks == 0, text
            cat = _category(domain, text)
            assert cat not in NAME_ERRORS + ("syntax",), (lint(domain, text).error.message, text)
            ok += cat is None
        assert ok > 10


def test_random_walks_with_statement_names_declare_every_name_and_never_dead_end(tokenizer):
    """The task statement's names as required objects (omtr.statement, test_statement_objects.py)."""
    from omtr.pddl.model import parse_problem

    g = PddlGrammar(tokenizer, len(tokenizer), GrammarLimits(name_len=8, objects=8, init=6, goal=3))
    cases = [(examples.GRIPPER_DOMAIN, ["room_1", "ball_1", "ball_2", "room_2"], {"room_1": "room", "room_2": "room"}),
             (examples.BW_DOMAIN, ["red", "blue", "green"], {})]
    for domain, names, types in cases:
        given = given_declarations(domain)
        finished = 0
        for seed in range(30):
            text, done, st = _walk(g, seed, given=given, objects=names)
            assert not st.scope_left and st.fallbacks == 0, text
            if not done:
                continue
            finished += 1
            objs = parse_problem(text).objects
            assert set(names) <= set(objs), text
            assert list(objs)[:len(names)] == sorted(names, key=list(objs).index)  # the names came first
            for o, ty in types.items():
                assert objs[o] == ty, text  # room_1 is a room
            err = lint(domain, text).error
            assert err is None or err.category.value not in ("syntax", "object_type", "predicate_schema"), text
        assert finished > 10


def test_the_plain_grammar_alone_admits_what_the_scope_rules_refuse(tight):
    """Without the scope rules the same walks do fail on names: the rules are what prevents it."""
    bad = 0
    for seed in range(40):
        rng = random.Random(seed)
        st = tight.state()
        bm = tight.allocate_bitmask(1)
        for _ in range(1500):
            forced = st.fill(bm, 0)
            ids = np.flatnonzero(np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:tight.vocab_size])
            tok = forced if forced is not None else int(rng.choice(ids))
            if tok == tight.eos:
                break
            st.accept(tok, tight.vocab.pieces[tok])
            if st.matcher.is_terminated():
                break
        bad += _category(*_split(st.text)) in NAME_ERRORS
    assert bad >= 20


# ------------------------------------------------------------------ each rule, by hand

DOMAIN = """(define (domain d) (:requirements :strips :typing)
  (:types block table - thing thing)
  (:predicates (on ?x - block ?y - thing) (clear ?x - thing) (free))
  (:action put :parameters (?b - block ?t - table)
    :precondition (and (clear ?b) (free))
    :effect (and (on ?b ?t) (not (free)))))"""


def _tracker(text: str, given=None) -> ScopeTracker:
    t = ScopeTracker(given)
    t.feed_text(text)
    return t


def test_predicates_must_be_declared_with_their_arity():
    head = DOMAIN[:DOMAIN.index("(and (clear")] + "(and "
    t = _tracker(head)
    assert t.admits("(clear ?b)") and t.admits("(free)")
    assert not t.admits("(cleer")  # undeclared
    assert not t.admits("(free ")  # arity 0: no argument may follow
    assert not t.admits("(clear)")  # arity 1: too few
    assert not t.admits("(clear ?b ?t)")  # too many
    assert not t.admits("(on ?b ?z")  # not a parameter
    assert not t.admits("(on ?t ?b")  # ?t is a table, `on` needs a block first
    assert t.admits("(on ?b ?t)")  # table is a subtype of thing
    assert not t.admits("(= ?b ?t)")  # :equality not declared
    assert not t.admits("(not (free))")  # :negative-preconditions not declared
    t.feed_text("(clear ?b) ")
    assert not t.admits("(clear ?b)")  # the same literal twice in one conjunction


def test_nothing_is_declared_twice():
    assert not _tracker("(define (domain d) (:requirements :strips").admits(" :strips")
    assert not _tracker("(define (domain d) (:requirements :typing) (:types a b").admits(" a ")
    assert not _tracker("(define (domain d) (:requirements :typing) (:types a - object").admits(" object ")
    preds = "(define (domain d) (:predicates (p ?x) (q)"
    assert not _tracker(preds).admits(" (p ")
    assert not _tracker(preds + " (r ?x").admits(" ?x)")
    assert _tracker(preds + " (r ?x").admits(" ?y)")
    act = preds + ") (:action a :parameters (?x) :precondition (q) :effect (q)) (:action "
    assert not _tracker(act).admits("a ")
    assert not _tracker(act + "b :parameters (?x").admits(" ?x)")
    prob = act + "b :parameters () :precondition (q) :effect (q))) (define (problem p) (:domain d) (:objects o1"
    assert not _tracker(prob).admits(" o1)")
    assert _tracker(prob).admits(" o2)")


def test_types_and_objects_must_be_declared_and_fit():
    assert not _tracker("(define (domain d) (:requirements :strips) (:predicates (p ?x").admits(" -")  # no :typing
    typed = "(define (domain d) (:requirements :typing) (:types ball room) (:predicates (at ?b - "
    t = _tracker(typed)
    assert t.admits("ball") and t.admits("object") and not t.admits("box ")
    assert not _tracker("(define (domain d) (:requirements :typing) (:types a - a").admits(")")  # cycle
    full = DOMAIN + "\n(define (problem p) (:domain d) (:objects b1 - block t1 - table) (:init "
    t = _tracker(full)
    assert t.admits("(on b1 t1)") and t.admits("(clear t1)")
    assert not t.admits("(on t1 b1)")  # a table where a block is needed
    assert not t.admits("(clear room)")  # not an object
    assert not t.admits("(on b1 ?x")  # :init is ground


def test_lists_close_only_when_something_can_follow():
    # an action whose parameters fit no predicate could write no effect: refused as soon as it shows
    dom = "(define (domain d) (:requirements :typing) (:types a b) (:predicates (p ?x - a)) (:action go :parameters ("
    t = ScopeTracker()
    t.feed_text(dom)
    assert not t.admits("?y - b)") and t.admits("?y - b ?z - a)")
    t = ScopeTracker(limits=GrammarLimits(parameters=1))  # one parameter only: it must be an `a`
    t.feed_text(dom)
    assert not t.admits("?y - b") and t.admits("?y - a)")
    # a problem whose objects fit no predicate could write no goal
    dom = ("(define (domain d) (:requirements :typing) (:types block table) (:predicates (ready ?x - block)) "
           "(:action r :parameters (?b - block) :precondition (ready ?b) :effect (not (ready ?b))))")
    t = _tracker(dom + " (define (problem p) (:domain d) (:objects t1 - table")
    assert not t.admits(")")


def test_the_demonstrations_and_real_specs_are_in_scope():
    from omtr.inference.prompts import DEMOS

    for demo in DEMOS.values():
        _tracker(demo.answer)  # raises Reject if any name were refused
    _tracker(examples.GRIPPER_DOMAIN.strip() + "\n\n" + examples.GRIPPER_PROBLEM.strip())


def test_a_broken_given_domain_is_an_input_error():
    with pytest.raises(GivenDomainError, match="given domain"):
        given_declarations("(define (domain x) (:predicates (p ?x)")
    given = given_declarations(examples.BW_DOMAIN)
    t = ScopeTracker(given)
    t.feed_text("(define (problem p) (:domain bw4) (:objects a b) (:init ")
    assert t.admits("(clear a)") and not t.admits("(clear c)") and not t.admits("(on a)")


def test_the_scope_filter_keeps_a_subset_of_the_grammar_mask(tight):
    st = tight.state(scoped=True)
    text, _, _ = _walk(tight, 3, max_steps=60)
    tok = tight.tokenizer
    for t in tok.encode(text, add_special_tokens=False):
        if not st.forced:
            st.accept(t, tight.vocab.pieces[t])
    bm = tight.allocate_bitmask(1)
    st.matcher.fill_next_token_bitmask(bm, 0)
    plain = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:tight.vocab_size].astype(bool)
    keep = scoped_tokens(st.scope, tight.vocab, plain)
    assert not (keep & ~plain).any() and keep.any()
    for i in np.flatnonzero(keep):
        assert st.scope.admits(tight.vocab.pieces[i])


def test_the_decoding_constraint_is_named_in_the_model_config():
    assert ModelConfig().decoding == "scoped" and ModelConfig().constraint == "scoped"
    assert ModelConfig(grammar=False).constraint == "off"
    assert ModelConfig(decoding="off").grammar is False
    assert ModelConfig(grammar=False).replace(decoding="plain").constraint == "plain"
    with pytest.raises(ConfigError, match="decoding"):
        ModelConfig(decoding="strict")


# ------------------------------------------------------------------ with a model


@pytest.fixture(scope="module")
def micro():
    from omtr.model import load_model

    return load_model("micro")


def _prompts(family="blocksworld", n=3):
    from omtr.inference.prompts import actor_messages
    from omtr.tasks.training import TrainingTask

    return [actor_messages(TrainingTask(f"t{i}", family, None, f"move block {i} onto the table")) for i in range(n)]


@pytest.mark.parametrize("given", [False, True])
def test_token_logprobs_replay_the_scoped_masks(micro, given):
    from omtr.policy import Sampling

    prompts = _prompts()
    domains = [examples.BW_DOMAIN] * len(prompts) if given else None
    s = Sampling(greedy=False, temperature=1.0, max_new_tokens=120, seed=5)
    gens = micro.generate("actor", prompts, s, domains=domains, constraint="scoped")
    lp, mask = micro.token_logprobs("actor", prompts, [g.token_ids for g in gens], domains=domains, constraint="scoped")
    for b, g in enumerate(gens):
        assert torch.allclose(lp[b, :len(g.token_ids)], torch.tensor(g.logprobs), atol=1e-4)
        if given:
            assert g.text.startswith("(define (problem")
    # the plain grammar's masks differ somewhere on these tokens (so the replay is not trivially equal)
    plain, _ = micro.token_logprobs("actor", prompts, [g.token_ids for g in gens], domains=domains, constraint="plain")
    assert (plain[mask] < lp[mask] - 1e-4).any()


@pytest.mark.slow
def test_micro_samples_under_scoped_decoding_never_fail_on_names(micro):
    from omtr.inference.extract import extract_spec
    from omtr.policy import Sampling

    prompts = _prompts("gripper", 4)
    gens = micro.generate("actor", prompts, Sampling(greedy=False, temperature=1.0, max_new_tokens=500, seed=1),
                          constraint="scoped")
    for g in gens:
        ex = extract_spec(g.text)
        if ex.ok:
            cat = _category(ex.domain, ex.problem)
            assert cat not in NAME_ERRORS and cat != "syntax", (cat, g.text)
        else:
            assert g.finish_reason == "length", g.text


def _copycat_walk(grammar, seed: int, *, max_steps: int = 300):
    """A walk that, where it can, retypes a name already taken and drives names to the length
    limit: the corners (a duplicate at the limit, a full list) a uniform walk seldom reaches."""
    rng = random.Random(seed)
    st = grammar.state(scoped=True)
    bm = grammar.allocate_bitmask(1)
    pieces = grammar.vocab.pieces
    V = grammar.vocab_size
    for _ in range(max_steps):
        tr = st.scope.clone() if st.scope is not None else None
        grammar_bm = grammar.allocate_bitmask(1)
        forced = st.fill(bm, 0)
        if forced is None:
            yield st, tr, grammar_bm, bm
            ids = np.flatnonzero(np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:V])
            tok = int(rng.choice(ids))
            if tr is not None and tr.word_due() and rng.random() < 0.8:
                _, banned = tr.word_constraint()
                w = tr.word
                copy = [i for i in ids if banned and any(b.startswith(w + pieces[i]) for b in banned)]
                longer = [i for i in ids if pieces[i] and all(c.isalnum() or c in "_-" for c in pieces[i])]
                tok = int(rng.choice(copy or longer or list(ids)))
        else:
            tok = forced
        if tok == grammar.eos or not st.accept(tok, pieces[tok]) or st.matcher.is_terminated():
            return


def test_the_bulk_filter_admits_exactly_what_the_tracker_admits(tight):
    """At every step of walks that chase the corners, the vocabulary-wide filter keeps a token
    if and only if the tracker, fed that token's text, does not refuse it."""
    pieces = tight.vocab.pieces
    V = tight.vocab_size
    steps = 0
    for seed in range(6):
        for st, tr, plain_bm, bm in _copycat_walk(tight, seed):
            if tr is None:
                continue
            st.matcher.fill_next_token_bitmask(plain_bm, 0)
            plain = np.unpackbits(plain_bm[0].numpy().view(np.uint8), bitorder="little")[:V].astype(bool)
            keep = scoped_tokens(tr, tight.vocab, plain)
            brute = np.array([bool(plain[i]) and tr.admits(pieces[i]) for i in range(V)])
            diff = np.flatnonzero(keep != brute)
            assert not diff.size, (st.text[-80:], [(pieces[i], bool(keep[i])) for i in diff[:8]])
            steps += 1
        assert not st.scope_left, (seed, st.text[-120:])
    assert steps > 500


def test_a_taken_name_at_the_length_limit_cannot_be_written_again(tight):
    """The case that leaked in SmolLM2's answers: a predicate declared at the name limit, then the
    same name again: the last piece must be masked out, not refused after it was sampled."""
    g = tight
    st = g.state(scoped=True)
    text = "(define (domain d) (:requirements :strips) (:predicates (abcdefgh) (abcdefg"
    for t in g.tokenizer.encode(text, add_special_tokens=False):
        assert st.accept(t, g.vocab.pieces[t]), st.text
    bm = g.allocate_bitmask(1)
    st.fill(bm, 0)
    keep = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[:g.vocab_size].astype(bool)
    assert not st.scope.admits("h")
    assert not any(keep[i] for i in range(g.vocab_size) if g.vocab.pieces[i].startswith("h"))
    assert keep.any()
