"""Grammar-constrained decoding: one PDDL grammar (EBNF), applied with xgrammar.

The grammar covers the subset of PDDL that omtr's lint reads: STRIPS with typing, negative
preconditions and equality. Output is a domain followed by a problem, each a plain
``(define ...)`` form whose header is written exactly ``(define (domain NAME)`` /
``(define (problem NAME)``. Every repetition is bounded (predicates, actions, parameters, literals,
objects, init atoms, name lengths, whitespace runs), so a model that loops is forced to move on
and a spec always ends within a known size.

One thing a context-free grammar cannot say is that the problem's ``(:domain NAME)`` repeats the
domain's name. :class:`GrammarState` handles it: when a sequence reaches ``(:domain`` in the
problem, the next tokens are forced to spell the domain's own name. A forced token has
probability 1 under the decoding distribution, so its log-probability is 0.

:class:`GrammarState` is used both while generating and when log-probabilities of given tokens
are recomputed (PPO), so the two see exactly the same masks.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

log = logging.getLogger("omtr.model")

# Words a predicate may not be called: lint reads them as formula heads (and `not` in :init).
RESERVED = ("and", "not", "or", "imply", "exists", "forall", "when", "either")
REQUIREMENTS = (":strips", ":typing", ":negative-preconditions", ":equality")
GRAMMAR_WORDS = ("(define", "(domain", "(problem", "(:requirements", "(:types", "(:predicates", "(:action",
                 ":parameters", ":precondition", ":effect", "(:domain", "(:objects", "(:init", "(:goal",
                 "(and", "(not", "(=") + REQUIREMENTS

_NAME_HEAD = "abcdefghijklmnopqrstuvwxyz"
_NAME_TAIL = _NAME_HEAD + "0123456789_-"


@dataclass(frozen=True)
class GrammarLimits:
    """Upper bounds of every repetition in the grammar."""

    name_len: int = 24
    ws: int = 12  # deepest indentation after a line break, in spaces
    types: int = 12
    predicates: int = 16
    predicate_args: int = 4
    actions: int = 8
    parameters: int = 6
    literals: int = 12  # per precondition / effect
    objects: int = 32
    init: int = 64
    goal: int = 16
    atom_args: int = 4


def _char_class(chars: str) -> str:
    out = "".join("\\-" if c == "-" else c for c in chars)
    return f"[{out}]"


def _excluding(rule: str, words, limits: GrammarLimits) -> list[str]:
    """EBNF rules for ``rule``: names [a-z][a-z0-9_-]* up to name_len long, except ``words``.

    A trie over the excluded words: at each node either stop (if the prefix is not excluded),
    follow a child letter, or leave the trie with any other letter and a free tail."""
    words = {w for w in words if len(w) <= limits.name_len}
    prefixes = {w[:i] for w in words for i in range(1, len(w) + 1)}
    rules: list[str] = []

    def node_name(p: str) -> str:
        return f"{rule}_{p}" if p else rule

    def emit(p: str) -> None:
        children = sorted({w[len(p)] for w in prefixes if len(w) == len(p) + 1 and w.startswith(p)})
        alts = [f'"{c}" {node_name(p + c)}' for c in children]
        pool = (_NAME_HEAD if not p else _NAME_TAIL)
        others = "".join(c for c in pool if c not in children)
        remaining = limits.name_len - len(p) - 1
        if remaining >= 0:
            alts.append(f"{_char_class(others)} {_char_class(_NAME_TAIL)}{{0,{remaining}}}")
        body = " | ".join(f"({a})" for a in alts)
        if not body:
            body = '""'
        elif p and p not in words:
            body = f"({body})?"
        rules.append(f"{node_name(p)} ::= {body}")
        for c in children:
            emit(p + c)

    emit("")
    return rules


def _typed(item: str, n: int) -> str:
    """A typed list of at most ``n`` items, ``a b - t c - u d``, as one flat repetition.

    Flat on purpose: groups nested inside a repetition (``((ws a)+ (- t)?)*``) let one list split
    into groups in exponentially many ways, and the matcher tracks all of them. Here a ``- type``
    is always followed by another item or ends the list, so it never dangles (lint: syntax)."""
    if n <= 1:
        return f'({item} (" - " name)?)'
    return f'({item} (" " {item} | " - " name " " {item}){{0,{n - 1}}} (" - " name)?)'


def pddl_ebnf(limits: GrammarLimits | None = None) -> str:
    """The grammar's EBNF text (xgrammar / GBNF dialect); root rule ``root``."""
    L = limits or GrammarLimits()
    req = " | ".join(f'"{r}"' for r in REQUIREMENTS)
    rules = [
        'root ::= domain ("\\n\\n" | ws) problem',
        # Between words: one space. Before "(", ":" and ")": one space, or a line break and an
        # indentation. Runs of spaces, tabs, blank lines and line breaks inside lists of names are
        # left out: they make most of a BPE vocabulary ambiguous to the matcher (20-60 ms a token
        # instead of ~0.1 ms on SmolLM2's 49k tokens) and no PDDL needs them.
        f'ws ::= " " | "\\n" " "{{0,{L.ws}}}',
        "ows ::= ws?",
        f"name ::= [a-z] {_char_class(_NAME_TAIL)}{{0,{L.name_len - 1}}}",
        f"var ::= \"?\" [a-z] {_char_class(_NAME_TAIL)}{{0,{L.name_len - 1}}}",
        # ---- domain
        'domain ::= "(define (domain " name ")" (ws requirements)? (ws types)? ws predicates '
        f"(ws action){{1,{L.actions}}} ows \")\"",
        f'requirements ::= "(:requirements" (" " req){{1,{len(REQUIREMENTS)}}} ")"',
        f"req ::= {req}",
        f'types ::= "(:types " {_typed("name", L.types)} ")"',
        f'predicates ::= "(:predicates" (ws pdecl){{1,{L.predicates}}} ows ")"',
        f'pdecl ::= "(" pname (" " {_typed("var", L.predicate_args)})? ")"',
        'action ::= "(:action " name ws ":parameters" " "? "(" params? ")" '
        'ws ":precondition" ws pre ws ":effect" ws eff ows ")"',
        f"params ::= {_typed('var', L.parameters)}",
        f'pre ::= "(and" (ws plit){{0,{L.literals}}} ows ")" | plit',
        'plit ::= atom | eq | "(not " atom ")" | "(not " eq ")"',
        f'atom ::= "(" pname (" " term){{0,{L.atom_args}}} ")"',
        "term ::= var | name",
        'eq ::= "(= " term " " term ")"',
        f'eff ::= "(and" (ws elit){{1,{L.literals}}} ows ")" | elit',
        'elit ::= atom | "(not " atom ")"',
        # ---- problem
        'problem ::= "(define (problem " name ")" ws "(:domain " name ")" ws objects ws init ws goal ows ")"',
        f'objects ::= "(:objects" (" " {_typed("name", L.objects)})? ")"',
        f'init ::= "(:init" (ws gatom){{0,{L.init}}} ows ")"',
        f'gatom ::= "(" pname (" " name){{0,{L.atom_args}}} ")"',
        f'goal ::= "(:goal" ws gform ows ")"',
        f'gform ::= "(and" (ws glit){{1,{L.goal}}} ows ")" | glit',
        'glit ::= gatom | "(not " gatom ")"',
    ]
    rules += _excluding("pname", RESERVED, L)
    return "\n".join(rules) + "\n"


