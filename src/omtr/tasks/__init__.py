"""Planning tasks: records, generators, PlanBench import, transfer benchmarks, stats.

Evaluation code uses ``Task`` (which may carry reference PDDL) and ``load_tasks``. Training code
must import only from ``omtr.tasks.training`` (``TrainingTask``, ``load_training_tasks``), which
cannot carry reference PDDL; see ``omtr.tasks.records`` for the reasoning.
"""

from omtr.tasks.records import (
    MODES,
    GivenDomainError,
    MissingReferenceError,
    ReferenceSpec,
    Task,
    TaskFormatError,
    TrainingTask,
    load_tasks,
    load_training_tasks,
    require_reference,
    write_tasks,
)

__all__ = [
    "MODES",
    "GivenDomainError",
    "MissingReferenceError",
    "ReferenceSpec",
    "Task",
    "TaskFormatError",
    "TrainingTask",
    "load_tasks",
    "load_training_tasks",
    "require_reference",
    "write_tasks",
]
