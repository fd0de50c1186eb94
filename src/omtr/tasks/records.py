"""Task records: the evaluation-side ``Task`` and the training-side ``TrainingTask``.

Why two types, and how the leakage guarantee holds
--------------------------------------------------
Reference PDDL exists only for evaluation (the faithfulness checker). Training learns from the
planner alone, so the training path must not be able to *reach* reference text, not merely be
asked politely not to read it:

* ``TrainingTask`` is a frozen, slotted dataclass with no ``reference`` field. ``__slots__`` means
  no attribute can be attached later (``AttributeError``), and frozen means its fields cannot be
  reassigned. Its ``meta`` holds only an allow-list of scalar keys (``TRAINING_META_KEYS``), so a
  gold plan or a PDDL string hidden in ``meta`` is dropped too.
* ``load_training_tasks`` decodes each JSONL line with a hook that discards the ``reference`` key
  (and any non-allowed key) as the object is built, so no ``TrainingTask`` nor anything it points
  to holds reference text; the decoded line is dropped before the next one is read.
* A task may carry ``domain``: PDDL text given with the task (the domain-given mode: the model
  writes only the problem). It is an *input*, like ``nl``, so the training view keeps it; the
  reference problem stays unreachable as above. A given domain that does not lint is the user's
  input error (:class:`GivenDomainError`, raised while reading the record), never the model's.
* Training modules import only ``omtr.tasks.training`` (``TrainingTask``,
  ``load_training_tasks``); a test walks the object graph and the pickle of loaded training tasks
  looking for the reference text, and another scans training packages for forbidden imports.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

SPLITS = ("train", "val", "test")

# Keys of ``meta`` a training task may keep: scalars that say nothing about the reference spec
# beyond its size. Anything else (gold plans, reference plans, answers, PDDL) stays evaluation-only.
TRAINING_META_KEYS = frozenset(
    {"n_objects", "size", "plan_length", "seed", "source", "generator", "difficulty", "hops", "variant",
     "domain_source", "domain_reason", "domain_description"}  # where a domain-given task's domain came from (omtr.tasks.library)
)

# Top-level keys of a task record; anything else in a file is an error (catches typos early).
RECORD_KEYS = frozenset({"id", "family", "split", "nl", "domain", "reference", "meta"})

# The two modes of a task: the model writes domain and problem, or only the problem of a given domain.
MODES = ("full", "domain-given")


class TaskFormatError(ValueError):
    """A task file or record that cannot be read; the message names the file, line and fix."""


class GivenDomainError(TaskFormatError):
    """A task's given ``domain`` that does not lint: the user's input, named with the task."""


class MissingReferenceError(ValueError):
    """A task without reference PDDL used where one is required (faithfulness evaluation)."""


@dataclass(frozen=True, slots=True)
class ReferenceSpec:
    """The reference PDDL of a task (evaluation only)."""

    domain: str
    problem: str

    def to_json(self) -> dict[str, str]:
        return {"domain": self.domain, "problem": self.problem}


@dataclass(frozen=True)
class Task:
    """One planning task as evaluation sees it: NL text plus (optionally) the reference spec."""

    id: str
    family: str | None
    split: str | None
    nl: str
    reference: ReferenceSpec | None = None
    meta: dict = field(default_factory=dict)
    domain: str | None = None  # a given domain (PDDL text): an input of the task, not its reference

    def __post_init__(self) -> None:
        _check_common(self.id, self.family, self.split, self.nl, self.meta)
        check_given_domain(self.id, self.domain)
        if self.reference is not None and not isinstance(self.reference, ReferenceSpec):
            raise TaskFormatError(f"task {self.id!r}: reference must be a ReferenceSpec")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "family": self.family, "split": self.split, "nl": self.nl}
        if self.domain is not None:
            out["domain"] = self.domain
        if self.reference is not None:
            out["reference"] = self.reference.to_json()
        out["meta"] = dict(self.meta)
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "Task":
        if not isinstance(obj, dict):
            raise TaskFormatError(f"a task record must be a JSON object, got {type(obj).__name__}")
        unknown = set(obj) - RECORD_KEYS
        if unknown:
            raise TaskFormatError(
                f"task {obj.get('id')!r}: unknown keys {sorted(unknown)}; a record has "
                f"{sorted(RECORD_KEYS)} (only id and nl are required)"
            )
        ref = obj.get("reference")
        reference = None
        if ref is not None:
            if not isinstance(ref, dict) or not isinstance(ref.get("domain"), str) or not isinstance(
                ref.get("problem"), str
            ):
                raise TaskFormatError(
                    f"task {obj.get('id')!r}: 'reference' must be an object with string fields "
                    "'domain' and 'problem' (PDDL text)"
                )
            reference = ReferenceSpec(ref["domain"], ref["problem"])
        return cls(
            id=_req_str(obj, "id"),
            family=obj.get("family"),
            split=obj.get("split"),
            nl=_req_str(obj, "nl"),
            reference=reference,
            meta=dict(obj.get("meta") or {}),
            domain=_opt_domain(obj),
        )

    @property
    def mode(self) -> str:
        return task_mode(self)

    def with_given_domain(self, domain: str | None = None) -> "Task":
        """This task in the domain-given mode: ``domain`` (default: the reference's domain) as input."""
        if domain is None:
            domain = require_reference(self).domain
        return dataclasses.replace(self, domain=domain)

    def for_training(self) -> "TrainingTask":
        """The training view: no reference, meta reduced to ``TRAINING_META_KEYS``; a given domain kept."""
        return TrainingTask(self.id, self.family, self.split, self.nl, training_meta(self.meta), self.domain)


@dataclass(frozen=True, slots=True)
class TrainingTask:
    """A task as training sees it. It has no reference field and cannot be given one."""

    id: str
    family: str | None
    split: str | None
    nl: str
    meta: dict = field(default_factory=dict)
    domain: str | None = None  # a given domain (PDDL text): an input, as ``nl`` is

    def __post_init__(self) -> None:
        _check_common(self.id, self.family, self.split, self.nl, self.meta)
        check_given_domain(self.id, self.domain)
        bad = [k for k, v in self.meta.items() if k not in TRAINING_META_KEYS or not _is_scalar(v)]
        if bad:
            raise TaskFormatError(
                f"training task {self.id!r}: meta keys {sorted(bad)} are not allowed on the training "
                f"side (allowed: scalar values under {sorted(TRAINING_META_KEYS)})"
            )

    @property
    def mode(self) -> str:
        return task_mode(self)

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.id, "family": self.family, "split": self.split, "nl": self.nl}
        if self.domain is not None:
            out["domain"] = self.domain
        out["meta"] = dict(self.meta)
        return out


