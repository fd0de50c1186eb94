"""``omtr evaluate``: a policy on a task file under a planner-call budget; ``omtr evaluate compare``."""

from __future__ import annotations

import os
import sys

from omtr.cli import CliError, add_command

SELECT_CHOICES = ("greedy", "invariants", "supported")  # omtr.inference.select.SELECT_MODES (kept here: --help imports no loop)

EXAMPLES = """  omtr tasks import-planbench --out planbench.jsonl
  omtr evaluate --policy oracle --tasks planbench.jsonl --out eval/oracle          # harness check: 100%
  omtr evaluate --policy mutant:drop_goal_atom --tasks planbench.jsonl --out eval/mutant
  omtr evaluate --policy model --model runs/model --tasks planbench.jsonl --out eval/model
  omtr evaluate --policy CoT --backend hf:small --tasks bw.jsonl --limit 20 --out eval/cot
  omtr evaluate --policy self-refine --backend openai:http://127.0.0.1:8000/v1 --llm-model qwen \\
      --llm-key-env MY_KEY --grammar vllm --tasks bw.jsonl --out eval/sr
  omtr evaluate --policy file:their_specs.jsonl --tasks planbench.jsonl --out eval/theirs
  omtr evaluate --policy plan:zero-shot --backend hf:small --tasks planbench.jsonl --limit 20 --out eval/plan
  omtr evaluate --policy tot --backend hf:small --tot-breadth 3 --tot-beam 2 --tasks bw.jsonl --out eval/tot
  omtr evaluate --policy oracle --tasks planbench.jsonl --out eval/oracle --resume  # after a kill
  omtr evaluate --policy model --model runs/model --tasks val.jsonl --out eval/model \\
      --solver-url http://omtr-solver.omtr:8600                                  # verify on the solver fleet
  omtr evaluate compare eval/model eval/cot eval/tot eval/llmp eval/sr --out eval/compare
  omtr tasks import-planbench --family blocksworld --given-domain --out pb_given.jsonl
  omtr evaluate --policy model --model runs/model --tasks pb_given.jsonl --out eval/given   # problems only
  omtr evaluate --policy llm+p --backend hf:small --tasks pb_given.jsonl --out eval/llmp-given  # LLM+P as Liu et al.
  omtr evaluate --policy model --model small --tasks bw.jsonl --decoding plain --out eval/plain
  omtr evaluate --policy model --model small --tasks bw.jsonl --engine hf --out eval/hf   # reference engine (CPU default: fast)
  omtr evaluate --policy model --model small --tasks pb_given.jsonl --budget 4 --select invariants --out eval/select

Policies: model (--model DIR|small|micro|paper), oracle, mutant:<kind> (a mutator of
omtr.faithfulness.mutators), file:PATH ({"id", "domain", "problem"} per attempt, in order), and the
baselines cot, tot, llm+p, self-refine (Self-Refine+Solver) on --backend: hf:small (SmolLM2),
hf:micro, hf:DIR, or openai:URL (any OpenAI-compatible chat endpoint; key from --llm-key-env).
Tasks whose records carry "domain" (omtr tasks generate|import-planbench --given-domain) are
evaluated in the domain-given mode: every policy, baselines included, writes only the problem, the
planner verifies it with the given domain, and the checker compares it with the reference problem.
--out gets traces.jsonl, episodes.parquet, metrics.json (top-level success, faithful, drift as
fractions and calls, then per-family blocks), figures/*.png and report.html.
--select invariants (the model policy only) spends the budget on Actor samples instead of Editor
repairs: the greedy spec first; while the answer is unsolved or its initial state breaks one of the
domain's mutex invariants, a sample at temperature 0.7, one planner call each; the answer is the
best candidate (solved with a plan, fewest broken invariants, agreement, earliest). Each trace line
then has a "selection" block (candidates, broken counts, the chosen index and why) and metrics.json
a "selection" summary. --select supported asks more of a candidate: its whole support verdict
(clauses grounded one to one, objects named by the English) must be supported. greedy (the default) is the Actor-then-Editor loop.
"""


