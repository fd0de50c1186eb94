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
* ``layout == "plain"`` (free English without a ``[STATEMENT]`` line, :func:`read_plain`): the names
  rule with the names the English surely introduces ("two blocks, a and b", "ball1", "block x",
  "two grippers, left and right", "the red block"), not closed (the problem may declare objects of
  its own: "the kitchen"); and, only where every clause of the goal's sentences reads as "X on Y" /
  "X to Y" over two names ("Put a on b", "I want y on top of z"), the facts rule on the goal part
  alone (each goal atom stands for one of those clauses, its predicate the one the clause's words
  name) with ``:init`` free except that it may not hold an atom a goal clause stands for (a goal
  that already holds asks for nothing);
* ``layout == "none"`` (no names read): nothing; the grammar and the plain scope rules alone.
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
    # plain English: the clause says where the one thing it does not name is ("the robot is in room
    # r1": the robot is in one place only), so the atoms of its predicate exclude each other
    single: bool = field(default=False, compare=False)

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
    # plain English: (normalised name, noun) for each name the English gives one class noun ("ball b1",
    # "balls b1 and b2", "two pallets, pa and pb"); a name given two different nouns has none
    nouns: tuple = ()

    @property
    def noun_of(self) -> dict:
        return dict(self.nouns)

    @property
    def norm_names(self) -> frozenset:
        return frozenset(_norm(n) for n in self.names)

    @property
    def rules(self) -> tuple[str, ...]:
        """The statement rules this reading is sure enough for (module doc)."""
        if not self.names or self.layout == "none":
            return ()
        if self.layout == "planbench" or (self.layout == "plain" and (self.goal or self.init)):
            return (RULE_OBJECTS, RULE_FACTS, RULE_PREDICATES)
        return (RULE_OBJECTS,)

    @property
    def fact_parts(self) -> tuple[str, ...]:
        """The parts the facts rule binds: both in PlanBench's layout; the goal alone in plain English
        (whose initial state is never stated in full), where ``:init`` holds no goal clause's atom."""
        if self.layout == "plain":
            return ("goal",) if self.goal else ()
        return ("init", "goal")

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


def type_claims(clauses, types, predicates: dict) -> dict[str, frozenset]:
    """The types one-name clauses give their names by the type's own name ("location_0_0 is an
    airport" where the domain declares the type ``airport`` and no predicate of that name), as
    ``{type: the names (normalised) given it}``. A negated clause ("is not an airport") and one whose
    words name a predicate (:func:`clause_predicate`: an untyped domain's ``(airport l)``) give none.
    ``types``: the domain's declared types; ``predicates``: its predicates (name -> argument types).
    Shared by the decoder's names rule and the typed grounding signal."""
    by_word = {_norm(t.lower()): t for t in types if t.lower() != "object"}
    claims: dict[str, set] = {}
    for c in clauses:
        if len(c.key) != 1 or any(w in _NEGATING for w in c.words) or clause_predicate(c, predicates):
            continue
        for w in c.words:
            t = by_word.get(w)
            if t is not None and w != c.key[0]:
                claims.setdefault(t, set()).add(c.key[0])
    return {t: frozenset(v) for t, v in claims.items()}


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
        return read_plain(text)
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


# ------------------------------------------------------------------ plain English (no [STATEMENT] line)

_NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_PLAIN_TOKEN = re.compile(r"[a-z0-9][a-z0-9_\-]*(?:'[a-z]+)?|,")
_SENTENCE = re.compile(r"[.!?;:](?:\s+|$)|\n")
_COLOURS = frozenset("red blue green yellow orange white black purple pink brown grey gray cyan magenta violet "
                     "silver gold".split())
# After the article "a" comes a noun or an adjective; after a one-letter name "a", one of these (or
# the end of the sentence): "Put a on b", "a is on b", "a and b", "city a's airport".
_AFTER_NAME = frozenset("on onto to into in at and or is are was sits lies stays has from with crave craves "
                        "needs must should can will , 's".split())
# Words that never name an object in a list ("two blocks, a and b"): function words and quantities.
_NOT_NAMES = TEMPLATE_WORDS | FILLER_WORDS | frozenset(_NUMBERS) | frozenset(
    "one both all each every some other them they it this that these those there here not no".split())
