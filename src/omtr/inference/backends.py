"""LLM backends, registered by name: what the paper's baselines (and transfer answers) talk to.

A backend turns chat prompts into text, batched; it knows nothing about roles or budgets:

    chat(prompts, sampling, *, stop_when=None, grammar=False, domains=None) -> list[Generation]

``domains[i]``, when given, is prompt i's given domain (the domain-given mode): its answer is a
problem alone, so a grammar sent for it is the problem-only grammar
(``pddl_ebnf(problem_only=True)``), and a local model decodes it under its problem grammar.

* ``hf:PROFILE|DIR|HF_FOLDER`` — a local Hugging Face causal LM through omtr's role model loader:
  ``hf:small`` (SmolLM2-135M-Instruct), ``hf:micro`` (a tiny random model for tests), a model
  directory written by ``omtr model init``/training, or any causal LM folder. Imported on first use.
* ``openai:URL`` — any OpenAI-compatible chat endpoint (vLLM, TGI, Ollama, a llama.cpp server, a
  hosted API). ``URL`` is the server's base (``http://host:8000/v1``); the model name and the
  environment variable holding the key are options. Requests retry on 429, 5xx, time-outs and
  refused connections with exponential back-off and full jitter (``Retry-After`` is honoured), run
  at most ``max_concurrency`` at a time, and fail with one :class:`BackendError` sentence that
  says what went wrong (authentication, a rejected request, a malformed answer, an unreachable
  server). Where the server can constrain output with a grammar, ``grammar=...`` sends omtr's
  PDDL grammar, rendered in the server's dialect (``vllm``: ``structured_outputs.grammar``;
  ``vllm-legacy``: ``guided_grammar``; both xgrammar's EBNF; ``llamacpp``: ``grammar`` in GBNF as
  llama.cpp's C++ parser reads it: :mod:`omtr.inference.grammar_dialects`).

Register another backend with :func:`register_backend`; ``make_backend("name:arg", **options)``
builds one. The standard library is enough for the HTTP backend (no client package needed).
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import importlib.util
import inspect
import json
import logging
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from omtr.inference import grammar_dialects
from omtr.policy import Generation, Messages, Sampling

log = logging.getLogger(__name__)


class BackendError(RuntimeError):
    """A backend that cannot answer; the message is one sentence saying why and what to do."""


class BackendAuthError(BackendError):
    """401/403: the key is missing or wrong."""


class BackendRequestError(BackendError):
    """Another 4xx: the server rejected the request (model name, parameters, prompt too long)."""


class BackendResponseError(BackendError):
    """The server answered 2xx with something that is not a chat completion."""


class BackendUnavailable(BackendError):
    """Retries exhausted on 429/5xx/time-outs/refused connections."""


class Backend(Protocol):
    name: str

    def chat(self, prompts: Sequence[Messages], sampling: Sampling, *,
             stop_when: Callable[[str], bool] | None = None, grammar: bool = False,
             domains: Sequence[str | None] | None = None) -> list[Generation]: ...


BACKENDS: dict[str, Callable[..., Backend]] = {}
BACKEND_HELP: dict[str, str] = {}


def register_backend(name: str, help: str = ""):
    def deco(factory):
        BACKENDS[name] = factory
        BACKEND_HELP[name] = help
        return factory

    return deco


def make_backend(spec: str, **options) -> Backend:
    """``"hf:small"``, ``"openai:http://127.0.0.1:8000/v1"``, ...; ``options`` go to the factory.
    A bare profile (``small``, ``micro``) or directory means ``hf:``."""
    name, _, arg = spec.partition(":")
    if name not in BACKENDS:  # "small", "micro", "runs/model", "http://..."
        if spec.startswith(("http://", "https://")):
            name, arg = "openai", spec
        else:
            name, arg = "hf", spec
    return BACKENDS[name](arg, **options)


def cut_at_stop(text: str, stop_when: Callable[[str], bool] | None) -> tuple[str, bool]:
    """The text up to the first line end where ``stop_when`` holds (as an early-stopping decoder)."""
    if stop_when is None:
        return text, False
    acc = ""
    for line in text.splitlines(keepends=True):
        acc += line
        if stop_when(acc):
            return acc, True
    return text, False


# ----------------------------------------------------------------------------------- grammar


@functools.lru_cache(maxsize=2)
def _source_grammar(problem_only: bool = False) -> str:
    here = Path(__file__).resolve().parent.parent / "model" / "grammar.py"
    spec = importlib.util.spec_from_file_location("_omtr_pddl_grammar", here)
    if spec is None or spec.loader is None:
        raise BackendError(f"cannot read omtr's PDDL grammar from {here}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_omtr_pddl_grammar", mod)
    spec.loader.exec_module(mod)
    return mod.pddl_ebnf(problem_only=problem_only)


@functools.lru_cache(maxsize=None)
def pddl_grammar(dialect: str = "xgrammar", *, problem_only: bool = False) -> str:
    """omtr's PDDL grammar in a server's dialect (:mod:`omtr.inference.grammar_dialects`), read
    without importing torch. ``xgrammar`` is the source the local decoder compiles;
    ``problem_only``: the root is a problem alone (answers for a given domain)."""
    try:
        return grammar_dialects.render(_source_grammar(problem_only), dialect)
    except grammar_dialects.DialectError as exc:
        raise BackendError(f"omtr's PDDL grammar cannot be sent as {dialect!r}: {exc}") from None


GRAMMAR_MODES = ("none", "vllm", "vllm-legacy", "llamacpp")


def grammar_fields(mode: str, *, problem_only: bool = False) -> dict:
    """Request fields that carry the PDDL grammar, in the server's dialect, to a server of the given
    kind; ``problem_only`` for a prompt whose domain is given (the answer is a problem alone)."""
    if mode == "none":
        return {}
    if mode == "vllm":
        return {"structured_outputs": {"grammar": pddl_grammar("vllm", problem_only=problem_only)}}
    if mode == "vllm-legacy":
        return {"guided_grammar": pddl_grammar("vllm-legacy", problem_only=problem_only)}
    if mode == "llamacpp":
        return {"grammar": pddl_grammar("llamacpp", problem_only=problem_only)}
    raise BackendError(f"unknown grammar mode {mode!r}; choose from {', '.join(GRAMMAR_MODES)}")


def _check_domains(prompts, domains) -> list[str | None] | None:
    """``domains`` as a list as long as ``prompts`` (None: no prompt has a given domain)."""
    if domains is None:
        return None
    domains = [d or None for d in domains]
    if len(domains) != len(prompts):
        raise BackendError(f"{len(prompts)} prompts but {len(domains)} given domains")
    return domains if any(domains) else None


# ------------------------------------------------------------------------------------- local


class HFBackend:
    """A local causal LM through omtr's role model (its Actor adapter; grammar off unless asked)."""

    def __init__(self, spec: str = "small", *, device: str | None = None, model=None):
        self.name = f"hf:{spec}"
        self.spec, self.device = spec or "small", device
        self._model = model
        self._lock = threading.Lock()

    @property
    def model(self):
        with self._lock:
            if self._model is None:
                from omtr.inference.loading import load_policy

                self._model = load_policy(self.spec, **({"device": self.device} if self.device else {}))
            return self._model

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False, domains=None):
        if not prompts:
            return []
        model = self.model
        domains = _check_domains(prompts, domains)
        params = inspect.signature(model.generate).parameters
        kw = {}
        if "grammar" in params:
            kw["grammar"] = grammar
        if domains is not None:
            if "domains" not in params:
                raise BackendError(f"{self.name}: the model's generate() takes no given domains (domains=)")
            kw["domains"] = domains
        return model.generate("actor", list(prompts), sampling, stop_when=stop_when, **kw)


