"""The copy of PlanBench that ships inside omtr, read in place from one compressed archive.

``src/omtr/data/planbench/`` holds ``planbench.tar.xz`` (PlanBench's ``LICENSE``, ``configs/``,
the instances and domain files of BlocksWorld, Mystery BlocksWorld, Logistics and Depots, the
Logistics one-shot prompts, and ``plan_generation/`` with the gold plans, all byte for byte as in the
PlanBench folder the project uses), its ``LICENSE`` (MIT) and ``UPSTREAM`` (the
repository and commit the files come from). Nothing is unpacked to disk: :func:`shipped_root`
returns an :class:`ArchivePath`, a read-only stand-in for :class:`pathlib.Path` over the archive's
members, which :mod:`omtr.tasks.planbench` reads like any folder.

One source of truth: the archive is built from a PlanBench folder with :func:`build_archive`, and
the tests compare every member with the folder beside the checkout, byte for byte, where one exists.
"""

from __future__ import annotations

import functools
import io
import tarfile
from importlib import resources
from pathlib import Path, PurePosixPath

ARCHIVE = "planbench.tar.xz"
PREFIX = "planbench"
UPSTREAM_REPO = "karthikv792/LLMs-Planning"
UPSTREAM_COMMIT = "b008bc4327112affd525035b9e82f93f54b9b3a3"

# What omtr needs from a PlanBench folder (paths relative to it).
MEMBERS = (
    "LICENSE",
    "configs",
    "instances/blocksworld/generated_domain.pddl",
    "instances/blocksworld/generated_basic",
    "instances/blocksworld/generated_basic_3",
    "instances/blocksworld/mystery/generated_domain.pddl",
    "instances/blocksworld/mystery/generated_basic",
    "instances/blocksworld/mystery/generated_basic_3",
    "instances/logistics",
    "instances/depots",
    "prompts/logistics",   # the Logistics domain text as models saw it (longer than the config's)
    "plan_generation",     # gold plans with PDDL object names, one line per instance
)


def data_dir():
    """The package folder holding the archive, its LICENSE and UPSTREAM."""
    return resources.files("omtr") / "data" / "planbench"


@functools.lru_cache(maxsize=2)
def _members(archive: str | None = None) -> dict[str, bytes]:
    src = Path(archive) if archive else data_dir() / ARCHIVE
    with src.open("rb") as fh:
        raw = fh.read()
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:xz") as tf:
        for m in tf:
            if m.isfile():
                out[m.name] = tf.extractfile(m).read()  # type: ignore[union-attr]
    return out


class ArchivePath:
    """A read-only path inside the archive: the subset of :class:`pathlib.Path` the importer uses."""

    def __init__(self, files: dict[str, bytes], path: str = PREFIX, dirs: frozenset[str] | None = None):
        self._files, self._path = files, path.rstrip("/")
        if dirs is None:
            dirs = frozenset(str(p) for name in files for p in PurePosixPath(name).parents if str(p) != ".")
        self._dirs = dirs

    def __truediv__(self, other) -> "ArchivePath":
        return ArchivePath(self._files, f"{self._path}/{other}", self._dirs)

    def __str__(self) -> str:
        return f"<omtr shipped PlanBench>/{self._path}"

    __repr__ = __str__

    def __fspath__(self) -> str:  # so that a stray open() fails loudly rather than reading a real path
        raise TypeError(f"{self} lives inside an archive; read it with read_text() or read_bytes()")

    @property
    def name(self) -> str:
        return PurePosixPath(self._path).name

    @property
    def stem(self) -> str:
        return PurePosixPath(self._path).stem

    @property
    def relative(self) -> str:
        """The path below the PlanBench folder, e.g. ``configs/logistics.yaml``."""
        return self._path[len(PREFIX) + 1:]

    def is_dir(self) -> bool:
        return self._path in self._dirs

    def is_file(self) -> bool:
        return self._path in self._files

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def iterdir(self):
        if not self.is_dir():
            raise NotADirectoryError(str(self))
        prefix = self._path + "/"
        children = {n[len(prefix):].split("/", 1)[0] for n in (*self._files, *self._dirs) if n.startswith(prefix)}
        return (self / c for c in sorted(children))

    def read_bytes(self) -> bytes:
        try:
            return self._files[self._path]
        except KeyError:
            raise FileNotFoundError(str(self)) from None

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def walk_files(self):
        """Every file below this folder, as (path relative to the PlanBench folder, bytes)."""
        prefix = self._path + "/"
        for name in sorted(self._files):
            if name.startswith(prefix):
                yield name[len(PREFIX) + 1:], self._files[name]


def shipped_root(archive: str | None = None) -> ArchivePath:
    """The shipped PlanBench folder (read from the archive once per process)."""
    return ArchivePath(_members(archive))


def upstream() -> str:
    """``owner/repo@commit`` of the shipped files."""
    return (data_dir() / "UPSTREAM").read_text(encoding="utf-8").split()[0]


def build_archive(src: str | Path, out: str | Path) -> int:
    """Write the archive from a PlanBench folder (deterministic: sorted, no times or owners).
    Returns the number of files."""
    src = Path(src)
    files: list[Path] = []
    for m in MEMBERS:
        p = src / m
        if not p.exists():
            raise FileNotFoundError(f"{p} is missing; is {src} a PlanBench folder?")
        files += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    with tarfile.open(out, "w:xz", preset=9) as tf:
        for f in sorted(files):
            data = f.read_bytes()
            info = tarfile.TarInfo(f"{PREFIX}/{f.relative_to(src).as_posix()}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tf.addfile(info, io.BytesIO(data))
    return len(files)
