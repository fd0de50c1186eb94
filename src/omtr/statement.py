"""Reading a task's statement: what its English says, and how sure the reading is (never a reference).

This is the one place omtr reads a task's English. :func:`read_statement` turns a task's text into
a :class:`Reading`, a plain value that the scope rules (:class:`omtr.model.scope.ScopeTracker`),
the grounding reward (:mod:`omtr.rl.grounding`), the episode records and the conformance suite
(:mod:`omtr.model.scope_check`) all consume. It reads the ``nl`` text alone and imports nothing of
omtr, so it sits below every room that uses it (beside the task records, not among them: the training
side may import from ``omtr.tasks`` only ``omtr.tasks.training``).

The task suites state a task in PlanBench's layout: a description of the domain, then a
``[STATEMENT]`` line, then "As initial conditions I have that, ... My goal is to have that ...".
The statement is split into clauses (at commas, "and", full stops and semicolons); the goal part
starts at the first word "goal". A statement's *names* are, in any clause:

* identifiers: a letter, then letters, digits, ``_`` or ``-`` with at least one digit
  (``package_0``, ``crate0``, ``location_1_1``), even when the description uses the same name in a
  worked example;
* single letters that follow a word other than the template's (``object a``: Mystery BlocksWorld);
* any other word that is neither a word of the description nor one of the template's words
  (colours: "the red block").

How sure the reading is decides which scope rules may use it (:attr:`Reading.rules`):

* ``layout == "planbench"`` (the two template sentences found, every clause read): the names and
  the facts (each clause's names in order);
* ``layout == "statement"`` (a ``[STATEMENT]`` line in another layout): the names rule only, and
  only identifiers count as names there (a word such as "stays" could be anything);
* ``layout == "none"`` (free English, or no names): nothing; the grammar and the plain scope
  rules alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

STATEMENT = "[STATEMENT]"
_WORD = re.compile(r"[a-z0-9][a-z0-9_\-]*")
_CLAUSE_SPLIT = re.compile(r",|;|\.(?:\s|$)|\n|\band\b")
_GOAL = re.compile(r"\bgoal\b")
_PART = re.compile(r"[_\-]+|(?<=[a-z])(?=[0-9])")
_IDENT = re.compile(r"[a-z][a-z0-9_\-]*[0-9][a-z0-9_\-]*")
_SPELLED = re.compile(r"[a-z][a-z0-9_-]*")
_INIT_LEAD = re.compile(r"^\s*as initial conditions i have that\b")
_GOAL_LEAD = re.compile(r"\bmy goal is to have that\b")
# A clause's text loses the template's lead-in ("as initial conditions i have that", "is to have that").
_LEAD = re.compile(r"^(?:as initial conditions i have that|(?:my goal )?is to have that)\b\s*")
# The statement's own wording (PlanBench's "As initial conditions I have that, ... My goal is to have
# that ..."), and short function words: never names by themselves.
TEMPLATE_WORDS = frozenset(
    "as initial conditions i have that my goal is to the a an of on in at top and are be it its "
    "with by from for".split())

RULE_OBJECTS = "objects"  # the statement's names are the problem's first objects (and, sure, its only ones)
RULE_FACTS = "facts"  # each :init / goal atom over the names stands for one clause
RULE_PREDICATES = "predicates"  # a clause whose words name one predicate has an atom of that predicate
# Words that join a clause's other words without naming anything: skipped when a predicate's name
# is matched against the words ("on the table": ontable; "the hand is empty": handempty).
FILLER_WORDS = frozenset("the a an is are be being been".split())
# Words after which a clause does not say a plain fact (the rule stands aside).
_NEGATING = frozenset("not no never nothing none".split())
_MATCH_SPAN = 4  # a predicate's name is matched against at most this many consecutive words


def _norm(word: str) -> str:
    return word.replace("_", "").replace("-", "")


def name_parts(name: str) -> list[str]:
    """A name's parts, split at ``_``/``-`` and before a digit run: ``ball_1`` and ``ball1`` -> ball, 1."""
    return _PART.split(name)


