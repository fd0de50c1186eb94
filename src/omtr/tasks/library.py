"""The domain library: domains omtr can trust, each with a short English description, and the match
of a task's free English against them.

A task that comes without a domain makes the small model write both domain and problem (the full
mode), where it is rarely faithful; given the domain it writes only the problem, and is faithful far
more often. The library turns the first into the second when a known domain fits:

* shipped domains (:func:`shipped_library`): PlanBench's four (BlocksWorld, Mystery BlocksWorld,
  Logistics, Depots, from the PlanBench copy inside omtr) and the generators' Gripper;
* a user's folder (:func:`load_folder`): ``NAME.pddl`` with ``NAME.txt`` (or ``NAME.md``) beside it,
  a short English description of the domain; the domain must lint.

:func:`match` scores the task's English against each domain by its words (a lexical match: the
description's words and the domain's predicate, action and type names split at ``-``/``_``, each
word weighted by how few of the library's domains use it, summed over the words the task uses).
The best domain is used when its score reaches ``min_score`` and beats the runner-up by ``margin``;
two domains within the margin are ambiguous, and the task runs in the full mode saying so; no domain
over the floor, likewise. :func:`attach` applies it to task records: a matched task gets the domain
(the domain-given mode) and ``meta`` ``domain_source`` (``library:NAME`` or ``written``) and
``domain_reason``. ``benchmarks/domain_library.py`` measures the match on held-out English.

Only domains are read here, never a task's reference; the episode loop reads ``domain_source`` from
the task's ``meta`` (``omtr.inference.episode.Episode.domain_source``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from omtr.tasks.records import TaskFormatError, TrainingTask, given_domain_error

MIN_SCORE = 1.5  # the best domain's score must reach this: one word no other domain of the shipped library uses
MARGIN = 0.15  # and beat the runner-up by this share of its score, else the match is ambiguous

# Words that say nothing about which domain a task is in.
STOP = frozenset("""a an the and or of on in at to from is are be been being it its this that these those
there here i you we my your our with by for as into onto off up down out over under all each every
some any no not one two three four five six seven eight nine ten first second other another than then
so if can could would should will shall do does did have has had get put make let want need please
which what who where when how now also only just them they their he she his her me us while after
before until start end goal initial state want like way same both either""".split())

DESCRIPTIONS = {
    "blocksworld": "Blocks on a table, stacked into towers by a hand that picks up, puts down, stacks "
                   "and unstacks one block at a time; a block is clear when nothing is on top of it.",
    "mystery_blocksworld": "Objects with craves, province, planet, harmony and pain facts, changed by "
                           "the attack, succumb, overcome and feast actions: an obfuscated BlocksWorld.",
    "logistics": "Packages delivered between locations in cities: trucks drive within a city, airplanes "
                 "fly between airports of different cities, packages are loaded and unloaded.",
    "depots": "Crates stacked on pallets in depots and distributors: hoists lift and drop crates, trucks "
              "drive between places and hoists load and unload crates into trucks.",
    "gripper": "A robot with a left and a right gripper carries balls between rooms: it moves from room "
               "to room, picks a ball up with a free gripper and drops it in a room.",
}
PLANBENCH_CONFIGS = {"blocksworld": "blocksworld", "mystery_blocksworld": "mystery_blocksworld",
                     "logistics": "logistics", "depots": "depots"}

_WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    """Lower-case alphabetic words without stop words, each without a plural ``s`` ("crates": crate)."""
    out = []
    for w in _WORD.findall((text or "").lower()):
        if len(w) < 2 or w in STOP:
            continue
        if len(w) > 3 and w.endswith("ies"):
            w = w[:-3] + "y"
        elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


@dataclass(frozen=True)
class LibraryDomain:
    """One domain of the library: its name, PDDL text, English description and where it came from."""

    name: str
    domain: str
    description: str
    source: str = "shipped"

    @functools.cached_property
    def vocabulary(self) -> frozenset:
        """The description's words and the domain's predicate, action and type names, split."""
        from omtr.pddl.model import parse_domain

        d = parse_domain(self.domain)
        names = [*d.predicates, *d.actions, *d.types]
        return frozenset(words(self.description) + words(" ".join(re.sub(r"[-_]", " ", n) for n in names)))


@dataclass(frozen=True)
class Match:
    """The library's answer for one task: ``domain`` (None: none fits, or two fit equally), its
    ``source`` (``library:NAME`` or ``written``), ``reason`` (one sentence) and every domain's score."""

    domain: LibraryDomain | None
    source: str
    reason: str
    scores: dict