def register(sub) -> None:
    p = add_command(
        sub, "evaluate",
        help="evaluate a policy (model, oracle, mutant, file, baselines) under a planner-call budget",
        description=(
            "Run a policy on a task file through the episode loop with a budget of K planner calls per "
            "task, check solved specs against references, and write traces, metrics with bootstrap "
            "intervals, figures and a self-contained report.html. `omtr evaluate compare DIR...` puts "
            "several evaluations side by side."
        ),
        examples=EXAMPLES,
    )
    p.add_argument("compare", nargs="*", metavar="compare DIR", help=argparse_suppress())
    p.add_argument("--policy", metavar="NAME", help="model | oracle | mutant:<kind> | file:PATH | cot | tot | llm+p | self-refine")
    p.add_argument("--tasks", metavar="FILE.jsonl", help="task records (references needed for faithfulness)")
    p.add_argument("--out", metavar="DIR", help="output folder")
    p.add_argument("--model", metavar="DIR|PROFILE", help="the model policy's directory or profile")
    p.add_argument("--backend", metavar="NAME", default="hf:small",
                   help="LLM backend for baselines: hf:small (default), hf:micro, hf:DIR, openai:URL")
    p.add_argument("--llm-model", metavar="NAME", help="model name for openai: backends")
    p.add_argument("--llm-key-env", metavar="VAR", default="OPENAI_API_KEY", help="environment variable with the API key")
    p.add_argument("--llm-timeout", type=float, default=120.0, metavar="S", help="per-request time-out (openai:)")
    p.add_argument("--llm-concurrency", type=int, default=4, metavar="N", help="requests in flight (openai:)")
    p.add_argument("--llm-retries", type=int, default=4, metavar="N", help="retries on 429/5xx/time-outs (openai:)")
    p.add_argument("--grammar", default="none", choices=("none", "vllm", "vllm-legacy", "llamacpp"),
                   help="send omtr's PDDL grammar to the server (openai:) where it supports it")
    p.add_argument("--engine", default="auto", metavar="NAME",
                   help="rollout engine of a role model: auto (the default: fast where the model runs on a CPU, "
                        "hf elsewhere), fast (CPU: merged adapters, int8 linears; several times the tokens/s, "
                        "near-identical outcomes) or hf (the reference, exact)")
    p.add_argument("--prefix-cache", choices=("on", "off"), default="on",
                   help="the fast engine's prefix cache across prompts: a family's shared prompt tokens "
                        "computed once, in this run and for later batches (default on; off: every prompt "
                        "computes all its tokens, the same results, for benchmarks and debugging)")
    p.add_argument("--prefix-cache-mb", type=float, default=None, metavar="MB",
                   help="the prefix cache's bound in MiB (least recently used blocks go first; default 1024)")
    p.add_argument("--decoding", choices=("scoped", "plain", "off"), default=None,
                   help="the model policy's decoding constraint: scoped, plain (grammar alone) or off; "
                        "default: the model's (scoped)")
    p.add_argument("--baseline-grammar", default="on", choices=("on", "off"),
                   help="baselines write specs under omtr's PDDL grammar where the backend can, as the model does "
                        "(default on)")
    p.add_argument("--tot-breadth", type=int, default=None, metavar="N", help="ToT: thoughts expanded per state (default 2)")
    p.add_argument("--tot-beam", type=int, default=None, metavar="N", help="ToT: states kept per stage (default 2)")
    p.add_argument("--tot-thought-tokens", type=int, default=None, metavar="N",
                   help="ToT: token limit of one thought (default 160)")
    p.add_argument("--budget", type=int, default=None, metavar="K", help="planner calls per task (default 6)")
    p.add_argument("--select", choices=SELECT_CHOICES, default="greedy",
                   help="greedy: the Actor's spec, then Editor repairs (default); invariants: Actor samples within "
                        "the budget, the answer the one solved with no broken mutex invariant (the model policy only)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N tasks")
    p.add_argument("--family", action="append", default=[], help="only tasks of this family (repeatable)")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="episodes generated together (default 64)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="a fixed token limit per answer (default: 768, raised where the task's statement needs "
                        "more; see --fit-statement)")
    p.add_argument("--fit-statement", action="store_true",
                   help="with --max-new-tokens: still raise the limit where the task's statement needs more")
    p.add_argument("--solver-url", metavar="URL", help="verify specs on a solver fleet (omtr solver serve) instead "
                   "of local workers (default: $OMTR_SOLVER_URL; token: $OMTR_SOLVER_TOKEN)")
    p.add_argument("--workers", type=int, default=2, help="solver worker processes (default 2)")
    p.add_argument("--time-limit", type=float, metavar="S", help="planner CPU limit in seconds (default 60)")
    p.add_argument("--device", default=None, help="torch device for local models")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="B", help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full-check", action="store_true",
                   help="run the faithfulness checker's mapping search even on specs identical to the reference")
    p.add_argument("--no-report", action="store_true", help="skip figures and report.html")
    p.add_argument("--no-episode-log", action="store_true", help="skip episodes.parquet and its validation")
    p.add_argument("--resume", action="store_true", help="keep --out's traces and skip tasks already in them")
    p.add_argument("--overwrite", action="store_true", help="replace an existing evaluation in --out")
    p.add_argument("--track", action="store_true", help="log to MLflow (also on when MLFLOW_TRACKING_URI is set)")
    p.add_argument("--experiment", default="omtr-evaluate", help="MLflow experiment (default omtr-evaluate)")
    p.set_defaults(handler=run)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


