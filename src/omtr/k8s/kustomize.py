"""Render the kustomizations under ``k8s/`` with the real kustomize.

``kubectl kustomize DIR`` (kustomize v5 is built into kubectl) or, where it is installed, the
standalone ``kustomize build DIR``: the same renderer ``kubectl apply -k`` uses, so what is
validated here is what a cluster receives. No API server is needed. ``OMTR_KUSTOMIZE`` names the
binary to use (``kubectl`` or ``kustomize``, or a path to one) when both are installed.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

TIMEOUT_S = 120


class KustomizeError(Exception):
    """kustomize is missing or refused a kustomization; the message says which and why."""


def command(directory: str | Path) -> list[str]:
    """The command line that renders ``directory``."""
    wanted = os.environ.get("OMTR_KUSTOMIZE", "").strip()
    candidates = [wanted] if wanted else ["kustomize", "kubectl"]
    for c in candidates:
        path = shutil.which(c)
        if path:
            return [path, "build", str(directory)] if Path(c).name.startswith("kustomize") else \
                [path, "kustomize", str(directory)]
    raise KustomizeError(
        (f"OMTR_KUSTOMIZE={wanted}: no such program" if wanted else "neither kustomize nor kubectl is installed")
        + "; install kubectl (it carries kustomize v5: https://kubernetes.io/docs/tasks/tools/) or the kustomize "
        "binary, then run again")


def render_yaml(directory: str | Path) -> str:
    """The rendered objects of the kustomization in ``directory`` as one multi-document YAML text."""
    d = Path(directory)
    if not d.is_dir():
        raise KustomizeError(f"{d}: no such directory")
    cmd = command(d)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise KustomizeError(f"`{' '.join(cmd)}` did not finish within {TIMEOUT_S} s") from None
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise KustomizeError(f"{d}: {Path(cmd[0]).name} refused the kustomization: {' '.join(msg)[:2000]}")
    return r.stdout


def render(directory: str | Path) -> list[dict]:
    """The rendered objects, parsed, in kustomize's output order."""
    import yaml

    return [o for o in yaml.safe_load_all(render_yaml(directory)) if o]
