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

from omtr.model.limits import GrammarLimits

log = logging.getLogger("omtr.model")

# Words a predicate may not be called: lint reads them as formula heads (and `not` in :init).
RESERVED = ("and", "not", "or", "imply", "exists", "forall", "when", "either")
REQUIREMENTS = (":strips", ":typing", ":negative-preconditions", ":equality")
GRAMMAR_WORDS = ("(define", "(domain", "(problem", "(:requirements", "(:types", "(:predicates", "(:action",
                 ":parameters", ":precondition", ":effect", "(:domain", "(:objects", "(:init", "(:goal",
                 "(and", "(not", "(=") + REQUIREMENTS

_NAME_HEAD = "abcdefghijklmnopqrstuvwxyz"
_NAME_TAIL = _NAME_HEAD + "0123456789_-"


def _bucket(n: int, step: int = 8) -> int:
    return -(-n // step) * step


def statement_limits(limits: GrammarLimits, objects) -> GrammarLimits:
    """``limits`` widened to what the task's statement needs, so that a bound kept for speed never
    forbids the task: as many objects as the statement names plus one of the problem's own for each
    clause that names nothing (Gripper's "the left gripper is free"), ``:init`` atoms for every
    clause plus one static fact per name (PlanBench's Logistics never states ``(truck t0)``), goal
    atoms for every goal clause, names as long as the longest. Rounded up to multiples of 8, so few
    grammars are compiled. ``objects``: the statement's names (:class:`omtr.statement.StatementNames`)."""
    if not objects:
        return limits
    reading = getattr(objects, "reading", None)
    n = len(objects)
    longest = max((len(o) for o in objects), default=0)
    if reading is not None:
        init_named, goal_named = (sum(1 for c in reading.init if c.key), sum(1 for c in reading.goal if c.key))
        free_init, free_goal = reading.nameless
    else:
        init_named = goal_named = free_init = free_goal = 0
    need = {
        "objects": n + free_init,
        "init": init_named + free_init + n,
        "goal": goal_named + free_goal,
        "name_len": longest,
    }
    changes = {k: _bucket(v) for k, v in need.items() if v > getattr(limits, k)}
    if "name_len" in changes:
        changes["name_len"] = need["name_len"]
    return GrammarLimits(**{**limits.__dict__, **changes}) if changes else limits


# How an answer's token limit is sized from its statement (:func:`answer_tokens`): characters per
# token of PDDL under a byte-level BPE (SmolLM2 writes PlanBench's problems at 2.0-2.7, generated ones at
# 2.6-3.4; the lowest is taken), the share added on top for the model's own spacing and names, and the domain's share
# of a full-mode answer (PlanBench's domains take 330-740 SmolLM2 tokens, generated ones 280-490).
ANSWER_CHARS_PER_TOKEN = 2.0
ANSWER_MARGIN = 1.25
FULL_DOMAIN_TOKENS = 640


def answer_tokens(objects, given=None) -> int:
    """The tokens a problem stating everything this task's statement says takes, with a margin: a
    header, every name declared (with a type where the domain is typed), an atom per clause (the
    domain's longest predicate over the clause's names), one static fact per name (PlanBench's
    Logistics never states ``(truck t0)``) and the goal; in the full mode (``given`` None) the
    domain's share (:data:`FULL_DOMAIN_TOKENS`) on top. 0 without a reading of the statement. Sized
    as :func:`statement_limits` sizes the grammar's bounds, from the English alone."""
    reading = getattr(objects, "reading", None)
    if not objects or reading is None:
        return 0
    spelled = {n.replace("_", "").replace("-", ""): n for n in objects}
    preds = dict(given.predicates) if given is not None else {}
    pred_len = max((len(p) for p in preds), default=12)
    typed = given is None or bool({":typing", ":adl"} & set(given.flags))
    type_len = max((len(t) for t in (given.types if given is not None else ())), default=10) if typed else 0

    def atom(key) -> int:  # "\n    (pred a b)"
        return 8 + pred_len + sum(len(spelled.get(k, k)) + 1 for k in key)

    chars = 120 + len(getattr(given, "name", "") or "") * 2  # (define (problem ..) (:domain ..)
    chars += sum(len(n) + 1 + (type_len + 3 if typed else 0) for n in objects)
    free_init, free_goal = reading.nameless
    chars += sum(atom(c.key) for c in reading.init if c.key) + free_init * atom(("object",))
    chars += sum(atom(c.key) for c in reading.goal if c.key) + free_goal * atom(("object",)) + 16
    statics = given is None or any(len(a) == 1 and p not in given.fluents for p, a in preds.items())
    if statics:  # a static fact per name, where the domain has unary static predicates
        chars += sum(atom((n,)) for n in objects)
    tokens = int(ANSWER_MARGIN * chars / ANSWER_CHARS_PER_TOKEN) + 16
    return tokens + (FULL_DOMAIN_TOKENS if given is None else 0)


def problem_limits(limits: GrammarLimits, given) -> GrammarLimits:
    """``limits`` for the problem grammar of a given domain: atoms as long as its longest
    predicate, names as long as its longest name (at least the configured bounds)."""
    arity = max((len(a) for a in given.predicates.values()), default=0)
    names = [given.name or "", *given.predicates, *given.constants, *given.types]
    longest = max((len(n) for n in names), default=0)
    return GrammarLimits(**{**limits.__dict__, "atom_args": max(limits.atom_args, arity),
                            "name_len": max(limits.name_len, longest)})


def decode_limits(limits: GrammarLimits, given=None, objects=None) -> GrammarLimits:
    """The bounds one answer decodes under: ``limits`` widened for a given domain
    (:func:`problem_limits`) and for the task's statement (:func:`statement_limits`). The decoder
    (:meth:`PddlGrammar.limits_for`) and ``omtr model scope-check`` both use it."""
    return statement_limits(problem_limits(limits, given) if given is not None else limits, objects)


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


def pddl_ebnf(limits: GrammarLimits | None = None, *, problem_only: bool = False) -> str:
    """The grammar's EBNF text (xgrammar / GBNF dialect); root rule ``root``.

    ``problem_only``: the answer is a problem alone (the domain-given mode)."""
    L = limits or GrammarLimits()
    req = " | ".join(f'"{r}"' for r in REQUIREMENTS)
    rules = [
        "root ::= problem" if problem_only else 'root ::= domain ("\\n\\n" | ws) problem',
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
CONSTRAINTS = ("scoped", "plain", "off")


class PddlGrammar:
    """The PDDL grammar compiled for one tokenizer; hands out per-sequence states.

    Two roots: the full answer (domain, then problem) and, for the domain-given mode, a problem
    alone (compiled on first use). :meth:`state` gives one sequence's state under the plain
    grammar or, with ``scoped=True``, under the grammar plus the scope rules of
    :mod:`omtr.model.scope`."""

    def __init__(self, tokenizer, vocab_size: int, limits: GrammarLimits | None = None):
        import xgrammar as xgr

        t0 = time.perf_counter()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.limits = limits or GrammarLimits()
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=[tokenizer.eos_token_id])
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=2)
        self.compiled = self._compiler.compile_grammar(pddl_ebnf(self.limits))
        self._problem: dict[tuple, object] = {}
        self._full: dict[tuple, object] = {tuple(sorted(self.limits.__dict__.items())): self.compiled}
        self._vocab = None
        self.eos = tokenizer.eos_token_id
        self.compile_s = time.perf_counter() - t0
        log.info("PDDL grammar compiled in %.2f s", self.compile_s)


    def problem_grammar(self, limits: GrammarLimits):
        """The compiled problem-only grammar under ``limits`` (compiled once per limits)."""
        key = tuple(sorted(limits.__dict__.items()))
        got = self._problem.get(key)
        if got is None:
            got = self._problem[key] = self._compiler.compile_grammar(pddl_ebnf(limits, problem_only=True))
        return got

    def full_grammar(self, limits: GrammarLimits):
        """The compiled grammar of a whole answer (domain, then problem) under ``limits``."""
        key = tuple(sorted(limits.__dict__.items()))
        got = self._full.get(key)
        if got is None:
            got = self._full[key] = self._compiler.compile_grammar(pddl_ebnf(limits))
        return got

    def limits_for(self, given=None, objects=None) -> GrammarLimits:
        """The bounds one answer decodes under (:func:`decode_limits` of the configured ones)."""
        return decode_limits(self.limits, given, objects)

    @property
    def vocab(self) -> "ScopedVocab":
        if self._vocab is None:
            self._vocab = ScopedVocab(self.tokenizer, self.vocab_size)
        return self._vocab

    def state(self, *, scoped: bool = False, given=None, objects=None) -> "GrammarState":
        """One sequence's state. ``given``: the given domain's declarations
        (:class:`omtr.model.scope.Declared`) in the domain-given mode, where the answer is the
        problem alone. ``objects``: names the problem must declare first (scoped only; the task
        statement's names, :class:`omtr.model.scope.ScopeTracker`)."""
        return GrammarState(self, scoped=scoped, given=given, objects=objects)

    def allocate_bitmask(self, rows: int):
        import xgrammar as xgr

        return xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits, bitmask) -> None:
        """Set disallowed logits to -inf in place (rows of ``logits`` match rows of ``bitmask``)."""
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size)


