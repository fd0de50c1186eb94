"""``omtr infer``: the Actor -> planner -> Editor loop, greedy, on any task file (``--select invariants``:
Actor samples within the budget, the one breaking no mutex invariant chosen)."""

from __future__ import annotations

import json
import logging
import os
import sys

from omtr.cli import CliError, add_command, finished_ids

SELECT_CHOICES = ("greedy", "invariants", "supported")  # omtr.inference.select.SELECT_MODES (kept here: --help imports no loop)

EXAMPLES = """  omtr infer --model small --tasks my_tasks.jsonl --out traces.jsonl
  omtr infer --model runs/model --tasks bw.jsonl --budget 6 --batch-size 8 --workers 2 --out traces.jsonl
  omtr infer --model small --tasks bw.jsonl --out traces.jsonl --resume     # continue a stopped run
  omtr infer --model scripted:answers.jsonl --tasks my_tasks.jsonl --out traces.jsonl
  omtr tasks generate --family gripper --n 8 --given-domain --out g.jsonl
  omtr infer --model small --tasks g.jsonl --out traces.jsonl        # domain given: the model writes problems
  omtr infer --model small --tasks bw.jsonl --decoding plain --out traces.jsonl   # the grammar without scope rules
  omtr infer --model small --tasks bw.jsonl --engine hf --out traces.jsonl        # the reference engine (CPU default: fast)
  omtr infer --model small --tasks g.jsonl --budget 4 --select invariants --out traces.jsonl  # choose among samples
  omtr infer --model small --tasks mine.jsonl --domains my_domains/ --abstain --out traces.jsonl  # my domains; no unsupported specs

--model is a model directory (omtr model init), a profile (small, micro, paper), or
scripted:ANSWERS.jsonl, which replays fixed answers: one {"id": ..., "texts": ["<Actor's answer>",
"<first repair>", ...]} line per task. Task files need only "id" and "nl" per line; reference PDDL,
if present, is dropped while reading. A record with "domain" (PDDL text; omtr tasks generate
--given-domain writes one) runs in the domain-given mode: the prompts show that domain, the model
writes only the problem, and the planner verifies the given domain with it; a given domain that
does not lint stops the run before any model is loaded, naming the task. Each finished episode is appended to --out as one JSON line
(id, success, planner_calls, final domain/problem/plan, and every step's text, spec, verdict, Judge
score, token counts and times), with the answer's support verdict: "support" is supported,
unsupported or trivial and "support_reasons" says why (an empty plan or a goal that already holds,
broken mutex invariants, objects the English never mentions, names of objects in the domain's
vocabulary; nothing read from a reference). A summary (solved, supported apart from solved, calls per
task, categories) goes to stdout. --abstain answers no spec where the verdict is not supported.

A task without a domain is matched against the domain library (PlanBench's BlocksWorld, Mystery
BlocksWorld, Logistics and Depots, the generators' Gripper, and --domains): when one domain fits its
English it runs domain-given with that domain, where the small model is faithful far more often; when
none fits, or two fit about equally, the model writes the domain. Each trace says which
("domain_source": given, library:NAME or written) and why ("domain_reason"). --library off turns it off.

--select invariants spends the budget on Actor samples instead of Editor repairs: the greedy spec
first, and while the answer is unsolved or its initial state breaks one of the domain's mutex
invariants (the given domain, or the spec's own in the full mode), one more sample at temperature
0.7 (seeded --seed + round), one planner call each; the answer is the best candidate (solved with a
plan, fewest broken invariants, agreement among the solved ones, earliest). Each trace line then
carries "selection": the candidates, their verdicts and broken counts, the chosen index and why.
--select supported does the same with the whole support verdict: a candidate ends the search only when
it is supported (no broken invariant, every object named by the English and, for a statement omtr
reads, every clause stated by the atom of its own predicate and no atom more).
A scripted answers line may hold "samples": [...], the answers a sampled Actor gives in turn.
"""