# A sentence that asks for something: it starts with one of these verbs, or says what is wanted.
_ASKING = frozenset("put move stack carry bring get deliver ship fly swap build make unstack take place drive load "
                    "unload transport leave reverse please use arrange".split())
_WANTED = re.compile(r"\b(?:so that|i want|i'd like|i would like|want|goal|must end up|should end up|needs? to|"
                     r"(?:i|we) need)\b")
_RELATIONS = frozenset("on onto to into in at".split())


def _plain_tokens(sentence: str) -> list[str]:
    """A sentence's words and commas, a possessive or contraction split off ("a's": a, 's; "i'd": i)."""
    out = []
    for t in _PLAIN_TOKEN.findall(sentence):
        base, _, rest = t.partition("'")
        out.append(base)
        if rest == "s":
            out.append("'s")
    return out


def _is_word(t: str) -> bool:
    return bool(t) and t[0].isalpha() and _SPELLED.fullmatch(t) is not None


def _plain_names(tokens: list[str]) -> list[bool]:
    """Per token of one sentence: is it a name the English surely introduces (:func:`read_plain`)?"""
    n = len(tokens)
    name = [False] * n

    def letter_name(i: int) -> bool:
        t = tokens[i]
        if t == "i":
            return False
        if t != "a":
            return True
        return i + 1 >= n or tokens[i + 1] in _AFTER_NAME

    for i, t in enumerate(tokens):
        if not _is_word(t):
            continue
        if _IDENT.fullmatch(t):
            name[i] = True
        elif len(t) == 1:
            name[i] = letter_name(i)
        elif t in _COLOURS and i + 1 < n and _is_word(tokens[i + 1]) and tokens[i + 1] not in _AFTER_NAME:
            name[i] = True  # "the red block", "the green one"
        elif i > 0 and tokens[i - 1] == "named" and t not in _NOT_NAMES:
            name[i] = True  # "the ball named red"
        elif i > 0 and tokens[i - 1] in _CLASS_NOUNS and _word_after_noun(tokens, i):
            name[i] = True  # "package pk is at s1", "hoist hx": a word after a class noun, then a verb
    # "two grippers, left and right", "two cities, paris and rome": a count, a plural noun, then a
    # list of exactly that many words
    for i, t in enumerate(tokens):
        k = _NUMBERS.get(t)
        if not k or i + 1 >= n or not tokens[i + 1].endswith("s"):
            continue
        j = i + 2
        if j < n and tokens[j] == ",":
            j += 1
        items, expect_item = [], True
        while j < n:
            w = tokens[j]
            if expect_item:
                if not _is_word(w) or w in _NOT_NAMES:
                    break
                items.append(j)
                expect_item = False
            elif w in (",", "and"):
                expect_item = True
                if w == "," and j + 1 < n and tokens[j + 1] == "and":
                    j += 1
            else:
                break
            if len(items) == k:
                break
            j += 1
        if len(items) == k:
            for j in items:
                name[j] = True
    return name


# Singular class nouns: a word right after one, then a verb or a relation, is a name ("package pk
# is at s1"); the noun is the name's kind (:attr:`Reading.nouns`). Their plurals add an "s".
_CLASS_NOUNS = frozenset("block ball package parcel crate pallet truck airplane plane hoist depot distributor room "
                         "city airport location spot place gripper robot".split())
# Words that never name an object right after a class noun ("the block too", "the truck there")
_NOT_AFTER_NOUN = frozenset("too also then now there here first next last top bottom itself same other own "
                            "which who where when whose".split())


def _word_after_noun(tokens: list[str], i: int) -> bool:
    """Is ``tokens[i]``, right after a singular class noun, a name: a word of two letters or more that
    is no function word, verb or noun, followed by a verb, a relation, a comma or nothing ("package
    pk are at s1", "deliver package pk")? Words that read as verb forms ("-s", "-ed", "-ing") are not."""
    t = tokens[i]
    if len(t) < 2 or not _is_word(t) or t in _NOT_NAMES or t in _AFTER_NAME or t in _STATE_VERBS \
            or t in _ASKING or t in _NOUNS or t in _CLASS_NOUNS or t in _NOT_AFTER_NOUN or t in _RELATIONS:
        return False
    if t.endswith(("s", "ed", "ing")):
        return False
    return i + 1 >= len(tokens) or tokens[i + 1] in _AFTER_NAME or tokens[i + 1] in _STATE_VERBS