def task_mode(task) -> str:
    """``domain-given`` when the task carries a given domain, else ``full``."""
    return "domain-given" if getattr(task, "domain", None) else "full"


_LINTED: dict[str, str | None] = {}  # given domain text -> the lint error ("" when it lints), per process


def given_domain_error(domain: str) -> str | None:
    """Why a given domain cannot be used (it does not parse or lint), or None when it can.

    The domain is linted with a trivial problem of its own name (no objects, an empty goal), so
    only the domain's own faults are reported. Results are cached by text: a file of a thousand
    tasks sharing one domain lints it once."""
    if domain in _LINTED:
        return _LINTED[domain] or None
    from omtr.pddl.model import SpecError, parse_domain
    from omtr.solver.lint import lint

    try:
        name = parse_domain(domain).name
    except SpecError as exc:
        err = f"{exc.category.value}: {exc.message}"
    else:
        res = lint(domain, f"(define (problem given-domain-check) (:domain {name}) (:init) (:goal (and)))")
        err = f"{res.error.category.value}: {res.error.message}" if res.error is not None else ""
    if len(_LINTED) > 1024:
        _LINTED.clear()
    _LINTED[domain] = err
    return err or None


def check_given_domain(task_id: str, domain) -> None:
    """Raise :class:`GivenDomainError` (naming the task) for a given domain that is not lint-clean PDDL."""
    if domain is None:
        return
    if not isinstance(domain, str) or not domain.strip():
        raise GivenDomainError(
            f"task {task_id!r}: 'domain' must be PDDL text (define (domain ...)) or absent, got "
            f"{type(domain).__name__ if not isinstance(domain, str) else 'an empty string'}"
        )
    err = given_domain_error(domain)
    if err:
        raise GivenDomainError(
            f"task {task_id!r}: its given domain does not lint ({err}); fix the record's 'domain' field, "
            "or drop it to let the model write the domain too"
        )


def training_meta(meta: dict) -> dict:
    """The allow-listed, scalar part of a task's meta."""
    return {k: v for k, v in meta.items() if k in TRAINING_META_KEYS and _is_scalar(v)}


def require_reference(task: Task | TrainingTask) -> ReferenceSpec:
    """The task's reference spec, or a clear error naming the task and what to do."""
    ref = getattr(task, "reference", None)
    if ref is None:
        where = (
            "this is a training task, which never carries reference PDDL; load the file with "
            "omtr.tasks.load_tasks for evaluation"
            if isinstance(task, TrainingTask)
            else 'add "reference": {"domain": "<PDDL>", "problem": "<PDDL>"} to its record'
        )
        raise MissingReferenceError(
            f"task {task.id!r} has no reference PDDL, which faithfulness evaluation requires; {where}, "
            "or evaluate it with the planner only (solve rate), which needs no reference"
        )
    return ref