def name_of(arg: str, names) -> str | None:
    """The statement name (normalised, one of ``names``) that a problem's argument stands for: the
    name it spells (``ball1`` and ``ball_1`` alike) or the one name it holds as a part (``red_block``
    names ``red``); None for an argument that names nothing or several."""
    a = arg.lower()
    if _norm(a) in names:
        return _norm(a)
    hits = [p for p in name_parts(a) if p in names]
    return hits[0] if len(hits) == 1 else None


@dataclass(frozen=True)
class Clause:
    """One clause of the statement: its normalised words, and its names in the order it gives them
    (``key``; empty for a clause that names nothing, "the hand is empty")."""

    words: tuple[str, ...]
    key: tuple[str, ...]
    text: str = field(default="", compare=False)  # the clause as the statement writes it (lower case)

    @property
    def says_something(self) -> bool:
        return any(w and w not in TEMPLATE_WORDS for w in self.words)


@dataclass(frozen=True)
class Reading:
    """What a task's statement says, read from its English alone.

    ``names``: the statement's names as it spells them (lower case, first use first, one spelling
    per name). ``init`` / ``goal``: its clauses per part. ``layout``: how the statement was laid out
    (module doc), which decides :attr:`rules`. ``why``: one sentence on what was read, for traces."""

    layout: str
    names: tuple[str, ...] = ()
    init: tuple[Clause, ...] = ()
    goal: tuple[Clause, ...] = ()
    why: str = ""
    words: frozenset = frozenset()  # every word of the task's text as it is spelled (lower case)

    @property
    def norm_names(self) -> frozenset:
        return frozenset(_norm(n) for n in self.names)

    @property
    def rules(self) -> tuple[str, ...]:
        """The statement rules this reading is sure enough for (module doc)."""
        if not self.names or self.layout == "none":
            return ()
        if self.layout == "planbench":
            return (RULE_OBJECTS, RULE_FACTS, RULE_PREDICATES)
        return (RULE_OBJECTS,)

    @property
    def closed(self) -> bool:
        """Is the reading sure that the statement names every object (PlanBench's layout)? Then a
        problem declares no object the statement does not name, except for its clauses that name
        nothing, and those only with words of the task's own text (:attr:`words`)."""
        return self.layout == "planbench" and bool(self.names)

    @property
    def facts(self) -> tuple[tuple, tuple]:
        """(init keys, goal keys): each clause's names in order; clauses without names left out."""
        return (tuple(c.key for c in self.init if c.key), tuple(c.key for c in self.goal if c.key))

    @property
    def nameless(self) -> tuple[int, int]:
        """Per part, the clauses that say something without a name ("the hand is empty")."""
        return (sum(1 for c in self.init if not c.key and c.says_something),
                sum(1 for c in self.goal if not c.key and c.says_something))


def clause_predicate(clause: Clause, predicates: dict) -> str | None:
    """The predicate a clause's own words name, or None where the words do not settle it.

    ``predicates``: a domain's predicates (name -> argument types). A predicate is named when its
    name, without ``-``/``_``, is one of the clause's words other than its names, or several such
    words in a row with :data:`FILLER_WORDS` skipped ("on the table": ``ontable``; "in the city":
    ``in-city``). A clause with names takes only a predicate of as many arguments as it has names;
    where several are named the one matching the most words wins, and a tie, a negated clause
    ("is not clear") or no match at all gives None (the rule stands aside). Read from the English
    and the domain's declared names alone, never from a reference."""
    if not predicates or any(w in _NEGATING for w in clause.words):
        return None
    names = set(clause.key)
    content = [w for w in clause.words if w and w not in FILLER_WORDS and w not in names]
    spans: dict[str, int] = {}
    for i in range(len(content)):
        joined = ""
        for j in range(i, min(i + _MATCH_SPAN, len(content))):
            joined += content[j]
            spans.setdefault(joined, j - i + 1)
            spans[joined] = max(spans[joined], j - i + 1)
    best: list[tuple[int, str]] = []
    for p, args in predicates.items():
        n = spans.get(_norm(p.lower()))
        if n is None or (clause.key and len(args) != len(clause.key)):
            continue
        best.append((n, p))
    if not best:
        return None
    best.sort(reverse=True)
    if len(best) > 1 and best[0][0] == best[1][0]:
        return None
    return best[0][1]


