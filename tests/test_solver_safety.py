"""Resource limits, hostile input and the cache, with the real planner binaries."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import planner_processes
from omtr.config import SolverConfig
from omtr.pddl.categories import Category
from omtr.solver import ResultCache, SolverPool, solve, solve_many
from omtr.solver.examples import BW_DOMAIN, BW_PROBLEM


def _hard(benchmarks, n=110):
    inst = benchmarks / "planbench" / "instances" / "blocksworld_hard"
    return (inst / "generated_domain.pddl").read_text(), (inst / "generated" / f"instance-{n}.pddl").read_text()


def test_time_limit_sets_flag_and_leaves_no_process(benchmarks):
    d, p = _hard(benchmarks)
    cfg = SolverConfig(time_limit_s=1, search="astar(blind())", memory_limit_mb=8192, cache=False)
    t0 = time.monotonic()
    v = solve(d, p, cfg)
    assert time.monotonic() - t0 < 30
    assert not v.success and v.timed_out and not v.memory_out
    assert v.category == Category.UNREACHABLE_SEARCH and "time limit" in v.message
    assert planner_processes() == []


def test_memory_limit_sets_flag_and_leaves_no_process(benchmarks):
    d, p = _hard(benchmarks)
    cfg = SolverConfig(time_limit_s=60, search="astar(blind())", memory_limit_mb=200, cache=False)
    v = solve(d, p, cfg)
    assert not v.success and v.memory_out and not v.timed_out, v.message
    assert v.category == Category.UNREACHABLE_SEARCH and "memory" in v.message
    assert planner_processes() == []


def test_translator_time_limit_in_the_warm_worker():
    # 6 parameters over 30 objects: 7e8 groundings, far beyond a 1 s translation.
    objs = " ".join(f"o{i}" for i in range(30))
    dom = """(define (domain wide) (:requirements :strips)
      (:predicates (p ?a) (q ?a ?b ?c ?d ?e ?f))
      (:action big :parameters (?a ?b ?c ?d ?e ?f)
        :precondition (and (p ?a) (p ?b) (p ?c) (p ?d) (p ?e) (p ?f))
        :effect (q ?a ?b ?c ?d ?e ?f)))"""
    init = " ".join(f"(p o{i})" for i in range(30))
    prob = f"(define (problem w) (:domain wide) (:objects {objs}) (:init {init}) (:goal (q o1 o2 o3 o4 o5 o6)))"
    with SolverPool(1, SolverConfig(time_limit_s=1, cache=False)) as pool:
        t0 = time.monotonic()
        v = pool.solve(dom, prob)
        assert time.monotonic() - t0 < 20
        assert v.timed_out and v.stage == "translate", v
        # the same worker still answers afterwards
        assert pool.solve(BW_DOMAIN, BW_PROBLEM).success
    assert planner_processes() == []


def test_many_limited_calls_leave_no_process(benchmarks):
    d, p = _hard(benchmarks)  # 13 blocks: blind search cannot finish within these limits
    cfg = SolverConfig(time_limit_s=1, search="astar(blind())", memory_limit_mb=300, cache=False)
    with SolverPool(2, cfg) as pool:
        vs = pool.solve_many([(d, p)] * 4 + [(BW_DOMAIN, BW_PROBLEM)] * 2)
    assert all(v.timed_out or v.memory_out for v in vs[:4]), [(v.exit_code, v.message) for v in vs[:4]]
    assert all(v.success for v in vs[4:])
    assert planner_processes() == []


GARBAGE = {
    "non-utf8": b"\xff\xfe(define (domain x))",
    "nul": "(define (domain x)\x00)",
    "empty": "",
    "whitespace": "   \n\t ",
    "none": None,
    "number": 42,
    "random-bytes": bytes(range(256)) * 4,
    "unbalanced-close": "(define (domain x)))",
    "unbalanced-open": "(define (domain x) (:predicates (p)",
    "text-outside": "hello (define (domain x))",
    "two-forms": "(define (domain x)) (define (domain y))",
    "model-chatter": "Sure! Here is the PDDL you asked for:\n```pddl\n(define (domain x))\n```",
    "surrogates": "(define (domain x\udcff))",
}


# Over omtr's own limits: not malformed PDDL, so not `syntax`, but a limit verdict.
OVER_LIMITS = {
    "oversized": "(define (domain x) " + "(:predicates (p))" * 20000 + ")",
    "deep-nesting": "(define (domain x) " + "(" * 5000 + ")" * 5000 + ")",
}


@pytest.mark.parametrize("name", sorted(OVER_LIMITS))
def test_over_a_limit_is_a_limit_verdict_not_syntax(name):
    bad = OVER_LIMITS[name]
    for v in (solve(bad, BW_PROBLEM), solve(BW_DOMAIN, bad)):
        assert not v.success and v.too_large and v.limited, (name, v)
        assert v.category == Category.UNREACHABLE_SEARCH and v.stage == "lint"
        assert not v.timed_out and not v.memory_out
        assert ("max_file_bytes" if name == "oversized" else "max_nesting") in v.message


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_gets_a_syntax_verdict_fast(name):
    bad = GARBAGE[name]
    t0 = time.monotonic()
    for v in (solve(bad, BW_PROBLEM), solve(BW_DOMAIN, bad)):
        assert not v.success and v.category == Category.SYNTAX, (name, v)
        assert v.stage == "lint" and v.message
        assert ("domain" in v.message) or ("problem" in v.message)
    assert time.monotonic() - t0 < 20  # a hang guard: these never reach a planner


def test_size_limit_names_its_setting_and_can_be_raised():
    padded = BW_DOMAIN + (";" + "x" * 60 + "\n") * 80  # valid PDDL, 5 KB of comments
    v = solve(padded, BW_PROBLEM, SolverConfig(max_file_bytes=4096))
    assert v.too_large and "4,096 bytes" in v.message and "--max-file-bytes" in v.message
    assert solve(padded, BW_PROBLEM, SolverConfig(max_file_bytes=8192)).success


def test_cli_flag_raises_the_size_limit(tmp_path):
    d, p = tmp_path / "d.pddl", tmp_path / "p.pddl"
    d.write_text(BW_DOMAIN + (";" + "x" * 60 + "\n") * 5000)  # 300 KB (VAL is slow on one long line)
    p.write_text(BW_PROBLEM)
    over = json.loads(_omtr("solve", str(d), str(p)).stdout)
    assert over["too_large"] and over["category"] == "unreachable_search" and not over["success"]
    raised = json.loads(_omtr("solve", str(d), str(p), "--max-file-bytes", "400000").stdout)
    assert raised["success"] and not raised["too_large"]


def test_cache_ignores_whitespace_comments_and_case():
    cache = ResultCache()
    cfg = SolverConfig()
    with SolverPool(1, cfg, cache=cache) as pool:
        first = pool.solve(BW_DOMAIN, BW_PROBLEM)
        variant = "; a comment\n" + BW_DOMAIN.upper().replace(" (", "   \n\t(")
        second = pool.solve(variant, BW_PROBLEM)
        other_cfg = pool.solve(BW_DOMAIN, BW_PROBLEM, cfg.replace(search="astar(lmcut())"))
    assert first.success and not first.cached
    assert second.success and second.cached and second.plan == first.plan
    assert not other_cfg.cached
    assert cache.hits == 1


def test_disk_cache_survives_the_process(tmp_path):
    cfg = SolverConfig(cache_dir=str(tmp_path / "cache"))
    with SolverPool(1, cfg) as pool:
        assert not pool.solve(BW_DOMAIN, BW_PROBLEM).cached
    with SolverPool(1, cfg) as pool:  # a new pool with a fresh in-memory cache
        v = pool.solve(BW_DOMAIN, BW_PROBLEM)
    assert v.cached and v.success


def test_limit_verdicts_are_not_cached(benchmarks):
    d, p = _hard(benchmarks)
    cache = ResultCache()
    cfg = SolverConfig(time_limit_s=1, search="astar(blind())")
    with SolverPool(1, cfg, cache=cache) as pool:
        assert pool.solve(d, p).timed_out
    assert len(cache) == 0


def test_duplicates_in_a_batch_cost_one_planner_call():
    vs = solve_many([(BW_DOMAIN, BW_PROBLEM)] * 5, config=SolverConfig(cache=False))
    assert all(v.success for v in vs)
    assert sum(not v.cached for v in vs) == 1


def _omtr(*args, **kw):
    return subprocess.run([sys.executable, "-m", "omtr", *args], capture_output=True, text=True, **kw)


def test_cli_solve_prints_one_json_verdict(tmp_path, benchmarks):
    inst = benchmarks / "planbench" / "instances" / "blocksworld"
    r = _omtr("solve", str(inst / "generated_domain.pddl"), str(inst / "generated_basic" / "instance-3.pddl"))
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    for key in ("success", "category", "message", "plan", "warnings", "timed_out", "cached", "timings"):
        assert key in v
    assert v["success"] and v["plan"]
    bad = tmp_path / "bad.pddl"
    bad.write_bytes(b"\xff\xfe")
    r = _omtr("solve", str(bad), str(inst / "generated_basic" / "instance-3.pddl"))
    assert r.returncode == 0 and json.loads(r.stdout)["category"] == "syntax"
    r = _omtr("solve", str(tmp_path / "missing.pddl"), str(bad))
    assert r.returncode == 2 and "missing.pddl" in r.stderr and not r.stdout


def test_cli_batch_with_a_broken_line_and_resume(tmp_path):
    specs = tmp_path / "specs.jsonl"
    lines = [json.dumps({"id": f"s{i}", "domain": BW_DOMAIN, "problem": BW_PROBLEM}) for i in range(3)]
    lines.insert(1, "{not json")
    lines.append(json.dumps({"id": "nodomain", "problem": BW_PROBLEM}))
    specs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "verdicts.jsonl"
    r = _omtr("solve", "--batch", str(specs), "--out", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"s0", "s1", "s2", "line-2", "nodomain"}
    assert rows["s0"]["success"] and rows["s2"]["success"]
    assert rows["line-2"]["category"] == "syntax" and "line 2" in rows["line-2"]["message"]
    assert "'domain'" in rows["nodomain"]["message"]
    # Refuses to clobber; --resume skips what is done.
    r = _omtr("solve", "--batch", str(specs), "--out", str(out))
    assert r.returncode == 2 and "--resume" in r.stderr
    with open(specs, "a") as f:
        f.write(json.dumps({"id": "s9", "domain": BW_DOMAIN, "problem": BW_PROBLEM}) + "\n")
    r = _omtr("solve", "--batch", str(specs), "--out", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert ids.count("s0") == 1 and ids.count("s9") == 1
    # A kill mid-line leaves half a record: resuming drops it, solves that spec again, and every
    # line of the result is whole JSON.
    whole = out.read_text().splitlines()
    out.write_text("\n".join(whole[:-1]) + "\n" + whole[-1][: len(whole[-1]) // 2])
    r = _omtr("solve", "--batch", str(specs), "--out", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(json.loads(x)["id"] for x in whole)


def test_help_has_examples_and_starts_fast():
    r = _omtr("solve", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "--batch" in r.stdout
    code = "import sys, omtr.cli; omtr.cli.build_parser(); print(sorted(m for m in ('torch','mlflow','fast_downward') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs util-linux setpriv for the parent-death signal")
def test_worker_killed_mid_search_is_replaced_and_leaves_no_planner(benchmarks):
    import signal
    import threading

    d, p = _hard(benchmarks)
    cfg = SolverConfig(time_limit_s=60, search="astar(blind())", memory_limit_mb=8192, cache=False)
    with SolverPool(1, cfg) as pool:
        victim = pool.worker_pids()[0]

        def kill_when_planning():
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not planner_processes():
                time.sleep(0.05)
            os.kill(victim, signal.SIGKILL)

        killer = threading.Thread(target=kill_when_planning)
        killer.start()
        v = pool.solve(d, p)
        killer.join()
        assert not v.success and v.category == Category.UNREACHABLE_SEARCH
        assert "worker died" in v.message
        assert pool.worker_pids()[0] != victim
        assert pool.solve(BW_DOMAIN, BW_PROBLEM).success  # the replacement works
    deadline = time.monotonic() + 5
    while planner_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert planner_processes() == []


def test_pool_made_in_a_thread_that_ends_keeps_its_workers():
    """A worker's parent-death signal follows the thread that forked it: a pool first used from a
    short-lived thread (a request handler, a helper thread of a test) must keep its workers after
    that thread ends, or its next spec reports a dead worker."""
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("pool", SolverPool(1, SolverConfig(cache=False))))
    t.start()
    t.join()
    pool = box["pool"]
    try:
        pid = pool.worker_pids()[0]
        time.sleep(0.5)  # the signal is delivered as the thread exits
        v = pool.solve(BW_DOMAIN, BW_PROBLEM)
        assert v.success, v.message
        assert pool.worker_pids()[0] == pid  # the same worker: never replaced
    finally:
        pool.close()
