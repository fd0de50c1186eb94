"""Standard model files from a role-model directory: ``omtr model export``.

Two layouts, per role (actor, editor, judge), for tools that do not know omtr's directory:

- ``--peft DIR``: ``DIR/ROLE/`` is that role's LoRA adapter as peft's ``save_pretrained`` writes it
  (``adapter_config.json`` + ``adapter_model.safetensors``), loadable with
  ``PeftModel.from_pretrained(backbone, DIR/ROLE)``; ``DIR/backbone/`` is the backbone as a plain
  Hugging Face folder the adapters apply to.
- ``--merged DIR``: ``DIR/ROLE/`` is a plain Hugging Face causal-LM folder (config, safetensors,
  tokenizer) with the role's adapter merged into the backbone's weights, loadable by transformers,
  vLLM or a GGUF converter, and ``role_vectors.safetensors`` beside it: the role's learned prompt
  embeddings (``role_vectors``, ``[R, hidden]``). omtr puts them before every prompt's token
  embeddings; a runtime that takes prompt embeddings (``inputs_embeds`` in transformers, vLLM's
  prompt-embedding input) gives the same answers as the role model. A runtime that takes only
  token ids loses them: it runs the role's merged weights without the role's prefix, a different
  (untested) policy.

The Judge's scalar head is omtr's own (``roles.safetensors`` in the model directory): no standard
format carries it, so the Judge's export is its merged LM and role vectors only.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ROLE_VECTORS_FILE = "role_vectors.safetensors"
EXPORT_FILE = "omtr-export.json"


def _fresh(model_dir: Path, out: Path) -> Path:
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose another folder or remove it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def export_peft(model_dir: str | Path, out: str | Path) -> Path:
    """Write each role's adapter with peft's ``save_pretrained``, and the backbone, under ``out``."""
    from omtr.model.roles import ROLE_NAMES, RoleModel

    model_dir, out = Path(model_dir), _fresh(Path(model_dir), Path(out))
    rm = RoleModel.load(model_dir, device="cpu")
    with tempfile.TemporaryDirectory(prefix="omtr-peft-") as tmp:
        rm.lm.save_pretrained(tmp, selected_adapters=list(ROLE_NAMES))
        for role in ROLE_NAMES:
            src = Path(tmp) / role  # peft writes a named (non-default) adapter into its own subfolder
            if not (src / "adapter_config.json").is_file():
                raise RuntimeError(f"peft did not write {role}'s adapter_config.json (looked in {src})")
            shutil.copytree(src, out / role)
    _save_backbone_folder(rm, out / "backbone")
    (out / EXPORT_FILE).write_text(json.dumps({"layout": "peft", "roles": list(ROLE_NAMES),
                                               "source": str(model_dir)}, indent=2) + "\n")
    log.info("wrote peft adapters of %s to %s", model_dir, out)
    return out


def _save_backbone_folder(rm, folder: Path) -> None:
    """The backbone without the LoRA layers (peft's ``unload``: nothing merged) and the tokenizer."""
    rm.lm.unload().save_pretrained(folder)
    rm.tokenizer.save_pretrained(folder)


def export_merged(model_dir: str | Path, out: str | Path) -> Path:
    """Write, per role, the backbone with that role's adapter merged and the role's vectors."""
    from safetensors.torch import save_file

    from omtr.model.roles import ROLE_NAMES, RoleModel

    model_dir, out = Path(model_dir), _fresh(Path(model_dir), Path(out))
    for i, role in enumerate(ROLE_NAMES):
        rm = RoleModel.load(model_dir, device="cpu")  # merging changes the weights: one fresh load per role
        rm.lm.set_adapter(role)
        vectors = rm.role_embeddings[i].detach().cpu().contiguous().clone()
        merged = rm.lm.merge_and_unload(adapter_names=[role])
        merged.save_pretrained(out / role)
        rm.tokenizer.save_pretrained(out / role)
        save_file({"role_vectors": vectors}, str(out / role / ROLE_VECTORS_FILE))
        log.info("wrote %s merged (%d role vectors of width %d)", role, vectors.shape[0], vectors.shape[1])
    (out / EXPORT_FILE).write_text(json.dumps({
        "layout": "merged", "roles": list(ROLE_NAMES), "source": str(model_dir),
        "role_vectors": f"{ROLE_VECTORS_FILE}: put its 'role_vectors' [R, hidden] before the prompt's token "
                        "embeddings (inputs_embeds); the chat template's text follows them",
    }, indent=2) + "\n")
    return out