def _noun_of(t: str) -> str | None:
    """The singular class noun a token is, or None ("balls": ball)."""
    if t in _CLASS_NOUNS:
        return t
    if t.endswith("es") and t[:-2] in _CLASS_NOUNS and t[:-2].endswith(("s", "x", "ch")):
        return t[:-2]
    if t.endswith("ies") and t[:-3] + "y" in _CLASS_NOUNS:
        return t[:-3] + "y"
    if t.endswith("s") and t[:-1] in _CLASS_NOUNS:
        return t[:-1]
    return None


def _plain_nouns(tokens: list[str], name: list[bool]) -> list[tuple[str, str]]:
    """(name, noun) for each name of a sentence that a class noun introduces: right after a singular
    one ("ball b1") or in a list right after a plural one ("balls b1 and b2", "two pallets, pa and
    pb")."""
    out = []
    noun, listing = None, False
    for i, t in enumerate(tokens):
        if name[i]:
            if noun is not None:
                out.append((_norm(t), noun))
            if not listing:
                noun = None
            continue
        n = _noun_of(t)
        if n is not None:
            noun, listing = n, t != n
        elif t in (",", "and") and listing and noun is not None:
            continue
        else:
            noun, listing = None, False
    return out


def _range_names(tokens: list[str]) -> list[str]:
    """Identifiers a range stands for ("ball1 to ball4": ball1, ball2, ball3, ball4)."""
    out = []
    for i in range(len(tokens) - 2):
        a, b = tokens[i], tokens[i + 2]
        ma, mb = re.fullmatch(r"([a-z]+)(\d+)", a), re.fullmatch(r"([a-z]+)(\d+)", b)
        if tokens[i + 1] == "to" and ma and mb and ma.group(1) == mb.group(1) and int(ma.group(2)) < int(mb.group(2)) \
                and int(mb.group(2)) - int(ma.group(2)) < 20:
            out += [f"{ma.group(1)}{k}" for k in range(int(ma.group(2)), int(mb.group(2)) + 1)]
    return out


_INIT_RELATIONS = frozenset("on onto in at".split())
# Verbs that state how things are ("p is on q"): a clause after a request's colon with one of them
# describes the state now, one without ("o on n") what the request asks for.
_STATE_VERBS = frozenset("is are sits sit lies lie stands stand rests rest was were".split())
# Words beside a lone name in a request that wait for the next clause's phrase ("bring b1 and b2 to r1")
_LONE_WORDS = _ASKING | frozenset("the both then also block ball package crate".split())


def _table_clause(tokens: list[str], name: list[bool]) -> Clause | None:
    """A clause of one name that puts it on the table ("put b on the table", "b onto the table"):
    the name, a relation (on, onto), "the table" and nothing after; its words name the predicate
    (``ontable`` in BlocksWorld, :func:`clause_predicate`)."""
    at = [i for i, t in enumerate(tokens) if name[i]]
    if len(at) != 1 or any(t in _NEGATING for t in tokens) or any(not _is_word(t) for t in tokens):
        return None
    x = at[0]
    tail = tokens[x + 1:]
    if tail[-2:] == ["the", "table"]:
        tail = tail[:-2]
    elif tail[-1:] == ["table"]:
        tail = tail[:-1]
    else:
        return None
    if tail not in (["on"], ["onto"], ["is", "on"], ["be", "on"], ["ends", "up", "on"], ["end", "up", "on"]):
        return None
    return Clause(tuple(_norm(t) for t in tokens), (_norm(tokens[x]),), " ".join(tokens))


# the words of a stack's gap between two names ("a on b on c", "a on top of b on top of c")
_STACK_GAPS = (("on",), ("on", "top", "of"), ("onto",))
_STACK_LEAD = frozenset("the stack tower is reads it's with".split())


