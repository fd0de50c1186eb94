"""A task's reference spec with its objects spelled as the English spells them (evaluation only).

The conformance suite of scoped decoding (``tests/test_scope_conformance.py``,
``benchmarks/scope_conformance.py``) asks whether the decoder lets a model write the task's own
spec. A reference names its objects its own way (PlanBench's ``p0`` is "package_0", the generator's
BlocksWorld ``a`` is "the red block"); a faithful answer spells them as the statement does. This
module renames a reference's objects to those spellings, from the renderer that wrote the
statement: PlanBench's ``encoded_objects`` (its class nouns "block" and "object" dropped), and each
generator family's own naming. It reads references: evaluation code, never the training path.
"""

from __future__ import annotations

import re
from functools import lru_cache

from omtr.pddl.model import parse_problem
from omtr.tasks.records import Task

_CLASS_NOUNS = ("block", "object")


class SpellingError(ValueError):
    """A task whose objects this module cannot spell (an unknown family or configuration)."""


@lru_cache(maxsize=None)
def _planbench_config(variant: str) -> dict:
    import yaml

    from omtr.tasks.planbench import find_root
    from omtr.tasks.planbench_data import shipped_root

    root = find_root(shipped_root())
    return yaml.safe_load((root / "configs" / f"{variant}.yaml").read_text(encoding="utf-8"))


def _planbench_name(obj: str, variant: str) -> str:
    from omtr.tasks.planbench import _object_name

    encoded = {str(k): v for k, v in _planbench_config(variant)["encoded_objects"].items()}
    words = [w for w in _object_name(obj, encoded).lower().split() if w not in _CLASS_NOUNS]
    if len(words) != 1:
        raise SpellingError(f"{variant}: cannot spell object {obj!r} as one name ({words})")
    return words[0]


def _generator_name(obj: str, family: str) -> str:
    if family == "blocksworld":
        from omtr.tasks.generators.blocksworld import COLOURS, LETTERS

        return COLOURS[LETTERS.index(obj)]
    if family == "mystery_blocksworld":
        return obj
    if family == "gripper":
        return obj.replace("room", "room_").replace("ball", "ball_")
    if family == "logistics":
        from omtr.tasks.generators.logistics import _nl_name

        return _nl_name(obj)
    raise SpellingError(f"no spelling for generator family {family!r}")


def english_names(task: Task) -> dict[str, str]:
    """Reference object -> the name the task's English gives it."""
    if task.reference is None:
        raise SpellingError(f"task {task.id} has no reference spec")
    objects = parse_problem(task.reference.problem).objects
    variant = task.meta.get("variant")
    if variant:
        return {o: _planbench_name(o, variant) for o in objects}
    if task.meta.get("source") == "omtr-generator":
        return {o: _generator_name(o, task.family) for o in objects}
    raise SpellingError(f"task {task.id}: neither a PlanBench task nor a generated one")


def rename(text: str, names: dict[str, str]) -> str:
    """``text`` with each whole-word object name replaced (PDDL is case-insensitive)."""
    if not names:
        return text
    pat = re.compile(r"(?<![A-Za-z0-9_\-?])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
                     + r")(?![A-Za-z0-9_\-])", re.IGNORECASE)
    lower = {k.lower(): v for k, v in names.items()}
    return pat.sub(lambda m: lower[m.group(1).lower()], text)


def spelled_problem(task: Task) -> str:
    """The reference problem with its objects spelled as the English spells them."""
    return rename(task.reference.problem, english_names(task))
