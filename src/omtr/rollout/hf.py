"""The ``hf`` engine: the role model's own :meth:`~omtr.model.roles.RoleModel.generate` (the reference)."""

from __future__ import annotations

from omtr.rollout import OverModel


class HFEngine(OverModel):
    """A thin view of the role model as a rollout engine; it generates with the policy itself."""

    engine_name = "hf"
    exact = True

    def __init__(self, model):
        self.model = model
        self.refresh_s = 0.0

    def generate(self, role, prompts, sampling, **kw):
        return self.model.generate(role, prompts, sampling, **kw)

    def judge(self, prompts):
        return self.model.judge(prompts)

    def refresh(self) -> float:
        return 0.0  # the policy itself: always current

    def mark_stale(self) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0
