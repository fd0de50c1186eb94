"""The README's first command on a fresh clone: what the main job gives, run after run.

    python benchmarks/main_job.py                      # one run at HEAD of this checkout
    python benchmarks/main_job.py --runs 3 --commit abc1234 --out docs/results/main-job-DATE.json

Each run clones this repository at ``--commit`` (default HEAD; uncommitted changes are not part of
it) into a new temporary folder and runs ``mlflow run . -e main --env-manager local`` there, as the
README's first command does after its install. The install is not repeated: the run uses the
interpreter and packages this script runs on, with the clone's own ``src/`` first on PYTHONPATH (a
run checks that ``omtr`` is imported from the clone). Every run starts from nothing: its own
``mlruns.db``, ``.omtr/pipeline`` working folder and registry. The SmolLM2 conversion cache
(``$OMTR_CACHE``) is shared, as it is on a user's machine after the first run.

Per run: wall-clock seconds, the trained model's and the untrained model's validation metrics, the
paired faithful difference and its interval (the version's baseline.faithful_diff* tags), and the
promotion decision (champion or challenger, and why), read from the job's parent run. With
several runs the summary gives each outcome's count and the range of the metrics.
One JSON object to stdout (and ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(commit: str, i: int, keep: bool, extra: list[str]) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"omtr-main-job-{i}-"))
    clone = work / "omtr"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        env.pop(k, None)
    where = subprocess.run([sys.executable, "-c", "import omtr; print(omtr.__file__)"], env=env, cwd=clone,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not where.startswith(str(clone)):
        raise SystemExit(f"omtr is imported from {where}, not from the clone: the check would not be of a fresh clone")
    cmd = [str(Path(bin_dir) / "mlflow"), "run", ".", "-e", "main", "--env-manager", "local", *extra]
    t0 = time.monotonic()
    with open(work / "main-job.log", "w") as log:
        rc = subprocess.run(cmd, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds = round(time.monotonic() - t0)
    row = {"run": i, "exit_status": rc, "seconds": seconds, "log": str(work / "main-job.log")}
    row.update(_outcome(clone))
    print(f"[main-job] run {i}: {json.dumps(row)}", file=sys.stderr, flush=True)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
        row.pop("log")
    return row


def _outcome(clone: Path) -> dict:
    """The job's result from its own registry: both evaluations (the parent run's metrics) and the
    promotion decision stored on the version (``omtr.promotion``)."""
    import mlflow

    # `mlflow run` gives the job MLflow's default store, ./mlflow.db (MLflow 3); `omtr pipeline` run
    # by itself uses ./mlruns.db
    db = next((clone / f for f in ("mlflow.db", "mlruns.db") if (clone / f).is_file()), None)
    if db is None:
        return {"outcome": None, "tracking": None}
    uri = f"sqlite:///{db}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, filter_string="tags.`omtr.pipeline` = 'main'", max_results=1) if exps else []
    if not runs:
        return {"outcome": None}
    m = runs[0].data.metrics
    row = {"tracking": db.name, "trained": {k: m.get(k) for k in ("success", "faithful", "calls", "tasks")},
           "untrained": {k: m.get(f"baseline.{k}") for k in ("success", "faithful", "calls", "tasks")}}
    try:
        versions = client.search_model_versions("name='omtr-role-model'")
    except Exception:  # nothing registered
        versions = []
    if not versions:
        return {**row, "outcome": None}
    mv = max(versions, key=lambda v: int(v.version))
    decision = json.loads(mv.tags.get("omtr.promotion", "{}"))
    row.update({"version": mv.version, "outcome": "champion" if decision.get("promote") else "challenger",
                "reason": decision.get("reason"), "baseline_check": decision.get("baseline_check")})
    # the paired faithful difference (trained - untrained) the version was registered with
    tags = {k[len("baseline."):]: v for k, v in mv.tags.items() if k.startswith("baseline.")}
    if "faithful_diff" in tags:
        row["paired"] = {"diff": float(tags["faithful_diff"]), "low": float(tags["faithful_diff_low"]),
                         "high": float(tags["faithful_diff_high"]), "tasks": int(tags["paired_tasks"])}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", default="HEAD", help="the commit to clone (default HEAD)")
    ap.add_argument("--runs", type=int, default=1, help="how many fresh clones to run in turn (default 1)")
    ap.add_argument("--keep", action="store_true", help="keep each clone (its mlruns.db and the job's log)")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("extra", nargs="*", help="more `mlflow run` arguments after --, e.g. -- -P mode=full")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    out = {"command": "mlflow run . -e main --env-manager local", "commit": commit, "extra": args.extra,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_avg_start": os.getloadavg()}, "runs": []}
    for i in range(1, args.runs + 1):
        out["runs"].append(one_run(commit, i, args.keep, args.extra))
    out["machine"]["load_avg_end"] = os.getloadavg()
    outcomes = [r.get("outcome") for r in out["runs"]]
    out["summary"] = {"outcomes": {o: outcomes.count(o) for o in sorted(set(map(str, outcomes)))},
                      "seconds": [min(r["seconds"] for r in out["runs"]), max(r["seconds"] for r in out["runs"])]}
    for side in ("trained", "untrained"):
        for k in ("success", "faithful"):
            vals = [r[side][k] for r in out["runs"] if r.get(side) and r[side].get(k) is not None]
            if vals:
                out["summary"][f"{side}.{k}"] = [min(vals), max(vals)]
    diffs = [r["paired"]["diff"] for r in out["runs"] if r.get("paired")]
    if diffs:
        out["summary"]["paired.diff"] = [min(diffs), max(diffs)]
    text = json.dumps(out, indent=2, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