class _Index:
    """Texts (token pieces, or what is left of them after some characters) indexed for the scope
    filter: which are all name characters, which start a name, the entries of each all-name text,
    and the entries that go on past a word (by that word)."""

    def __init__(self, texts: list[str]):
        import numpy as np

        from omtr.model.scope import WORD_CHARS

        self.texts = texts
        n = len(texts)
        lead = np.zeros(n, dtype=np.int32)
        first_name = np.zeros(n, dtype=bool)
        self.pure_ids: dict[str, list[int]] = {}
        self.heads: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            k = 0
            while k < len(t) and t[k] in WORD_CHARS:
                k += 1
            lead[i] = k
            if t and k == len(t):
                self.pure_ids.setdefault(t, []).append(i)
                first_name[i] = t[0].isalpha() or t[0] == "?"
            elif k:
                self.heads.setdefault(t[:k], []).append(i)
        lens = np.array([len(t) for t in texts], dtype=np.int32)
        self.empty = lens == 0
        self.pure = (lead == lens) & (lens > 0)
        self.pure_name_start = self.pure & first_name
        self.lead0 = (lead == 0) & (lens > 0)
        self.wordish = lead > 0  # starts with a name character
        self.has_empty = bool((lens == 0).any())
        self.first = np.array([min(ord(t[0]), 255) if t else 0 for t in texts], dtype=np.int32)
        self._children: dict[int, tuple] = {}

    def child(self, c: int):
        """(positions, index of the rests) of the entries that start with the non-name character ``c``."""
        got = self._children.get(c)
        if got is None:
            import numpy as np

            pos = np.flatnonzero(self.lead0 & (self.first == c))
            got = self._children[c] = (pos, _Index([self.texts[i][1:] for i in pos]))
        return got