def run(args) -> int:
    if args.compare:
        if args.compare[0] != "compare":
            raise CliError(f"unexpected argument {args.compare[0]!r}; did you mean `omtr evaluate compare DIR...`?")
        return _compare(args.compare[1:], args.out)
    for flag in ("policy", "tasks", "out"):
        if not getattr(args, flag):
            raise CliError(f"--{flag} is required (or use `omtr evaluate compare DIR...`)")
    if args.budget is not None and args.budget < 1:
        raise CliError(f"--budget must be at least 1 (the Actor's spec), got {args.budget}")
    if args.workers < 1 or args.batch_size < 1:
        raise CliError("--workers and --batch-size must be at least 1")
    if args.select != "greedy" and args.policy.partition(":")[0].lower() != "model":
        raise CliError(f"--select {args.select} samples omtr's role model (--policy model); {args.policy} cannot be "
                       "sampled that way: leave --select at greedy")
    traces = os.path.join(args.out, "traces.jsonl")
    if os.path.exists(traces) and not (args.resume or args.overwrite):
        raise CliError(f"{args.out} holds an evaluation; pass --resume to continue it or --overwrite to replace it")

    import time

    from omtr.config import ConfigError, EpisodeConfig, SolverConfig
    from omtr.evaluation.provenance import RunMismatch
    from omtr.evaluation.run import EvalConfig, evaluate
    from omtr.inference.backends import BackendError
    from omtr.inference.registry import UnknownPolicy, make_policy
    from omtr.inference.scripted import PolicyLoadError
    from omtr.progress import Progress
    from omtr.solver import SolverPool
    from omtr.tasks.records import TaskFormatError, load_tasks

    t0 = time.perf_counter()
    try:
        tasks = load_tasks(args.tasks)
    except TaskFormatError as exc:
        raise CliError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--tasks {args.tasks}: cannot read ({exc})") from None
    if args.family:
        tasks = [t for t in tasks if t.family in args.family]
    if args.limit is not None:
        tasks = tasks[: args.limit]
    load_s = time.perf_counter() - t0
    budget = args.budget if args.budget is not None else EpisodeConfig().planner_call_budget
    try:
        cfg = EvalConfig(budget=budget, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                         fit_statement=args.max_new_tokens is None or args.fit_statement, bootstrap=args.bootstrap, seed=args.seed, validate_log=not args.no_episode_log,
                         figures=not args.no_report, full_check=args.full_check, select=args.select)
        solver_cfg = SolverConfig().replace(time_limit_s=args.time_limit)
    except (ConfigError, ValueError) as exc:
        raise CliError(str(exc)) from None
    backend_options = {"model": args.llm_model, "key_env": args.llm_key_env, "timeout_s": args.llm_timeout,
                       "max_concurrency": args.llm_concurrency, "retries": args.llm_retries, "grammar": args.grammar,
                       "device": args.device}
    t = time.perf_counter()
    try:
        policy = make_policy(args.policy, tasks=tasks, model=args.model, backend=args.backend, budget=budget,
                             seed=args.seed, device=args.device, decoding=args.decoding, engine=args.engine,
                             grammar=args.baseline_grammar == "on",
                             breadth=args.tot_breadth, beam=args.tot_beam, thought_tokens=args.tot_thought_tokens,
                             backend_options={k: v for k, v in backend_options.items() if v is not None})
    except (UnknownPolicy, PolicyLoadError, BackendError, ValueError) as exc:  # PlanPolicyError is a ValueError
        raise CliError(str(exc)) from None
    policy_s = time.perf_counter() - t
    from omtr.rollout import prefix_cache_report, set_prefix_cache

    if args.prefix_cache_mb is not None and args.prefix_cache_mb < 0:
        raise CliError(f"--prefix-cache-mb must be 0 or more, got {args.prefix_cache_mb}")
    set_prefix_cache(policy, args.prefix_cache == "on", args.prefix_cache_mb)

    from omtr.config import FleetConfig

    try:
        fleet = FleetConfig.from_env(url=args.solver_url)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if fleet.url:  # the solver fleet verifies; the local pool stays the default
        from omtr.solver.client import FleetClient, FleetError

        verifier = _FleetEnv(FleetClient(fleet), solver_cfg)
    else:
        FleetError = ()  # noqa: N806 - nothing to catch
        verifier = SolverPool(args.workers, solver_cfg)
    bar = Progress(len(tasks), "tasks", quiet=args.quiet, batch=args.batch_size)
    t = time.perf_counter()
    try:
        with verifier as pool:
            pool_s = time.perf_counter() - t
            metrics = evaluate(tasks, policy, args.out, env=pool, config=cfg, policy_name=args.policy,
                               resume=args.resume, progress=bar.update, solver_config=solver_cfg,
                               run_info={"backend": args.backend if _uses_backend(args.policy) else None,
                                         "model": args.model, "tasks_file": args.tasks,
                                         "options": _policy_options(args)})
    except RunMismatch as exc:
        raise CliError(str(exc)) from None
    except BackendError as exc:
        raise CliError(f"{exc} (finished tasks are kept; rerun with --resume)") from None
    except FleetError as exc:
        raise CliError(f"{exc} (finished tasks are kept; rerun with --resume)") from None
    bar.close()
    metrics["timing"].update({"load_tasks_s": round(load_s, 3), "load_policy_s": round(policy_s, 3),
                              "start_solver_s": round(pool_s, 3), "total_s": round(time.perf_counter() - t0, 3)})
    cache = prefix_cache_report(policy)
    if cache is not None:  # the fast engine's prefill: tokens computed and found, time to the first token
        metrics["prefix_cache"] = cache
    from omtr.evaluation.traces import METRICS

    import json

    with open(os.path.join(args.out, METRICS), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2)
        fh.write("\n")
    if args.track or os.environ.get("MLFLOW_TRACKING_URI"):
        _track(args, metrics)
    _print(metrics, args.out)
    return 0


