"""The closed vocabulary of environment outcomes: six diagnostic categories (paper H.7)."""

from __future__ import annotations

import enum


class Category(str, enum.Enum):
    SYNTAX = "syntax"
    OBJECT_TYPE = "object_type"
    PREDICATE_SCHEMA = "predicate_schema"
    PRECONDITION_EFFECT = "precondition_effect"
    GOAL_CONSTRAINT = "goal_constraint"
    UNREACHABLE_SEARCH = "unreachable_search"

    def __str__(self) -> str:  # JSON and messages show the plain value
        return self.value


CATEGORY_HELP = {
    Category.SYNTAX: "the file does not parse as PDDL (parentheses, sections, encoding, size)",
    Category.OBJECT_TYPE: "undeclared or mistyped objects or types, arguments of the wrong type",
    Category.PREDICATE_SCHEMA: "undeclared predicates, arity mismatches, unbound parameters, malformed actions",
    Category.PRECONDITION_EFFECT: "plan fails validation, contradictory or never-applicable actions",
    Category.GOAL_CONSTRAINT: "goal names undeclared things, can never become true, or contradicts static facts",
    Category.UNREACHABLE_SEARCH: "proven unsolvable, search exhausted, or a time/memory limit",
}
