"""Rollout engines: one interface for generating sequences, engines behind it.

An engine writes Actor/Editor answers for prompts under a sampling config and a decoding
constraint, exactly as :meth:`omtr.model.roles.RoleModel.generate` does (it *is* a
:class:`omtr.policy.Policy`), from weights it takes from a role model, the *policy*:

``hf``
    The role model itself (LoRA adapters, role vectors, shared-prefix KV cache through
    ``transformers``): the reference. Exact: its log-probabilities are the policy's.
``fast``
    A CPU engine (:mod:`omtr.rollout.fast`): adapters and role vectors merged into a copy of the
    weights, int8 linears, its own shared-prefix KV cache and decoder loop, the same grammar
    masks (:class:`omtr.model.grammar.GrammarState`). Not exact (int8): PPO recomputes the
    "old" log-probabilities with the policy on the sampled tokens (see :mod:`omtr.rl.update`).

Every engine has:

- ``generate(role, prompts, sampling, *, stop_when, grammar, constraint, domains)``: the
  :meth:`RoleModel.generate` contract (``Generation.logprobs`` are the *engine's*);
- ``judge(prompts)``: the policy's Judge (engines only generate);
- ``refresh()``: take the policy's current weights (after an optimizer step); returns seconds;
  ``mark_stale()`` asks for one before the next generation;
- ``exact``: whether its log-probabilities are the policy's (then no recomputation is needed);
- ``memory_bytes()``: the weights it holds beyond the policy's.

The fast engine also keeps a prefix cache across prompts (:mod:`omtr.rollout.prefix_cache`):
``set_prefix_cache(on, mb)`` and ``cache_report()``; :func:`set_prefix_cache` reaches it behind a
policy, :func:`prompt_group` orders tasks so that a family's prompts meet it.

A vLLM engine would implement the same five members (see the README, "Rollout engines").
This module imports no torch: the names are known without it.
"""

from __future__ import annotations

import importlib

# The fast engine's prefix cache (omtr.rollout.prefix_cache): its default bound, one place for the
# CLI, the trainer's and the served model's settings (SmolLM2: ~46 KiB of keys and values a token).
PREFIX_CACHE_MB = 1024.0

# name -> (module, class, one line of help)
ENGINES: dict[str, tuple[str, str, str]] = {
    "hf": ("omtr.rollout.hf", "HFEngine", "the role model through transformers (the reference, exact)"),
    "fast": ("omtr.rollout.fast", "FastEngine", "merged weights, int8 linears, own KV cache (CPU; not exact)"),
}
ENGINE_NAMES = tuple(ENGINES)


class UnknownEngine(ValueError):
    pass


class OverModel:
    """What every engine shares: it runs over a role model ``self.model`` and reads and sets
    that model's config (the decoding constraint, the token limit) as its own."""

    takes_objects = True  # generate(..., objects=): each task statement's names, for the scope rules

    @property
    def cfg(self):
        return self.model.cfg

    @cfg.setter
    def cfg(self, value):
        self.model.cfg = value


def check_engine_name(name: str) -> str:
    if name not in ENGINES:
        known = ", ".join(f"{k} ({v[2]})" for k, v in ENGINES.items())
        raise UnknownEngine(f"unknown rollout engine {name!r}; choose one of: {known}")
    return name


def make_engine(name: str, model, **options):
    """The engine ``name`` over the role model ``model`` (the policy)."""
    mod, cls, _ = ENGINES[check_engine_name(name)]
    return getattr(importlib.import_module(mod), cls)(model, **options)


def _behind(policy) -> list:
    """The engines or models a router holds (``policy.engines`` / ``policy.models``), else none."""
    return [v for name in ("engines", "models") if isinstance(getattr(policy, name, None), dict)
            for v in getattr(policy, name).values()]


def prefix_cache_engines(policy) -> list:
    """The engines with a prefix cache behind ``policy`` (itself, or a router's engines)."""
    found, seen = [], set()
    for obj in (policy, *_behind(policy)):
        if hasattr(obj, "set_prefix_cache") and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)
    return found


def set_prefix_cache(policy, on: bool, mb: float | None = None) -> int:
    """Turn the prefix cache of the engines behind ``policy`` on or off (``mb``: its bound in MiB);
    returns how many engines it reached (0: the policy has none, e.g. the hf engine)."""
    engines = prefix_cache_engines(policy)
    for e in engines:
        e.set_prefix_cache(on, mb)
    return len(engines)


def prefix_cache_report(policy) -> dict | None:
    """The first prefix-cache engine's :meth:`cache_report` (None: no such engine)."""
    engines = prefix_cache_engines(policy)
    return engines[0].cache_report() if engines else None


def prompt_group(task) -> tuple[str, str, str]:
    """What a task's prompts share with its family's (the sort key that puts them side by side):
    its family, its given domain and its description (the English before PlanBench's
    ``[STATEMENT]``)."""
    nl = getattr(task, "nl", "") or ""
    at = nl.find("[STATEMENT]")
    return (getattr(task, "family", None) or "", getattr(task, "domain", None) or "", nl[:at] if at >= 0 else "")


def default_engine(device: str | None) -> str:
    """The engine a role model runs on unless told (``--engine auto``): ``fast`` on CPU, ``hf``
    elsewhere (no GPU engine yet)."""
    return "fast" if (device or "cpu").startswith("cpu") else "hf"


def engine_info(policy) -> dict:
    """What generated for ``policy``, for an evaluation's provenance: ``engine`` (``hf``, ``fast``,
    or ``none`` for a policy that is no role model: scripted answers, a baseline over an HTTP
    backend), and for the fast engine ``int8``, the format of its many-token passes of the int8
    slots that keep a wide copy (``prefill_wide``: bf16 or fp32, by the CPU), whether it decodes
    the runs the grammar forces in one step (``jump_forward``) and its prefix cache
    (``prefix_cache``, ``prefix_cache_mb``)."""
    backend = getattr(policy, "backend", None)
    candidates = [policy, *_behind(policy), getattr(backend, "_model", None)]
    for obj in candidates:
        name = getattr(obj, "engine_name", None)
        if name == "fast":
            cache = getattr(obj, "prefix_cache", None)
            return {"engine": "fast", "int8": bool(getattr(obj, "quantize", False)),
                    "prefill_wide": getattr(obj, "prefill_wide", "fp32"),
                    "jump_forward": bool(getattr(obj, "jump_forward", False)),
                    "prefix_cache": bool(getattr(obj, "use_prefix_cache", False)),
                    "prefix_cache_mb": round(getattr(cache, "capacity", 0) / 2**20, 1) if cache is not None else 0.0}
    for obj in candidates:
        if obj is not None and (getattr(obj, "engine_name", None) == "hf" or hasattr(obj, "token_logprobs")):
            return {"engine": "hf"}
    return {"engine": "none"}


__all__ = ["ENGINES", "ENGINE_NAMES", "PREFIX_CACHE_MB", "OverModel", "UnknownEngine", "check_engine_name", "default_engine", "engine_info", "make_engine",
           "prefix_cache_engines", "prefix_cache_report", "prompt_group", "set_prefix_cache"]
