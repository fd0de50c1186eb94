"""Rollout engines: one interface for generating sequences, engines behind it.

An engine writes Actor/Editor answers for prompts under a sampling config and a decoding
constraint, exactly as :meth:`omtr.model.roles.RoleModel.generate` does (it *is* a
:class:`omtr.inference.policy.Policy`), from weights it takes from a role model, the *policy*:

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

A vLLM engine would implement the same five members (see the README, "Rollout engines").
This module imports no torch: the names are known without it.
"""

from __future__ import annotations

import importlib

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


def default_engine(device: str | None) -> str:
    """The engine to serve with: ``fast`` on CPU, ``hf`` elsewhere (no GPU engine yet)."""
    return "fast" if (device or "cpu").startswith("cpu") else "hf"


__all__ = ["ENGINES", "ENGINE_NAMES", "OverModel", "UnknownEngine", "check_engine_name", "default_engine", "make_engine"]