class Library:
    """Domains by name, and the match of English against them."""

    def __init__(self, domains: Iterable[LibraryDomain], *, min_score: float = MIN_SCORE, margin: float = MARGIN):
        self.domains: dict[str, LibraryDomain] = {}
        for d in domains:
            self.domains[d.name] = d  # a user's domain of the same name replaces a shipped one
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.min_score, self.margin = min_score, margin

    def __len__(self) -> int:
        return len(self.domains)

    def with_domains(self, more: Iterable[LibraryDomain]) -> "Library":
        return Library([*self.domains.values(), *more], min_score=self.min_score, margin=self.margin)

    @functools.cached_property
    def _idf(self) -> dict[str, float]:
        n = len(self.domains)
        df: dict[str, int] = {}
        for d in self.domains.values():
            for w in d.vocabulary:
                df[w] = df.get(w, 0) + 1
        return {w: math.log((n + 1) / k) for w, k in df.items()}

    def scores(self, nl: str) -> dict[str, float]:
        """Per domain, the summed weights of the task's distinct words in its vocabulary."""
        ws = set(words(nl))
        idf = self._idf
        return {name: round(sum(idf.get(w, 0.0) for w in ws & d.vocabulary), 4) for name, d in self.domains.items()}

    def match(self, nl: str) -> Match:
        """The domain the English is about (module doc), or None with the reason."""
        sc = self.scores(nl)
        ranked = sorted(sc.items(), key=lambda kv: (-kv[1], kv[0]))
        if not ranked or ranked[0][1] < self.min_score:
            best = f"; best {ranked[0][0]}, score {ranked[0][1]:.1f} < {self.min_score:.1f}" if ranked else ""
            return Match(None, "written", f"no library domain fits the English{best}: the model writes the domain",
                         sc)
        (n1, s1), (n2, s2) = ranked[0], (ranked[1] if len(ranked) > 1 else ("", 0.0))
        if n2 and s2 >= (1 - self.margin) * s1:
            return Match(None, "written", f"ambiguous: the English matches {n1}, score {s1:.1f}, and {n2}, score {s2:.1f}, "
                         "about equally, so neither is used: the model writes the domain", sc)
        return Match(self.domains[n1], f"library:{n1}",
                     f"the English matches the library's {n1}: score {s1:.1f}, next {n2 or '-'} {s2:.1f}", sc)


def _planbench_domain(config: str) -> str:
    import yaml

    from omtr.tasks.planbench import find_root
    from omtr.tasks.planbench_data import shipped_root

    root = find_root(shipped_root())
    cfg = yaml.safe_load((root / "configs" / f"{config}.yaml").read_text())
    return (root / "instances" / cfg["domain_file"]).read_text()


@functools.lru_cache(maxsize=1)
def shipped_domains() -> tuple[LibraryDomain, ...]:
    """PlanBench's four domains and the generators' Gripper, with their descriptions."""
    from omtr.tasks.generators.gripper import GRIPPER_DOMAIN

    out = [LibraryDomain(name, _planbench_domain(cfg), DESCRIPTIONS[name]) for name, cfg in PLANBENCH_CONFIGS.items()]
    out.append(LibraryDomain("gripper", GRIPPER_DOMAIN, DESCRIPTIONS["gripper"]))
    return tuple(out)


def shipped_library(**kw) -> Library:
    return Library(shipped_domains(), **kw)


def load_folder(path: str | Path) -> list[LibraryDomain]:
    """A user's domains: each ``NAME.pddl`` in ``path`` with ``NAME.txt`` or ``NAME.md`` beside it (its
    English description). Raises :class:`TaskFormatError` naming the file for a missing description
    or a domain that does not lint."""
    p = Path(path)
    if not p.is_dir():
        raise TaskFormatError(f"{p}: not a folder of domains (NAME.pddl with NAME.txt beside each)")
    out = []
    for f in sorted(p.glob("*.pddl")):
        desc = next((f.with_suffix(s) for s in (".txt", ".md") if f.with_suffix(s).is_file()), None)
        if desc is None:
            raise TaskFormatError(f"{f}: no description beside it; write {f.with_suffix('.txt').name}, a sentence "
                                  "or two of English on what the domain is about")
        text = f.read_text(encoding="utf-8")
        err = given_domain_error(text)
        if err:
            raise TaskFormatError(f"{f}: the domain does not lint ({err})")
        out.append(LibraryDomain(f.stem, text, desc.read_text(encoding="utf-8").strip(), source=str(f)))
    if not out:
        raise TaskFormatError(f"{p}: no NAME.pddl files in it")
    return out


def _meta_text(text: str) -> str:
    """A sentence as a training task's ``meta`` holds it: no parentheses (meta never carries PDDL),
    at most 200 characters."""
    return re.sub(r"[()]", "", text)[:200]


def attach(tasks: Sequence, library: Library | None) -> list[TrainingTask]:
    """Tasks as the episode loop takes them, each with where its domain comes from: a task with a
    domain keeps it (``given``); one without is matched (``library:NAME``: the domain-given mode with
    that domain; ``written``: the full mode, the reason saying why). ``library`` None: no matching
    (``written``, "the library is off")."""
    out = []
    for t in tasks:
        meta = dict(getattr(t, "meta", None) or {})
        base = t if isinstance(t, TrainingTask) else t.for_training()
        if base.domain:
            meta.update(domain_source="given", domain_reason="the task came with its domain")
            out.append(replace(base, meta=meta))
            continue
        if library is None or not len(library):
            meta.update(domain_source="written", domain_reason="the domain library is off: the model writes the domain")
            out.append(replace(base, meta=meta))
            continue
        m = library.match(base.nl)
        meta.update(domain_source=m.source, domain_reason=_meta_text(m.reason))
        if m.domain is not None:  # the support verdict reads it beside the English (the grippers' names)
            meta["domain_description"] = _meta_text(m.domain.description)
        out.append(replace(base, meta=meta, domain=m.domain.domain if m.domain else None))
    return out


__all__ = ["DESCRIPTIONS", "Library", "LibraryDomain", "MARGIN", "MIN_SCORE", "Match", "attach", "load_folder",
           "shipped_domains", "shipped_library", "words"]
