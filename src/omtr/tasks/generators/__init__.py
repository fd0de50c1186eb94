"""Seeded generators of planning tasks, one registered family per domain (STYLE.md #6).

``generate(family, n, seed)`` draws instances, renders the NL text and the reference PDDL, proves
each instance solvable with the family's constructive plan (replayed under the emitted PDDL), and,
with ``verify=True``, asks the environment (``omtr.solver.solve_many``) to solve every reference.

Splits are disjoint by construction: each instance's canonical signature (init and goal up to
object renaming) is hashed into a split bucket, so asking for ``split="test"`` keeps only test
signatures, whatever the seed. Within one call, signatures are unique.

Adding a family: write a module with a ``sample(rng, size, options) -> Instance`` function and
call ``register(Family(...))`` at import; add the module name to ``_FAMILY_MODULES``.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from omtr.tasks.records import SPLITS, ReferenceSpec, Task
from omtr.tasks.strips import Atom, signature, simulate

log = logging.getLogger(__name__)

DEFAULT_SPLIT_RATIOS = (0.8, 0.1, 0.1)
STATEMENT_SEP = "\n[STATEMENT]\n"  # between the domain description and the problem statement


class GenerationError(ValueError):
    """Impossible generator settings, or an instance space too small for the request."""


@dataclass
class Instance:
    """One drawn instance, before it becomes a ``Task``."""

    objects: dict[str, str]  # PDDL object -> type
    init: list[Atom]  # as written in the reference problem
    goal: list[Atom]
    domain_pddl: str
    problem_pddl: str
    nl_domain: str
    nl_problem: str
    plan: list[str]  # a valid plan (constructive, not necessarily optimal)
    size: int  # the family's size unit (blocks, balls, packages)
    struct: tuple[list[Atom], list[Atom]] | None = None  # (init, goal) in canonical names, for the signature
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nl(self) -> str:
        return self.nl_domain + STATEMENT_SEP + self.nl_problem


@dataclass(frozen=True)
class Family:
    name: str
    size_unit: str  # what min_objects / max_objects count
    default_min: int
    default_max: int
    limit_min: int
    limit_max: int
    sample: Callable[[random.Random, int, dict], Instance]
    options: dict[str, str] = field(default_factory=dict)  # option -> help
    check_options: Callable[[dict], dict] | None = None  # validates and fills defaults
    description: str = ""


_REGISTRY: dict[str, Family] = {}
_FAMILY_MODULES = ("blocksworld", "logistics", "gripper")


def register(family: Family) -> Family:
    _REGISTRY[family.name] = family
    return family


def _load() -> None:
    for mod in _FAMILY_MODULES:  # cached by the import system after the first call
        importlib.import_module(f"omtr.tasks.generators.{mod}")


def families() -> dict[str, Family]:
    _load()
    return dict(_REGISTRY)


def get_family(name: str) -> Family:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise GenerationError(f"unknown task family {name!r}; choose one of {sorted(_REGISTRY)}") from None


def split_of(sig: str, ratios: tuple[float, float, float] = DEFAULT_SPLIT_RATIOS) -> str:
    """The split a signature belongs to (a fixed function of the signature and the ratios)."""
    u = int(hashlib.sha256(("split:" + sig).encode()).hexdigest()[:12], 16) / float(16**12)
    acc = 0.0
    for name, r in zip(SPLITS, ratios):
        acc += r
        if u < acc:
            return name
    return SPLITS[-1]


def _check_ratios(ratios) -> tuple[float, float, float]:
    ratios = tuple(float(r) for r in ratios)
    if len(ratios) != 3 or any(r < 0 for r in ratios) or abs(sum(ratios) - 1.0) > 1e-6:
        raise GenerationError(f"split_ratios must be three non-negative numbers summing to 1 (train, val, test), got {ratios}")
    return ratios  # type: ignore[return-value]


def generate(
    family: str,
    n: int,
    seed: int,
    *,
    min_objects: int | None = None,
    max_objects: int | None = None,
    split: str | None = None,
    verify: bool = True,
    split_ratios: tuple[float, float, float] = DEFAULT_SPLIT_RATIOS,
    workers: int = 2,
    solver_config=None,
    progress: Callable[[int, int], None] | None = None,
    **family_options,
) -> list[Task]:
    """``n`` solvable tasks of ``family``, deterministic for ``seed``.

    ``min_objects``/``max_objects`` bound the family's size unit (blocks, balls or packages; see
    ``families()[name].size_unit``). ``split`` keeps only instances whose signature falls in that
    split (``None``: each task is labelled with its own signature's split). ``verify`` solves every
    reference with the environment and records the planner's plan length.
    """
    fam = get_family(family)
    if n < 0:
        raise GenerationError(f"n must be >= 0, got {n}")
    if split is not None and split not in SPLITS:
        raise GenerationError(f"split must be one of {list(SPLITS)} or None, got {split!r}")
    ratios = _check_ratios(split_ratios)
    if split is not None and ratios[SPLITS.index(split)] == 0:
        raise GenerationError(f"split {split!r} has ratio 0 in split_ratios={ratios}; nothing can be drawn")
    lo = fam.default_min if min_objects is None else int(min_objects)
    hi = fam.default_max if max_objects is None else int(max_objects)
    if hi < lo:
        raise GenerationError(f"max_objects ({hi}) is below min_objects ({lo})")
    if lo < fam.limit_min or hi > fam.limit_max:
        raise GenerationError(
            f"{family}: {fam.size_unit} must lie in {fam.limit_min}..{fam.limit_max}, got {lo}..{hi}"
        )
    unknown = set(family_options) - set(fam.options)
    if unknown:
        raise GenerationError(
            f"{family}: unknown option(s) {sorted(unknown)}; options are {sorted(fam.options) or 'none'}"
        )
    options = fam.check_options(dict(family_options)) if fam.check_options else dict(family_options)

    rng = random.Random(f"omtr:{family}:{seed}")
    seen: set[str] = set()
    out: list[Task] = []
    # rejection sampling over a finite space: give up after many consecutive fruitless draws
    max_misses = 2000 + 200 * n
    misses = 0
    want = n
    while len(out) < n:
        batch: list[tuple[Instance, str]] = []
        while len(batch) < want:
            inst = fam.sample(rng, rng.randint(lo, hi), options)
            s_init, s_goal = inst.struct or (inst.init, inst.goal)
            sig = signature(inst.objects, s_init, s_goal)
            bucket = split_of(sig, ratios)
            if sig in seen or (split is not None and bucket != split):
                misses += 1
                if misses > max_misses:
                    raise GenerationError(
                        f"{family}: only {len(out) + len(batch)} distinct instances found for split "
                        f"{split or 'any'} with {fam.size_unit} in {lo}..{hi} (asked for {n}); "
                        "widen --min-objects/--max-objects or ask for fewer"
                    )
                continue
            misses = 0
            seen.add(sig)
            simulate(inst.domain_pddl, inst.init, inst.goal, inst.plan)  # solvable by construction
            batch.append((inst, sig))
            if progress:  # constructed instances; verification reports its own progress
                progress(min(len(out) + len(batch), n), n)
        verdicts = _verify(batch, workers, solver_config) if verify else [None] * len(batch)
        for (inst, sig), verdict in zip(batch, verdicts):
            if verdict is not None and not verdict.success:
                log.warning("%s: dropping an instance the environment did not solve: %s", family, verdict.message)
                continue
            out.append(_to_task(fam, inst, sig, bucket=split_of(sig, ratios), seed=seed, verdict=verdict))
        want = n - len(out)
    return out[:n]


def _to_task(fam: Family, inst: Instance, sig: str, *, bucket: str, seed: int, verdict) -> Task:
    plan_len = len(inst.plan)
    plan_source = "constructive"
    if verdict is not None and verdict.plan_length is not None and verdict.plan_length <= plan_len:
        plan_len, plan_source = verdict.plan_length, "planner"
    meta = {
        "n_objects": len(inst.objects),
        "size": inst.size,
        "plan_length": plan_len,
        "plan_length_source": plan_source,
        "seed": seed,
        "source": "omtr-generator",
        "generator": fam.name,
        "signature": sig,
        "verified": verdict is not None,
        "reference_plan": list(verdict.plan) if plan_source == "planner" else list(inst.plan),
        **inst.meta,
    }
    return Task(
        id=f"{fam.name}-{sig[:12]}",
        family=fam.name,
        split=bucket,
        nl=inst.nl,
        reference=ReferenceSpec(inst.domain_pddl, inst.problem_pddl),
        meta=meta,
    )


def _verify(batch: list[tuple[Instance, str]], workers: int, config) -> list:
    try:
        from omtr.solver import solve_many
    except ImportError as exc:  # the environment is not installed / not built
        raise GenerationError(
            f"verify=True needs the environment (omtr.solver): {exc}; pass verify=False (--no-verify) "
            "to rely on the constructive plans only"
        ) from None
    if not batch:
        return []
    t0 = time.monotonic()
    verdicts = solve_many([(i.domain_pddl, i.problem_pddl) for i, _ in batch], workers=workers, config=config,
                          progress=True)
    log.info("verified %d references with the environment in %.1f s", len(batch), time.monotonic() - t0)
    return verdicts


def range_option(value, name: str, minimum: int) -> tuple[int, int]:
    """Parse an option given as N, "N", "A..B", "A-B" or (A, B)."""
    if isinstance(value, str):
        for sep in ("..", "-", ":"):
            if sep in value:
                a, b = value.split(sep, 1)
                value = (int(a), int(b))
                break
        else:
            value = int(value)
    if isinstance(value, int):
        value = (value, value)
    lo, hi = int(value[0]), int(value[1])
    if lo < minimum or hi < lo:
        raise GenerationError(f"option {name}={value!r}: need {minimum} <= low <= high, e.g. {name}={minimum}..{minimum + 1}")
    return lo, hi


def join_facts(facts: list[str]) -> str:
    """'x', 'x and y', 'x, y and z' (PlanBench's list style)."""
    if len(facts) <= 1:
        return "".join(facts)
    return ", ".join(facts[:-1]) + " and " + facts[-1]


def statement(init_facts: list[str], goal_facts: list[str]) -> str:
    return f"As initial conditions I have that, {join_facts(init_facts)}.\nMy goal is to have that {join_facts(goal_facts)}."


MIX = "mix"


def family_list(spec: str) -> tuple[str, ...]:
    """The generator families a ``--family`` value names: one, several comma-separated, or ``mix``
    (every family, in name order). Raises :class:`GenerationError` for a name no family has."""
    names = tuple(sorted(families())) if spec.strip() == MIX else tuple(
        dict.fromkeys(f.strip() for f in spec.split(",") if f.strip()))
    unknown = [f for f in names if f not in families()]
    if unknown or not names:
        raise GenerationError(f"unknown task family {', '.join(unknown) or repr(spec)}; choose {MIX}, or one or more "
                              f"(comma-separated) of {', '.join(sorted(families()))}")
    return names


def generate_mix(spec: str, n: int, seed: int, **kw) -> list:
    """:func:`generate` over the families ``spec`` names (:func:`family_list`): ``n`` tasks split
    evenly (the first families take the remainder), each family drawn with ``seed`` as alone,
    interleaved so that any prefix mixes the families. ``progress`` counts tasks over all of them."""
    names = family_list(spec)
    progress = kw.pop("progress", None)
    per = [n // len(names) + (1 if i < n % len(names) else 0) for i in range(len(names))]
    drawn, done = [], 0
    for fam, k in zip(names, per):
        if k == 0:
            drawn.append([])
            continue
        base = done
        got = generate(fam, k, seed, progress=(lambda d, _t, b=base: progress(b + d, n)) if progress else None, **kw)
        done += k
        drawn.append(got)
    return [t for i in range(max(per, default=0)) for ts in drawn if i < len(ts) for t in [ts[i]]]
