"""Which omtr code a result came from, and that code as a wheel.

:func:`code_hash` hashes the files of the ``omtr`` package itself (its ``.py`` files and package
data, by relative path), so it names the code whether omtr runs from a git checkout, an editable
install or a wheel inside an image. :func:`source_version` adds the git commit and whether the
tree is dirty where there is a checkout. The main job's step keys include it, so a code change
means new steps, never a silent reuse of old ones.

:func:`build_wheel` writes omtr's package files as a wheel whose version carries the code hash
(``0.1.0+c1a2b3c4d5e6``): a registered model ships it, so its serving environment installs exactly
the code that was logged, and MLflow's environment cache (keyed by the requirements' text) never
mistakes an older omtr for it. The wheel is written from the package folder, so it works the same
from a checkout and from an installed omtr (the omtr image installs it from source).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import logging
import subprocess
import zipfile
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def package_dir() -> Path:
    import omtr

    return Path(omtr.__file__).resolve().parent


def _package_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (SKIP_DIRS & set(p.relative_to(root).parts)) and not p.name.endswith(SKIP_SUFFIXES):
            out.append(p)
    return out


def code_hash(root: Path | None = None) -> str:
    """sha256 (first 12 hex digits) over the omtr package's files: relative path and content."""
    root = root or package_dir()
    h = hashlib.sha256()
    for p in _package_files(root):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:12]


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def source_version(root: Path | None = None) -> dict:
    """Where the running code comes from: ``omtr_version`` and ``code_hash`` always; where ``root``
    (default: omtr's package folder) is inside a git checkout, also ``git_commit``, ``git_dirty``
    and, for a dirty tree, ``git_changes`` (a hash of the uncommitted diff and the untracked files'
    contents, so the same edits give the same value). The git fields are None without a checkout."""
    import omtr

    pkg = package_dir()
    root = Path(root) if root is not None else pkg
    out = {"omtr_version": omtr.__version__, "code_hash": code_hash(pkg), "git_commit": None,
           "git_dirty": None, "git_changes": None}
    commit = _git(["rev-parse", "HEAD"], root)
    if commit is None:
        return out
    top = Path(_git(["rev-parse", "--show-toplevel"], root) or root)
    status = _git(["status", "--porcelain", "--untracked-files=all"], top)
    out.update(git_commit=commit, git_dirty=bool(status) if status is not None else None)
    if out["git_dirty"]:
        h = hashlib.sha256((_git(["diff", "HEAD", "--binary"], top) or "").encode())
        for name in sorted((_git(["ls-files", "--others", "--exclude-standard"], top) or "").splitlines()):
            f = top / name
            h.update(name.encode() + b"\0" + (f.read_bytes() if f.is_file() else b""))
        out["git_changes"] = h.hexdigest()[:12]
    return out


def describe(src: dict) -> str:
    """One line for logs: ``commit 1a2b3c4 (dirty: 5d6e7f...)`` or ``omtr 0.1.0, code c1a2...``."""
    if src.get("git_commit"):
        state = f"dirty: changes {src.get('git_changes')}" if src.get("git_dirty") else "clean"
        return f"commit {src['git_commit'][:10]} ({state}), code {src['code_hash']}"
    return f"omtr {src['omtr_version']}, code {src['code_hash']} (no git checkout)"


@lru_cache(maxsize=1)
def _metadata_text() -> str:
    """The installed omtr's METADATA headers (its requirements and extras), without the long description."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution("omtr").read_text("METADATA") or ""
    except PackageNotFoundError:
        text = ""
    head = text.split("\n\n", 1)[0]
    if not head.strip():
        raise RuntimeError("omtr's package metadata is not installed (no omtr dist-info): "
                           "install omtr with `pip install -e .` or from its wheel")
    return head


def wheel_version() -> str:
    import omtr

    return f"{omtr.__version__}+c{code_hash()}"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(out_dir: str | Path) -> Path:
    """Write ``omtr-VERSION-py3-none-any.whl`` into ``out_dir`` from the running omtr's package
    files and metadata; returns its path. Deterministic: the same code gives the same bytes."""
    root = package_dir()
    version = wheel_version()
    dist_info = f"omtr-{version}.dist-info"
    lines = []
    for line in _metadata_text().splitlines():
        lines.append(f"Version: {version}" if line.startswith("Version:") else line)
    files: list[tuple[str, bytes]] = [(f"omtr/{p.relative_to(root).as_posix()}", p.read_bytes())
                                      for p in _package_files(root)]
    files += [
        (f"{dist_info}/METADATA", ("\n".join(lines) + "\n").encode()),
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: omtr.tracking.source\nRoot-Is-Purelib: true\n"
                               b"Tag: py3-none-any\n"),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nomtr = omtr.cli:main\n"),
        (f"{dist_info}/top_level.txt", b"omtr\n"),
    ]
    record = io.StringIO()
    w = csv.writer(record, lineterminator="\n")
    for name, data in files:
        w.writerow([name, _record_hash(data), len(data)])
    w.writerow([f"{dist_info}/RECORD", "", ""])
    files.append((f"{dist_info}/RECORD", record.getvalue().encode()))
    out = Path(out_dir) / f"omtr-{version}-py3-none-any.whl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    log.info("wrote %s (%d files)", out.name, len(files))
    return out
