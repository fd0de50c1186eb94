"""Faithfulness reference checker (evaluation only; never a training signal).

``check(reference, generated, plan)`` decides whether a solver-successful generated spec is the
task the reference states, matching structure rather than names. See ``ASSUMPTIONS.md`` in this
folder for what counts as semantically equivalent.
"""

from omtr.faithfulness.checker import DriftCategory, FaithfulnessReport, Finding, check
from omtr.faithfulness.mapping import Mapping, find_mapping
from omtr.faithfulness.normal import NormalizeError, NSpec, normalize
from omtr.faithfulness.replay import parse_plan, simulate

__all__ = [
    "DriftCategory",
    "FaithfulnessReport",
    "Finding",
    "Mapping",
    "NSpec",
    "NormalizeError",
    "check",
    "find_mapping",
    "normalize",
    "parse_plan",
    "simulate",
]
