"""The PDDL grammar rendered per server dialect: GBNF that llama.cpp's parser reads, vLLM's text
unchanged, and every rendering the same language as the grammar omtr's own decoder compiles.

The real llama.cpp parser and server are in tests/test_llamacpp_server.py (slow, optional extra)."""

from __future__ import annotations

import re

import pytest

from omtr.inference import grammar_dialects as gd
from omtr.inference.backends import BackendError, grammar_fields, pddl_grammar
from omtr.solver import examples

SOURCE = pddl_grammar("xgrammar")
GBNF = pddl_grammar("llamacpp")


def test_llamacpp_rendering_is_gbnf_one_rule_a_line():
    assert gd.gbnf_problems(SOURCE), "the source has '_' names and '\\-' escapes: the check must see them"
    assert gd.gbnf_problems(GBNF) == []
    heads = [line.split(" ::= ", 1)[0] for line in GBNF.splitlines()]
    assert all(re.fullmatch(r"[a-z0-9-]+", h) for h in heads), heads
    assert heads[0] == "root" and len(heads) == len(gd.rules(SOURCE)) == len(set(heads))
    assert "pname-and ::=" in GBNF and "pname_and" not in GBNF and "\\-" not in GBNF
    assert "[0-9_a-z-]{0,23}" in GBNF, "a literal dash goes last in the class, '_' stays a member"


def test_vllm_renderings_are_the_source_and_no_gbnf_leaks_into_them():
    for mode in ("vllm", "vllm-legacy"):
        text = pddl_grammar(mode)
        assert text == SOURCE and "pname_and ::=" in text and "pname-and" not in text
    assert grammar_fields("vllm") == {"structured_outputs": {"grammar": SOURCE}}
    assert grammar_fields("vllm-legacy") == {"guided_grammar": SOURCE}
    assert grammar_fields("llamacpp") == {"grammar": GBNF} and grammar_fields("none") == {}
    # vLLM reads a grammar as Lark unless its lines use '::=': the first rule line must
    first = next(line for line in SOURCE.splitlines() if line.strip())
    assert "::=" in first and "#" not in first and "//" not in first


def test_gbnf_is_the_same_token_stream_with_names_renamed():
    """Structural equivalence: rule for rule, token for token; classes compare as sets of ranges."""
    src, out = gd.rules(SOURCE), gd.rules(GBNF)
    assert [gd.gbnf_name(n) for n, _ in src] == [n for n, _ in out]

    def renamed(tokens):
        return [gd.Token(t.kind, gd.gbnf_name(t.value)) if t.kind == "name" else t for t in tokens]

    for (name, body), (_, body2) in zip(src, out):
        assert renamed(body) == body2, name


