"""Without the ``llamacpp`` extra: the reason the slow llama.cpp tests skip, and the server helper's
errors, are one line that says what to install (the server itself: tests/test_llamacpp_server.py)."""

from __future__ import annotations

import sys

import pytest

from omtr.inference import llamacpp


def test_missing_server_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    monkeypatch.setenv(llamacpp.PYTHON_ENV, str(tmp_path / "no-python"))
    assert llamacpp.server_python() is None
    assert llamacpp.missing_reason() == f"${llamacpp.PYTHON_ENV}={tmp_path / 'no-python'} is not a file; " \
                                        "point it at a Python with llama-cpp-python[server]"
    srv = llamacpp.LlamaCppServer(tmp_path / "m.gguf")
    srv.python = None  # as where no Python has the extra
    with pytest.raises(llamacpp.LlamaCppError, match=r"not installed: install the optional extra: "
                                                     r"pip install -e '\.\[llamacpp\]'"):
        srv.command()
    srv.close()
    assert srv.log_path is None, "nothing started, no log file left behind"


def test_a_server_that_exits_at_once_is_an_error_with_its_log(tmp_path):
    """This Python stands in for a broken install: without llama_cpp (or with it, on a file that is
    no model) the server process exits before it answers."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not a model")
    srv = llamacpp.LlamaCppServer(gguf, python=sys.executable)
    with pytest.raises(llamacpp.LlamaCppError, match=r"exited \(code 1\) before it answered; its log ends: .*"
                                                     r"(No module named llama_cpp|error|Error)"):
        with srv:
            pass
    assert srv.log_path is not None and not srv.log_path.exists()
    with pytest.raises(llamacpp.LlamaCppError, match="does not exist"):
        llamacpp.LlamaCppServer(tmp_path / "absent.gguf", python=sys.executable).start()