def _uses_backend(policy: str) -> bool:
    from omtr.inference.registry import ALIASES, BASELINES

    kind = policy.partition(":")[0].lower()
    return ALIASES.get(kind, kind) in BASELINES or kind == "plan"


def _policy_options(args) -> dict | None:
    """The options that shape a baseline's answers (for the provenance)."""
    if not _uses_backend(args.policy):
        return None
    out = {"baseline_grammar": args.baseline_grammar, "server_grammar": args.grammar, "llm_model": args.llm_model}
    if args.policy.lower().startswith("tot"):
        out.update(breadth=args.tot_breadth or 2, beam=args.tot_beam or 2, thought_tokens=args.tot_thought_tokens or 160)
    return out


def _print(m: dict, out: str) -> None:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    modes = ", ".join(f"{k} {v}" for k, v in (m.get("modes") or {}).items())
    print(f"policy: {m['policy']}  tasks: {m['tasks']}  budget: {m['budget']}" + (f"  mode: {modes}" if modes else ""))
    print(f"success: {pct(m['success'])}  faithful: {pct(m['faithful'])}  drift: {pct(m['drift'])}  "
          f"calls: {m['calls'] if m['calls'] is not None else '-'}")
    if m.get("supported") is not None:  # a planner success is not an answer by itself
        sup = m.get("support") or {}
        print(f"supported: {pct(m['supported'])} (solved but trivial {sup.get('trivial', 0)}, "
              f"solved but unsupported {sup.get('unsupported', 0)})")
    for f, b in (m.get("families") or {}).items():
        print(f"  {f}: {b['tasks']} tasks, success {pct(b['success']['value'])}, faithful "
              f"{pct(b['faithful']['value'])}, drift {pct(b['drift']['value'])}, calls {b['calls']['value']}")
    avg = m.get("paper_average") or {}
    if avg.get("sets"):
        if avg.get("complete"):
            print(f"{avg['name']}: success {pct(avg['success'])}, faithful {pct(avg['faithful'])}")
        else:
            print(f"{avg['name']}: not reported, missing {', '.join(avg['missing'])} (mean over "
                  f"{', '.join(avg['sets'])}: success {pct(avg['partial_success'])})")
    pl = (m.get("overall") or {}).get("planetarium")
    if pl:
        print("Planetarium view: parseable {}  solvable {}  equivalent {}".format(
            *(pct(pl[k]["value"]) for k in ("parseable", "solvable", "equivalent"))))
    lim = m.get("limits") or {}
    if lim.get("calls"):
        print(f"planner limits: {lim['timed_out']} time-outs, {lim['memory_out']} memory-outs, "
              f"{lim['too_large']} too large (counted as failed calls)")
    print(f"identical to reference: {m.get('identical_to_reference', 0)} solved final specs")
    sel = m.get("selection")
    if sel:
        print(f"selection ({sel['mode']}): {sel['candidates_per_task']} candidates per task; greedy spec kept "
              f"{sel['greedy_kept']} of {sel['episodes']}, answered with a later sample {sel['episodes'] - sel['greedy_kept']}; "
              f"solved and unbroken {sel['accepted']}; chosen solved but broken {sel['chosen_solved_broken']}")
    pf = m.get("policy_file")
    if pf:
        print(f"attempts file: {pf['attempts']} attempts for {pf['tasks_with_attempts']} tasks; "
              f"{pf['beyond_budget']['attempts']} beyond K, {pf['unknown_ids']['lines']} lines with unknown ids, "
              f"{pf['no_attempt']['count']} tasks with no attempt")
    dc = ((m.get("overall") or {}).get("drift_categories") or {})
    if dc:
        print("drift categories: " + ", ".join(f"{c} {v['count']}" for c, v in dc.items()))
    pg = m.get("plan_generation")
    if pg:
        print(f"plan generation (VAL on the reference): {pct(pg['overall']['valid']['value'])} valid of "
              f"{pg['overall']['tasks']}")
        for f, b in pg["families"].items():
            print(f"  {f}: {b['tasks']} tasks, valid {pct(b['valid']['value'])}")
    t = m.get("transfer")
    if t:
        print(f"transfer exact match: {pct(t['overall']['exact_match']['value'])} of {t['overall']['tasks']}")
    log = m.get("episode_log") or {}
    if log.get("valid") is False:
        print(f"episode log: FAILED validation ({'; '.join(log.get('failures', [])[:3])})")
    print(f"time: {m['timing'].get('total_s', m['timing'].get('run_s'))} s  report: {os.path.join(out, 'report.html')}")
    sys.stdout.flush()


