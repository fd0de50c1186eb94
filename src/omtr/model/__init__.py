"""The role model: one backbone (any Hugging Face causal LM), three roles (Actor, Judge, Editor).

``build_model(profile_or_config)`` makes a fresh model; ``load_model(DIR)`` reads a model directory
written by ``RoleModel.save`` or ``omtr model init``. Importing this package imports torch.
"""

from __future__ import annotations

from omtr.config import MODEL_PROFILES, ModelConfig, model_profile
from omtr.model.backbone import BackboneError, load_backbone
from omtr.model.roles import MODEL_FILE, RoleModel


def build_model(profile: str | ModelConfig = "small", *, device: str | None = None) -> RoleModel:
    cfg = profile if isinstance(profile, ModelConfig) else model_profile(profile)
    return RoleModel.build(cfg, device=device)


def load_model(path_or_profile: str, *, device: str | None = None) -> RoleModel:
    """A model directory if ``path_or_profile`` is one, else a fresh model of that profile / backbone."""
    from pathlib import Path

    from omtr.model.backbone import check_backbone_name

    if (Path(path_or_profile) / MODEL_FILE).is_file():
        return RoleModel.load(path_or_profile, device=device)
    check_backbone_name(path_or_profile)
    return build_model(path_or_profile, device=device)


__all__ = ["MODEL_PROFILES", "BackboneError", "ModelConfig", "RoleModel", "build_model", "load_backbone",
           "load_model", "model_profile"]
