"""The main job: prepare -> train -> evaluate -> evaluate-baseline -> validate -> register -> promote,
as nested MLflow runs.

Each step is one ``omtr`` subcommand run as a subprocess inside its own nested run (the subcommand
joins that run through ``MLFLOW_RUN_ID``). Steps hand over their outputs as MLflow run artifacts:
a step downloads what it needs from the earlier steps' runs, never from their working folders.

Content keys: a step's key hashes its parameters, the keys of the steps it reads from, and the
source version (:func:`omtr.tracking.source.source_version`: the git commit, whether the tree is
dirty and a hash of its uncommitted changes, and the hash of omtr's own files, which names the code
where there is no git). A step whose key already has a finished run (tag ``omtr.step_done``) is not
run again; a nested run tagged ``omtr.reused_run`` points at the finished one and says why it was
reused (``omtr.reuse_reason``). A finished run with the same parameters but other code is not
reused, and the log says so. Training works in ``WORK/train-KEY``; a killed
training step leaves its checkpoints there and an unfinished run with its key, which the next
``omtr pipeline`` reopens and continues with ``omtr train --resume``.

``evaluate-baseline`` evaluates the model training starts from (the untrained one: the training
profile's model or ``--model``, with the decoding training gives it) on the same validation tasks
with the same budget, token limit, bootstrap and seed as ``evaluate``. Its key holds the tasks, that
model and those settings, not the training step's, so runs that train differently from the same
start reuse it. ``register`` writes its metrics as ``baseline.*`` tags and, from both evaluations'
per-task records (their runs' traces.jsonl), the paired faithful difference (trained - untrained)
with its 95% bootstrap interval; ``promote`` refuses a version whose faithful success is not above
the baseline's (rule point) or whose paired interval does not lie above 0 (rule ci). Planner success
never decides. Leave it out of ``steps`` to register without a baseline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

log = logging.getLogger("omtr.pipeline")

STEPS = ("prepare", "train", "evaluate", "evaluate-baseline", "validate", "register", "promote")
KEY_TAG, DONE_TAG, STEP_TAG, REUSED_TAG = "omtr.step_key", "omtr.step_done", "omtr.step", "omtr.reused_run"
PARAMS_KEY_TAG, SOURCE_TAG, REASON_TAG = "omtr.params_key", "omtr.source", "omtr.reuse_reason"


@dataclass(frozen=True)
class PipelineConfig:
    """Everything the main job's result depends on (and so its content keys)."""

    profile: str = "small"  # training profile (small, paper, micro); also the model unless `model` is set
    model: str = ""  # model directory or profile to start from ("": the profile's)
    # generated tasks' family: `mix` (every generator family, the tasks split evenly and
    # interleaved), one, or several comma-separated (omtr tasks generate --family)
    family: str = "mix"
    mode: str = "given"  # given: tasks give the family's domain (the Actor writes the problem); full: both
    n_train: int = 8  # training tasks
    n_val: int = 24  # validation tasks, for both the trained and the untrained model (the promotion gate's sample)
    min_objects: int = 2
    max_objects: int = 4
    # validation tasks' largest size (0: max_objects). BlocksWorld's validation split holds only 23
    # distinct tasks of 2-4 blocks, so the small profile's 24 validation tasks reach 5 blocks.
    val_max_objects: int = 5
    seed: int = 0
    train_set: tuple[str, ...] = ()  # extra `omtr train --set k=v`
    eval_budget: int = 2  # planner calls per validation task
    eval_max_new_tokens: int = 448  # token limit per answer in evaluation and serving
    bootstrap: int = 1000
    name: str = "omtr-role-model"  # registered model
    rule: str = "point"  # promotion rule (point, ci)
    serve_budget: int = 6  # planner calls per served task

    def __post_init__(self) -> None:
        if self.n_train < 1 or self.n_val < 1:
            raise ValueError("n_train and n_val must be at least 1")
        if self.rule not in ("point", "ci"):
            raise ValueError(f"unknown promotion rule {self.rule!r}; choose point or ci")
        if self.mode not in ("given", "full"):
            raise ValueError(f"unknown task mode {self.mode!r}; choose given (the domain is given) or full")
        if self.eval_budget < 1 or self.serve_budget < 1:
            raise ValueError("eval_budget and serve_budget must be at least 1")
        from omtr.tasks.generators import GenerationError, family_list

        try:
            family_list(self.family)
        except GenerationError as exc:
            raise ValueError(str(exc)) from None
        if self.val_max_objects and self.val_max_objects < self.min_objects:
            raise ValueError(f"val_max_objects ({self.val_max_objects}) is below min_objects ({self.min_objects}); "
                             "set it to 0 to validate on the training sizes")

    @property
    def val_objects(self) -> int:
        """The validation tasks' largest size."""
        return self.val_max_objects or self.max_objects


