"""Policies by name: ``model``, ``oracle``, ``mutant:<kind>``, ``file:PATH``, and the paper's baselines.

    make_policy("cot", tasks=tasks, backend="hf:small")           # a baseline on SmolLM2
    make_policy("model", tasks=tasks, model="runs/model")         # a trained role model
    make_policy("oracle", tasks=tasks)                            # harness check (reads references)

``register_policy(name)`` adds one: a factory ``f(arg, *, tasks, model, backend, budget, options)``
returning an object with the :class:`~omtr.policy.Policy` methods, plus optionally
``uses_judge`` (whether the loop should ask its Judge) and ``budget_for(task_id, K)`` (a harness that
has fewer than K attempts for a task). ``oracle``, ``mutant`` and ``file`` live on the evaluation
side (``omtr.evaluation.harness``) because they read references; they are imported only when named.
"""

from __future__ import annotations

import importlib
from typing import Callable, Sequence

from omtr.inference.backends import BACKEND_HELP, make_backend
from omtr.inference.baselines import ALIASES, BASELINES, baseline

PolicyFactory = Callable[..., object]
POLICIES: dict[str, PolicyFactory] = {}
POLICY_HELP: dict[str, str] = {}


class UnknownPolicy(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register_policy(name: str, help: str = ""):
    def deco(factory: PolicyFactory) -> PolicyFactory:
        POLICIES[name] = factory
        POLICY_HELP[name] = help
        return factory

    return deco


def _harness(fn: str):
    def factory(arg, *, tasks, budget, options, **_):
        mod = importlib.import_module("omtr.evaluation.harness")
        if fn == "oracle":
            return mod.oracle(tasks)
        if fn == "mutant":
            if not arg:
                raise UnknownPolicy("mutant needs a kind: mutant:<mutator>, e.g. mutant:drop_goal_atom")
            return mod.mutant(arg, tasks, seed=options.get("seed", 0))
        if not arg:
            raise UnknownPolicy("file needs a path: file:ATTEMPTS.jsonl")
        return mod.from_file(arg, tasks, budget=budget)

    return factory


register_policy("oracle", "each task's reference spec (harness check: 100% success and faithful)")(_harness("oracle"))
register_policy("mutant", "mutant:<kind>: references through one checker mutator (harness check of drift)")(
    _harness("mutant"))
register_policy("file", "file:PATH: replay specs from JSONL ({id, domain, problem} per attempt)")(_harness("file"))


@register_policy("plan", "plan:zero-shot | plan:cot: the LLM writes the plan itself, checked by VAL (PlanBench's protocol)")
def _plan(arg, *, tasks, backend, options, **_):
    mod = importlib.import_module("omtr.evaluation.plans")
    be = backend if not isinstance(backend, str) and backend is not None else make_backend(
        backend or "hf:small", **options.get("backend_options", {}))
    policy = mod.PlanPolicy(be, arg or "zero-shot")
    transfer = importlib.import_module("omtr.evaluation.run").is_transfer
    policy.excluded = {str(t.id): "plan policies score PlanBench tasks only (their NL action templates)"
                       for t in tasks if not transfer(t) and (t.reference is None or mod.planbench_config(t) is None)}
    return policy


@register_policy("model", "a trained omtr role model (--model DIR or a profile), greedy")
def _model(arg, *, model, tasks, options, **_):
    from omtr.inference.loading import load_policy

    spec = arg or model
    if not spec:
        raise UnknownPolicy("policy 'model' needs --model DIR (or a profile: small, micro, paper)")
    kw = {k: options[k] for k in ("device", "decoding", "engine") if options.get(k)}
    policy = load_policy(spec, tasks=tasks, **kw)  # tasks: scripted:FILE keys its answers by task id
    return policy


def _baseline_factory(key: str):
    def factory(arg, *, backend, budget, options, **_):
        be = backend if not isinstance(backend, str) and backend is not None else make_backend(
            arg or backend or "hf:small", **options.get("backend_options", {}))
        kw = {"seed": options.get("seed", 0)}
        if options.get("grammar") is not None:
            kw["grammar"] = bool(options["grammar"])
        if key == "tot":
            kw["budget"] = budget
            kw.update({k: options[k] for k in ("breadth", "beam", "thought_tokens") if options.get(k) is not None})
        return baseline(key, be, **kw)

    return factory


for _key, _cls in BASELINES.items():
    register_policy(_key, f"baseline: {(_cls.__doc__ or _key).strip().splitlines()[0]}")(_baseline_factory(_key))


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str, *, tasks: Sequence = (), model: str | None = None, backend=None, budget: int = 6,
                **options):
    """The policy called ``name`` (``kind`` or ``kind:arg``; baselines case-insensitive: CoT, ToT,
    LLM+P, Self-Refine+Solver). ``backend`` (a name such as ``hf:small`` or a backend object) is what
    baselines run on (``cot:hf:micro`` names one inline); ``model`` is the ``model`` policy's
    directory or profile."""
    kind, _, arg = name.partition(":")  # "mutant:drop_goal_atom", "file:PATH", "cot:hf:small"
    key = ALIASES.get(kind.lower(), kind.lower())
    if key not in POLICIES:
        raise UnknownPolicy(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} "
                            f"(backends for baselines: {', '.join(BACKEND_HELP)})")
    policy = POLICIES[key](arg, tasks=list(tasks), model=model, backend=backend, budget=budget, options=options)
    if not hasattr(policy, "name"):
        try:
            policy.name = name
        except AttributeError:
            pass
    return policy