def _names_in(words: list[str], described: set[str]) -> list[str]:
    """The names among a clause's raw words (module doc), in order."""
    out = []
    for i, w in enumerate(words):
        w = w.strip("-_")
        if not w or not w[0].isalpha():
            continue
        if _IDENT.fullmatch(w):
            out.append(w)
        elif len(w) == 1 and i > 0 and words[i - 1] not in TEMPLATE_WORDS and not _IDENT.fullmatch(words[i - 1]) \
                and words[i - 1] not in out:
            out.append(w)  # "object a": a one-letter name after a class noun
        elif _norm(w) not in described and w not in TEMPLATE_WORDS:
            out.append(w)
    return out


def read_statement(nl: str) -> Reading:
    """Read a task's text (module doc). Never raises: a text it cannot account for gives a reading
    whose :attr:`Reading.rules` are empty, with ``why`` saying so."""
    text = (nl or "").lower()
    cut = text.rfind(STATEMENT.lower())
    if cut < 0:
        return Reading("none", why="no [STATEMENT] line: the statement rules stand aside")
    described = {_norm(w) for w in _WORD.findall(text[:cut])}
    stmt = text[cut + len(STATEMENT):]
    m = _GOAL.search(stmt)
    init_text, goal_text = (stmt[:m.start()], stmt[m.end():]) if m else (stmt, "")
    spelled: dict[str, str] = {}

    def clauses(part: str) -> tuple[Clause, ...]:
        out = []
        for c in _CLAUSE_SPLIT.split(part):
            raw = _WORD.findall(c)
            names = _names_in(raw, described)
            for n in names:
                if _SPELLED.fullmatch(n):
                    spelled.setdefault(_norm(n), n)
            out.append(Clause(tuple(_norm(w) for w in raw), tuple(_norm(n) for n in names),
                              _LEAD.sub("", " ".join(c.split())).strip()))
        return tuple(out)

    init, goal = clauses(init_text), clauses(goal_text)
    names = tuple(spelled.values())
    words = frozenset(w.strip("-_") for w in _WORD.findall(text) if _SPELLED.fullmatch(w.strip("-_") or "0"))
    if not names:
        return Reading("none", init=init, goal=goal, why="the statement names no object: the statement rules stand aside")
    planbench = bool(_INIT_LEAD.search(init_text)) and bool(m) and bool(_GOAL_LEAD.search(stmt))
    if planbench:
        return Reading("planbench", names, init, goal,
                       why=f"PlanBench layout: {len(names)} names, {sum(1 for c in init + goal if c.key)} clauses with names",
                       words=words)
    # Another layout: only identifiers are sure to be names ("stays" in "the yellow block stays" is not)
    sure = tuple(n for n in names if _IDENT.fullmatch(n))
    if not sure:
        return Reading("none", init=init, goal=goal,
                       why="a statement not in PlanBench's layout and without identifiers: the statement rules stand aside")
    return Reading("statement", sure, init, goal,
                   why=f"{len(sure)} identifiers in a statement not in PlanBench's layout: the names rule only",
                   words=words)


# ------------------------------------------------------------------ the views the rest of omtr uses


def statement_parts(nl: str) -> tuple[set[str], list[list[str]], list[list[str]]] | None:
    """(names, init clauses, goal clauses) of a task's text: names normalised, each clause as its
    list of normalised words; None without a ``[STATEMENT]`` line."""
    r = read_statement(nl)
    if r.layout == "none" and not r.init:
        return None
    return set(r.norm_names), [list(c.words) for c in r.init], [list(c.words) for c in r.goal]