def _chain_clauses(tokens: list[str], name: list[bool]) -> list[Clause] | None:
    """A stack written as one clause, "a on b on c" (three names or more, each gap "on" / "on top
    of"): each name on the next, as "a on b", "b on c"; None for anything else. Before the first
    name only words such as "the stack is"; after the last, none but a noun."""
    at = [i for i, t in enumerate(tokens) if name[i]]
    if len(at) < 3 or any(t in _NEGATING for t in tokens) or any(not _is_word(t) for t in tokens):
        return None
    if not set(tokens[:at[0]]) <= _STACK_LEAD | _NOUNS or not set(tokens[at[-1] + 1:]) <= _NOUNS:
        return None
    out = []
    for x, y in zip(at, at[1:]):
        gap = [t for t in tokens[x + 1:y] if t not in ("block", "the")]
        if tuple(gap) not in _STACK_GAPS:
            return None
        words = [tokens[x]] + tokens[x + 1:y + 1]
        out.append(Clause(tuple(_norm(t) for t in words), (_norm(tokens[x]), _norm(tokens[y])), " ".join(words)))
    return out


def _goal_clause(tokens: list[str], name: list[bool], relations=_RELATIONS) -> Clause | None:
    """One clause of a goal sentence as "X on Y" / "X to Y" over two names, or None when it does
    not read so (the goal is then not read at all)."""
    at = [i for i, t in enumerate(tokens) if name[i]]
    if len(at) != 2 or any(t in _NEGATING for t in tokens):
        return None
    x, y = at
    if not any(t in relations for t in tokens[x + 1:y]) or not (len(tokens) - y <= 2 and set(tokens[y + 1:]) <= _NOUNS):
        return None
    if any(not _is_word(t) for t in tokens) or _range_names([tokens[x], "to", tokens[y]]):
        return None
    # "onto" / "into" say "on" / "in" (the words then name ``on`` / ``in`` where the domain has them)
    words = tuple(_norm(_MOTION.get(t, t)) if x < i < y else _norm(t) for i, t in enumerate(tokens))
    return Clause(words, (_norm(tokens[x]), _norm(tokens[y])), " ".join(tokens))


_MOTION = {"onto": "on", "into": "in"}


_SUBJECT_WORDS = frozenset("the there are is two three four five six seven eight nine ten blocks block balls ball "
                           "objects object packages package crates crate".split()) | _CLASS_NOUNS
# Nouns that may stand beside a name without changing what a clause says ("block x", "the green one").
_NOUNS = frozenset("block blocks ball balls object objects package packages parcel crate crates pallet pallets "
                   "truck trucks hoist room city airplane plane location one".split())
_PLURAL_VERBS = frozenset("are lie sit stand wait".split())
# "nothing is on x", "there is nothing on top of block x", "x has nothing on it": x is clear
_CLEAR_LEADS = (("nothing", "is", "on"), ("nothing", "sits", "on"), ("nothing", "lies", "on"), ("nothing", "on"),
                ("there", "is", "nothing", "on"), ("nothing", "is", "stacked", "on"))
_CLEAR_TAILS = (("has", "nothing", "on", "it"), ("has", "nothing", "on"))
_CLEAR_SKIP = frozenset("the top of block crate pallet".split())  # "nothing is on top of block x"
# the robot of a domain with one robot (Gripper's robby): "the robot is in room r1", "robby is at r1"
_ROBOT = frozenset("robot robby".split())
_VEHICLES = frozenset("truck trucks airplane airplanes plane planes package packages parcel parcels".split())


def _clear_clause(part: list[str], pf: list[bool]) -> Clause | None:
    """"nothing is on x" / "x has nothing on it" / "nothing is on top of block x" over one name: read as "x is clear"
    (its words then name a predicate ``clear`` where the domain has one; the clause's text stays the
    English's). None for anything else."""
    at = [i for i, f in enumerate(pf) if f]
    if len(at) != 1 or any(not _is_word(t) for t in part):
        return None
    x = at[0]
    head = [w for w in part[:x] if w not in _CLEAR_SKIP]
    tail = [w for w in part[x + 1:] if w not in _CLEAR_SKIP]
    ok = (tuple(head) in _CLEAR_LEADS and not tail) or (not head and tuple(tail) in _CLEAR_TAILS)
    if not ok:
        return None
    return Clause((_norm(part[x]), "is", "clear"), (_norm(part[x]),), " ".join(part))