class _FleetEnv:
    """The episode loop's environment on the solver fleet, with this evaluation's solver config."""

    def __init__(self, client, config):
        self.client, self.config = client, config

    def __enter__(self) -> "_FleetEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()

    def solve_many(self, specs):
        return self.client.solve_many(list(specs), config=self.config)


def _track(args, metrics: dict) -> None:
    import mlflow

    from omtr.tracking import start_run

    flat = {k: metrics[k] for k in ("success", "faithful", "drift", "calls") if metrics.get(k) is not None}
    for f, b in (metrics.get("families") or {}).items():
        for k in ("success", "faithful", "drift"):
            if b[k]["value"] is not None:
                flat[f"{f}.{k}"] = b[k]["value"]
    pg = metrics.get("plan_generation")
    if pg:
        flat["plan_valid"] = pg["overall"]["valid"]["value"]
        for f, b in pg["families"].items():
            flat[f"{f}.plan_valid"] = b["valid"]["value"]
    avg = metrics.get("paper_average") or {}
    if avg.get("complete"):
        flat["paper_average.success"] = avg["success"]
        if avg.get("faithful") is not None:
            flat["paper_average.faithful"] = avg["faithful"]
    for c in ((metrics.get("overall") or {}).get("csr") or []):
        flat[f"csr.h{c['h']}"] = c["value"] or 0.0
    with start_run(args.experiment, f"evaluate-{args.policy}"):
        mlflow.log_params({"policy": args.policy, "tasks": args.tasks, "budget": metrics["budget"],
                           "model": args.model or "", "backend": args.backend, "select": args.select, "decoding": args.decoding or "",
                           "modes": ",".join(sorted(metrics.get("modes") or {})),
                           # the engine that generated, as resolved (auto: fast on a CPU), and its settings
                           **{f"engine.{k}" if k != "engine" else "engine": v for k, v in
                              ((metrics.get("provenance") or {}).get("engine") or {"engine": args.engine}).items()}})
        mlflow.log_metrics(flat)
        mlflow.log_artifacts(args.out)


def _compare(folders: list[str], out: str | None) -> int:
    if not folders:
        raise CliError("compare needs at least one evaluation folder: omtr evaluate compare DIR...")
    from omtr.evaluation.report import CompareError, compare

    try:
        html_text, md = compare(folders)
    except (FileNotFoundError, CompareError) as exc:
        raise CliError(str(exc)) from None
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare.html"), "w", encoding="utf-8") as fh:
            fh.write(html_text)
        with open(os.path.join(out, "compare.md"), "w", encoding="utf-8") as fh:
            fh.write(md + "\n")
        print(f"wrote {os.path.join(out, 'compare.html')} and compare.md")
    else:
        print(md)
    return 0
