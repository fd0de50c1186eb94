"""The bounds of every repetition in the PDDL grammar: what the grammar (:mod:`omtr.model.grammar`)
compiles and the scope tracker (:mod:`omtr.model.scope`) keeps its typed lists within. Their own
module, so that neither of the two imports the other for them; the names are listed in
``omtr.config.GRAMMAR_LIMIT_NAMES`` too, so that a config is checked without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


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
