"""Where the whole ``omtr evaluate`` command's time goes, the prefix cache off and on.

    python benchmarks/evaluate_profile.py --out docs/results/evaluate-profile-DATE.json
    python benchmarks/evaluate_profile.py --count 2 --settings on --work /tmp/ep   # a smoke run
    python benchmarks/evaluate_profile.py --tasks my-tasks.jsonl --settings off,on
    python benchmarks/evaluate_profile.py --settings on+bf16,on+fp32    # the engine's wide format too
    python benchmarks/evaluate_profile.py --settings on+nojf,on+jf      # jump-forward decoding off, on
    python benchmarks/evaluate_profile.py --method cprofile --count 4              # cProfile instead of timers
    python benchmarks/evaluate_profile.py --show /tmp/ep/result.json               # the table of a finished run

The sample: ``--count`` PlanBench tasks (default 18), the domain given, spread over the four
shipped families as evenly as they go (blocksworld, mystery_blocksworld, logistics, depots: 5, 5,
4, 4 for 18), each family's tasks the first of ``benchmarks/statement_rules.py``'s seeded draw
(``build_tasks``, ``--seed`` 5519, its default); ``--draw first`` takes each family's first tasks
instead, as ``benchmarks/prefix_cache.py --per-family`` does; ``--tasks FILE`` takes a task file
as it is. The command, as in ``benchmarks/prefix_cache.py``'s runs: ``omtr --quiet evaluate
--policy model --model small --engine fast --budget 1 --prefix-cache on|off --bootstrap 200
--workers 2``.

Each setting runs in a fresh process of its own, one after another. The whole command's wall
clock is taken from the spawn of that process to its exit; in the same process the command's
main thread is split into phases (the table ``PHASES``): each phase is one or a few named
functions, timed by a wrapper around them, and a moment belongs to the innermost phase running
(exclusive time), so the phases, the interpreter's start (``startup``), the imports, what no
phase covers (``other``) and the interpreter's exit add up to the whole command. Threads other
than the main one (the planner's dispatch threads and worker processes, the grammar helper) are
not charged: what the command waits for them is (``planner`` is the main thread waiting on Fast
Downward's results). ``--method cprofile`` runs the command under cProfile instead (slower: the
decode loop is Python per token) and attributes the same table from the profile's cumulative
times, with the top functions by cumulative time; the ``.prof`` file stays in ``--work``.

Beside the phases, the command's own instrumentation (metrics.json's timing and prefix-cache
report, the traces' per-batch prefill/decode/Judge times) is read as a cross-check, and whether
the two settings gave identical greedy outcomes. A setting is the prefix cache (``on``/``off``),
optionally with the fast engine's format for the many-token passes of its int8 down projection
(``on+bf16``, ``on+fp32``: ``OMTR_PREFILL_WIDE`` in the command's environment; without it the
engine's ``auto``) and its jump-forward decoding (``on+nojf``, ``on+jf``: ``OMTR_JUMP_FORWARD``;
without it the engine's default, on). With two settings, ``speedup`` is the first one's time over the second's, and
their greedy outcomes are compared. A table to stdout; one JSON object to ``--out``.
Measure alone on the machine: two processes' threads on two cores halve each other.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("evaluate_profile")

FAMILIES = ("blocksworld", "mystery_blocksworld", "logistics", "depots")
SPAWN_ENV = "OMTR_PROFILE_SPAWN"  # the parent's time.time() at the child's spawn

# ----------------------------------------------------------------------------- the phase table
#
# phase, function ("module:qualname"), via, within
#   via: the row counts only when the function's direct caller is this function (else the call
#        stays in whatever phase is running: the Judge's own prefill is the Judge's);
#   within: for --method cprofile only, the phase this row's time is carved out of (the nesting
#        the timers see as it happens; a profile has only direct caller edges).
PHASES: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("load_model", "omtr.inference.registry:make_policy", None, None),  # backbone, tokenizer, grammar
    ("engine_build", "omtr.rollout:make_engine", None, "load_model"),  # merge + int8 quantize
    ("solver_pool", "omtr.solver.pool:SolverPool.__init__", None, None),  # start the planner workers
    ("solver_pool", "omtr.solver.pool:SolverPool.close", None, None),
    ("statement", "omtr.inference.episode:read_statement", None, None),  # reading the English
    ("statement", "omtr.inference.episode:statement_objects", None, None),
    ("decode", "omtr.rollout.fast:FastEngine.generate", None, None),  # tokenize, limits, decode loop
    ("prefill", "omtr.rollout.fast:FastEngine._prefill", "omtr.rollout.fast:FastEngine._generate", "decode"),
    ("judge", "omtr.rollout.fast:FastEngine.judge", None, None),  # the Judge's prompts' prefill + head
    ("extract", "omtr.inference.episode:extract_spec", None, None),  # the answer's PDDL read
    ("planner", "omtr.inference.episode:_Runner._harvest", None, None),  # waiting on Fast Downward
    ("checker", "omtr.evaluation.run:faithfulness", None, "planner"),  # the faithfulness check
    ("report", "omtr.evaluation.run:finish", None, None),  # metrics, episode log, figures, report.html
)
# the display order; startup, imports, other and exit are measured around the table's functions
ORDER = ("startup", "imports", "load_model", "engine_build", "solver_pool", "statement", "prefill",
         "decode", "judge", "extract", "planner", "checker", "report", "other", "exit")
LABELS = {
    "startup": "interpreter start",
    "imports": "imports (torch, omtr)",
    "load_model": "model load",
    "engine_build": "fast engine build",
    "solver_pool": "planner pool start/stop",
    "statement": "statement reading",
    "prefill": "Actor prefill",
    "decode": "Actor decode (+tokenize)",
    "judge": "Judge scoring",
    "extract": "answer extraction",
    "planner": "planner wait (FD)",
    "checker": "faithfulness checker",
    "report": "metrics/report",
    "other": "other (loop, traces)",
    "exit": "interpreter exit",
}


# ----------------------------------------------------------------------------- exclusive timing

class Attributor:
    """Exclusive time per phase from enter/leave events: a moment belongs to the innermost phase
    open at it; moments with no phase open belong to ``root``. Pure (the clock is passed in)."""

    def __init__(self, start: float, root: str = "other"):
        self.root = root
        self.stack: list[tuple[str, float]] = []  # (phase, when it, or its last child, resumed it)
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._since = start

    def _charge(self, now: float) -> None:
        phase = self.stack[-1][0] if self.stack else self.root
        self.seconds[phase] = self.seconds.get(phase, 0.0) + (now - self._since)
        self._since = now

    def enter(self, phase: str, now: float) -> None:
        self._charge(now)
        self.stack.append((phase, now))
        self.calls[phase] = self.calls.get(phase, 0) + 1

    def leave(self, now: float) -> None:
        self._charge(now)
        self.stack.pop()

    def close(self, now: float) -> dict[str, float]:
        """Charge up to ``now`` and return the seconds (the open phases keep theirs)."""
        self._charge(now)
        return dict(self.seconds)


def resolve(target: str):
    """(owner object, attribute name, function) for ``module:qualname``."""
    mod_name, _, qual = target.partition(":")
    owner = importlib.import_module(mod_name)
    parts = qual.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return owner, parts[-1], getattr(owner, parts[-1])


def _code(fn):
    return inspect.unwrap(fn).__code__


def install_timers(att: Attributor, clock=time.perf_counter, table=PHASES) -> list:
    """Wrap the table's functions so that their calls on the main thread enter and leave their
    phase; returns the patches (owner, name, original) to undo them."""
    main = threading.main_thread().ident
    patches = []
    for phase, target, via, _ in table:
        owner, name, fn = resolve(target)
        via_code = _code(resolve(via)[2]) if via else None
        original = inspect.getattr_static(owner, name)
        static = isinstance(original, staticmethod)

        def wrapper(*a, __fn=fn, __phase=phase, __via=via_code, **k):
            if threading.get_ident() != main or (__via is not None and sys._getframe(1).f_code is not __via):
                return __fn(*a, **k)
            att.enter(__phase, clock())
            try:
                return __fn(*a, **k)
            finally:
                att.leave(clock())

        wrapper.__wrapped__ = fn
        wrapper.__name__ = getattr(fn, "__name__", name)
        setattr(owner, name, staticmethod(wrapper) if static else wrapper)
        patches.append((owner, name, original))
    return patches


def remove_timers(patches: list) -> None:
    for owner, name, original in reversed(patches):
        setattr(owner, name, original)


def profile_phases(stats: dict, keys: dict[str, tuple], table=PHASES) -> dict[str, dict]:
    """Phase seconds from a cProfile profile (``pstats.Stats(...).stats``: key -> (cc, nc, tt, ct,
    callers)); ``keys``: each table function's (and via function's) target -> its profile key.
    A row's inclusive time is its function's cumulative time (with ``via``: the cumulative time of
    the calls from that caller only); a phase's exclusive time is its rows' inclusive time less
    that of the rows ``within`` it. A function called recursively counts once (cProfile's ct)."""
    inclusive: dict[str, float] = {}
    for phase, target, via, _ in table:
        st = stats.get(keys.get(target))
        if st is None:
            t = 0.0
        elif via:
            edge = st[4].get(keys.get(via))
            t = edge[3] if edge else 0.0
        else:
            t = st[3]
        inclusive[phase] = inclusive.get(phase, 0.0) + t
    exclusive = dict(inclusive)
    carved: dict[str, float] = {}
    seen = set()
    for phase, _, _, within in table:
        if within and phase not in seen:
            seen.add(phase)
            carved[within] = carved.get(within, 0.0) + inclusive[phase]
    for p, c in carved.items():
        exclusive[p] = exclusive.get(p, 0.0) - c
    return {p: {"inclusive_s": round(inclusive[p], 3), "exclusive_s": round(exclusive[p], 3)} for p in inclusive}


# ----------------------------------------------------------------------------- the child process

def child(argv: list[str], report: str, method: str, prof: str | None) -> int:
    t_start = time.time()
    spawn = float(os.environ.get(SPAWN_ENV) or t_start)
    clock = time.perf_counter
    c0 = clock()
    att = Attributor(c0)
    att.enter("imports", c0)
    import resource

    from omtr.cli import main

    for _, target, via, _ in PHASES:  # the table's modules (and torch with the engine's)
        resolve(target)
        if via:
            resolve(via)
    att.leave(clock())
    rc = 1
    result: dict = {"method": method}
    try:
        if method == "timers":
            install_timers(att, clock)
            rc = main(argv)
        else:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            try:
                rc = main(argv)
            finally:
                pr.disable()
            if prof:
                pr.dump_stats(prof)
            st = pstats.Stats(pr)
            keys = {}
            for _, target, via, _ in PHASES:
                for t in (target, via):
                    if t:
                        code = _code(resolve(t)[2])
                        keys[t] = (code.co_filename, code.co_firstlineno, code.co_name)
            result["profile_phases"] = profile_phases(st.stats, keys)
            top = sorted(st.stats.items(), key=lambda kv: -kv[1][3])[:40]
            result["profile_top"] = [{"function": f"{Path(k[0]).name}:{k[1]}({k[2]})", "calls": v[1],
                                      "tottime_s": round(v[2], 3), "cumtime_s": round(v[3], 3)} for k, v in top]
    finally:
        c1 = clock()
        seconds = att.close(c1)
        t_end = time.time()
        result.update({
            "rc": rc, "startup_s": round(t_start - spawn, 3), "main_s": round(c1 - c0, 3), "end_time": t_end,
            "phases_s": {k: round(v, 3) for k, v in seconds.items()}, "calls": att.calls,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        })
        Path(report).write_text(json.dumps(result, indent=2) + "\n")
    return rc


# ----------------------------------------------------------------------------- the sample

def allocate(count: int, families=FAMILIES) -> dict[str, int]:
    """``count`` tasks over the families as evenly as they go, the first families first."""
    base, extra = divmod(count, len(families))
    return {f: base + (i < extra) for i, f in enumerate(families)}


def build_sample(path: Path, count: int, seed: int, draw: str) -> list[str]:
    """The task file: ``count`` PlanBench tasks, domain given (module doc); their ids."""
    want = allocate(count)
    if draw == "seeded":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from statement_rules import build_tasks

        build_tasks(path, max(want.values()), 0, seed)
        rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        from omtr.tasks.planbench import import_planbench
        from omtr.tasks.planbench_data import shipped_root

        rows = []
        for fam in FAMILIES:
            rows += [{**t.to_json(), "domain": t.reference.domain}
                     for t in import_planbench(shipped_root(), [fam])[: want[fam]]]
    kept, seen = [], dict.fromkeys(FAMILIES, 0)
    for r in rows:
        fam = r.get("family")
        if seen.get(fam, 0) < want.get(fam, 0):
            seen[fam] += 1
            kept.append(r)
    with path.open("w", encoding="utf-8") as fh:
        for r in kept:
            fh.write(json.dumps(r) + "\n")
    return [r["id"] for r in kept]


# ----------------------------------------------------------------------------- the command's own figures

def read_traces(folder: Path) -> dict[str, dict]:
    out = {}
    path = folder / "traces.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                rec = json.loads(line)
                out[str(rec["id"])] = rec
    return out


def instrumented(metrics: dict, traces: dict[str, dict]) -> dict:
    """What ``omtr evaluate`` measures itself (seconds): metrics.json's timing and prefix-cache
    report, and the traces' per-batch times (a batch's steps carry one generate call's times)."""
    batches: dict[tuple, dict] = {}
    tokens = 0
    finish: dict[str, int] = {}
    for rec in traces.values():
        for s in rec.get("steps") or []:
            t = s.get("times") or {}
            key = (s.get("role"), s.get("index"), t.get("generate_ms"), t.get("prefill_ms"))
            b = batches.setdefault(key, {k: 0.0 for k in ("generate", "prefill", "decode", "judge", "grammar",
                                                          "grammar_wait")})
            b["generate"] = t.get("generate_ms", 0.0) / 1000
            b["prefill"] = t.get("prefill_ms", 0.0) / 1000
            for k in ("decode", "judge", "grammar", "grammar_wait"):
                b[k] = max(b[k], t.get(k + "_ms", 0.0) / 1000)
            tokens += int(s.get("new_tokens") or 0)
            fr = s.get("finish_reason") or "?"
            finish[fr] = finish.get(fr, 0) + 1
    tm = metrics.get("timing") or {}
    pc = metrics.get("prefix_cache") or {}
    total = {k: round(sum(b[k] for b in batches.values()), 3)
             for k in ("generate", "prefill", "decode", "judge", "grammar", "grammar_wait")}
    return {
        "load_policy_s": tm.get("load_policy_s"),
        "start_solver_s": tm.get("start_solver_s"),
        "batches": len(batches),
        "actor_generate_s": total["generate"],
        "actor_prefill_s": total["prefill"],
        "actor_decode_s": total["decode"],
        "judge_s": total["judge"],
        "grammar_s": total["grammar"],  # grammar masks and accepts, the helper thread's included
        "grammar_wait_s": total["grammar_wait"],  # what of it the decode loop waited for
        "new_tokens": tokens,
        "finish_reasons": dict(sorted(finish.items())),
        "planner_worker_s": tm.get("solver_total_s"),  # worker time, beside the main thread
        "checker_s": tm.get("faithfulness_s"),
        "report_s": round(sum(tm.get(k) or 0.0 for k in ("metrics_s", "episode_log_s", "figures_s")), 3),
        "loop_s": tm.get("loop_s"),
        "total_s": tm.get("total_s"),
        "prefill_tokens_computed": pc.get("computed_tokens"),
        "prefill_tokens_cached": pc.get("cached_tokens"),
        "prefill_all_s": pc.get("prefill_s"),  # the Actor's and the Judge's prefill
        "first_token_s": pc.get("first_token_s"),
    }


def outcome_key(rec: dict) -> list:
    return [(s.get("text"), (s.get("verdict") or {}).get("success"), (s.get("verdict") or {}).get("category"),
             s.get("judge_score")) for s in rec.get("steps") or []]


# ----------------------------------------------------------------------------- the breakdown and table

def breakdown(child_report: dict, command_s: float, exit_s: float) -> dict[str, float]:
    """Seconds per phase of ``ORDER`` for one run: the child's exclusive phase times plus its
    start and exit; whatever the parts miss of ``command_s`` (clock skew, the spawn) joins exit."""
    ph = dict(child_report.get("phases_s") or {})
    prof = child_report.get("profile_phases")
    if prof:  # cprofile: the table's exclusive times; the rest of main is other
        main_s = child_report.get("main_s") or 0.0
        ph = {"imports": ph.get("imports", 0.0), **{p: v["exclusive_s"] for p, v in prof.items()}}
        ph["other"] = main_s - sum(ph.values())
    out = {p: 0.0 for p in ORDER}
    out.update({p: float(v) for p, v in ph.items()})
    out["startup"] = float(child_report.get("startup_s") or 0.0)
    out["exit"] = float(exit_s)
    rest = command_s - sum(out.values())
    out["exit"] += rest
    return {p: round(v, 3) for p, v in out.items()}


def table(runs: dict[str, dict]) -> str:
    """Seconds and share per phase, the settings side by side (``runs``: name -> {"command_s",
    "phases": {phase: s}}); the largest share of each setting marked with *."""
    names = list(runs)
    head = f"{'phase':28s}" + "".join(f" | {n + ' s':>10s} {'share':>6s}" for n in names)
    lines = [head, "-" * len(head)]
    largest = {}
    for n in names:
        ph = {p: v for p, v in runs[n]["phases"].items() if p not in ("startup", "exit", "other")}
        largest[n] = max(ph, key=ph.get) if ph else None
    phases = [p for p in ORDER if any(p in runs[n]["phases"] for n in names)]
    phases += sorted({p for n in names for p in runs[n]["phases"]} - set(phases))
    for p in phases:
        row = f"{LABELS.get(p, p):28s}"
        for n in names:
            total = runs[n]["command_s"] or 1.0
            v = runs[n]["phases"].get(p, 0.0)
            mark = "*" if largest[n] == p else " "
            row += f" | {v:10.1f} {100 * v / total:5.1f}%{mark}"
        lines.append(row)
    lines.append("-" * len(head))
    row = f"{'whole command':28s}"
    for n in names:
        row += f" | {runs[n]['command_s']:10.1f} {100.0:5.1f}% "
    lines.append(row)
    return "\n".join(lines)


def largest_shares(phases: dict[str, float], n: int = 3) -> list[tuple[str, float]]:
    ph = {p: v for p, v in phases.items() if p not in ("other", "exit", "startup")}
    return sorted(ph.items(), key=lambda kv: -kv[1])[:n]


# ----------------------------------------------------------------------------- the parent

def parse_setting(name: str) -> tuple[str, str | None, str | None]:
    """A setting's prefix cache (``on``/``off``), the engine's wide format (``bf16``/``fp32``, None:
    the engine's own ``auto``) and its jump-forward decoding (``jf``/``nojf``, None: the engine's
    default, on): ``on``, ``off+fp32``, ``on+nojf``, ``on+fp32+jf``; ValueError naming it otherwise."""
    cache, *opts = name.split("+")
    wide = [o for o in opts if o in ("bf16", "fp32")]
    jump = [o for o in opts if o in ("jf", "nojf")]
    if cache not in ("on", "off") or len(wide) > 1 or len(jump) > 1 or len(wide) + len(jump) != len(opts):
        raise ValueError(f"setting {name!r}: on or off, optionally +bf16 or +fp32, and +jf or +nojf")
    return cache, (wide or [None])[0], (jump or [None])[0]


def run_setting(name: str, tasks: Path, work: Path, args) -> dict:
    cache, wide, jump = parse_setting(name)
    out = work / name
    report = work / f"{name}.child.json"
    prof = work / f"{name}.prof" if args.method == "cprofile" else None
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--child-report", str(report),
           "--method", args.method, *(["--child-prof", str(prof)] if prof else []), "--",
           "--quiet", "evaluate", "--policy", "model", "--model", args.model, "--engine", "fast",
           "--tasks", str(tasks), "--out", str(out), "--overwrite", "--budget", str(args.budget),
           "--prefix-cache", cache, "--bootstrap", "200", "--workers", "2", *args.extra]
    log.info("[%s] %s", name, " ".join(cmd[cmd.index("--") + 1:]))
    logf = work / f"{name}.log"
    env = dict(os.environ)
    if wide:
        env["OMTR_PREFILL_WIDE"] = wide
    if jump:
        env["OMTR_JUMP_FORWARD"] = "on" if jump == "jf" else "off"
    with logf.open("w") as fh:
        t0 = time.perf_counter()
        env[SPAWN_ENV] = repr(time.time())
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        wall = time.perf_counter() - t0
        t_exit = time.time()
    if rc != 0:
        sys.stderr.write(logf.read_text()[-3000:])
        raise SystemExit(f"setting {name}: the command failed ({rc}); log {logf}")
    rep = json.loads(report.read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    traces = read_traces(out)
    row = {
        "prefix_cache": cache, "prefill_wide": wide or "auto", "jump_forward": jump != "nojf", "command_s": round(wall, 2), "peak_rss_mib": rep.get("peak_rss_mib"),
        "phases": breakdown(rep, wall, t_exit - rep["end_time"]),
        "calls": rep.get("calls"),
        "instrumented": instrumented(metrics, traces),
        "outcomes": {"tasks": len(traces), "solved": sum(bool(r.get("success")) for r in traces.values()),
                     "faithful": sum(bool((r.get("faithful") or {}).get("faithful")) for r in traces.values())},
        "folder": str(out),
    }
    if "profile_phases" in rep:
        row["profile_phases"], row["profile_top"], row["prof"] = rep["profile_phases"], rep["profile_top"], str(prof)
    log.info("[%s] %.1f s (%s)", name, wall, ", ".join(f"{p} {v:.1f}" for p, v in largest_shares(row["phases"])))
    return row


def show(result: dict) -> str:
    runs = result["runs"]
    text = [table(runs)]
    for n, r in runs.items():
        top = ", ".join(f"{LABELS.get(p, p)} {v:.1f} s ({100 * v / r['command_s']:.0f}%)"
                        for p, v in largest_shares(r["phases"]))
        text.append(f"cache {n}: largest shares: {top}")
    names = list(runs)
    keys = list(next(iter(runs.values()))["instrumented"]) if runs else []
    text.append("\nthe command's own figures (metrics.json, traces):")
    text.append(f"{'':26s}" + "".join(f" | {n:>10s}" for n in names))
    for k in keys:
        vals = [runs[n]["instrumented"].get(k) for n in names]
        text.append(f"{k:26s}" + "".join(f" | {'-' if v is None else str(v):>10}" for v in vals))
    for n, r in runs.items():
        if r.get("profile_top"):
            text.append(f"\ncache {n}: cProfile, the main thread's top functions by cumulative time ({r.get('prof')}):")
            text += [f"  {f['cumtime_s']:9.1f} s cum {f['tottime_s']:9.1f} s own {f['calls']:>8} calls  {f['function']}"
                     for f in r["profile_top"][:15]]
    if "identical_greedy_outcomes" in result:
        text.append(f"identical greedy outcomes: {result['identical_greedy_outcomes']}")
    return "\n".join(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", "--limit", type=int, default=18, help="PlanBench tasks in the sample (default 18)")
    ap.add_argument("--seed", type=int, default=5519, help="the sample's seed (statement_rules.py's default)")
    ap.add_argument("--draw", choices=("seeded", "first"), default="seeded",
                    help="seeded: statement_rules.py's draw; first: each family's first tasks (prefix_cache.py)")
    ap.add_argument("--tasks", help="a task file to run as it is (instead of drawing a sample)")
    ap.add_argument("--settings", default="off,on", help="prefix-cache settings, in order (default off,on)")
    ap.add_argument("--budget", type=int, default=1)
    ap.add_argument("--model", default="small")
    ap.add_argument("--method", choices=("timers", "cprofile"), default="timers",
                    help="timers: wall-clock wrappers on the table's functions (default); cprofile: the "
                         "command under cProfile, the same table from cumulative times (slower)")
    ap.add_argument("--work", help="folder for the sample, the evaluations and logs (default: a temporary one)")
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--show", metavar="JSON", help="print the table of a result written before; run nothing")
    ap.add_argument("--quiet", action="store_true", help="only the table (no progress log)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                    help="more options for omtr evaluate (last on the line)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-report", help=argparse.SUPPRESS)
    ap.add_argument("--child-prof", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        i = argv.index("--")
        a = ap.parse_args(argv[:i])
        return child(argv[i + 1:], a.child_report, a.method, a.child_prof)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(message)s")
    if args.show:
        print(show(json.loads(Path(args.show).read_text())))
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="omtr-evaluate-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.tasks:
        tasks = Path(args.tasks)
        ids = [json.loads(x)["id"] for x in tasks.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        tasks = work / "tasks.jsonl"
        ids = build_sample(tasks, args.count, args.seed, args.draw)
    log.info("%d tasks in %s; work folder %s", len(ids), tasks, work)
    settings = [s for s in args.settings.split(",") if s]
    for s in settings:
        try:
            parse_setting(s)
        except ValueError as exc:
            ap.error(f"--settings: {exc}")
    result: dict = {"benchmark": "evaluate_profile", "date": time.strftime("%Y-%m-%d"), "model": args.model,
                    "engine": "fast", "budget": args.budget, "method": args.method, "cores": os.cpu_count(),
                    "load_avg_at_start": list(os.getloadavg()),
                    "sample": {"file": str(tasks), "tasks": len(ids), "draw": None if args.tasks else args.draw,
                               "seed": None if args.tasks else args.seed, "ids": ids},
                    "table": [list(r) for r in PHASES], "runs": {}}
    for s in settings:
        result["runs"][s] = run_setting(s, tasks, work, args)
    if len(result["runs"]) == 2:  # the first setting against the second
        (off_name, off_run), (on_name, on_run) = result["runs"].items()
        on, off = read_traces(Path(on_run["folder"])), read_traces(Path(off_run["folder"]))
        same = [i for i in off if i in on and outcome_key(on[i]) == outcome_key(off[i])]
        result["identical_greedy_outcomes"] = {"settings": [off_name, on_name], "tasks": len(off),
                                               "identical": len(same), "differ": sorted(set(off) - set(same))}
        result["speedup"] = round(off_run["command_s"] / on_run["command_s"], 2)
    result["load_avg_at_end"] = list(os.getloadavg())
    text = json.dumps(result, indent=2) + "\n"
    (work / "result.json").write_text(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(show(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