class ScopedVocab:
    """The tokenizer's pieces, indexed for the scope filter (see :func:`scoped_tokens`)."""

    def __init__(self, tokenizer, vocab_size: int):
        t0 = time.perf_counter()
        self.pieces = [tokenizer.decode([i]) if i < len(tokenizer) else "" for i in range(vocab_size)]
        self.size = vocab_size
        self.root = _Index(self.pieces)
        log.info("scope vocabulary indexed in %.2f s", time.perf_counter() - t0)


class GrammarState:
    """The grammar's position in one sequence, plus forced tokens for the problem's domain name
    and, when scoped, the scope rules (:class:`omtr.model.scope.ScopeTracker`)."""

    def __init__(self, grammar: PddlGrammar, *, scoped: bool = False, given=None, objects=None):
        import xgrammar as xgr

        self.grammar = grammar
        self.given = given
        limits = self.limits = grammar.limits_for(given, objects)
        if given is not None:
            self.matcher = xgr.GrammarMatcher(grammar.problem_grammar(limits))
        else:
            self.matcher = xgr.GrammarMatcher(grammar.full_grammar(limits))
        self.text = ""
        self.forced: list[int] = []
        self._name_done = False
        self.failed = False  # a token the grammar rejected reached accept (should not happen)
        self.scope = None
        self.scope_left = False  # the text left the scope rules (a token chosen without them)
        self.fallbacks = 0  # steps where the scope rules left no token and the plain mask was used
        self.scope_s = 0.0
        if scoped:
            from omtr.model.scope import ScopeTracker

            self.scope = ScopeTracker(given, limits=limits, objects=objects)

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
        if self.scope is not None:
            t0 = time.perf_counter()
            self._restrict(bitmask, row)
            self.scope_s += time.perf_counter() - t0
        return None

    def _restrict(self, bitmask, row: int) -> None:
        import numpy as np
        import torch

        voc = self.grammar.vocab
        V = voc.size
        words = bitmask[row].numpy()
        allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:V].astype(bool)
        keep = scoped_tokens(self.scope, voc, allowed)
        if not keep.any():
            self.fallbacks += 1
            log.debug("scope rules left no token after %r; using the plain grammar's mask", self.text[-60:])
            return
        packed = np.packbits(np.concatenate([keep, np.zeros(words.size * 32 - V, dtype=bool)]), bitorder="little")
        bitmask[row] = torch.from_numpy(packed.view(np.int32).copy())

    def accept(self, token: int, piece: str) -> bool:
        """Advance by one token; ``piece`` is its decoded text."""
        if self.forced and self.forced[0] == token:
            self.forced.pop(0)
        ok = self.matcher.accept_token(token)
        if not ok:
            self.failed = True
            return False
        self.text += piece
        if self.scope is not None:
            from omtr.model.scope import Reject

            try:
                self.scope.feed_text(piece)
            except Reject as e:
                self.scope_left = True
                self.scope = None
                log.warning("scope rules refused %r after %r (%s); the rest of this answer is unscoped",
                            piece, self.text[-80:-len(piece) or None], e)
        if not self._name_done and "(:domain" in self.text[-len(piece) - 9:]:
            m = _AT_PROBLEM_DOMAIN.search(self.text)
            if m:
                self._force_domain_name(bool(m.group(1)))
        return True

    def _force_domain_name(self, has_space: bool) -> None:
        self._name_done = True
        if self.given is not None:
            name = self.given.name
        else:
            m = _DOMAIN_NAME.search(self.text)
            if not m:  # cannot happen under the grammar: the domain header comes first
                return
            name = m.group(1)
        if not name or not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
            return
        text = ("" if has_space else " ") + name + ")"
        self.forced = list(self.grammar.tokenizer.encode(text, add_special_tokens=False))