def _robot_clause(part: list[str], pf: list[bool]) -> Clause | None:
    """"the robot is in room r1", "robby is at r1", "the robot is in room1 with both grippers free":
    the one robot's place, read as "robot at robby r1" (Gripper's ``at-robby``; in a domain without
    such a predicate its words name none and the rules drop it). Marked :attr:`Clause.single`: the
    robot is in one place."""
    at = [i for i, f in enumerate(pf) if f]
    if len(at) != 1 or any(not _is_word(t) for t in part):
        return None
    x = at[0]
    head = [w for w in part[:x] if w not in ("the", "my", "our", "room", "currently", "now")]
    if len(head) != 3 or head[0] not in _ROBOT or head[1] not in ("is", "stands", "waits", "sits") \
            or head[2] not in ("in", "at"):
        return None
    tail = part[x + 1:]
    if tail and tail[0] != "with":  # "with both grippers free" says nothing of the place
        return None
    words = ("robot", "at", "robby", _norm(part[x]))
    return Clause(words, (_norm(part[x]),), " ".join(part), single=True)


def _city_clauses(part: list[str], pf: list[bool]) -> list[Clause] | None:
    """"package p1 is at location l1 in city c1" (three names: X at Y in city Z): "X at Y" and "Y in
    city Z" (Logistics' ``at`` and ``in-city``); None for anything else. The place Y is a place (not
    a truck: "p1 is in truck t1 in city c1" is not read)."""
    at = [i for i, f in enumerate(pf) if f]
    if len(at) != 3 or any(not _is_word(t) for t in part):
        return None
    x, y, z = at
    if part[y + 1:z] not in (["in", "city"], ["in", "the", "city"], ["of", "city"], ["in"]) or part[z + 1:]:
        return None
    gap = [w for w in part[x + 1:y] if w not in FILLER_WORDS]
    if not gap or gap[0] != "at" or any(w in _VEHICLES for w in gap[1:]) or not set(gap[1:]) <= _CLASS_NOUNS:
        return None
    if not set(part[:x]) <= _NOUNS | _CLASS_NOUNS | {"the"}:
        return None
    first = [part[x]] + part[x + 1:y + 1]
    second = [part[y], "in", "city", part[z]]
    return [Clause(tuple(_norm(w) for w in first), (_norm(part[x]), _norm(part[y])), " ".join(first)),
            Clause(tuple(_norm(w) for w in second), (_norm(part[y]), _norm(part[z])), " ".join(part[y:]))]


