"""A demonstration shown in the given domain's own vocabulary (the domain-given mode).

The hand-written demonstrations of :mod:`omtr.inference.prompts` use vocabularies of their own
(``hand-empty``, ``on-table``, a ``lights`` domain for Mystery BlocksWorld). In the domain-given
mode the answer must use the given domain's names instead, and a small model copies the
demonstration's names more readily than it reads them off the domain. So where the given domain
is the demonstration's domain up to renaming (the structural domain mapping of
:mod:`omtr.faithfulness.mapping` matches every predicate, action and literal), the demonstration
is rewritten into the given domain: its problem's predicates (with their argument orders), types
and domain name, and, for demonstrations whose English uses the domain's own words (Mystery
BlocksWorld's), those words in its text. Otherwise the demonstration is kept as written.

Only the demonstration and the given domain are read: the task's domain is part of its input in
this mode; no reference problem is involved.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import replace

log = logging.getLogger(__name__)

def in_given_vocabulary(demo, domain_text: str, *, rename_text: bool = False):
    """``demo`` rewritten into ``domain_text``'s names, or ``demo`` itself when the domains are not
    the same up to renaming (or the given domain cannot be read). ``rename_text``: also rename
    the demonstration's words that are its predicate or action names (whole words, the case of
    the first letter kept)."""
    try:
        return _adapt(demo, domain_text.strip(), rename_text)
    except Exception as e:  # any domain the parser or the normaliser cannot read: keep the demonstration as written
        log.debug("demonstration kept in its own vocabulary: %s", e)
        return demo


@functools.lru_cache(maxsize=64)
def _adapt(demo, domain_text: str, rename_text: bool):
    from omtr.faithfulness.mapping import _domain_totals, map_domain
    from omtr.faithfulness.normal import normalize
    from omtr.pddl.model import parse_domain
    from omtr.pddl.sexpr import read_sexpr, to_text

    name = parse_domain(domain_text).name  # SpecError on a domain that does not parse
    ref = normalize(demo.domain, demo.problem)
    gen = normalize(domain_text, f"(define (problem vocabulary-probe) (:domain {name}) (:objects) (:init) (:goal (and)))")
    if gen.objects:
        return demo  # the demonstration's objects could clash with the domain's constants
    cands = map_domain(ref, gen)
    ref_total, gen_total = _domain_totals(ref, gen)
    if not cands or ref_total != gen_total or cands[0][0] != ref_total:
        return demo
    _, pmap, amap = cands[0]
    if set(pmap) != set(ref.arity) or len({g for g, _ in pmap.values()}) != len(pmap) or len(amap) != len(ref.actions):
        return demo
    types = {}
    for r, (g, _) in pmap.items():
        if r.startswith("type:"):
            if not g.startswith("type:"):
                return demo  # a type mapped onto a predicate: not a renaming of the problem's text
            types[r[5:]] = g[5:]
    preds = {r: (g, perm) for r, (g, perm) in pmap.items() if not r.startswith("type:")}

    root = read_sexpr(demo.problem, what="demonstration problem")

    def atom(x):
        if isinstance(x, list) and x and isinstance(x[0], str):
            head = str(x[0])
            if head in ("and", "or", "not", "imply", "exists", "forall", "when"):
                return [x[0], *(atom(y) for y in x[1:])]
            if head in preds:
                g, perm = preds[head]
                args = list(x[1:])
                out = [None] * len(args)
                for i, a in enumerate(args):
                    out[perm[i]] = a
                return [g, *out]
        return x

    def typed(items):
        out, after_dash = [], False
        for it in items:
            if after_dash:
                out.append(types.get(str(it), it))
                after_dash = False
            else:
                out.append(it)
                after_dash = it == "-"
        return out

    new = [root[0], root[1]]
    for sec in root[2:]:
        head = sec[0] if isinstance(sec, list) and sec else None
        if head == ":domain":
            new.append([":domain", name])
        elif head == ":objects":
            new.append([":objects", *typed(sec[1:])])
        elif head in (":init", ":goal"):
            new.append([head, *(atom(x) for x in sec[1:])])
        else:
            new.append(sec)
    problem = _layout(to_text(new))
    nl = demo.nl
    if rename_text:
        words = {r: g for r, (g, _) in preds.items()}
        words.update({r: g for r, (g, _) in amap.items()})
        nl = _rename_words(nl, words)
    return replace(demo, nl=nl, domain=domain_text, problem=problem)


def _layout(text: str) -> str:
    """One section a line, as the hand-written demonstrations are laid out."""
    return re.sub(r" \((:domain|:objects|:init|:goal)\b", r"\n  (\1", text)


def _rename_words(text: str, table: dict[str, str]) -> str:
    table = {k: v for k, v in table.items() if k != v}
    if not table:
        return text
    pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True)) + r")(?![\w-])",
                         re.IGNORECASE)

    def sub(m):
        word = m.group(1)
        new = table[word.lower()]
        return new[:1].upper() + new[1:] if word[:1].isupper() else new

    return pattern.sub(sub, text)
