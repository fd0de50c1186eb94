"""The planner stages of E(y) for a spec that passed lint: translate, search, validate.

Runs inside a solver worker: the Fast Downward translator is imported once and runs in-process
(warm), the search binary and VAL run as limited subprocesses in a private temporary directory.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import resource
import shutil
import signal
import tempfile
import time

from omtr.config import SolverConfig
from omtr.pddl.categories import Category
from omtr.pddl.plan import read_plan as read_steps
from omtr.pddl.plan import read_plan_file
from omtr.solver import proc
from omtr.solver.lint import LintResult
from omtr.solver.lint import lint as run_lint
from omtr.solver.verdict import Verdict

log = logging.getLogger(__name__)

# Fast Downward exit codes (driver/returncodes.py), as a closed table.
EXIT_PLAN = {0, 1, 2, 3}
EXIT_UNSOLVABLE = {10, 11, 13}
EXIT_INCOMPLETE = {12}
EXIT_MEMORY = {20, 22, 24}
EXIT_TIME = {21, 23}
EXIT_INPUT = {30, 31, 33}
EXIT_UNSUPPORTED = {34}


class _TranslateTimeout(Exception):
    pass


def _on_sigprof(signum, frame):
    raise _TranslateTimeout()


_translator = None


def warm_translator():
    """Import the translator once per process (about 0.3 s) and return its entry points."""
    global _translator
    if _translator is None:
        from fast_downward.translate import main as tmain
        from fast_downward.translate import options as topts
        from fast_downward.translate.pddl_parser import parse_error

        _translator = (topts, tmain, parse_error.ParseError)
    return _translator


def _limit_own_memory(memory_mb: int):
    """The in-process translator may use ``memory_mb`` on top of what the worker already maps.

    Only the soft limit moves, and only while the translator runs; the previous limits are
    returned for :func:`resource.setrlimit` to restore.
    """
    try:
        with open("/proc/self/statm") as f:
            vm_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        before = resource.getrlimit(resource.RLIMIT_AS)
        hard = before[1]
        soft = vm_bytes + memory_mb * 1024 * 1024
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        return before
    except (OSError, ValueError):
        return None


def _translate(domain_path: str, problem_path: str, sas_path: str, cfg: SolverConfig):
    """Return (status, text): status in ok|unsolvable|error|timeout|memory."""
    topts, tmain, ParseError = warm_translator()
    buf = io.StringIO()
    in_main = True
    try:
        old = signal.signal(signal.SIGPROF, _on_sigprof)
        signal.setitimer(signal.ITIMER_PROF, cfg.time_limit_s)
    except ValueError:  # not the main thread: rely on the pool's wall clock
        in_main = False
    restore = _limit_own_memory(cfg.memory_limit_mb)
    try:
        with contextlib.redirect_stdout(buf):
            topts.set_options([domain_path, problem_path, "--sas-file", sas_path])
            tmain.main()
        text = buf.getvalue()
        if "Generating unsolvable task" in text:
            return "unsolvable", text
        return "ok", text
    except _TranslateTimeout:
        return "timeout", buf.getvalue()
    except MemoryError:
        return "memory", buf.getvalue()
    except ParseError as exc:
        return "error", f"{exc}"
    except SystemExit as exc:
        return "error", buf.getvalue()[-2000:] + f"\n(exit {exc.code})"
    except RecursionError:
        return "error", "the translator hit Python's recursion limit on this spec"
    except Exception as exc:  # the translator crashes with KeyError etc. on some malformed input
        return "error", f"{type(exc).__name__}: {exc}"
    finally:
        if restore is not None:
            resource.setrlimit(resource.RLIMIT_AS, restore)
        if in_main:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, old)


def _translator_error(text: str) -> tuple[Category, str]:
    t = text.strip().splitlines()[-3:] if text.strip() else ["(no output)"]
    summary = " ".join(x.strip() for x in t)[:400]
    low = text.lower()
    if "undefined object" in low or "keyerror" in low or "type" in low and "undefined" in low:
        return Category.OBJECT_TYPE, f"the planner's translator rejected the spec: {summary}"
    if "predicate" in low or "arity" in low or "parameter" in low:
        return Category.PREDICATE_SCHEMA, f"the planner's translator rejected the spec: {summary}"
    return Category.SYNTAX, f"the planner's translator could not read the spec: {summary}"


def read_plan(path: str) -> list[str]:
    return read_plan_file(path)


def run_planner(domain_text: str, problem_text: str, cfg: SolverConfig) -> Verdict:
    """Plan and validate a spec that passed lint.

    The spec is parsed again only if a failure needs explaining; lint warnings are added by the
    caller, which linted the spec before sending it.
    """
    timings: dict[str, float] = {}
    v = Verdict(success=False, timings=timings)

    def unsolvable(why: str) -> Verdict:
        return _unsolvable(v, run_lint(domain_text, problem_text, cfg), why)

    tmp = tempfile.mkdtemp(prefix="omtr-solve-")
    try:
        dpath, ppath = os.path.join(tmp, "domain.pddl"), os.path.join(tmp, "problem.pddl")
        sas, plan_path = os.path.join(tmp, "output.sas"), os.path.join(tmp, "sas_plan")
        with open(dpath, "w", encoding="utf-8") as f:
            f.write(domain_text)
        with open(ppath, "w", encoding="utf-8") as f:
            f.write(problem_text)

        t0 = time.perf_counter()
        status, text = _translate(dpath, ppath, sas, cfg)
        timings["translate_ms"] = (time.perf_counter() - t0) * 1000
        v.stage = "translate"
        if status == "timeout":
            v.category, v.timed_out, v.exit_code = Category.UNREACHABLE_SEARCH, True, 21
            v.message = f"time limit: translating the task took more than {cfg.time_limit_s:g} s of CPU; the task is too large"
            return v
        if status == "memory":
            v.category, v.memory_out, v.exit_code = Category.UNREACHABLE_SEARCH, True, 20
            v.message = f"memory limit: translating the task needed more than {cfg.memory_limit_mb} MiB; the task is too large"
            return v
        if status == "error":
            v.category, v.message = _translator_error(text)
            v.exit_code = 31
            return v
        if status == "unsolvable":
            v.exit_code = 10
            return unsolvable("the translator proved the goal unreachable")

        t0 = time.perf_counter()
        argv = [proc.search_binary(), *proc.search_arguments(cfg.search), "--internal-plan-file", plan_path]
        res = proc.run_limited(
            argv,
            cwd=tmp,
            stdin_path=sas,
            cpu_s=cfg.time_limit_s,
            memory_mb=cfg.memory_limit_mb,
            wall_s=cfg.time_limit_s + cfg.wall_clock_slack_s,
        )
        timings["search_ms"] = (time.perf_counter() - t0) * 1000
        v.stage, v.exit_code = "search", res.returncode
        rc = res.returncode
        if res.killed:
            v.category, v.timed_out, v.exit_code = Category.UNREACHABLE_SEARCH, True, 23
            v.message = f"time limit: no plan within {cfg.time_limit_s:g} s (wall clock); the search was stopped"
            return v
        if rc in EXIT_TIME or rc == -signal.SIGXCPU or rc == -signal.SIGKILL and "time" in res.stdout[-500:].lower():
            v.category, v.timed_out = Category.UNREACHABLE_SEARCH, True
            v.message = f"time limit: no plan within {cfg.time_limit_s:g} s of CPU; not a proof of unsolvability"
            return v
        if rc in EXIT_MEMORY or rc in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGKILL) and _looks_oom(res.stdout):
            v.category, v.memory_out = Category.UNREACHABLE_SEARCH, True
            v.message = f"memory limit: the search needed more than {cfg.memory_limit_mb} MiB; not a proof of unsolvability"
            return v
        if rc in EXIT_UNSOLVABLE:
            return unsolvable("the planner proved the task unsolvable")
        if rc in EXIT_INCOMPLETE:
            return unsolvable(f"the search `{cfg.search}` exhausted its search space without a plan")
        if rc in EXIT_UNSUPPORTED:
            v.category = Category.UNREACHABLE_SEARCH
            v.message = f"the search `{cfg.search}` does not support this spec's features: {_tail(res.stdout)}"
            return v
        if rc in EXIT_INPUT:
            v.category, msg = _translator_error(res.stdout)
            v.message = msg
            return v
        if rc not in EXIT_PLAN or not os.path.exists(plan_path):
            v.category = Category.UNREACHABLE_SEARCH
            v.message = f"the planner failed with exit code {rc}: {_tail(res.stdout)}"
            return v

        v.plan = read_plan(plan_path)
        v.plan_length = len(v.plan)
        if not cfg.validate:
            v.success, v.stage = True, "done"
            return v
        t0 = time.perf_counter()
        check = validate_files(dpath, ppath, plan_path, cfg, cwd=tmp)
        timings["validate_ms"] = (time.perf_counter() - t0) * 1000
        v.stage = "validate"
        if check.valid:
            v.success, v.stage = True, "done"
        elif check.timed_out:
            v.category, v.timed_out = Category.UNREACHABLE_SEARCH, True
            v.message = (f"time limit: the planner found a plan but VAL did not finish checking it within "
                         f"{cfg.time_limit_s:g} s; not a verdict on the spec")
        else:
            v.category = Category.PRECONDITION_EFFECT
            v.message = "the planner found a plan but VAL rejects it: " + check.message
        return v
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _looks_oom(text: str) -> bool:
    low = text[-2000:].lower()
    return "memory" in low or "bad_alloc" in low


def _tail(text: str, n: int = 300) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-3:])[-n:] if lines else "(no output)"


def _unsolvable(v: Verdict, lint: LintResult, why: str) -> Verdict:
    from omtr.solver.diagnose import diagnose_unsolvable

    t0 = time.perf_counter()
    diag = diagnose_unsolvable(lint.domain, lint.problem, lint.hints)
    v.timings["diagnose_ms"] = (time.perf_counter() - t0) * 1000
    v.category = diag.category
    v.message = f"{why}: {diag.message}" if diag.category != Category.UNREACHABLE_SEARCH else f"{diag.message} ({why})"
    return v


# --------------------------------------------------------------------------------------- VAL


class PlanCheck:
    __slots__ = ("valid", "message", "output", "timed_out")

    def __init__(self, valid: bool, message: str, output: str = "", timed_out: bool = False):
        self.valid, self.message, self.output, self.timed_out = valid, message, output, timed_out

    def __repr__(self) -> str:
        return f"PlanCheck(valid={self.valid}, message={self.message!r})"


def validate_files(dpath: str, ppath: str, plan_path: str, cfg: SolverConfig, *, cwd: str) -> PlanCheck:
    def run(*flags):
        return proc.run_limited(
            [proc.validate_binary(), *flags, dpath, ppath, plan_path],
            cwd=cwd,
            cpu_s=cfg.time_limit_s,
            memory_mb=cfg.memory_limit_mb,
            wall_s=cfg.time_limit_s + cfg.wall_clock_slack_s,
        )

    res = run()
    # VAL exits 0 for some failures ("Bad plan description!"): only "Plan valid" counts.
    if res.returncode == 0 and re.search(r"^Plan valid\s*$", res.stdout, re.M):
        return PlanCheck(True, "Plan valid", res.stdout)
    if res.killed:
        return PlanCheck(False, "VAL did not finish within the time limit", res.stdout, timed_out=True)
    res = run("-v")  # again, verbose, for the repair advice the Editor needs
    return PlanCheck(False, _val_reason(res.stdout, res), res.stdout, timed_out=res.killed)


def _val_reason(out: str, res) -> str:
    if res.killed:
        return "VAL did not finish within the time limit"
    lines = [x.strip() for x in out.splitlines() if x.strip()]
    keep = []
    capture = False
    for line in lines:
        if line.startswith("Plan Repair Advice") or line.startswith("Plan failed") or "Bad plan" in line \
                or line.startswith("Goal not satisfied") or "unsatisfied precondition" in line.lower() \
                or line.startswith("Error") or "Bad operator" in line:
            capture = True
        if capture:
            keep.append(line)
        if len(keep) >= 6:
            break
    if not keep:
        keep = lines[-4:]
    return " ".join(keep)[:500] or f"VAL exit code {res.returncode}"


def _unknown_steps(domain_text: str, plan: str) -> str | None:
    """Name a plan step whose action is not in the domain or has the wrong number of arguments."""
    from omtr.pddl import SpecError, parse_domain

    try:
        dom = parse_domain(domain_text)
    except SpecError:
        return None  # VAL reports the domain's own problems
    for n, step in enumerate(read_steps(plan, bare=False), 1):
        if step.time is not None:  # timed plans are left to VAL
            return None
        act = dom.actions.get(step.name)
        if act is None:
            return f"plan step {n} {step} uses action `{step.name}`, which the domain does not define"
        if len(step.args) != len(act.parameters):
            return f"plan step {n} {step} gives {len(step.args)} arguments but `{step.name}` takes {len(act.parameters)}"
    return None


def validate_plan(domain_text: str, problem_text: str, plan, cfg: SolverConfig | None = None) -> PlanCheck:
    """Check a plan (list of "(act a b)" strings or plan text) with VAL on the given spec."""
    cfg = cfg or SolverConfig()
    if not isinstance(plan, str):
        plan = "\n".join(plan)
    unknown = _unknown_steps(domain_text, plan)
    if unknown:
        return PlanCheck(False, unknown)
    tmp = tempfile.mkdtemp(prefix="omtr-val-")
    try:
        paths = []
        for name, text in (("domain.pddl", domain_text), ("problem.pddl", problem_text), ("plan.txt", plan + "\n")):
            p = os.path.join(tmp, name)
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
            paths.append(p)
        return validate_files(*paths, cfg, cwd=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