def _init_clauses(tokens: list[str], name: list[bool]) -> list[Clause]:
    """The clauses of a sentence that states the initial state, where they read surely: two names
    joined by on, onto, in or at ("b sits on c", "a is on top of b", "truck t is at north"); one
    name with words that name a predicate of one argument ("z is on the table": the predicates rule
    binds it); and a list of names that a plural phrase follows ("a and b, on the table", "b1, b2
    and b3 lie in room a": each name with the phrase). A clause of one name binds only where its
    words name a predicate of the domain (the scope rules drop it otherwise, :mod:`omtr.model.scope.facts`)."""
    out: list[Clause] = []
    pending: list[str] = []
    start = 0
    for j in range(len(tokens) + 1):
        if j < len(tokens) and tokens[j] not in (",", "and"):
            continue
        part, pf = tokens[start:j], name[start:j]
        start = j + 1
        if not part:
            continue
        at = [i for i, f in enumerate(pf) if f]
        special = _clear_clause(part, pf) or _robot_clause(part, pf)
        if special is not None:  # "nothing is on x", "the robot is in room r1"
            out.append(special)
            pending = []
            continue
        city = _city_clauses(part, pf)
        if city:  # "package p1 is at location l1 in city c1"
            out += city
            pending = []
            continue
        if any(t in _NEGATING for t in part):
            pending = []
            continue
        if len(at) == 1 and all(t in _SUBJECT_WORDS for i, t in enumerate(part) if i != at[0]):
            pending.append(part[at[0]])  # "a", "four blocks a": a subject waiting for its phrase
            continue
        chain = _chain_clauses(part, pf)
        if chain:  # "the stack is a on b on c"
            out += chain
            pending = []
            continue
        two = _goal_clause(part, pf, _INIT_RELATIONS)
        if two is not None and "city" in part[at[0] + 1:at[1]] and at[0] > 0 and part[at[0] - 1] in _VEHICLES:
            pending = []  # "truck t1 is in city c1": somewhere in the city, at no place it names: not read
            continue
        if two is not None:
            out.append(two)
            x = at[0]
            if pending and part[x + 1:x + 2] and part[x + 1] in _PLURAL_VERBS:
                out += [Clause(tuple(_norm(w) for w in [p] + part[x + 1:]), (_norm(p), two.key[1]),
                               " ".join([p] + part[x + 1:])) for p in pending]
            pending = []
            continue
        subjects, phrase = [], []
        if len(at) == 1 and set(part[:at[0]]) <= _NOUNS | {"the", "an", "with"}:  # "the green block is on the table"
            phrase = part[at[0] + 1:]
            if phrase[:1] and phrase[0] in _NOUNS:
                phrase = phrase[1:]
            subjects = [part[at[0]]] + (pending if phrase[:1] and phrase[0] in _PLURAL_VERBS else [])
        elif not at and pending and part[0] in _INIT_RELATIONS:  # "a and b, on the table"
            subjects, phrase = pending, part
        elif len(at) == 1 and at[0] == len(part) - 1 and len(pending) > 1 and len(part) == 3 \
                and part[0] in _PLURAL_VERBS and part[1] in _INIT_RELATIONS:
            # "three balls, ball1, ball2 and ball3, are in room3": each waiting name in that place
            out += [Clause(tuple(_norm(w) for w in [p] + part), (_norm(p), _norm(part[-1])), " ".join([p] + part))
                    for p in pending]
            pending = []
            continue
        elif not at and all(_is_word(w) for w in part) and any(w in _STATE_VERBS or w == "holds" for w in part) \
                and part[0] not in ("there", "we", "i") and not any(w in _NUMBERS for w in part):
            # a clause that names nothing ("the hand is empty", "harmony holds"): it binds only where
            # its words name a predicate of no argument (:mod:`omtr.model.scope.facts`)
            out.append(Clause(tuple(_norm(w) for w in part), (), " ".join(part)))
        for sub in subjects:
            if phrase and all(_is_word(w) for w in phrase):
                out.append(Clause(tuple(_norm(w) for w in [sub] + phrase), (_norm(sub),), " ".join([sub] + phrase)))
        pending = []
    return out


