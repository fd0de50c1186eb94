"""benchmarks/evaluate_profile.py's pure parts: exclusive phase time from enter/leave events, the
same table from a (synthetic and a real) cProfile profile, the timers on real functions, the
breakdown adding up to the whole command, the table and the sample's allocation."""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
import types
from pathlib import Path

import pytest

from bench_helpers import load_benchmark  # noqa: E402


def _bench():
    return load_benchmark("evaluate_profile")


def test_a_moment_belongs_to_the_innermost_phase():
    ep = _bench()
    att = ep.Attributor(0.0)
    att.enter("decode", 1.0)   # other 0-1
    att.enter("prefill", 2.0)  # decode 1-2
    att.leave(5.0)             # prefill 2-5
    att.leave(6.0)             # decode 5-6
    att.enter("judge", 6.5)    # other 6-6.5
    att.leave(8.0)             # judge 6.5-8
    got = att.close(10.0)      # other 8-10
    assert got == pytest.approx({"other": 3.5, "decode": 2.0, "prefill": 3.0, "judge": 1.5})
    assert sum(got.values()) == pytest.approx(10.0)
    assert att.calls == {"decode": 1, "prefill": 1, "judge": 1}


TABLE = (
    ("decode", "toy_engine:generate", None, None),
    ("prefill", "toy_engine:_prefill", "toy_engine:_generate", "decode"),
    ("judge", "toy_engine:judge", None, None),
)


