"""PDDL specs as omtr reads them: a tolerant s-expression reader and a structural model.

``parse_domain`` / ``parse_problem`` never execute anything and fail with :class:`SpecError`,
which carries one of the six diagnostic categories and the line of the offending element.
"""

from omtr.pddl.sexpr import SExprError, SList, Sym, read_sexpr
from omtr.pddl.model import (
    Action,
    Derived,
    Domain,
    Problem,
    SpecError,
    SpecLimitError,
    atoms_of,
    parse_domain,
    parse_problem,
)

__all__ = [
    "Action",
    "Derived",
    "Domain",
    "Problem",
    "SExprError",
    "SList",
    "SpecError",
    "SpecLimitError",
    "Sym",
    "atoms_of",
    "parse_domain",
    "parse_problem",
    "read_sexpr",
]
