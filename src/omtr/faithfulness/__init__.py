"""Faithfulness reference checker (evaluation only; never a training signal).

``check(reference, generated, plan)`` decides whether a solver-successful generated spec is the
task the reference states, matching structure rather than names. See ``ASSUMPTIONS.md`` in this
folder for what counts as semantically equivalent.
"""

from omtr.faithfulness.checker import DriftCategory, FaithfulnessReport, Finding, check
from omtr.faithfulness.mapping import Mapping, find_mapping
from omtr.faithfulness.normal import NormalizeError, NSpec, normalize
from omtr.faithfulness.replay import parse_plan, simulate
from omtr.faithfulness.separation import auc, drift_distribution, drift_rate, partition, separation

__all__ = [
    "DriftCategory",
    "FaithfulnessReport",
    "Finding",
    "Mapping",
    "NSpec",
    "NormalizeError",
    "auc",
    "check",
    "drift_distribution",
    "drift_rate",
    "find_mapping",
    "normalize",
    "parse_plan",
    "partition",
    "separation",
    "simulate",
]