def register(sub) -> None:
    p = add_command(
        sub, "infer",
        help="turn NL tasks into solver-checked PDDL with the Actor -> planner -> Editor loop",
        description=(
            "Run the episode loop greedily: the Actor writes a spec per task, the planner checks "
            "it, and the Editor repairs failed specs from the planner's diagnostic until one "
            "succeeds or the budget of planner calls is spent."
        ),
        examples=EXAMPLES,
    )
    p.add_argument("--model", required=True, metavar="DIR|PROFILE",
                   help="model directory, profile (small, micro, paper) or scripted:ANSWERS.jsonl")
    p.add_argument("--tasks", required=True, metavar="FILE.jsonl", help="task records ({id, nl} per line)")
    p.add_argument("--out", required=True, metavar="TRACES.jsonl", help="where episode traces go")
    p.add_argument("--budget", type=int, default=None, metavar="K",
                   help="planner calls per task: the Actor's spec plus K-1 repairs (default 6)")
    p.add_argument("--batch-size", type=int, default=8, metavar="N",
                   help="episodes generated together (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="a fixed token limit per answer (default: 768, raised where the task's statement needs "
                        "more; see --fit-statement)")
    p.add_argument("--fit-statement", action="store_true",
                   help="with --max-new-tokens: still raise the limit where the task's statement needs more")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N tasks")
    p.add_argument("--no-judge", action="store_true", help="skip the Judge's scores")
    p.add_argument("--select", choices=SELECT_CHOICES, default="greedy",
                   help="greedy: the Actor's spec, then Editor repairs (default); invariants: Actor samples within "
                        "the budget, the answer the one solved with no broken mutex invariant; supported: the same, "
                        "the answer the one whose support verdict is supported (clauses grounded, objects named)")
    p.add_argument("--abstain", action="store_true",
                   help="answer no spec rather than one whose support verdict is unsupported or trivial (the trace "
                        "keeps the steps and says abstained)")
    p.add_argument("--library", choices=("auto", "on", "off"), default="auto",
                   help="match a task without a domain against the domain library and run it domain-given when one "
                        "fits (on); off: the model writes every domain; auto (default): on, except for scripted: replays")
    p.add_argument("--domains", metavar="DIR|URI", default=None,
                   help="more library domains: a folder of NAME.pddl files, each with NAME.txt (a short English "
                        "description) beside it, or an MLflow artifact URI of such a folder (runs:/..., models:/...)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="sampling seed under --select invariants (round r samples with N + r; default 0)")
    p.add_argument("--decoding", choices=("scoped", "plain", "off"), default=None,
                   help="decoding constraint: scoped (the grammar plus scope rules), plain (the grammar alone) "
                        "or off (free text); default: the model's (scoped)")
    p.add_argument("--device", default=None, help="torch device for the model (default: the profile's)")
    p.add_argument("--engine", default="auto", metavar="NAME",
                   help="rollout engine of a role model: auto (the default: fast where the model runs on a CPU, "
                        "hf elsewhere), fast (CPU: merged adapters, int8 linears; several times the tokens/s, "
                        "near-identical outcomes) or hf (the reference, exact)")
    p.add_argument("--prefix-cache", choices=("on", "off"), default="on",
                   help="the fast engine's prefix cache across prompts (default on; off: every prompt computes "
                        "all its tokens, the same results)")
    p.add_argument("--prefix-cache-mb", type=float, default=None, metavar="MB",
                   help="the prefix cache's bound in MiB (least recently used blocks go first; default 1024)")
    p.add_argument("--workers", type=int, default=1, help="solver worker processes (default 1)")
    p.add_argument("--time-limit", type=float, metavar="S", help="planner CPU limit in seconds (default 60)")
    p.add_argument("--resume", action="store_true", help="keep --out and skip task ids already in it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.set_defaults(handler=run)


def _check_args(args) -> None:
    if args.budget is not None and args.budget < 1:
        raise CliError(f"--budget must be at least 1 (the Actor's spec), got {args.budget}")
    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    if args.workers < 1:
        raise CliError("--workers must be at least 1")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CliError("--max-new-tokens must be at least 1")
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be >= 0")
    if args.prefix_cache_mb is not None and args.prefix_cache_mb < 0:
        raise CliError(f"--prefix-cache-mb must be 0 or more, got {args.prefix_cache_mb}")
    if os.path.exists(args.out) and not (args.resume or args.overwrite):
        raise CliError(f"{args.out} exists; pass --resume to continue it or --overwrite to replace it")


def run(args) -> int:
    _check_args(args)
    from omtr.config import ConfigError, EpisodeConfig, SolverConfig
    from omtr.inference.episode import summarize
    from omtr.inference.loading import load_policy
    from omtr.inference.scripted import PolicyLoadError
    from omtr.inference.select import run_with_select, selection_summary
    from omtr.policy import Sampling
    from omtr.progress import Progress
    from omtr.solver import SolverPool
    from omtr.tasks.training import TaskFormatError, load_training_tasks

    try:
        tasks = load_training_tasks(args.tasks)
    except TaskFormatError as exc:
        raise CliError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--tasks {args.tasks}: cannot read ({exc})") from None
    chosen = tasks[: args.limit] if args.limit is not None else tasks
    chosen = _with_library(chosen, args)
    done = finished_ids(args.out) if args.resume and os.path.exists(args.out) else set()
    todo = [t for t in chosen if t.id not in done]
    try:
        solver_cfg = SolverConfig().replace(time_limit_s=args.time_limit)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    options = {"device": args.device} if args.device else {}
    if args.decoding:
        options["decoding"] = args.decoding
    if args.engine:
        options["engine"] = args.engine
    try:
        policy = load_policy(args.model, tasks=tasks, **options)
    except PolicyLoadError as exc:
        raise CliError(str(exc)) from None
    from omtr.rollout import prompt_group, set_prefix_cache

    set_prefix_cache(policy, args.prefix_cache == "on", args.prefix_cache_mb)
    from omtr.rollout import engine_info

    eng = engine_info(policy)
    if eng["engine"] != "none":
        logging.getLogger("omtr.infer").info(
            "engine: %s%s", eng["engine"], "" if eng["engine"] != "fast" else
            f" (int8 {'on' if eng['int8'] else 'off'}, wide passes {eng['prefill_wide']}, "
            f"jump-forward {'on' if eng['jump_forward'] else 'off'}, "
            f"prefix cache {'on' if eng['prefix_cache'] else 'off'})")
    # a family's tasks side by side, so that their prompts meet in the prefix cache (the traces keep
    # finishing order; each line carries its task id)
    todo = sorted(todo, key=prompt_group)
    seed = {"seed": args.seed} if args.select != "greedy" else {}  # greedy: exactly the loop's decoding
    sampling = Sampling(greedy=True, **seed)
    if args.max_new_tokens:  # the user's limit holds unless they ask for the statement's sizing too
        sampling = Sampling(greedy=True, max_new_tokens=args.max_new_tokens, fit_statement=args.fit_statement, **seed)

    bar = Progress(len(todo), "episodes", quiet=args.quiet, batch=args.batch_size)
    mode = "a" if args.resume else "w"
    with open(args.out, mode, encoding="utf-8") as out, SolverPool(args.workers, solver_cfg) as pool:
        def write(ep) -> None:  # appended as each episode ends: a killed run keeps what finished
            out.write(json.dumps(ep.to_json(), ensure_ascii=False) + "\n")
            out.flush()
            bar.update()

        try:
            episodes = run_with_select(args.select, todo, policy, pool, config=EpisodeConfig(), budget=args.budget,
                                       sampling=sampling, batch_size=args.batch_size, judge=not args.no_judge,
                                       on_episode=write, abstain=args.abstain)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
    bar.close()
    summary = summarize(episodes)
    summary["skipped_as_done"] = len(done & {t.id for t in chosen})
    summary["selection"] = selection_summary([ep.to_json() for ep in episodes])
    _print_summary(summary, args.out)
    return 0


def _with_library(tasks, args):
    """The tasks with their domains' sources: matched against the library (shipped domains and
    ``--domains``) unless it is off."""
    from omtr.tasks.library import attach, load_folder, shipped_library
    from omtr.tasks.training import TaskFormatError

    on = args.library == "on" or (args.library == "auto" and not args.model.startswith("scripted:"))
    if not on:
        if args.domains:
            raise CliError("--domains adds to the domain library; it needs --library on (or auto with a model)")
        return attach(tasks, None)
    lib = shipped_library()
    if args.domains:
        folder = args.domains
        if "://" in folder or folder.startswith(("runs:/", "models:/")):
            import mlflow

            folder = mlflow.artifacts.download_artifacts(folder)
        try:
            lib = lib.with_domains(load_folder(folder))
        except TaskFormatError as exc:
            raise CliError(f"--domains: {exc}") from None
    return attach(tasks, lib)


def _print_summary(s: dict, out: str) -> None:
    n = s["tasks"]
    pct = f"{100 * s['solve_rate']:.1f}%" if n else "-"
    sel = s.get("selection")
    later = "by a later sample" if sel else "after repair"
    print(f"tasks: {n}  solved: {s['solved']} ({pct})  by the Actor: {s['actor_solved']}  "
          f"{later}: {s['repaired']}")
    # a planner success is not an answer by itself: the support verdict says which are backed by the English
    print(f"supported: {s['supported']} of {s['solved']} solved  (trivial {s['solved_trivial']}, unsupported "
          f"{s['solved_unsupported']})" + (f"  abstained: {s['abstained']}" if s.get("abstained") else ""))
    if sel:
        print(f"selection ({sel['mode']}): {sel['candidates_per_task']} candidates per task; greedy spec kept "
              f"{sel['greedy_kept']}; solved and unbroken {sel['accepted']}; chosen solved but broken "
              f"{sel['chosen_solved_broken']}")
    if s.get("modes"):
        print("mode: " + ", ".join(f"{k} {v}" for k, v in s["modes"].items()))
    if s.get("domain_sources"):
        print("domain: " + ", ".join(f"{k} {v}" for k, v in s["domain_sources"].items()))
    print(f"planner calls: {s['planner_calls']}  per task: {s['calls_per_task']}  "
          f"per solved task: {s['calls_per_solved_task'] if s['calls_per_solved_task'] is not None else '-'}")
    for key, label in (("first_categories", "Actor's specs"), ("final_categories", "final specs")):
        cats = ", ".join(f"{k} {v}" for k, v in s[key].items()) or "-"
        print(f"{label}: {cats}")
    if s["skipped_as_done"]:
        print(f"skipped (already in {out}): {s['skipped_as_done']}")
    print(f"traces: {out}")
    sys.stdout.flush()