@register_backend("hf", "local Hugging Face model: hf:small (SmolLM2), hf:micro, hf:DIR")
def _hf(arg: str, **options) -> Backend:
    return HFBackend(arg or "small", device=options.get("device"), model=options.get("model"))


# -------------------------------------------------------------------------------------- HTTP


@dataclass
class OpenAIConfig:
    """How to reach an OpenAI-compatible chat endpoint."""

    url: str = field(metadata={"help": "base URL, e.g. http://127.0.0.1:8000/v1 (/chat/completions is added)"})
    model: str = field(default="default", metadata={"help": "model name the server knows"})
    key_env: str | None = field(default="OPENAI_API_KEY", metadata={"help": "environment variable with the key"})
    timeout_s: float = field(default=120.0, metadata={"help": "per-request time-out"})
    retries: int = field(default=4, metadata={"help": "retries after the first try (429, 5xx, time-outs)"})
    backoff_s: float = field(default=0.5, metadata={"help": "first back-off; doubles per retry, full jitter"})
    max_backoff_s: float = field(default=20.0, metadata={"help": "longest single wait"})
    max_concurrency: int = field(default=4, metadata={"help": "requests in flight at once"})
    grammar: str = field(default="none", metadata={"help": "grammar passthrough: " + ", ".join(GRAMMAR_MODES)})

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise BackendError(f"backend URL must start with http:// or https://, got {self.url!r}")
        if self.max_concurrency < 1 or self.retries < 0 or self.timeout_s <= 0:
            raise BackendError("max_concurrency >= 1, retries >= 0 and timeout_s > 0 are required")
        if self.grammar not in GRAMMAR_MODES:
            raise BackendError(f"unknown grammar mode {self.grammar!r}; choose from {', '.join(GRAMMAR_MODES)}")

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/chat/completions") else base + "/chat/completions"


