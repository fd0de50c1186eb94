"""The PDDL grammar: everything it admits passes lint without a syntax error."""

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

import numpy as np  # noqa: E402

from omtr.model.grammar import PddlGrammar, pddl_ebnf  # noqa: E402
from omtr.model.limits import GrammarLimits  # noqa: E402
from omtr.policy import Sampling  # noqa: E402
from omtr.solver import examples  # noqa: E402
from omtr.solver.lint import lint  # noqa: E402

SMALL = GrammarLimits(name_len=4, ws=2, types=2, predicates=3, predicate_args=2, actions=2, parameters=2,
                      literals=3, objects=4, init=4, goal=3, atom_args=2)


@pytest.fixture(scope="module")
def tokenizer():
    from omtr.model.backbone import build_micro_tokenizer

    return build_micro_tokenizer(1024)


@pytest.fixture(scope="module")
def grammar(tokenizer):
    return PddlGrammar(tokenizer, len(tokenizer))


def _split(text):
    i = text.find("(define (problem")
    assert i > 0, text[:300]
    return text[:i], text[i:]


def _lint_category(text):
    r = lint(*_split(text))
    return None if r.error is None else r.error.category.value


def _accepts(grammar, tokenizer, text):
    st = grammar.state()
    bm = grammar.allocate_bitmask(1)
    for tok in tokenizer.encode(text, add_special_tokens=False):
        forced = st.fill(bm, 0)
        if forced is not None and forced != tok:
            return False
        if not st.accept(tok, tokenizer.decode([tok])):
            return False
    return st.matcher.is_completed()


def test_grammar_admits_real_specs_and_forces_the_domain_name(grammar, tokenizer):
    bw = examples.BW_DOMAIN.split("\n", 1)[1]  # without its comment line
    assert _accepts(grammar, tokenizer, bw + "\n" + examples.BW_PROBLEM.strip())
    assert _accepts(grammar, tokenizer, examples.GRIPPER_DOMAIN.strip() + "\n\n" + examples.GRIPPER_PROBLEM.strip())
    wrong = examples.BW_PROBLEM.replace("(:domain bw4)", "(:domain other)")
    assert not _accepts(grammar, tokenizer, bw + "\n" + wrong.strip()), "the problem must name its domain"


@pytest.mark.parametrize("bad", [
    "(:init (not (on a b)))",        # negated init atom: lint's syntax error
    "(:init (and (on a b)))",        # a predicate named like a connective
    "(:init (on ?x b))",             # a variable in the initial state
    "(:init (on a b) ; comment\n)",  # comments
])
def test_grammar_rejects_what_lint_calls_syntax(grammar, tokenizer, bad):
    bw = examples.BW_DOMAIN.split("\n", 1)[1]
    good_problem = "(define (problem p) (:domain bw4) (:objects a b) (:init (on a b)) (:goal (on b a)))"
    assert _accepts(grammar, tokenizer, bw + "\n" + good_problem)
    assert not _accepts(grammar, tokenizer, bw + "\n" + good_problem.replace("(:init (on a b))", bad))


def test_reserved_words_are_excluded_from_predicate_names_only():
    ebnf = pddl_ebnf()
    assert "pname_not ::=" in ebnf and "pname_and ::=" in ebnf
    assert "{0,-" not in pddl_ebnf(SMALL), "short names drop long reserved words instead of a negative bound"


def _walk(grammar, tokenizer, rng, max_steps=4000):
    """A random derivation: uniform over allowed tokens, closing a list with probability 0.4."""
    pieces = [tokenizer.decode([i]) for i in range(grammar.vocab_size)]
    closers = np.array([(")" in p) for p in pieces])
    closers[tokenizer.eos_token_id] = True
    st = grammar.state()
    bm = grammar.allocate_bitmask(1)
    text = ""
    for _ in range(max_steps):
        if st.finished:
            return text
        forced = st.fill(bm, 0)
        if forced is None:
            bits = np.unpackbits(bm[0].numpy().view(np.uint8), bitorder="little")[: grammar.vocab_size].astype(bool)
            allowed = np.flatnonzero(bits)
            closing = np.flatnonzero(bits & closers)
            pool = closing if len(closing) and rng.random() < 0.4 else allowed
            tok = int(pool[rng.randrange(len(pool))])
        else:
            tok = forced
        assert st.accept(tok, pieces[tok])
        if tok != tokenizer.eos_token_id:
            text += pieces[tok]
    raise AssertionError(f"no complete spec in {max_steps} tokens: {text[-300:]}")


def test_random_derivations_of_the_full_grammar_pass_lint_syntax(grammar, tokenizer):
    rng = random.Random(0)
    texts = [_walk(grammar, tokenizer, rng) for _ in range(120)]
    cats = [_lint_category(t) for t in texts]
    assert "syntax" not in cats, [(c, t) for c, t in zip(cats, texts) if c == "syntax"][:2]
    assert len(set(texts)) == len(texts), "the walk explores the grammar"


def test_micro_model_sampling_under_the_grammar_never_gives_a_syntax_error():
    """The real decoding path: a random model sampling at temperature 1 under the grammar."""
    from omtr.model import build_model

    torch.set_num_threads(1)
    m = build_model("micro")
    m.set_grammar_limits(SMALL)
    prompts = [[{"role": "user", "content": f"Task {i}: move the blocks."}] for i in range(8)]
    texts = []
    for seed in range(3):
        gens = m.generate("actor", prompts, Sampling(greedy=False, temperature=1.0, top_p=1.0,
                                                     max_new_tokens=600, seed=seed))
        assert all(g.finish_reason == "stop" for g in gens), [len(g.token_ids) for g in gens]
        texts += [g.text for g in gens]
    cats = [_lint_category(t) for t in texts]
    assert "syntax" not in cats, [(c, t) for c, t in zip(cats, texts) if c == "syntax"][:2]
    assert len(set(texts)) == len(texts), "different seeds and prompts give different specs"
    for t in texts:
        d, p = _split(t)
        assert p.count("(:domain") == 1 and lint(d, p).domain is not None
