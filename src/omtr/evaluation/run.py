"""One evaluation: a policy on a task file under a planner-call budget, written to a folder.

    out/
      run.json           what the run was started with (policy, budget, solver config, tool versions, ...)
      traces.jsonl       one line per task as it finishes (episodes: every step's text, spec, verdict,
                         Judge score, times, plus the faithfulness report; transfer: answer, correct)
      episodes.parquet   the episode log (omtr.validation), checked with its expectation suite
      metrics.json       top-level success / faithful / drift (fractions) and calls, then blocks
      figures/*.png      CSR curve, diagnostic heatmap, solvability vs faithful bars, Judge violins
      report.html        the tables and figures in one self-contained file

Tasks with a given domain (the domain-given mode) run through the same loop, each policy writing
only the problem; the checker then compares (given domain, problem) with the reference, so with
the reference's domain given it compares the problems. Planning tasks go through the episode loop (``omtr.inference.episode.run_episodes``) — harness
policies too, so the oracle proves the whole path: extraction, planner, VAL, checker. A finished
episode's final spec is checked against the task's reference right away (on the loop's thread,
while the solver workers plan the next batch) and its line is appended and flushed, so a killed
run keeps what finished and ``resume=True`` skips those tasks. Transfer tasks (ProntoQA, NATURAL
PLAN) are answered in text and scored with the task suite's scorers.

The Judge scores every spec an episode writes (the loop asks it about the Actor's; the Editor's are
scored here as the episode ends), so its AUC can pool all candidates as the paper does. A harness
policy that carries its own scores (``file:`` with ``"score"`` per attempt) gives them instead.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from omtr.config import EpisodeConfig
from omtr.evaluation.traces import EPISODE_LOG, METRICS, TRACES, finished, read_records

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    budget: int = field(default_factory=lambda: EpisodeConfig().planner_call_budget,
                        metadata={"help": "K: planner calls per task (the Actor's spec plus K-1 repairs)"})
    batch_size: int = field(default=64, metadata={"help": "episodes generated (and sent to the planner) together"})
    max_new_tokens: int | None = field(default=None, metadata={"help": "token limit per answer"})
    fit_statement: bool = field(default=True, metadata={
        "help": "raise the limit where the task's statement needs a longer answer (omtr.model.grammar.answer_tokens)"})
    bootstrap: int = field(default=1000, metadata={"help": "bootstrap resamples for confidence intervals (0: none)"})
    seed: int = field(default=0, metadata={"help": "bootstrap and sampling seed"})
    validate_log: bool = field(default=True, metadata={"help": "write episodes.parquet and run its expectation suite"})
    figures: bool = field(default=True, metadata={"help": "write PNG figures and report.html"})
    full_check: bool = field(default=False, metadata={
        "help": "run the checker's mapping search even on specs identical to the reference"})
    judge_all_steps: bool = field(default=True, metadata={
        "help": "score the Editor's specs with the Judge too (the paper's pooled AUC), not only the Actor's"})
    select: str = field(default="greedy", metadata={
        "help": "greedy (the Actor, then Editor repairs) or invariants (Actor samples within the budget, the one "
                "breaking no mutex invariant chosen; omtr.inference.select)"})

    def __post_init__(self) -> None:
        from omtr.config import ConfigError
        from omtr.inference.select import check_select

        try:
            check_select(self.select)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if self.budget < 1:
            raise ValueError(f"the budget must be at least 1 planner call (the Actor's spec), got {self.budget}")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


def transfer_benchmarks() -> dict:
    """family -> the transfer benchmark (with its scorer)."""
    from omtr.tasks.transfer import BENCHMARKS

    return {b.family: b for b in BENCHMARKS.values()}


def is_transfer(task) -> bool:
    return (task.family or "") in transfer_benchmarks() and task.reference is None


def benchmark_set(task) -> str:
    """The set a task is reported under: its PlanBench configuration, else its family."""
    source = str((getattr(task, "meta", None) or {}).get("source") or "")
    if source.startswith("planbench/"):
        return "planbench/" + source.split("/")[1]
    return task.family or "none"


def score_steps(policy, episode) -> None:
    """Judge scores for the steps the loop did not score (the Editor's), in one call per episode."""
    given = getattr(policy, "step_scores", None)
    if callable(given):
        scores = given(str(episode.task.id), len(episode.steps))
        for s, v in zip(episode.steps, scores):
            if v is not None:
                s.judge_score = float(v)
        return
    if not getattr(policy, "uses_judge", True):
        return
    from omtr.inference import prompts as P

    todo = [s for s in episode.steps if s.judge_score is None]
    if not todo:
        return
    checks = P.judge_checks_on(policy)
    given = episode.mode == "domain-given"
    scores = policy.judge([P.judge_messages(episode.task, P.spec_text(s.domain, s.problem, s.text, given=given),
                                            checks=checks, domain=s.domain, problem=s.problem) for s in todo])
    for s, v in zip(todo, scores):
        s.judge_score = float(v)


def same_spec(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Equal after normalising layout, comments and case (as the solver's cache keys specs)."""
    from omtr.solver.cache import normalise

    return all(normalise(x) == normalise(y) for x, y in zip(a, b))


def faithfulness(task, ep_json: dict, *, full_check: bool = False) -> dict[str, Any]:
    """The checker's verdict on a solved final spec (evaluation only). A spec equal to the reference
    up to layout, comments and case is faithful without a mapping search unless ``full_check``."""
    if task.reference is None:
        return {"reference": False, "checked": False}
    if not ep_json.get("success"):
        return {"reference": True, "checked": False}
    if not full_check and same_spec((task.reference.domain, task.reference.problem),
                                    (ep_json["domain"], ep_json["problem"])):
        # The reference itself (up to layout, comments and case): faithful by definition, and VAL has
        # already accepted the plan on this very spec. No mapping to search for.
        return {"reference": True, "checked": True, "faithful": True, "categories": [], "findings": [],
                "identical": True, "ms": 0.0}
    from omtr.faithfulness import check

    rep = check((task.reference.domain, task.reference.problem), (ep_json["domain"], ep_json["problem"]),
                ep_json.get("plan") or None)
    return {"reference": True, "checked": True, "faithful": rep.faithful, "categories": rep.categories,
            "findings": [f.to_dict() for f in rep.findings][:10], "ms": round(rep.elapsed_ms, 3)}


def text_answers(policy, tasks: Sequence, sampling) -> dict[str, str]:
    """Transfer tasks answered in text: a harness's stored answer, a baseline's own method, else one
    greedy generation of the role model."""
    if hasattr(policy, "answer"):
        return {t.id: policy.answer(t) for t in tasks}
    if hasattr(policy, "answer_texts"):  # a baseline: its own method on a free-text task
        return dict(zip([t.id for t in tasks], policy.answer_texts([t.nl for t in tasks], sampling)))
    msgs = [[{"role": "user", "content": t.nl}] for t in tasks]
    backend = getattr(policy, "backend", None)
    if backend is not None:  # a baseline: ask its LLM directly
        gens = backend.chat(msgs, sampling)
    elif "grammar" in inspect.signature(policy.generate).parameters:  # the role model: free text, no PDDL grammar
        gens = policy.generate("actor", msgs, sampling, grammar=False)
    else:
        gens = policy.generate("actor", msgs, sampling)
    return {t.id: g.text for t, g in zip(tasks, gens)}


def evaluate(tasks: Sequence, policy, out_dir: str | os.PathLike, *, env, config: EvalConfig | None = None,
             policy_name: str = "", resume: bool = False, progress: Callable[[int], None] | None = None,
             on_record: Callable[[dict], None] | None = None, solver_config=None,
             run_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``policy`` on ``tasks`` with environment ``env`` (anything with ``solve_many``); returns metrics.

    ``solver_config`` (default: ``env.config``) and ``run_info`` (``backend``, ``model``,
    ``tasks_file``) go into the provenance; a resumed run under another policy, budget or solver
    config raises :class:`~omtr.evaluation.provenance.RunMismatch` before anything is written."""
    from omtr.evaluation import provenance as prov
    from omtr.inference.select import run_with_select
    from omtr.policy import Sampling

    cfg = config or EvalConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    traces = out / TRACES
    done = finished(traces) if resume else {}
    name = policy_name or getattr(policy, "name", "policy")
    excluded = dict(getattr(policy, "excluded", {}) or {})
    tasks = [t for t in tasks if str(t.id) not in excluded]
    solver = prov.solver_settings(solver_config if solver_config is not None else getattr(env, "config", None))
    key = prov.run_key(policy=name, budget=cfg.budget, solver=solver)
    if cfg.select != "greedy":  # a greedy run's key stays what it always was
        key["select"] = cfg.select
    if cfg.select != "greedy" and (getattr(policy, "routes_by_id", False) or getattr(policy, "writes_plans", False)):
        raise ValueError(f"select={cfg.select} samples the policy's Actor; {name} replays fixed answers or writes "
                         "plans, so there is nothing to sample: use select=greedy")
    if resume and done:
        prov.check_resume(out, key, done)
    if not resume and traces.exists():
        traces.unlink()
    info = dict(run_info or {})
    from omtr.rollout import engine_info

    provenance = {
        "policy": name, "backend": info.get("backend"), "policy_options": info.get("options"),
        "model": prov.model_info(info.get("model")),
        "engine": engine_info(policy), "budget": cfg.budget, "solver": solver, "tools": prov.tool_versions(), "omtr": prov.omtr_version(),
        "tasks": {"file": str(info["tasks_file"]) if info.get("tasks_file") else None,
                  "sha256": prov.sha256_file(info["tasks_file"]) if info.get("tasks_file") else None,
                  "count": len(tasks), "task_set": prov.task_set_hash(tasks)},
        "eval": {"seed": cfg.seed, "bootstrap": cfg.bootstrap, "max_new_tokens": cfg.max_new_tokens,
                 "fit_statement": cfg.fit_statement, "greedy": cfg.select == "greedy", "select": cfg.select, "judge_all_steps": cfg.judge_all_steps,
                 "full_check": cfg.full_check},
    }
    prov.write_run_file(out, key, provenance)
    by_id = {str(t.id): t for t in tasks}
    todo = [t for t in tasks if str(t.id) not in done]
    timing: dict[str, float] = {"faithfulness_s": 0.0}
    sampling = Sampling(greedy=True, seed=cfg.seed, fit_statement=cfg.fit_statement,
                        **({"max_new_tokens": cfg.max_new_tokens} if cfg.max_new_tokens else {}))
    t0 = time.perf_counter()

    with open(traces, "a", encoding="utf-8") as fh:
        def write(rec: dict) -> None:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            if on_record:
                on_record(rec)
            if progress:
                progress(1)

        def finish_episode(ep) -> None:
            if cfg.judge_all_steps:
                tj = time.perf_counter()
                score_steps(policy, ep)
                timing["judge_steps_s"] = timing.get("judge_steps_s", 0.0) + time.perf_counter() - tj
            rec = ep.to_json()
            task = by_id[str(rec["id"])]
            rec["set"] = benchmark_set(task)
            tf = time.perf_counter()
            rec["faithful"] = faithfulness(task, rec, full_check=cfg.full_check)
            timing["faithfulness_s"] += time.perf_counter() - tf
            rec["kind"], rec["policy"] = "planning", name
            if getattr(policy, "notes", None) and rec["id"] in policy.notes:
                rec["note"] = policy.notes[rec["id"]]
            write(rec)

        # a family's tasks side by side (family, given domain, description), so that their prompts
        # meet in the rollout engine's prefix cache batch after batch; records carry their ids
        from omtr.rollout import prompt_group

        planning = sorted((t for t in todo if not is_transfer(t)), key=prompt_group)
        transfer = [t for t in todo if is_transfer(t)]
        # harness policies may have fewer attempts than K for a task: one loop call per budget
        groups: dict[int, list] = {}
        for t in planning:
            k = policy.budget_for(str(t.id), cfg.budget) if hasattr(policy, "budget_for") else cfg.budget
            groups.setdefault(k, []).append(t)
        tl = time.perf_counter()
        if getattr(policy, "writes_plans", False):  # PlanBench's protocol: plans checked by VAL, no episode loop
            from omtr.evaluation.plans import score_plans

            env_cfg = solver_config if solver_config is not None else getattr(env, "config", None)
            for rec in score_plans(policy, planning, sampling, batch_size=cfg.batch_size, solver_config=env_cfg):
                rec["set"], rec["policy"] = benchmark_set(by_id[str(rec["id"])]), name
                write(rec)
            groups = {}
        for k, group in sorted(groups.items()):
            run_with_select(cfg.select, group, policy, env, budget=k, sampling=sampling, batch_size=cfg.batch_size,
                            judge=getattr(policy, "uses_judge", True), on_episode=finish_episode)
        timing["loop_s"] = time.perf_counter() - tl
        if transfer:
            benches = transfer_benchmarks()
            tt = time.perf_counter()
            answers = text_answers(policy, transfer, sampling)
            for t in transfer:
                ans = answers.get(t.id)
                ok = bool(ans) and benches[t.family].score(t, ans)
                write({"id": t.id, "family": t.family, "set": benchmark_set(t), "kind": "transfer", "policy": name, "answer": ans,
                       "answered": bool(ans), "correct": ok})
            timing["transfer_s"] = time.perf_counter() - tt
    timing["run_s"] = time.perf_counter() - t0
    metrics = finish(out, [str(t.id) for t in tasks], cfg, policy_name=name, timing=timing, resumed=len(done),
                     excluded=excluded, provenance=provenance, policy_report=getattr(policy, "report", None))
    return metrics


def finish(out: Path, ids: Sequence[str] | None, cfg: EvalConfig, *, policy_name: str, timing: dict | None = None,
           resumed: int = 0, excluded: dict[str, str] | None = None, provenance: dict[str, Any] | None = None,
           policy_report: dict[str, Any] | None = None) -> dict[str, Any]:
    """metrics.json, the validated episode log, figures and report.html from the trace file."""
    from omtr.evaluation.metrics import compute_metrics

    timing = dict(timing or {})
    t = time.perf_counter()
    records = read_records(out, ids)
    metrics = compute_metrics(records, bootstrap=cfg.bootstrap, seed=cfg.seed, budget=cfg.budget, policy=policy_name)
    timing["metrics_s"] = time.perf_counter() - t
    metrics["resumed"] = resumed
    modes: dict[str, int] = {}
    for r in records:
        if r.get("kind", "planning") == "planning":
            modes[r.get("mode") or "full"] = modes.get(r.get("mode") or "full", 0) + 1
    metrics["modes"] = dict(sorted(modes.items()))  # full | domain-given: who wrote the domain
    metrics["excluded"] = {"count": len(excluded or {}), "ids": sorted(excluded or {})[:50]}
    from omtr.inference.select import selection_summary

    selection = selection_summary(records)
    if selection is not None:  # --select invariants: which candidate each episode answered with, and why
        metrics["selection"] = selection
    if provenance is None and (out / "run.json").is_file():
        provenance = json.loads((out / "run.json").read_text(encoding="utf-8")).get("provenance")
    metrics["provenance"] = provenance
    if policy_report:
        metrics["policy_file"] = policy_report
    timing.update(solver_stages(records))
    if cfg.validate_log:
        t = time.perf_counter()
        metrics["episode_log"] = _episode_log(out, records, cfg)
        timing["episode_log_s"] = time.perf_counter() - t
    if cfg.figures:
        from omtr.evaluation import report

        t = time.perf_counter()
        metrics["figures"] = report.figures(metrics, out / "figures", records)
        timing["figures_s"] = time.perf_counter() - t
    metrics["timing"] = {k: round(v, 3) for k, v in timing.items()}
    (out / METRICS).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    if cfg.figures:
        from omtr.evaluation import report

        report.write_report(metrics, out)
    return metrics


def solver_stages(records: Sequence[dict]) -> dict[str, float]:
    """Worker time per solver stage over every verified spec (seconds; workers run in parallel)."""
    out: dict[str, float] = {}
    for r in records:
        for step in r.get("steps") or []:
            for k, v in ((step.get("verdict") or {}).get("timings") or {}).items():
                key = "solver_" + k.replace("_ms", "_s")
                out[key] = out.get(key, 0.0) + float(v) / 1000
    return out


def _episode_log(out: Path, records: list[dict], cfg: EvalConfig) -> dict[str, Any]:
    planning = [r for r in records if r.get("kind", "planning") == "planning"]
    if not planning:
        return {"rows": 0, "valid": None}
    try:
        from omtr.validation import rows_from_traces, validate_episode_log, write_episode_log
    except ImportError as exc:  # the validation extra is not installed
        return {"rows": 0, "valid": None, "skipped": f"episode log not written ({exc})"}
    rows = rows_from_traces(planning, run=out.name, cycle=0)
    path = write_episode_log(rows, out / EPISODE_LOG)
    result = validate_episode_log(path, max_step=max(cfg.budget - 1, 0))
    info = {"rows": len(rows), "valid": result.success, "checks": result.checks, "seconds": round(result.seconds, 3)}
    if not result.success:
        info["failures"] = [str(f) for f in result.failures][:10]
        log.warning("episode log %s failed validation: %s", path, info["failures"])
    return info
