"""Data-parallel training: the rank split and the batch-wide statistics (two gloo processes), and a
real two-rank run of the micro profile through a DeepSpeed ZeRO-2 engine on CPU, launched by
``python -m torch.distributed.run`` (the worker is tests/dist_train_worker.py)."""

import importlib.util
import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from omtr.rl import losses as L  # noqa: E402
from omtr.paths import free_port  # noqa: E402
from omtr.rl.distributed import Collective, merge_weighted_means, shard, whiten  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent



def test_shard_splits_a_batch_into_disjoint_contiguous_shares_that_cover_it():
    for n in range(0, 11):
        for world in range(1, 6):
            shares = [shard(n, r, world) for r in range(world)]
            assert [i for s in shares for i in s] == list(range(n))
            sizes = [len(s) for s in shares]
            assert max(sizes) - min(sizes) <= 1
    assert list(shard(4, 1, 2)) == [2, 3]
    with pytest.raises(ValueError):
        shard(4, 2, 2)


def test_single_process_collective_is_the_identity():
    c = Collective()
    assert not c.active and c.is_main
    assert c.sum([1, 2.5]) == [1.0, 2.5] and c.gather({"a": 1}) == [{"a": 1}] and c.any(True) and not c.any(False)
    xs = [0.5, -1.0, 2.0, 3.5]
    assert whiten(xs, c) == pytest.approx(L.whiten(xs))
    assert merge_weighted_means({"a": [1.0, 3.0], "b": []}, c) == {"a": 2.0}


# values of a batch and how two ranks hold them (rank 1 holds more, and a key rank 0 lacks)
_PARTS = ([0.5, -1.0], [2.0, 3.5, 0.0])
_STATS = ({"loss": [1.0, 1.0], "kl": [0.2]}, {"loss": [4.0], "clip": [0.5, 0.1]})


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        c = Collective.current()
        res = {"rank": c.rank, "world": c.world, "white": whiten(_PARTS[rank], c),
               "merged": merge_weighted_means(_STATS[rank], c), "any": c.any(rank == 1), "none": c.any(False),
               "gather": c.gather(rank * 10), "sum": c.sum([rank, 1.5]), "max": c.max([rank])}
        Path(out, f"{rank}.json").write_text(json.dumps(res))
    finally:
        torch.distributed.destroy_process_group()


def test_leaving_keeps_a_one_rank_group_and_does_nothing_without_one(tmp_path):
    from omtr.rl.distributed import leave_process_group

    dist = torch.distributed
    ours = not dist.is_initialized()
    if ours:  # a one-rank group, as the DeepSpeed engine makes for a single process
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        leave_process_group()
        assert dist.is_initialized() and dist.get_world_size() == 1
    finally:
        if ours:
            dist.destroy_process_group()
    if ours:
        leave_process_group()  # no group at all: nothing to leave, no error
        assert not dist.is_initialized()


def test_whitening_metrics_and_flags_over_two_ranks_are_the_whole_batch(tmp_path):
    torch.multiprocessing.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    r = [json.loads((tmp_path / f"{k}.json").read_text()) for k in (0, 1)]
    assert [x["rank"] for x in r] == [0, 1] and all(x["world"] == 2 for x in r)
    whole = L.whiten(_PARTS[0] + _PARTS[1])
    assert r[0]["white"] + r[1]["white"] == pytest.approx(whole)
    assert L.whiten(_PARTS[0]) != pytest.approx(r[0]["white"])  # a rank's own whitening would differ
    for x in r:
        assert x["merged"] == pytest.approx({"loss": 2.0, "kl": 0.2, "clip": 0.3})
        assert x["any"] is True and x["none"] is False
        assert x["gather"] == [0, 10] and x["sum"] == [1.0, 3.0] and x["max"] == [1.0]


def _launcher_env(**extra) -> dict:
    """The environment of a ``torch.distributed.run`` launch from a test: this checkout's sources,
    one thread a rank, and none of the variables a launcher sets for its ranks."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]), **extra)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


_LEAVER = """
import sys
import torch
from omtr.rl.distributed import Collective, init_from_env, leave_process_group

c = init_from_env(use_deepspeed=False)
assert c.world == 2, c
for _ in range(20):
    c.sum([float(c.rank)] * 256)