def read_plain(text: str) -> Reading:
    """Read free English (no ``[STATEMENT]`` line; module doc, ``layout == "plain"``).

    Names: identifiers (``ball1``, ``p1``, a range "ball1 to ball4"), one-letter names (``x`` in
    "block x"; ``a`` only where an article cannot stand: "Put a on b", "a and b", "city a's"), the
    words a count introduces ("two grippers, left and right"), a colour before a noun ("the red
    block") and a word after "named"; a word read as a name once is a name everywhere (but ``a``).
    Goal: the sentences that ask for something (they start with a verb such as "put", "move",
    "stack", or say "I want", "so that", "must end up"), from "so that" / "want" on, split at commas
    and "and"; read only when every such clause with words in it reads as two names joined by on,
    onto, to, into, in or at ("Put a on b", "b is on a", "Move b1 to room b"), else no goal at all.
    Initial clauses also read: "nothing is on x" / "x has nothing on it" (as "x is clear"), "the robot
    is in room r1" (the one robot's place, :attr:`Clause.single`), "package p1 is at airport ap1 in
    city c1" (two clauses); "truck t1 is in city c1" is not read. A word after a class noun is a name
    ("package pk"), and the noun is its kind (:attr:`Reading.nouns`)."""
    text = text.lower()
    words = frozenset(w for w in _WORD.findall(text) if _SPELLED.fullmatch(w))
    sentences, colon = [], []  # colon: the sentence ends with ":" (what follows it says what it asks for)
    pos = 0
    for m in list(_SENTENCE.finditer(text)) + [None]:
        piece = text[pos:m.start() if m else len(text)].strip()
        if piece:
            sentences.append(piece)
            colon.append(bool(m) and m.group().startswith(":"))
        pos = m.end() if m else len(text)
    tokenized = [_plain_tokens(s) for s in sentences]
    flags = [_plain_names(t) for t in tokenized]
    spelled: dict[str, str] = {}
    for toks, fl in zip(tokenized, flags):
        ranges = _range_names(toks)
        for t, f in zip(toks, fl):
            if f:
                spelled.setdefault(_norm(t), t)
                if ranges and t == ranges[0]:  # "ball1 to ball4": ball2 and ball3 after ball1
                    for r in ranges:
                        spelled.setdefault(_norm(r), r)
        for t in ranges:
            spelled.setdefault(_norm(t), t)
    if not spelled:
        return Reading("none", why="free English that names no object the reader is sure of: the statement rules stand aside",
                       words=words)
    # a word read as a name once is a name everywhere ("q is on block r"), but "a" (an article elsewhere)
    known = {k for k in spelled if k != "a"}
    flags = [[f or (_is_word(t) and _norm(t) in known) for t, f in zip(toks, fl)] for toks, fl in zip(tokenized, flags)]
    goal: list[Clause] = []
    sure = True
    asked = 0
    init: list[Clause] = []
    follows_ask = False  # the sentence before asked for something and ended with ":" ("Build a tower: ...")
    for k, (sent, toks, fl) in enumerate(zip(sentences, tokenized, flags)):
        m = _WANTED.search(sent)
        asking = (toks and toks[0] in _ASKING) or bool(m)
        after, follows_ask = follows_ask, bool(asking and colon[k])
        if after and not asking:
            if not any(t in _STATE_VERBS for t in toks):
                # what the request before the colon asks for ("o on n and n on m"): read as the goal
                m, asking = None, True
            else:
                init += _init_clauses(toks, fl)  # "Unstack everything: p is on q, ...": the state now
                continue
        if not asking:
            init += _init_clauses(toks, fl)
            continue
        if colon[k] and not any(fl):
            continue  # "Build a tower:": what it asks for follows the colon
        asked += 1
        if m:  # from "so that" / "want" on: the words before it say how, not what
            lead = len(_plain_tokens(sent[:m.end()]))
            toks, fl = toks[lead:], fl[lead:]
        start = 0
        pending: list[str] = []  # "Bring b1 and b2 to room r1": b1 waits for the phrase b2 has
        for j in range(len(toks) + 1):
            if j < len(toks) and toks[j] not in (",", "and"):
                continue
            part, pf = toks[start:j], fl[start:j]
            start = j + 1
            if not part:
                continue
            at = [i for i, f in enumerate(pf) if f]
            if len(at) == 1 and all(t in _LONE_WORDS for i, t in enumerate(part) if i != at[0]):
                pending.append(part[at[0]])
                continue
            got = _chain_clauses(part, pf) or [c for c in (_goal_clause(part, pf, _RELATIONS)
                                                           or _table_clause(part, pf),) if c is not None]
            if not got or (pending and len(got) != 1):
                sure = False
                break
            c = got[0]
            x = next(i for i, f in enumerate(pf) if f)
            for p in pending:  # each waiting name with the same phrase ("b1 ... to room r1")
                words = [p] + part[x + 1:]
                goal.append(Clause(tuple(_norm(w) for w in words), (_norm(p),) + c.key[1:], " ".join(words)))
            pending = []
            goal += got
        if pending:
            sure = False
    names = tuple(spelled.values())
    nouns: dict[str, str | None] = {}
    for toks, fl in zip(tokenized, flags):
        for n, kind in _plain_nouns(toks, fl):
            nouns[n] = kind if nouns.get(n, kind) == kind else None  # two different nouns: none
    if not (sure and goal and asked):
        goal = []
    # a clause the goal states too is not read as part of the initial state (the goal would hold)
    init = list(dict.fromkeys(c for c in init if c.key not in {g.key for g in goal}))
    how = (f"{len(goal)} goal clauses" if goal else "the goal not read") + f", {len(init)} initial clauses read"
    return Reading("plain", names, tuple(init), tuple(goal), words=words,
                   why=f"free English: {len(names)} names introduced, {how}",
                   nouns=tuple((n, k) for n, k in nouns.items() if k is not None))


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

