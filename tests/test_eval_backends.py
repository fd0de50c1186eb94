"""The OpenAI-compatible backend against a real HTTP server on loopback (standard library, no model):
retries with back-off, Retry-After, time-outs, the concurrency limit, grammar passthrough and errors."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from omtr.inference.backends import (
    BackendAuthError,
    BackendError,
    BackendRequestError,
    BackendResponseError,
    BackendUnavailable,
    OpenAIBackend,
    OpenAIConfig,
    make_backend,
    pddl_grammar,
)
from omtr.inference.extract import spec_complete
from omtr.policy import Sampling

SPEC = "(define (domain d) (:predicates (p)) (:action a :parameters () :precondition (p) :effect (not (p))))\n" \
       "(define (problem q) (:domain d) (:init (p)) (:goal (not (p))))\nand some chatter after\n"


class Server:
    """A chat-completions endpoint whose answers a test scripts: a list of (status, body, headers)."""

    def __init__(self):
        self.script: list[tuple[int, object, dict]] = []
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.delay = 0.0
        self.models: list[str] | None = None  # what GET /v1/models lists; None: not found
        self.active = self.peak = 0
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                ok = self.path.endswith("/models") and outer.models is not None
                data = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in outer.models or []]})
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", str(len(data) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(data.encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(body)
                    outer.headers.append(dict(self.headers))
                    outer.active += 1
                    outer.peak = max(outer.peak, outer.active)
                    status, payload, hdrs = outer.script.pop(0) if outer.script else (200, _ok("hi"), {})
                time.sleep(outer.delay)
                # leaves the count before answering: once the client has the answer it may send its next
                # request, and a busy machine may run that before this thread gets the CPU back
                with outer.lock:
                    outer.active -= 1
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _ok(text, finish="stop"):
    return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 12}}


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def _backend(server, **kw) -> OpenAIBackend:
    waits: list[float] = []
    be = OpenAIBackend(OpenAIConfig(url=server.url, model="m", **kw), sleep=waits.append)
    be.waits = waits
    return be


MSG = [[{"role": "user", "content": "write a spec"}]]


def test_answers_are_cut_where_the_spec_is_complete_and_the_request_is_well_formed(server, monkeypatch):
    monkeypatch.setenv("OMTR_TEST_KEY", "sekret")
    server.script = [(200, _ok(SPEC), {})]
    be = _backend(server, key_env="OMTR_TEST_KEY")
    [g] = be.chat(MSG, Sampling(greedy=True, max_new_tokens=50), stop_when=spec_complete)
    assert g.text.rstrip().endswith("(:goal (not (p))))") and "chatter" not in g.text and g.prompt_tokens == 12
    req = server.requests[0]
    assert req["model"] == "m" and req["temperature"] == 0.0 and req["max_tokens"] == 50 and req["messages"] == MSG[0]
    assert server.headers[0]["Authorization"] == "Bearer sekret"
    assert "grammar" not in json.dumps(req)


def test_retries_5xx_and_429_with_backoff_and_retry_after(server):
    server.script = [(503, {"error": {"message": "warming up"}}, {}), (429, {"error": "slow down"}, {"Retry-After": "3"}),
                     (200, _ok("done"), {})]
    be = _backend(server, retries=3, backoff_s=0.25)
    [g] = be.chat(MSG, Sampling())
    assert g.text == "done" and be.requests == 3
    assert 0 <= be.waits[0] <= 0.25 and be.waits[1] == 3.0


def test_gives_up_with_one_sentence_after_the_retries(server):
    server.script = [(500, {"error": "boom"}, {})] * 3
    be = _backend(server, retries=2)
    with pytest.raises(BackendUnavailable, match=r"did not answer after 3 tries \(last: HTTP 500: boom\)"):
        be.chat(MSG, Sampling())


def test_unreachable_server_and_time_outs(server):
    dead = OpenAIBackend(OpenAIConfig(url="http://127.0.0.1:9/v1", retries=1), sleep=lambda s: None)
    with pytest.raises(BackendUnavailable, match="is the server up"):
        dead.chat(MSG, Sampling())
    server.delay = 1.0
    be = _backend(server, retries=0, timeout_s=0.2)
    with pytest.raises(BackendUnavailable, match="(?i)timed? ?out"):
        be.chat(MSG, Sampling())


def test_client_errors_are_not_retried_and_say_what_is_wrong(server, monkeypatch):
    monkeypatch.delenv("OMTR_TEST_KEY", raising=False)
    server.script = [(401, {"error": {"message": "invalid api key"}}, {})]
    with pytest.raises(BackendAuthError, match=r"refused the key \(401: invalid api key\); \$OMTR_TEST_KEY is not set"):
        _backend(server, key_env="OMTR_TEST_KEY").chat(MSG, Sampling())
    server.script = [(400, {"error": {"message": "model 'm' not found"}}, {})]
    be = _backend(server)
    with pytest.raises(BackendRequestError, match="model 'm' not found"):
        be.chat(MSG, Sampling())
    assert be.requests == 1


def test_a_model_name_the_server_does_not_list_is_one_line_before_any_prompt(server):
    server.models = ["smollm2", "other"]
    with pytest.raises(BackendRequestError, match=r"/v1/models does not list the model 'm' \(it serves 'smollm2', "
                                                  r"'other'\); pass one of these as --llm-model"):
        _backend(server).chat(MSG, Sampling())
    assert server.requests == []
    server.models = ["m"]
    assert _backend(server).chat(MSG, Sampling())[0].text == "hi"
    server.models = None  # no model list: not checked
    assert _backend(server).chat(MSG, Sampling())[0].text == "hi"


@pytest.mark.parametrize("body, match", [
    (b"<html>gateway</html>", "not JSON"),
    ({"choices": []}, "without choices"),
    ({"choices": [{"message": {"content": 7}}]}, "without choices"),
    ([1, 2], "not an object"),
])
def test_malformed_answers(server, body, match):
    server.script = [(200, body, {})]
    with pytest.raises(BackendResponseError, match=match):
        _backend(server).chat(MSG, Sampling())


def test_concurrency_limit_and_order(server):
    server.delay = 0.15
    server.script = [(200, _ok(f"answer {i}"), {}) for i in range(8)]
    be = _backend(server, max_concurrency=3)
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(8)]
    gens = be.chat(prompts, Sampling(greedy=False, temperature=0.5, seed=4))
    assert len(gens) == 8 and server.peak == 3
    assert {g.text for g in gens} == {f"answer {i}" for i in range(8)}
    assert all(r["temperature"] == 0.5 and r["seed"] == 4 and "top_p" in r for r in server.requests)


@pytest.mark.parametrize("mode, field", [("vllm", "structured_outputs"), ("vllm-legacy", "guided_grammar"),
                                         ("llamacpp", "grammar")])
def test_grammar_passthrough(server, mode, field):
    be = _backend(server, grammar=mode)
    be.chat(MSG, Sampling(), grammar=True)
    be.chat(MSG, Sampling(), grammar=False)
    sent = server.requests[0][field]
    text = sent["grammar"] if isinstance(sent, dict) else sent
    assert text == pddl_grammar(mode) and text.startswith("root ::=")
    assert ("pname-and ::=" in text) == (mode == "llamacpp"), "GBNF for llama.cpp, xgrammar's EBNF for vLLM"
    assert field not in server.requests[1]


def test_problem_only_grammar_for_given_domains(server):
    """A prompt whose domain is given gets the problem-only grammar; the others the full one."""
    be = _backend(server, grammar="llamacpp")
    server.script = [(200, _ok("a"), {}), (200, _ok("b"), {})]
    be.chat([MSG[0], [{"role": "user", "content": "other"}]], Sampling(), grammar=True,
            domains=["(define (domain d))", None])
    by_prompt = {r["messages"][-1]["content"]: r["grammar"] for r in server.requests}
    assert by_prompt["other"] == pddl_grammar("llamacpp")
    assert by_prompt[MSG[0][-1]["content"]] == pddl_grammar("llamacpp", problem_only=True)
    assert by_prompt[MSG[0][-1]["content"]].startswith("root ::= problem")
    with pytest.raises(BackendError, match="2 prompts but 1 given domains"):
        be.chat([MSG[0], MSG[0]], Sampling(), grammar=True, domains=["x"])


def test_configuration_errors_and_names():
    with pytest.raises(BackendError, match="http"):
        OpenAIConfig(url="127.0.0.1:8000")
    with pytest.raises(BackendError, match="grammar mode"):
        OpenAIConfig(url="http://x", grammar="gbnf-ish")
    assert make_backend("openai:http://h:1/v1", model="q").cfg.model == "q"
    assert make_backend("http://h:1/v1").name == "openai:http://h:1/v1"
    assert make_backend("hf:micro").name == "hf:micro"  # loads lazily