assert c.gather(c.rank) == [0, 1]
leave_process_group()
assert not torch.distributed.is_initialized()
leave_process_group()  # a second call does nothing
"""


@pytest.mark.slow
def test_ranks_that_leave_the_group_exit_cleanly_every_time(tmp_path):
    """Two gloo ranks that simply exit after their last collective abort about half the time
    (``terminate called without an active exception``, SIGABRT: 12 of 25 launches here); this is how
    a two-rank CI run died after its work was done. Ranks that call ``leave_process_group``, as
    ``omtr train`` does at its end, exit 0: six launches, all clean (without it, six clean ones in a
    row are a 1-in-50 chance)."""
    script = tmp_path / "leaver.py"
    script.write_text(_LEAVER)
    env = _launcher_env()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(free_port()), str(script)],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(6)]
    outs = [(p.communicate(timeout=240)[0], p.returncode) for p in procs]
    bad = [(rc, out[-2000:]) for out, rc in outs if rc != 0]
    assert not bad, bad


def test_zero3_across_ranks_is_refused_with_a_way_out(tmp_path):
    pytest.importorskip("deepspeed")
    from torch import nn

    from omtr.config import ConfigError
    from omtr.rl.config import train_profile
    from omtr.rl.engine import DeepSpeedBackend, TrainModules

    mods = TrainModules({"m": nn.Linear(2, 2)}, nn.Linear(2, 2))
    cfg = train_profile("micro").replace(deepspeed=str(ROOT / "configs" / "deepspeed" / "zero3_bf16.json"))
    with pytest.raises(ConfigError, match="ZeRO-3 across 2 ranks.*zero2_bf16.json"):
        DeepSpeedBackend(mods, cfg, Collective(rank=0, world=2))


def _worker():
    spec = importlib.util.spec_from_file_location("dist_train_worker", HERE / "dist_train_worker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_CAUSES = ("Error", "error:", "Exception", "terminate called", "what():", "Fatal Python", "Aborted", "corrupt",
           "Traceback", "exitcode", "Root Cause", "rank:", "traceback :")


def _launch_failure(proc, out: Path) -> str:
    """What a failed two-rank launch left: the phases each rank finished (a crash after the last one
    is a teardown problem, one inside a phase is the trainer's), the lines of stderr that name a
    cause, and its end."""
    done = sorted(p.name for p in out.glob("*-rank-*.json"))
    lines = proc.stderr.splitlines()
    causes = [ln for ln in lines if any(c in ln for c in _CAUSES)]
    return "\n".join([f"exit {proc.returncode}; phases finished: {done or 'none'}", "--- stderr lines naming a cause:",
                      *causes[-60:], "--- stderr's end:", *lines[-40:], "--- stdout's end:", proc.stdout[-1500:]])


@pytest.mark.slow
def test_two_ranks_through_deepspeed_zero2_split_the_batch_and_match_one_process(tmp_path):
    pytest.importorskip("deepspeed")
    torch.set_num_threads(1)
    from omtr.model import RoleModel, build_model
    from omtr.rl.trainer import Trainer

    model_dir = tmp_path / "model"
    build_model("micro").save(model_dir)
    out = tmp_path / "out"
    out.mkdir()
    ds = ROOT / "configs" / "deepspeed" / "zero2_cpu.json"
    env = _launcher_env(DS_ACCELERATOR="cpu", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlruns.db'}")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(HERE / "dist_train_worker.py"), "grad,gradtorch,run,straight,idle,stop,badlog", str(out), str(model_dir), str(ds)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, _launch_failure(proc, out)
    print(f"two ranks: {time.perf_counter() - t0:.1f} s")

    def rec(phase):
        return [json.loads((out / f"{phase}-rank-{r}.json").read_text()) for r in (0, 1)]

    # --- the step's gradient is the whole batch's: the same as one process on the whole batch
    w = _worker()
    ref = Trainer(w.cfg(str(model_dir), None, mlflow=False), w.TASKS, tmp_path / "one", env=w.NoPlanner(), quiet=True,
                  model=RoleModel.load(model_dir))
    w.perturb(ref)
    items, judge = w.fixed_batch(ref)
    one = ref._update(items, judge)
    for phase in ("grad", "gradtorch"):  # DeepSpeed ZeRO-2, then the plain-torch backend
        g = rec(phase)
        assert g[0]["items"] > 0 and g[1]["items"] > 0 and g[0]["items"] + g[1]["items"] == len(items)
        assert g[0]["after"] == g[1]["after"], f"{phase}: parameters differ across ranks after the step"
        if phase == "grad":
            assert [x["shm_op"] for x in g] == [False, False]  # gloo alone on a CPU
        # torch clips (and reports) the policy's gradient apart from the value head's; DeepSpeed's
        # one global norm covers both
        want = dict(one, grad_norm=math.hypot(one["grad_norm"], one.get("value_grad_norm", 0.0))) \
            if phase == "grad" else one
        for k in ("grad_norm", "actor_pg_loss", "editor_pg_loss", "judge_loss", "value_loss", "actor_entropy"):
            assert g[0]["stats"][k] == pytest.approx(want[k], rel=2e-4, abs=1e-6), (phase, k)
            assert g[1]["stats"][k] == g[0]["stats"][k], (phase, k)
        assert g[0]["stats"]["update_tokens"] == one["update_tokens"]

    # --- a real run: disjoint shares covering each batch, one writer, identical parameters, resume
    a = rec("run")
    for r in a:
        assert r["status_a"] == "paused" and r["resumed_update"] == 1 and r["status_b"] == "finished"
        assert r["after_load"] == r["after_a"], "resume did not restore this rank's parameters"
    for u in ("0", "1"):
        got = [set(r["rollout"][u]) for r in a]
        assert got[0] and got[1] and not got[0] & got[1], got
        assert got[0] | got[1] == set(a[0]["batches"][u]) and sum(map(len, got)) == len(a[0]["batches"][u])
    assert a[0]["after_a"] == a[1]["after_a"] and a[0]["after_b"] == a[1]["after_b"]
    assert a[0]["after_b"] != a[0]["after_a"]
    assert a[0]["history"] == a[1]["history"] and len(a[0]["history"]) == 2
    assert all(h["ranks"] == 2.0 for h in a[0]["history"])
    assert a[0]["history"][-1]["episodes_total"] == 8  # the batch's episodes, not one rank's
    assert a[0]["metrics_lines_a"] == 1, "metrics.jsonl was written by more than one rank"
    run = out / "run"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    with sqlite3.connect(tmp_path / "mlruns.db") as db:
        assert db.execute("select count(*) from runs").fetchone()[0] == 1
    assert (run / "model" / "omtr-model.json").is_file() and (run / "training_curve.png").is_file()
    import pandas as pd

    for u, r in ((0, 0), (0, 1), (1, 0), (1, 1)):
        log = run / "episodes" / "cycle-0000" / f"update-{u:06d}.rank-{r:04d}.parquet"
        assert set(pd.read_parquet(log)["task_id"]) == set(a[r]["rollout"][str(u)])
        assert "passed" in log.with_suffix(".validation.txt").read_text()
    assert not list(run.glob("episodes/*/update-??????.parquet"))
    ckpt = run / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "update-000002"
    assert {p.name for p in (ckpt / "update-000002").glob("rng-rank-*.pt")} == {"rng-rank-0000.pt", "rng-rank-0001.pt"}

    # --- the resumed run reaches the parameters and figures of the run never stopped
    st = rec("straight")
    assert [r["status"] for r in st] == ["finished", "finished"]
    assert st[0]["after"] == a[0]["after_b"] and st[1]["after"] == a[1]["after_b"]
    keep = ("reward_actor", "actor_pg_loss", "grad_norm", "episodes_total", "gen_tokens")
    assert [{k: h[k] for k in keep} for h in st[0]["history"]] == [{k: h[k] for k in keep} for h in a[0]["history"]]

    # --- more ranks than tasks: the idle rank steps with the other and ends with the same parameters
    i = rec("idle")
    assert [r["status"] for r in i] == ["finished", "finished"] and [r["episodes"] for r in i] == [2, 2]
    assert i[0]["rollout"] == [] and len(i[1]["rollout"]) == 1
    assert i[0]["changed"] and i[0]["after"] == i[1]["after"]

    # --- a stop asked on one rank stops both, with a checkpoint
    s = rec("stop")
    assert [r["status"] for r in s] == ["stopped", "stopped"] and [r["update"] for r in s] == [0, 0]
    assert (out / "stop" / "checkpoints" / "latest").is_file()

    # --- one rank's episode log fails: both stop before the update
    b = rec("badlog")
    assert all("invalid" in r and r["update"] == 0 for r in b)
    assert "[1]" in b[0]["invalid"]