@pytest.fixture
def toy(monkeypatch):
    mod = types.ModuleType("toy_engine")
    src = '''
import time
def spin(s):
    t = time.perf_counter()
    while time.perf_counter() - t < s:
        pass
def _prefill(s):
    spin(s)
def _generate():
    _prefill(0.03)
    spin(0.02)
def generate():
    _generate()
def judge():
    _prefill(0.04)
'''
    exec(compile(src, "toy_engine.py", "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, "toy_engine", mod)
    return mod


def test_timers_follow_the_via_rule_and_undo(toy):
    ep = _bench()
    clock = time.perf_counter
    att = ep.Attributor(clock())
    originals = (toy.generate, toy._prefill, toy.judge)
    patches = ep.install_timers(att, clock, TABLE)
    toy.generate()
    toy.judge()
    got = att.close(clock())
    ep.remove_timers(patches)
    assert (toy.generate, toy._prefill, toy.judge) == originals
    # the Actor's prefill is its own phase; the Judge's prefill stays the Judge's
    assert got["prefill"] == pytest.approx(0.03, abs=0.02)
    assert got["decode"] == pytest.approx(0.02, abs=0.02)
    assert got["judge"] == pytest.approx(0.04, abs=0.02)
    assert att.calls == {"decode": 1, "prefill": 1, "judge": 1}


def test_profile_phases_from_a_synthetic_profile():
    ep = _bench()
    gen, gen_, pre, jud, caller = ("e.py", 1, "generate"), ("e.py", 5, "_generate"), ("e.py", 9, "_prefill"), \
        ("e.py", 12, "judge"), ("run.py", 3, "loop")
    stats = {
        gen: (1, 1, 0.0, 10.0, {caller: (1, 1, 0.0, 10.0)}),
        gen_: (1, 1, 3.0, 10.0, {gen: (1, 1, 3.0, 10.0)}),
        # _prefill: 7 s from _generate (the Actor's), 4 s from judge (the Judge's)
        pre: (2, 2, 11.0, 11.0, {gen_: (1, 1, 7.0, 7.0), jud: (1, 1, 4.0, 4.0)}),
        jud: (1, 1, 0.5, 4.5, {caller: (1, 1, 0.5, 4.5)}),
    }
    keys = {"toy_engine:generate": gen, "toy_engine:_generate": gen_, "toy_engine:_prefill": pre,
            "toy_engine:judge": jud}
    got = ep.profile_phases(stats, keys, TABLE)
    assert got == {"decode": {"inclusive_s": 10.0, "exclusive_s": 3.0},
                   "prefill": {"inclusive_s": 7.0, "exclusive_s": 7.0},
                   "judge": {"inclusive_s": 4.5, "exclusive_s": 4.5}}


def test_profile_phases_from_a_real_profile(toy):
    ep = _bench()
    pr = cProfile.Profile()
    pr.enable()
    toy.generate()
    toy.judge()
    pr.disable()
    st = pstats.Stats(pr)
    keys = {}
    for name in ("generate", "_generate", "_prefill", "judge"):
        code = getattr(toy, name).__code__
        keys[f"toy_engine:{name}"] = (code.co_filename, code.co_firstlineno, code.co_name)
    got = ep.profile_phases(st.stats, keys, TABLE)
    assert got["prefill"]["exclusive_s"] == pytest.approx(0.03, abs=0.02)
    assert got["decode"]["exclusive_s"] == pytest.approx(0.02, abs=0.02)
    assert got["judge"]["exclusive_s"] == pytest.approx(0.04, abs=0.02)


def test_the_table_names_functions_that_exist():
    ep = _bench()
    pytest.importorskip("torch")
    phases = set(ep.ORDER)
    for phase, target, via, within in ep.PHASES:
        assert phase in phases and phase in ep.LABELS
        assert callable(ep.resolve(target)[2])
        if via:
            assert callable(ep.resolve(via)[2])
        assert within is None or within in phases


def test_breakdown_adds_up_to_the_command_and_the_table_shows_it():
    ep = _bench()
    child = {"startup_s": 0.4, "main_s": 90.0,
             "phases_s": {"imports": 3.0, "load_model": 10.0, "prefill": 20.0, "decode": 40.0, "judge": 15.0,
                          "other": 2.0}}
    on = ep.breakdown(child, command_s=91.0, exit_s=0.3)
    assert sum(on.values()) == pytest.approx(91.0)
    assert on["exit"] == pytest.approx(0.6)  # 0.3 measured, 0.3 the parts missed
    assert set(on) == set(ep.ORDER)
    off = dict(on, prefill=60.0)
    text = ep.table({"off": {"command_s": 131.0, "phases": off}, "on": {"command_s": 91.0, "phases": on}})
    lines = text.splitlines()
    assert "off s" in lines[0] and "on s" in lines[0]
    prefill = next(x for x in lines if x.startswith("Actor prefill"))
    assert "60.0" in prefill and "45.8%*" in prefill  # off's largest share
    decode = next(x for x in lines if x.startswith("Actor decode"))
    assert "40.0" in decode and "44.0%*" in decode  # on's largest share
    assert lines[-1].startswith("whole command") and "131.0" in lines[-1] and "91.0" in lines[-1]
    assert ep.largest_shares(on, 2) == [("decode", 40.0), ("prefill", 20.0)]


def test_breakdown_from_a_cprofile_child():
    ep = _bench()
    child = {"startup_s": 0.5, "main_s": 50.0, "phases_s": {"imports": 4.0, "other": 46.0},
             "profile_phases": {"decode": {"inclusive_s": 30.0, "exclusive_s": 20.0},
                                "prefill": {"inclusive_s": 10.0, "exclusive_s": 10.0}}}
    got = ep.breakdown(child, command_s=51.0, exit_s=0.5)
    assert got["decode"] == 20.0 and got["prefill"] == 10.0 and got["imports"] == 4.0
    assert got["other"] == pytest.approx(16.0)
    assert sum(got.values()) == pytest.approx(51.0)


def test_instrumented_reads_one_batch_once():
    ep = _bench()
    times = {"generate_ms": 9000.0, "prefill_ms": 3000.0, "judge_ms": 2000.0}
    traces = {
        "a": {"steps": [{"role": "actor", "index": 0, "times": {**times, "decode_ms": 5000.0}}]},
        "b": {"steps": [{"role": "actor", "index": 0, "times": {**times, "decode_ms": 5900.0}}]},
        "c": {"steps": [{"role": "actor", "index": 0, "times": {"generate_ms": 1000.0, "prefill_ms": 400.0,
                                                                "decode_ms": 500.0, "judge_ms": 300.0},
                         "new_tokens": 3, "finish_reason": "stop"}]},
    }
    m = {"timing": {"load_policy_s": 12.0, "faithfulness_s": 0.5, "metrics_s": 1.0, "figures_s": 2.0},
         "prefix_cache": {"computed_tokens": 100, "cached_tokens": 50}}
    got = ep.instrumented(m, traces)
    assert got["batches"] == 2
    assert got["actor_generate_s"] == 10.0 and got["actor_prefill_s"] == 3.4
    assert got["actor_decode_s"] == 6.4 and got["judge_s"] == 2.3
    assert got["report_s"] == 3.0 and got["prefill_tokens_cached"] == 50
    assert got["new_tokens"] == 3
    assert got["finish_reasons"] == {"?": 2, "stop": 1}


def test_allocate_spreads_the_count():
    ep = _bench()
    assert ep.allocate(18) == {"blocksworld": 5, "mystery_blocksworld": 5, "logistics": 4, "depots": 4}
    assert ep.allocate(2) == {"blocksworld": 1, "mystery_blocksworld": 1, "logistics": 0, "depots": 0}
    assert sum(ep.allocate(12).values()) == 12


def test_a_setting_names_the_prefix_cache_and_optionally_the_engines_wide_format_and_jump_forward():
    import re

    ep = _bench()
    assert ep.parse_setting("on") == ("on", None, None)
    assert ep.parse_setting("off+fp32") == ("off", "fp32", None)
    assert ep.parse_setting("on+bf16") == ("on", "bf16", None)
    assert ep.parse_setting("on+nojf") == ("on", None, "nojf")
    assert ep.parse_setting("on+fp32+jf") == ("on", "fp32", "jf")
    for bad in ("maybe", "on+fp16", "on+", "+bf16", "on+jf+nojf", "on+bf16+fp32"):
        with pytest.raises(ValueError, match=f"setting '{re.escape(bad)}'"):
            ep.parse_setting(bad)