class StatementNames(list):
    """The statement's names (a list, spelled as the statement spells them) that the episode loop
    hands to ``generate(objects=...)``, with the :class:`Reading` they come from (``reading``) and
    its facts: ``facts = (init_keys, goal_keys)`` (or None when the reading is not sure enough for
    the facts rule), ``nameless`` per part. ``extra_words``: where the reading is sure the statement
    names every object (:attr:`Reading.closed`), the words an object of the problem's own may be (the
    task's words, for its clauses that name nothing); None: any name. ``predicates``: the predicates
    rule is on (:func:`clause_predicate`)."""

    reading: Reading | None = None
    facts: tuple | None = None
    nameless: tuple = (0, 0)  # per part, the clauses that name nothing ("the hand is empty")
    require: bool = True  # False: the names only size the grammar's bounds (statement_objects off)
    extra_words: frozenset | None = None
    predicates: bool = False

    def view(self, *, require: bool = True, facts: bool = True, predicates: bool = True) -> "StatementNames":
        """A copy for the decoder: ``require=False`` keeps the names for sizing the bounds only;
        ``facts=False`` drops the facts (the names rule alone); ``predicates=False`` keeps the facts
        but not the predicates their words name."""
        got = StatementNames(self)
        got.reading, got.require = self.reading, require
        if require:
            got.extra_words = self.extra_words
        if facts and require:
            got.facts, got.nameless = self.facts, self.nameless
            got.predicates = predicates and self.predicates
        return got

    def clause_facts(self, predicates: dict | None = None) -> dict:
        """Per part (``init``, ``goal``): ``(named, free)``, the clauses an atom must stand for:
        ``named`` as ``(key, predicate)`` for each clause with names, ``free`` a predicate for each
        clause that names nothing. A predicate is the one the clause's words name
        (:func:`clause_predicate` over the domain's ``predicates``) under the predicates rule, None
        otherwise (any predicate). Empty without facts."""
        r = self.reading
        out = {"init": ((), ()), "goal": ((), ())}
        if self.facts is None or r is None:
            return out

        def bind(c: Clause):
            return clause_predicate(c, predicates) if self.predicates and predicates else None

        for part, clauses in (("init", r.init), ("goal", r.goal)):
            out[part] = (tuple((c.key, bind(c)) for c in clauses if c.key),
                         tuple(bind(c) for c in clauses if not c.key and c.says_something))
        return out


def names_of(reading: Reading) -> StatementNames | None:
    """A reading as the names list the decoder takes (None when no rule may use it)."""
    if RULE_OBJECTS not in reading.rules:
        return None
    got = StatementNames(reading.names)
    got.reading = reading
    if reading.closed:
        got.extra_words = reading.words
    if RULE_FACTS in reading.rules:
        got.facts = reading.facts
        got.nameless = reading.nameless
        got.predicates = RULE_PREDICATES in reading.rules
    return got


def decoder_objects(names, statement_objects: bool = True, statement_facts: bool = True,
                    statement_predicates: bool = True):
    """What the decoder's ``objects`` argument holds for a task's names under a model's settings
    (``statement_objects``, ``statement_facts``, ``statement_predicates`` of
    :class:`omtr.config.ModelConfig`): the names with their facts (and the predicates the facts'
    words name), the names alone, or the names only for sizing the grammar's bounds; None for none.
    :meth:`omtr.model.roles.RoleModel.generate` and :mod:`omtr.model.scope_check` both use it."""
    if not names:
        return None
    if not isinstance(names, StatementNames):
        return tuple(names) if statement_objects else None  # names from elsewhere: no reading, no facts
    return names.view(require=statement_objects, facts=statement_facts, predicates=statement_predicates)


def statement_objects(nl: str) -> StatementNames | None:
    """The statement's names as it spells them (:func:`read_statement`), lower-cased, in order of
    first use, one spelling per name (``ball_1``, ``room_2``, ``red``, ``a``): what scoped decoding
    makes a problem declare as its objects. None when the reading is not sure of any name."""
    return names_of(read_statement(nl))