def scoped_tokens(tracker, voc: ScopedVocab, allowed):
    """The tokens of ``allowed`` (a bool array over the vocabulary) that keep the answer in scope."""
    return _admit(tracker, voc.root, allowed)


def _admit(tracker, idx: _Index, allowed):
    """``allowed`` restricted to the entries of ``idx`` whose text the tracker admits.

    Entries that begin with a space, a parenthesis or a line break are grouped by that first
    character: the tracker reads it once and the rests are decided the same way, one level down.
    Inside a word the admitted entries come from the allowed names (a finite set) or, for a new
    name, from the all-name entries at once; only entries that end a word and go on are
    simulated one by one."""
    import numpy as np

    keep = allowed & idx.empty if idx.has_empty else np.zeros(len(idx.texts), dtype=bool)
    texts = idx.texts
    sim: list[int] = []
    rest = allowed & idx.lead0
    if tracker.word_due():
        p = tracker.word
        closed, banned = tracker.word_constraint()
        if closed is not None:
            ends_here = False
            words = np.zeros(len(texts), dtype=bool)
            for s in closed:
                if not s.startswith(p):
                    continue
                r = s[len(p):]
                if not r:
                    ends_here = True
                    continue
                for k in range(1, len(r) + 1):
                    for i in idx.pure_ids.get(r[:k], ()):
                        words[i] = True
                sim.extend(idx.heads.get(r, ()))
            keep |= words & allowed
            if not ends_here:
                rest = rest & False
        else:
            free = allowed & (idx.pure if p else idx.pure_name_start)
            if not p:  # a new word: its first character may already be refused (a full list)
                for c in _chars(idx.first[free]):
                    if not tracker.admits(chr(c)):
                        free &= idx.first != c
            for b in banned or ():  # a taken name at the length limit: nothing can extend it past
                if len(b) >= tracker.name_len + b.startswith("?") and b.startswith(p):
                    for i in idx.pure_ids.get(b[len(p):], ()):
                        free[i] = False
            keep |= free
            sim.extend(np.flatnonzero(allowed & idx.wordish & ~free).tolist())
    else:
        sim.extend(np.flatnonzero(allowed & idx.wordish).tolist())
    for i in sim:
        if allowed[i] and not keep[i] and tracker.admits(texts[i]):
            keep[i] = True
    if rest.any():
        for c in _chars(idx.first[rest]):
            t2 = tracker.clone()
            try:
                t2.feed(chr(c))
            except _reject():
                continue
            pos, sub = idx.child(c)
            keep[pos] = _admit(t2, sub, allowed[pos])
    return keep


def _chars(codes) -> list[int]:
    import numpy as np

    return np.flatnonzero(np.bincount(codes, minlength=256)).tolist()


def _reject():
    from omtr.model.scope import Reject

    return Reject


def _bit(i: int) -> int:
    # bitmask entries are int32: bit 31 is the sign bit
    return (1 << i) - (1 << 32) if i == 31 else (1 << i)
