"""The environment's answer for one spec: :class:`Verdict`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from omtr.pddl.categories import Category


@dataclass
class Verdict:
    """What E(y) says about a spec.

    ``success`` is true iff both files parse, the planner returns a plan within the limits and
    VAL confirms the plan reaches the goal. ``category`` is one of the six diagnostic categories
    (``None`` on success); ``message`` is the diagnostic an Editor reads. ``timed_out``,
    ``memory_out`` and ``too_large`` mark limits (CPU time, memory, and omtr's own size limits on
    input: bytes per file and nesting depth); they come with the ``unreachable_search`` category
    and are never a verdict on the spec itself: rewards and metrics must treat them apart.
    """

    success: bool
    category: Category | None = None
    message: str = ""
    plan: list[str] = field(default_factory=list)
    plan_length: int | None = None
    warnings: list[str] = field(default_factory=list)
    timed_out: bool = False
    memory_out: bool = False
    too_large: bool = False
    cached: bool = False
    stage: str = ""  # lint | translate | search | validate | done
    exit_code: int | None = None  # Fast Downward's exit code where the planner ran
    timings: dict[str, float] = field(default_factory=dict)  # milliseconds per stage

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["category"] = self.category.value if self.category else None
        d["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if kw.get("category"):
            kw["category"] = Category(kw["category"])
        return cls(**kw)

    @property
    def limited(self) -> bool:
        """True when a limit, not the spec, decided this verdict."""
        return self.timed_out or self.memory_out or self.too_large

    @classmethod
    def failure(cls, category: Category, message: str, *, stage: str, **kw) -> "Verdict":
        return cls(success=False, category=category, message=message, stage=stage, **kw)