@pytest.mark.parametrize("cls, members, outsiders", [
    (r"[a-z0-9_\-]", "az09_-", "A.^ "),
    (r"[\-a]", "-a", "b"),
    (r"[a\-z]", "az-", "b"),  # an escaped dash is a member, not a range
    (r"[\^x]", "^x", "y"),
    (r"[^\]\-]", "xa", "]-"),
    (r"[\n\t]", "\n\t", " "),
    (r"[+--]", "+,-", "."),  # a range ending at the dash
])
def test_character_classes_keep_their_members(cls, members, outsiders):
    """Each class rendered for llama.cpp matches the same characters under xgrammar as the source."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    source = f"root ::= {cls}\n"
    rendered = gd.to_gbnf(source)
    assert gd.gbnf_problems(rendered) == [], rendered
    a, b = xgr.Grammar.from_ebnf(source), xgr.Grammar.from_ebnf(rendered)
    for c in members:
        assert accepts(a, c) and accepts(b, c), (rendered, c)
    for c in outsiders:
        assert not accepts(a, c) and not accepts(b, c), (rendered, c)


def _specs() -> tuple[list[str], list[str]]:
    """Real specs the grammar admits (generated tasks' references, the worked examples) and
    near misses it must refuse."""
    from omtr.tasks.generators import families, generate

    def one_line(text):
        return " ".join(re.sub(r";[^\n]*", "", text).split())

    good = [one_line(t.reference.domain) + "\n" + one_line(t.reference.problem)
            for fam in families() for t in generate(fam, 2, 7, verify=False)]
    good.append(examples.GRIPPER_DOMAIN.strip() + "\n\n" + examples.GRIPPER_PROBLEM.strip())
    base = good[0]
    bad = [
        base.replace("(define (domain", "(define  (domain"),                # two spaces
        base.upper(),                                                       # upper case
        base[:-1],                                                          # cut off
        base.replace("(:init", "(:init (and (x))", 1),                      # a connective as a predicate
        base.replace("(:objects", "(:objects _a", 1),                       # a name that starts with '_'
        base.replace("(:objects", "(:objects a.b", 1),                      # '.' is no name character
        base.replace("(:objects", "(:objects " + "a" * 30, 1),              # longer than name_len
        base.replace("(:init", "(:init (p ?x)", 1),                         # a variable in :init
        base.replace(")", ") ; comment", 1),                                # comments
        base + "\nchatter",                                                 # text after the spec
    ]
    named = [base.replace("(:objects", "(:objects a-b_c9", 1), base.replace("(:init", "(:init (either-x a)", 1)]
    return good + named, bad


def test_gbnf_accepts_and_rejects_what_the_local_decoders_grammar_does():
    """The rendering in step with the grammar ``PddlGrammar`` compiles: the same verdict on every
    string, both compiled by xgrammar (which reads either dialect)."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    good, bad = _specs()
    a, b = xgr.Grammar.from_ebnf(SOURCE), xgr.Grammar.from_ebnf(GBNF)
    verdicts = [(accepts(a, s), accepts(b, s)) for s in good + bad]
    assert all(x == y for x, y in verdicts), [s[:120] for s, (x, y) in zip(good + bad, verdicts) if x != y]
    assert [x for x, _ in verdicts] == [True] * len(good) + [False] * len(bad)


def test_problem_only_root_renders_and_agrees_with_the_source():
    """Main's problem-only root (the domain-given mode): rendered per dialect, the same rules
    otherwise, and the same verdicts as the source on problems alone and on full specs."""
    src = pddl_grammar("xgrammar", problem_only=True)
    gbnf = pddl_grammar("llamacpp", problem_only=True)
    assert src.splitlines()[0] == "root ::= problem" and gbnf.splitlines()[0] == "root ::= problem"
    assert gd.gbnf_problems(gbnf) == [] and len(gd.rules(gbnf)) == len(gd.rules(SOURCE))
    assert pddl_grammar("vllm", problem_only=True) == src != SOURCE
    assert grammar_fields("llamacpp", problem_only=True) == {"grammar": gbnf}
    assert grammar_fields("vllm", problem_only=True) == {"structured_outputs": {"grammar": src}}
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from omtr.tasks.generators import families, generate

    problems = [" ".join(re.sub(r";[^\n]*", "", t.reference.problem).split())
                for fam in families() for t in generate(fam, 1, 3, verify=False)]
    good, _ = _specs()
    a, b = xgr.Grammar.from_ebnf(src), xgr.Grammar.from_ebnf(gbnf)
    for s in problems:
        assert accepts(a, s) and accepts(b, s), s[:120]
    for s in good[:3]:  # a domain before the problem is not a problem alone
        assert not accepts(a, s) and not accepts(b, s), s[:120]


def test_rendering_errors_name_the_rule_and_the_fix():
    with pytest.raises(gd.DialectError, match=r"'a_b' and 'a-b' both become 'a-b'.*rename one"):
        gd.to_gbnf('root ::= a_b a-b\na_b ::= "x"\na-b ::= "y"\n')
    with pytest.raises(gd.DialectError, match=r"rule 'root' refers to 'missing'"):
        gd.to_gbnf('root ::= "x" missing\n')
    with pytest.raises(gd.DialectError, match="defined twice: x"):
        gd.to_gbnf('root ::= x\nx ::= "a"\nx ::= "b"\n')
    with pytest.raises(gd.DialectError, match=r"unknown escape '\\q' at line 1, column 11"):
        gd.to_gbnf('root ::= "\\q"\n')
    with pytest.raises(gd.DialectError, match="unknown grammar dialect 'gbnf'; choose from xgrammar"):
        gd.render(SOURCE, "gbnf")
    with pytest.raises(BackendError, match="cannot be sent as 'lark'"):
        pddl_grammar("lark")
    # comments and line breaks inside a rule are the source's business; GBNF gets one line a rule
    assert gd.to_gbnf('root ::= (\n  "a" # first\n  | b_c\n)\nb_c ::= [x-z]{2}\n') == \
        'root ::= ("a" | b-c)\nb-c ::= [x-z]{2}\n'