_DOMAIN_NAME = re.compile(r"\(define \(domain ([a-z][a-z0-9_-]*)\)")
_AT_PROBLEM_DOMAIN = re.compile(r"\(:domain(\s*)$")


class PddlGrammar:
    """The PDDL grammar compiled for one tokenizer; hands out per-sequence states."""

    def __init__(self, tokenizer, vocab_size: int, limits: GrammarLimits | None = None):
        import xgrammar as xgr

        t0 = time.perf_counter()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[tokenizer.eos_token_id])
        self.compiled = xgr.GrammarCompiler(self.info, max_threads=2).compile_grammar(pddl_ebnf(limits))
        self.eos = tokenizer.eos_token_id
        self.compile_s = time.perf_counter() - t0
        log.info("PDDL grammar compiled in %.2f s", self.compile_s)

    def state(self) -> "GrammarState":
        return GrammarState(self)

    def allocate_bitmask(self, rows: int):
        import xgrammar as xgr

        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits, bitmask) -> None:
        """Set disallowed logits to -inf in place (rows of ``logits`` match rows of ``bitmask``)."""
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size)


class GrammarState:
    """The grammar's position in one sequence, plus forced tokens for the problem's domain name."""

    def __init__(self, grammar: PddlGrammar):
        import xgrammar as xgr

        self.grammar = grammar
        self.matcher = xgr.GrammarMatcher(grammar.compiled)
        self.text = ""
        self.forced: list[int] = []
        self._name_done = False
        self.failed = False  # a token the grammar rejected reached accept (should not happen)

    @property
    def finished(self) -> bool:
        return self.matcher.is_terminated()

    def fill(self, bitmask, row: int) -> int | None:
        """Write the allowed tokens into ``bitmask[row]``; return the forced token, if one is."""
        if self.forced:
            tok = self.forced[0]
            bitmask[row].fill_(0)
            bitmask[row, tok // 32] = _bit(tok % 32)
            return tok
        self.matcher.fill_next_token_bitmask(bitmask, row)
        return None

    def accept(self, token: int, piece: str) -> bool:
        """Advance by one token; ``piece`` is its decoded text."""
        if self.forced and self.forced[0] == token:
            self.forced.pop(0)
        ok = self.matcher.accept_token(token)
        if not ok:
            self.failed = True
            return False
        self.text += piece
        if not self._name_done and "(:domain" in self.text[-len(piece) - 9:]:
            m = _AT_PROBLEM_DOMAIN.search(self.text)
            if m:
                self._force_domain_name(bool(m.group(1)))
        return True

    def _force_domain_name(self, has_space: bool) -> None:
        self._name_done = True
        m = _DOMAIN_NAME.search(self.text)
        if not m:  # cannot happen under the grammar: the domain header comes first
            return
        text = ("" if has_space else " ") + m.group(1) + ")"
        self.forced = list(self.grammar.tokenizer.encode(text, add_special_tokens=False))


def _bit(i: int) -> int:
    # bitmask entries are int32: bit 31 is the sign bit
    return (1 << i) - (1 << 32) if i == 31 else (1 << i)