# ----------------------------------------------------------------------------- files


def load_tasks(path: str | os.PathLike) -> list[Task]:
    """All tasks of a JSONL file (evaluation side: references kept when present)."""
    tasks: list[Task] = []
    seen: set[str] = set()
    for lineno, obj in _read_jsonl(path, json.loads):
        try:
            task = Task.from_json(obj)
        except TaskFormatError as exc:
            raise type(exc)(f"{path}:{lineno}: {exc}") from None
        _check_unique(task.id, seen, path, lineno)
        tasks.append(task)
    return tasks


def load_training_tasks(path: str | os.PathLike) -> list[TrainingTask]:
    """All tasks of a JSONL file as training sees them; reference text is dropped while decoding."""
    decoder = json.JSONDecoder(object_pairs_hook=_drop_reference_hook)
    tasks: list[TrainingTask] = []
    seen: set[str] = set()
    for lineno, obj in _read_jsonl(path, decoder.decode):
        if not isinstance(obj, dict):
            raise TaskFormatError(f"{path}:{lineno}: a task record must be a JSON object")
        try:
            unknown = set(obj) - RECORD_KEYS
            if unknown:
                raise TaskFormatError(f"task {obj.get('id')!r}: unknown keys {sorted(unknown)}")
            task = TrainingTask(
                id=_req_str(obj, "id"),
                family=obj.get("family"),
                split=obj.get("split"),
                nl=_req_str(obj, "nl"),
                meta=training_meta(obj.get("meta") or {}),
                domain=_opt_domain(obj),
            )
        except TaskFormatError as exc:
            raise type(exc)(f"{path}:{lineno}: {exc}") from None
        _check_unique(task.id, seen, path, lineno)
        tasks.append(task)
        del obj
    return tasks


def write_tasks(path: str | os.PathLike, tasks: Iterable[Task | TrainingTask]) -> int:
    """Write tasks as JSONL (atomically: a temp file renamed into place); returns the count."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(json.dumps(task.to_json(), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


# ----------------------------------------------------------------------------- helpers


def _drop_reference_hook(pairs: list[tuple[str, Any]]) -> dict:
    # Called for every JSON object, innermost first: the reference object is built, then dropped
    # here when its parent (the record) is built, so the record never points to it.
    return {k: v for k, v in pairs if k != "reference"}


def _read_jsonl(path, decode) -> Iterator[tuple[int, Any]]:
    p = Path(path)
    if not p.exists():
        raise TaskFormatError(f"task file {p} does not exist")
    with open(p, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = decode(line)
            except json.JSONDecodeError as exc:
                raise TaskFormatError(f"{p}:{lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
            yield lineno, obj


def _opt_domain(obj: dict) -> str | None:
    val = obj.get("domain")
    if val is not None and not isinstance(val, str):
        raise GivenDomainError(f"task {obj.get('id')!r}: 'domain' must be PDDL text (a string) or absent, "
                               f"got {type(val).__name__}")
    return val


def _req_str(obj: dict, key: str) -> str:
    val = obj.get(key)
    if not isinstance(val, str) or not val.strip():
        raise TaskFormatError(
            f"task {obj.get('id')!r}: field {key!r} is required and must be a non-empty string "
            '(minimal record: {"id": "t1", "nl": "..."})'
        )
    return val


def _check_common(id_, family, split, nl, meta) -> None:
    if not isinstance(id_, str) or not id_:
        raise TaskFormatError("task id must be a non-empty string")
    if family is not None and not isinstance(family, str):
        raise TaskFormatError(f"task {id_!r}: family must be a string or null")
    if split is not None and split not in SPLITS:
        raise TaskFormatError(f"task {id_!r}: split {split!r} is not one of {list(SPLITS)} (or null)")
    if not isinstance(nl, str) or not nl.strip():
        raise TaskFormatError(f"task {id_!r}: nl must be a non-empty string")
    if not isinstance(meta, dict):
        raise TaskFormatError(f"task {id_!r}: meta must be an object")


def _check_unique(task_id: str, seen: set[str], path, lineno: int) -> None:
    if task_id in seen:
        raise TaskFormatError(f"{path}:{lineno}: duplicate task id {task_id!r}; ids must be unique in a file")
    seen.add(task_id)


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 200 and "(" not in v)
