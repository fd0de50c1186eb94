"""``--model DIR|PROFILE|scripted:FILE`` -> a :class:`~omtr.policy.Policy`.

* ``scripted:ANSWERS.jsonl`` replays fixed answers (:mod:`omtr.inference.scripted`);
* anything else is a model directory or a profile name (``small``, ``micro``, ``paper``) and is
  handed to the role model's loader (``omtr.model.load_policy(spec, **options)`` when it exists,
  else ``omtr.model.load_model``), imported only here so that the loop and the command line start
  without torch.

``decoding`` (``scoped``, ``plain`` or ``off``; ``omtr infer|evaluate --decoding``) sets the role
model's decoding constraint for this run (``ModelConfig.decoding``); a scripted policy has none.
"""

from __future__ import annotations

import importlib
import logging
from typing import Iterable

from omtr.config import DECODING_CONSTRAINTS
from omtr.inference.scripted import PolicyLoadError, ScriptedPolicy
from omtr.policy import Policy

SCRIPTED = "scripted:"
log = logging.getLogger(__name__)
AUTO = "auto"  # the default engine: fast where the role model runs on a CPU, hf elsewhere


def load_policy(spec: str, *, tasks: Iterable | None = None, decoding: str | None = None,
                engine: str | None = None, **options) -> Policy:
    """The policy named by ``spec``. ``tasks`` is needed by ``scripted:`` (answers are keyed by id);
    ``decoding`` overrides the role model's decoding constraint; ``engine`` names the rollout
    engine that generates for a role model (:mod:`omtr.rollout`: ``hf``, the reference, or
    ``fast``); ``auto`` (or None, the default) takes ``fast`` where the model runs on a CPU and
    ``hf`` elsewhere, and ``hf`` where the fast engine does not run the backbone; ``options``
    (e.g. ``device``) go to the role model's loader."""
    if engine is not None and engine != AUTO:
        from omtr.rollout import UnknownEngine, check_engine_name

        try:
            check_engine_name(engine)
        except UnknownEngine as exc:
            raise PolicyLoadError(str(exc)) from None
    if decoding is not None and decoding not in DECODING_CONSTRAINTS:
        raise PolicyLoadError(f"decoding {decoding!r}: choose one of {', '.join(DECODING_CONSTRAINTS)}")
    if not spec or not spec.strip():
        raise PolicyLoadError("--model is empty; give a model directory, a profile (small, micro, paper) "
                              "or scripted:ANSWERS.jsonl")
    if spec.startswith(SCRIPTED):
        if engine not in (None, AUTO, "hf"):
            raise PolicyLoadError(f"--engine {engine} runs role models; {spec} replays fixed answers")
        return ScriptedPolicy.from_jsonl(spec[len(SCRIPTED):], list(tasks or []))
    try:
        model = importlib.import_module("omtr.model")
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == "omtr.model" or exc.name.startswith("omtr.model.")):
            raise PolicyLoadError(
                f"cannot load model {spec!r}: the role model (omtr.model) is not part of this installation; "
                "use --model scripted:ANSWERS.jsonl to replay fixed answers"
            ) from None
        raise PolicyLoadError(
            f"cannot load model {spec!r}: the ML stack is missing ({exc.name}); "
            "install it with: pip install -c constraints.txt -e '.[ml]'"
        ) from None
    # The role model itself is a Policy: load_policy when the package offers one, else load_model.
    loader = getattr(model, "load_policy", None) or getattr(model, "load_model", None)
    if loader is None:
        raise PolicyLoadError(f"cannot load model {spec!r}: omtr.model offers neither load_policy nor load_model")
    errors = (FileNotFoundError, ValueError, *(c for c in (getattr(model, "BackboneError", None),) if c))
    try:
        policy = loader(spec, **options)
    except errors as exc:
        raise PolicyLoadError(f"cannot load model {spec!r}: {exc}") from None
    if decoding is not None and hasattr(getattr(policy, "cfg", None), "replace"):
        policy.cfg = policy.cfg.replace(decoding=decoding)
        if decoding == "off":
            policy.cfg = policy.cfg.replace(grammar=False)
    auto = engine in (None, AUTO)
    if auto and hasattr(policy, "token_logprobs") and hasattr(policy, "device"):
        from omtr.rollout import default_engine

        engine = default_engine(str(policy.device))
    if engine not in (None, AUTO, "hf"):
        from omtr.rollout import make_engine

        try:
            policy = make_engine(engine, policy)
        except ValueError as exc:
            if not auto:
                raise PolicyLoadError(f"--engine {engine}: {exc}") from None
            log.info("the %s engine does not run this model (%s); generating with hf", engine, exc)
    return policy