# What `-P profile=paper` changes when the caller leaves the numbers at the small defaults.
PROFILE_DEFAULTS = {
    "small": {},
    "micro": {"n_train": 4, "n_val": 2, "val_max_objects": 0, "eval_max_new_tokens": 24, "bootstrap": 200, "mode": "full",
              "train_set": ("cycles=1", "updates_per_cycle=1")},
    "paper": {"n_train": 1000, "n_val": 100, "max_objects": 6, "val_max_objects": 0, "eval_budget": 6,
              "eval_max_new_tokens": 700,
              "mode": "full"},
}


def for_profile(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with its profile's defaults filled in where ``cfg`` still has the small ones."""
    base = PipelineConfig()
    over = {k: v for k, v in PROFILE_DEFAULTS.get(cfg.profile, {}).items() if getattr(cfg, k) == getattr(base, k)}
    return replace(cfg, **over)


MODES = ("profile", "given", "full")  # a run's task mode; profile: the profile's own (PROFILE_DEFAULTS)


def task_mode(profile: str, mode: str = "profile") -> str:
    """The task mode a run uses: ``mode`` when it names one (given, full), else the profile's
    default (small: given; micro and paper: full). The main job and the Kubeflow pipeline's
    prepare step both resolve it here."""
    if mode not in MODES:
        raise ValueError(f"unknown task mode {mode!r}; choose given (the domain is given), full, or profile "
                         "(the profile's own)")
    return mode if mode != "profile" else for_profile(PipelineConfig(profile=profile)).mode


def start_point(cfg: PipelineConfig) -> tuple[str, str]:
    """The model training starts from and the decoding constraint training gives it ("": the
    model's own), resolved as ``omtr train --profile P [--model M] --set ...`` resolves them: the
    untrained model the ``evaluate-baseline`` step evaluates."""
    from omtr.config import ConfigError
    from omtr.rl.config import train_profile

    try:
        t = train_profile(cfg.profile).with_overrides(list(cfg.train_set))
    except ConfigError as exc:
        raise StepFailed(f"the training settings do not resolve: {exc}") from None
    model = cfg.model or t.model
    if t.decoding is not None:
        decoding = t.decoding
    elif t.grammar is False:
        decoding = "off"
    elif t.grammar is True:  # the grammar turned on: the model's own constraint, scoped by default
        from omtr.config import MODEL_PROFILES

        decoding = MODEL_PROFILES[model].decoding if model in MODEL_PROFILES else "scoped"
    else:
        decoding = ""
    return model, decoding


def baseline_params(cfg: PipelineConfig, prepare_key: str) -> dict:
    """What the ``evaluate-baseline`` step's key holds: the tasks, the start model and its decoding,
    and ``evaluate``'s settings; no training setting other than those two."""
    model, decoding = start_point(cfg)
    return {"prepare_key": prepare_key, "model": model, "decoding": decoding, "budget": cfg.eval_budget,
            "max_new_tokens": cfg.eval_max_new_tokens, "bootstrap": cfg.bootstrap, "seed": cfg.seed}


def _key(step: str, params: dict, source: dict | None = None) -> str:
    """The step's content key: its parameters (with the keys of its inputs) and, given, the source."""
    blob = json.dumps({"step": step, **params, **({"source": source} if source is not None else {})},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class StepResult:
    step: str
    key: str
    run_id: str  # the run that holds the step's outputs (the reused one when skipped)
    skipped: bool
    info: dict = field(default_factory=dict)


class Pipeline:
    def __init__(self, cfg: PipelineConfig, work: str | Path, *, experiment: str = "omtr-main",
                 tracking_uri: str | None = None, quiet: bool = False, steps: tuple[str, ...] = STEPS,
                 source: dict | None = None):
        import mlflow

        from omtr.paths import default_tracking_uri
        from omtr.tracking.source import source_version

        self.source = source if source is not None else source_version()
        self.cfg, self.work, self.experiment, self.quiet = cfg, Path(work).resolve(), experiment, quiet
        self.uri = tracking_uri or default_tracking_uri()
        self.steps = steps
        self.mlflow = mlflow
        mlflow.set_tracking_uri(self.uri)
        mlflow.set_registry_uri(self.uri)
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, StepResult] = {}

    # ------------------------------------------------------------------ helpers

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(msg, flush=True)

    def _find(self, key: str, *, done: bool, tag: str = KEY_TAG):
        """The newest run of this experiment with this key (finished ones only when ``done``)."""
        filt = f"tags.`{tag}` = '{key}'"
        if done:
            filt += f" and tags.`{DONE_TAG}` = 'true'"
        runs = self.mlflow.search_runs(experiment_ids=[self.exp_id], filter_string=filt,
                                       order_by=["attributes.start_time DESC"], max_results=1, output_format="list")
        return runs[0] if runs else None

    def _omtr(self, args: list[str], run_id: str, *, ok=(0,)) -> int:
        env = {**os.environ, "MLFLOW_TRACKING_URI": self.uri, "MLFLOW_RUN_ID": run_id,
               "MLFLOW_EXPERIMENT_ID": self.exp_id}
        cmd = [sys.executable, "-m", "omtr", *(["-q"] if self.quiet else []), *args]
        self._say("  $ omtr " + " ".join(args))
        rc = subprocess.run(cmd, env=env).returncode
        if rc not in ok:
            raise StepFailed(f"`omtr {' '.join(args)}` exited with status {rc}")
        return rc

    def _download(self, run_id: str, path: str) -> Path:
        dst = self.work / "artifacts" / run_id
        dst.mkdir(parents=True, exist_ok=True)
        return Path(self.mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=str(dst)))

    def _step(self, step: str, params: dict, body) -> StepResult:
        """Run ``body(run_id, key) -> info`` in a nested run unless a finished run has the same key."""
        from omtr.tracking.source import describe

        mlflow = self.mlflow
        key, params_key = _key(step, params, self.source), _key(step, params)
        here = describe(self.source)
        done = self._find(key, done=True)
        if done is not None:
            reason = f"same parameters, inputs and source ({here}) as finished run {done.info.run_id}"
            with mlflow.start_run(run_name=f"{step} (reused)", nested=True) as r:
                mlflow.set_tags({STEP_TAG: step, KEY_TAG + ".reused": key, REUSED_TAG: done.info.run_id,
                                 REASON_TAG: reason})
            self._say(f"[{step}] reused: {reason}")
            info = json.loads(done.data.tags.get("omtr.step_info", "{}"))
            res = StepResult(step, key, done.info.run_id, True, info)
            self.results[step] = res
            return res
        other = self._find(params_key, done=True, tag=PARAMS_KEY_TAG)
        if other is not None:
            then = other.data.tags.get(SOURCE_TAG, "unknown code")
            self._say(f"[{step}] not reusing run {other.info.run_id}: same parameters, but it ran on {then} "
                      f"and this is {here}")
        unfinished = self._find(key, done=False)
        if unfinished is not None and step == "train":
            run = mlflow.start_run(run_id=unfinished.info.run_id, nested=True)
            self._say(f"[{step}] continuing unfinished run {unfinished.info.run_id}")
        else:
            run = mlflow.start_run(run_name=step, nested=True)
            mlflow.set_tags({STEP_TAG: step, KEY_TAG: key, PARAMS_KEY_TAG: params_key, SOURCE_TAG: here,
                             **{f"omtr.source.{k}": str(v) for k, v in self.source.items()}})
            mlflow.log_params({f"{step}.{k}": (json.dumps(v) if isinstance(v, (list, tuple, dict)) else v)
                               for k, v in params.items() if not k.endswith("_key")})
        run_id = run.info.run_id
        self._say(f"[{step}] run {run_id}")
        try:
            info = body(run_id, key) or {}
        except BaseException:
            mlflow.end_run(status="FAILED" if step != "train" else "KILLED")
            raise
        # a subcommand may have ended the run from its own process: reopen to mark it done
        mlflow.end_run()
        with mlflow.start_run(run_id=run_id, nested=True):
            mlflow.set_tags({DONE_TAG: "true", "omtr.step_info": json.dumps(info)[:4000]})
        res = StepResult(step, key, run_id, False, info)
        self.results[step] = res
        return res

    # ------------------------------------------------------------------ steps

    def prepare(self) -> StepResult:
        c = self.cfg
        params = {"family": c.family, "n_train": c.n_train, "n_val": c.n_val, "min_objects": c.min_objects,
                  "max_objects": c.max_objects, "seed": c.seed}
        if c.mode != "full":  # full-mode keys stay what they were before the mode existed
            params["mode"] = c.mode
        if c.val_objects != c.max_objects:  # keys stay what they were where validation has the training sizes
            params["val_max_objects"] = c.val_objects

        def body(run_id, key):
            out = self.work / f"prepare-{key}"
            out.mkdir(parents=True, exist_ok=True)
            for split, n, hi in (("train", c.n_train, c.max_objects), ("val", c.n_val, c.val_objects)):
                self._omtr(["tasks", "generate", "--family", c.family, "--n", str(n), "--seed", str(c.seed),
                            "--split", split, "--min-objects", str(c.min_objects), "--max-objects",
                            str(hi), "--out", str(out / f"{split}.jsonl")]
                           + (["--given-domain"] if c.mode == "given" else []), run_id)
            self.mlflow.log_artifacts(str(out), "tasks")
            return {"train": "tasks/train.jsonl", "val": "tasks/val.jsonl"}

        return self._step("prepare", params, body)

    def train(self, prep: StepResult) -> StepResult:
        c = self.cfg
        sets = [*c.train_set, "save_model_every_cycle=true"]
        params = {"prepare_key": prep.key, "profile": c.profile, "model": c.model, "set": list(sets)}

        def body(run_id, key):
            tasks = self._download(prep.run_id, "tasks/train.jsonl")
            out = self.work / f"train-{key}"
            if (out / "checkpoints" / "latest").is_file():  # omtr.rl.checkpoint.LATEST: a complete checkpoint
                args = ["train", "--tasks", str(tasks), "--out", str(out), "--resume"]
                self._say(f"[train] resuming from the checkpoint in {out}")
            else:
                args = ["train", "--tasks", str(tasks), "--out", str(out), "--profile", c.profile]
                args += ["--model", c.model] if c.model else []
                for s in sets:
                    args += ["--set", s]
            self._omtr(args, run_id)
            if not (out / "model").is_dir():
                raise StepFailed(f"training finished without a model directory in {out}")
            self.mlflow.log_artifacts(str(out / "model"), "model")
            self.mlflow.log_artifacts(str(out / "episodes"), "episodes")
            for f in ("metrics.jsonl", "training_curve.png", "config.json"):
                if (out / f).is_file():
                    self.mlflow.log_artifact(str(out / f))
            return {"model": "model", "episodes": "episodes"}

        return self._step("train", params, body)

    def evaluate(self, prep: StepResult, train: StepResult) -> StepResult:
        c = self.cfg
        params = {"prepare_key": prep.key, "train_key": train.key, "budget": c.eval_budget,
                  "max_new_tokens": c.eval_max_new_tokens, "bootstrap": c.bootstrap, "seed": c.seed}

        def body(run_id, key):
            tasks = self._download(prep.run_id, "tasks/val.jsonl")
            model = self._download(train.run_id, "model")
            out = self.work / f"evaluate-{key}"
            self._omtr(["evaluate", "--policy", "model", "--model", str(model), "--tasks", str(tasks), "--out",
                        str(out), "--budget", str(c.eval_budget), "--max-new-tokens", str(c.eval_max_new_tokens),
                        "--fit-statement", "--bootstrap", str(c.bootstrap), "--seed", str(c.seed), "--overwrite", "--track"], run_id)
            m = json.loads((out / "metrics.json").read_text())
            return {k: m.get(k) for k in ("success", "faithful", "drift", "calls", "tasks")}

        return self._step("evaluate", params, body)

    def evaluate_baseline(self, prep: StepResult) -> StepResult:
        """The untrained model (where training starts) on the validation split, as ``evaluate``."""
        c = self.cfg
        params = baseline_params(c, prep.key)
        model, decoding = params["model"], params["decoding"]

        def body(run_id, key):
            tasks = self._download(prep.run_id, "tasks/val.jsonl")
            out = self.work / f"evaluate-baseline-{key}"
            self._omtr(["evaluate", "--policy", "model", "--model", model, "--tasks", str(tasks), "--out", str(out),
                        "--budget", str(c.eval_budget), "--max-new-tokens", str(c.eval_max_new_tokens),
                        "--fit-statement", "--bootstrap", str(c.bootstrap), "--seed", str(c.seed), "--overwrite", "--track",
                        *(["--decoding", decoding] if decoding else [])], run_id)
            m = json.loads((out / "metrics.json").read_text())
            return {**{k: m.get(k) for k in ("success", "faithful", "drift", "calls", "tasks")},
                    "model": model, "decoding": decoding}

        return self._step("evaluate-baseline", params, body)

    def validate(self, train: StepResult, ev: StepResult) -> StepResult:
        params = {"train_key": train.key, "evaluate_key": ev.key}

        def body(run_id, key):
            logs = sorted(self._download(train.run_id, "episodes").rglob("*.parquet"))
            try:
                logs.append(self._download(ev.run_id, "episodes.parquet"))
            except Exception as exc:  # an evaluation run without an episode log
                raise StepFailed(f"the evaluation run {ev.run_id} has no episodes.parquet ({exc})") from None
            out = self.work / f"validate-{key}"
            out.mkdir(parents=True, exist_ok=True)
            failed = []
            for i, f in enumerate(logs):
                report = out / f"{i:03d}-{f.stem}.json"
                rc = self._omtr(["validate-episodes", str(f), "--json", str(report)], run_id, ok=(0, 1))
                if rc:
                    failed.append(str(f))
            self.mlflow.log_artifacts(str(out), "validation")
            self.mlflow.log_metrics({"logs_checked": len(logs), "logs_failed": len(failed)})
            if failed:
                raise StepFailed(f"episode logs failed validation: {failed} (reports in {out})")
            return {"logs": len(logs)}

        return self._step("validate", params, body)

    def register(self, train: StepResult, ev: StepResult, val: StepResult,
                 base: StepResult | None = None) -> StepResult:
        c = self.cfg
        params = {"train_key": train.key, "evaluate_key": ev.key, "validate_key": val.key, "name": c.name,
                  "serve_budget": c.serve_budget, "max_new_tokens": c.eval_max_new_tokens,
                  "baseline_key": base.key if base else ""}

        def body(run_id, key):
            model = self._download(train.run_id, "model")
            metrics = self._download(ev.run_id, "metrics.json")
            out = self.work / f"register-{key}.json"
            args = ["register", "--model-dir", str(model), "--name", c.name, "--metrics", str(metrics),
                    "--train-run", train.run_id, "--eval-run", ev.run_id, "--budget", str(c.serve_budget),
                    "--max-new-tokens", str(c.eval_max_new_tokens), "--json", str(out)]
            if base is not None:
                self._check_start(train, base)
                args += ["--baseline-run", base.run_id,
                         "--baseline-metrics", str(self._download(base.run_id, "metrics.json"))]
                # both evaluations' per-task records: the paired faithful difference and its interval
                args += ["--traces", str(self._traces(ev)), "--baseline-traces", str(self._traces(base))]
            else:
                self._say("[register] no evaluate-baseline step: registering without baseline.* tags "
                          "(promotion will not compare the version with its untrained model)")
            self._omtr(args, run_id)
            r = json.loads(out.read_text())
            return {"name": r["name"], "version": r["version"], "model_uri": r["model_uri"],
                    "baseline": bool(r.get("baseline")), "paired": r.get("paired")}

        return self._step("register", params, body)

    def _traces(self, ev: StepResult) -> Path:
        """An evaluation run's per-task records (``omtr evaluate --track`` logs its traces.jsonl)."""
        try:
            return self._download(ev.run_id, "traces.jsonl")
        except Exception as exc:  # an evaluation run without its records
            raise StepFailed(f"the {ev.step} run {ev.run_id} has no traces.jsonl, so the paired faithful difference "
                             f"cannot be computed ({str(exc).splitlines()[0]}); run that evaluation again") from None

    def _check_start(self, train: StepResult, base: StepResult) -> None:
        """The baseline must be the model the training run started from (its config.json's ``model``)."""
        try:
            saved = json.loads(self._download(train.run_id, "config.json").read_text())
        except Exception:  # a training run without config.json: nothing to check against
            self._say(f"[register] training run {train.run_id} has no config.json: the baseline's model "
                      f"({base.info.get('model')}) is not checked against it")
            return
        if base.info.get("model") and saved.get("model") != base.info["model"]:
            raise StepFailed(f"the baseline evaluated {base.info['model']!r} but training run {train.run_id} "
                             f"started from {saved.get('model')!r}")

    def promote(self, reg: StepResult) -> StepResult:
        c = self.cfg
        params = {"register_key": reg.key, "rule": c.rule}

        def body(run_id, key):
            out = self.work / f"promote-{key}.json"
            rc = self._omtr(["promote", "--name", reg.info["name"], "--version", str(reg.info["version"]),
                             "--rule", c.rule, "--json", str(out)], run_id, ok=(0, 1))
            d = json.loads(out.read_text())
            return {"promoted": rc == 0, "reason": d["reason"], "version": reg.info["version"],
                    "baseline_check": d.get("baseline_check"), "paired": d.get("paired")}

        return self._step("promote", params, body)

    # ------------------------------------------------------------------ the whole job

    def run(self) -> dict:
        from omtr.tracking import start_run

        mlflow = self.mlflow
        with start_run(self.experiment, f"main-{self.cfg.profile}", self.uri) as parent:
            self.exp_id = parent.info.experiment_id
            mlflow.log_params({f"pipeline.{k}": (json.dumps(v) if isinstance(v, tuple) else v)
                               for k, v in asdict(self.cfg).items()})
            mlflow.set_tag("omtr.pipeline", "main")
            prep = self.prepare()
            want_base = "evaluate-baseline" in self.steps
            base = None
            if "train" in self.steps:
                tr = self.train(prep)
                if "evaluate" in self.steps:
                    ev = self.evaluate(prep, tr)
                    base = self.evaluate_baseline(prep) if want_base else None
                    va = self.validate(tr, ev) if "validate" in self.steps else None
                    if va and "register" in self.steps:
                        reg = self.register(tr, ev, va, base)
                        if "promote" in self.steps:
                            self.promote(reg)
            if want_base and base is None:  # the untrained model alone (no training in this run)
                self.evaluate_baseline(prep)
            summary = {s: {"run_id": r.run_id, "skipped": r.skipped, **r.info} for s, r in self.results.items()}
            mlflow.log_dict(summary, "pipeline.json")
            for s, r in self.results.items():
                mlflow.set_tag(f"step.{s}.run_id", r.run_id)
            paired = (self.results["register"].info.get("paired") or {}) if "register" in self.results else {}
            if paired:
                mlflow.log_metrics({f"paired.{k}": float(paired[k]) for k in ("diff", "low", "high", "tasks")})
            for step, prefix in (("evaluate", ""), ("evaluate-baseline", "baseline.")):
                if step in self.results:
                    mlflow.log_metrics({prefix + k: float(v) for k, v in self.results[step].info.items()
                                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
            summary["parent_run_id"] = parent.info.run_id
        return summary


class StepFailed(Exception):
    """A step's command failed; the message names it. Finished steps are kept for the next run."""
