"""The training side's only door to task files.

Training code (``omtr.rl``, ``omtr.model``, training parts of ``omtr.inference``) imports task
loading from here and nowhere else in ``omtr.tasks``: ``TrainingTask`` has no reference field and
cannot be given one, and ``load_training_tasks`` drops reference PDDL while decoding. A test scans
the training packages for imports of anything else from ``omtr.tasks``.
"""

from omtr.tasks.records import (
    MODES,
    GivenDomainError,
    TaskFormatError,
    TrainingTask,
    load_training_tasks,
    task_mode,
)

__all__ = ["MODES", "GivenDomainError", "TaskFormatError", "TrainingTask", "load_training_tasks", "task_mode"]