class OpenAIBackend:
    """Chat completions over HTTP, one request per prompt, ``max_concurrency`` at a time."""

    def __init__(self, config: OpenAIConfig, *, sleep: Callable[[float], None] = time.sleep):
        self.cfg, self.name, self._sleep = config, f"openai:{config.url}", sleep
        self.requests = 0  # HTTP requests sent, retries included
        self._count = threading.Lock()
        self._model_checked = False
        self._model_lock = threading.Lock()

    def _key(self) -> str | None:
        if not self.cfg.key_env:
            return None
        return os.environ.get(self.cfg.key_env) or None

    def body(self, messages: Messages, sampling: Sampling, grammar: bool, *, problem_only: bool = False) -> dict:
        out = {"model": self.cfg.model, "messages": list(messages), "max_tokens": sampling.max_new_tokens,
               "temperature": 0.0 if sampling.greedy else sampling.temperature, "n": 1}
        if not sampling.greedy:
            out["top_p"] = sampling.top_p
        if sampling.seed is not None:
            out["seed"] = sampling.seed
        if grammar:
            out.update(grammar_fields(self.cfg.grammar, problem_only=problem_only))
        return out

    def chat(self, prompts, sampling, *, stop_when=None, grammar=False, domains=None):
        prompts = list(prompts)
        if not prompts:
            return []
        given = _check_domains(prompts, domains) or [None] * len(prompts)
        self.check_model()
        with cf.ThreadPoolExecutor(max_workers=min(self.cfg.max_concurrency, len(prompts)),
                                   thread_name_prefix="omtr-llm") as pool:
            futures = [pool.submit(self._one, p, sampling, stop_when, grammar, bool(d)) for p, d in zip(prompts, given)]
            return [f.result() for f in futures]

    def check_model(self) -> None:
        """Once per backend: a model name the server does not list is an error.

        Some servers answer any name with the model they have (llama-cpp-python's server does),
        so a misspelt ``--llm-model`` would otherwise go unnoticed. A server without a readable
        ``GET /models`` (or the name ``default``) is not checked."""
        with self._model_lock:
            if self._model_checked:
                return
            self._model_checked = True
            if self.cfg.model == "default":
                return
            url = self.cfg.endpoint[: -len("/chat/completions")] + "/models"
            headers = {"Accept": "application/json"}
            key = self._key()
            if key:
                headers["Authorization"] = f"Bearer {key}"
            try:
                req = urllib.request.Request(url, headers=headers, method="GET")
                with urllib.request.urlopen(req, timeout=min(self.cfg.timeout_s, 10.0)) as resp:
                    listed = [m["id"] for m in json.loads(resp.read())["data"]]
            except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as exc:
                log.debug("model list at %s not read (%s); the model name is not checked", url, exc)
                return
            if listed and self.cfg.model not in listed:
                shown = ", ".join(repr(m) for m in listed[:8]) + (" ..." if len(listed) > 8 else "")
                raise BackendRequestError(f"{url} does not list the model {self.cfg.model!r} (it serves {shown}); "
                                          "pass one of these as --llm-model")

    def _one(self, messages, sampling, stop_when, grammar, problem_only=False) -> Generation:
        t0 = time.perf_counter()
        data = self._post(self.body(messages, sampling, grammar, problem_only=problem_only))
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"]
            if text is None:
                text = ""
            if not isinstance(text, str):
                raise TypeError("content is not a string")
        except (KeyError, IndexError, TypeError) as exc:
            raise BackendResponseError(
                f"{self.cfg.endpoint} answered without choices[0].message.content ({exc}); "
                f"is it an OpenAI-compatible chat endpoint? Got: {json.dumps(data)[:200]}") from None
        text, stopped = cut_at_stop(text, stop_when)
        usage = data.get("usage") or {}
        reason = "stop" if stopped else ("length" if choice.get("finish_reason") == "length" else "stop")
        return Generation(text=text, prompt_tokens=int(usage.get("prompt_tokens") or 0), finish_reason=reason,
                          timings={"request_ms": 1000 * (time.perf_counter() - t0)})

    def _post(self, body: dict) -> dict:
        payload = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = self._key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.cfg.endpoint
        last = ""
        for attempt in range(self.cfg.retries + 1):
            retry_after = None
            with self._count:
                self.requests += 1
            try:
                req = urllib.request.Request(url, data=payload, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                    raw = resp.read()
                try:
                    data = json.loads(raw)
                except ValueError:
                    raise BackendResponseError(f"{url} answered with something that is not JSON: {raw[:120]!r}") from None
                if not isinstance(data, dict):
                    raise BackendResponseError(f"{url} answered with JSON that is not an object: {raw[:120]!r}")
                return data
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code in (401, 403):
                    where = f"${self.cfg.key_env}" if self.cfg.key_env else "no key variable"
                    state = "is set" if key else "is not set"
                    raise BackendAuthError(f"{url} refused the key ({exc.code}: {detail}); {where} {state}") from None
                if exc.code == 429 or exc.code >= 500:
                    last = f"HTTP {exc.code}: {detail}"
                    retry_after = _retry_after(exc)
                else:
                    raise BackendRequestError(f"{url} rejected the request ({exc.code}: {detail})") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"{type(reason).__name__}: {reason}"
            if attempt < self.cfg.retries:
                wait = retry_after if retry_after is not None else random.uniform(
                    0, min(self.cfg.max_backoff_s, self.cfg.backoff_s * 2 ** attempt))
                log.warning("LLM request to %s failed (%s); retry %d/%d in %.2fs", url, last, attempt + 1,
                            self.cfg.retries, wait)
                self._sleep(min(wait, self.cfg.max_backoff_s))
        raise BackendUnavailable(f"{url} did not answer after {self.cfg.retries + 1} tries (last: {last}); "
                                 "is the server up, and is --backend the right URL?")


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()[:2000]
        data = json.loads(raw)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") if isinstance(err, dict) else None
        return str(msg or err)[:300]
    except Exception:  # noqa: BLE001 - any body at all is only a hint
        return exc.reason if isinstance(exc.reason, str) else str(exc)


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    value = exc.headers.get("Retry-After") if exc.headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


@register_backend("openai", "OpenAI-compatible chat endpoint: openai:http://HOST:PORT/v1")
def _openai(arg: str, **options) -> Backend:
    fields = {k: v for k, v in options.items() if k in OpenAIConfig.__dataclass_fields__ and v is not None}
    return OpenAIBackend(OpenAIConfig(url=arg, **fields))
