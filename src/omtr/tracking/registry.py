"""The model registry: register a role model with its evaluation, promote versions with aliases.

A new version gets the alias ``challenger``. :func:`promote` moves ``champion`` to it only when it
beats the current champion on FAITHFUL success on the validation split (or there is no champion).
Planner success and planner calls never decide: a model that solves more tasks without being more
faithful has learned to please the planner, not to describe the task, and is not promoted. A tie
is not a promotion (the champion stays). The rules in :data:`RULES`:

* ``point`` (default): the version's faithful success must be strictly above the champion's (and,
  at the baseline gate, strictly above the untrained model's).
* ``ci``: better beyond noise. Against the champion, the lower end of the version's 95% bootstrap
  interval of faithful success is above the champion's faithful success; at the baseline gate, the
  lower end of the paired 95% interval of the per-task difference (trained - untrained) is above 0.

The baseline gate comes first: a version that carries ``baseline.*`` tags (the untrained model's
evaluation on the same validation tasks, the model training started from) is refused unless it
passes the rule against them. When the version was registered with both evaluations' per-task
records (``traces.jsonl``), :func:`paired_faithful` pairs them by task id: the per-task faithful
grade (1 when the final spec was solved and the checker found no drift against the reference, else
0), the mean of trained - untrained and its paired percentile bootstrap 95% interval (seeded), kept
as ``baseline.faithful_diff``, ``baseline.faithful_diff_low``/``_high`` and
``baseline.paired_tasks``. A version registered without per-task records still works: its
difference is unknown, the ``point`` rule applies, the ``ci`` gate refuses it and says why. A
version without baseline tags is judged against the champion alone (the decision says no baseline
was recorded). ``force`` overrides both the gate and the rule.

Every decision (rule, both versions' inputs, the baseline, the paired difference, the outcome and
why) is returned as a dict, written to the version's ``omtr.promotion`` tag, and logged to the
active MLflow run when there is one. Evaluation metrics live on each version as tags
(``metric.faithful``, ``metric.success``, ``metric.calls``, ``metric.faithful_ci_low``/``_high``
...), the untrained model's as ``baseline.*`` with the same names, with ``omtr.eval_run_id``,
``omtr.train_run_id`` and ``omtr.baseline_run_id`` linking to the runs behind them.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, replace

log = logging.getLogger("omtr.registry")

DEFAULT_NAME = "omtr-role-model"
CHAMPION, CHALLENGER = "champion", "challenger"
RULES = ("point", "ci")
METRIC_PREFIX, BASELINE_PREFIX = "metric.", "baseline."
PRIMARY = "faithful"  # the metric both rules rank by first, and the one the baseline gate compares
METRIC_TAGS = ("faithful", "success", "calls", "drift", "faithful_ci_low", "faithful_ci_high",
               "success_ci_low", "success_ci_high", "tasks")


PAIRED_TAGS = ("faithful_diff", "faithful_diff_low", "faithful_diff_high", "paired_tasks")  # under baseline.
PAIRED_BOOTSTRAP, PAIRED_SEED = 10000, 0


class PromotionError(Exception):
    """A request the registry cannot serve (unknown model or version, missing metrics, records that
    do not pair)."""


def _num(tags: dict, key: str) -> float | None:
    v = tags.get(key)
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class Scores:
    """What the rule reads from a version's tags."""

    version: str
    faithful: float | None
    success: float | None
    calls: float | None
    faithful_ci_low: float | None = None
    faithful_ci_high: float | None = None

    @classmethod
    def from_tags(cls, version: str, tags: dict, prefix: str = METRIC_PREFIX) -> "Scores":
        """The scores in ``tags`` under ``prefix`` (``metric.``: the version's; ``baseline.``: the
        untrained model's it was compared with)."""
        return cls(version, *(_num(tags, f"{prefix}{k}") for k in
                              ("faithful", "success", "calls", "faithful_ci_low", "faithful_ci_high")))


@dataclass(frozen=True)
class Paired:
    """The paired difference of faithful success, trained - untrained, on the tasks both evaluated:
    the mean of the per-task 0/1 differences and its paired bootstrap 95% interval."""

    diff: float
    low: float
    high: float
    tasks: int
    trained: float | None = None  # faithful success of each side on the paired tasks
    untrained: float | None = None
    bootstrap: int = PAIRED_BOOTSTRAP
    seed: int = PAIRED_SEED

    def tags(self) -> dict[str, str]:
        p = BASELINE_PREFIX
        return {f"{p}faithful_diff": repr(self.diff), f"{p}faithful_diff_low": repr(self.low),
                f"{p}faithful_diff_high": repr(self.high), f"{p}paired_tasks": str(self.tasks),
                f"{p}paired_bootstrap": str(self.bootstrap), f"{p}paired_seed": str(self.seed),
                **{f"{p}paired_{k}": repr(v) for k, v in (("trained", self.trained), ("untrained", self.untrained))
                   if v is not None}}

    @classmethod
    def from_tags(cls, tags: dict) -> "Paired | None":
        """The paired difference a version was registered with, or None (registered without
        per-task records)."""
        p = BASELINE_PREFIX
        vals = [_num(tags, p + k) for k in PAIRED_TAGS]
        if any(v is None for v in vals):
            return None
        b, s = _num(tags, p + "paired_bootstrap"), _num(tags, p + "paired_seed")
        trained, untrained = _num(tags, p + "paired_trained"), _num(tags, p + "paired_untrained")
        return cls(vals[0], vals[1], vals[2], int(vals[3]),
                   trained if trained is not None else _num(tags, METRIC_PREFIX + "faithful"),
                   untrained if untrained is not None else _num(tags, p + "faithful"),
                   int(b) if b is not None else PAIRED_BOOTSTRAP,
                   int(s) if s is not None else PAIRED_SEED)


def faithful_grades(records, *, what: str = "records") -> dict[str, int]:
    """Per task id, the evaluation's faithful grade: 1 when the final spec was solved and the
    checker, comparing it with the task's reference, found no drift; 0 otherwise. ``records`` are
    the lines of an ``omtr evaluate`` ``traces.jsonl`` (planning episodes; transfer and plan
    answers are skipped, as are tasks without a reference, which have no faithful grade: the same
    tasks and grades metrics.json's ``faithful`` averages). A task id seen twice keeps its last
    record (an evaluation continued with --resume)."""
    grades: dict[str, int] = {}
    twice = 0
    for i, r in enumerate(records):
        if not isinstance(r, dict) or "id" not in r:
            raise PromotionError(f"{what}: record {i + 1} is not an evaluation record (no task id); give the "
                                 "traces.jsonl that `omtr evaluate` wrote")
        if r.get("kind", "planning") != "planning":
            continue
        f = r.get("faithful") or {}
        if not f.get("reference"):
            continue
        tid = str(r["id"])
        twice += tid in grades
        grades[tid] = int(bool(r.get("success")) and bool(f.get("checked")) and bool(f.get("faithful")))
    if twice:
        log.warning("%s: %d task id(s) appear more than once; the last record of each counts", what, twice)
    return grades


def paired_faithful(trained, untrained, *, bootstrap: int = PAIRED_BOOTSTRAP, seed: int = PAIRED_SEED) -> Paired:
    """Pair two evaluations' records (``trained`` and ``untrained``: traces.jsonl lines, or the
    grades :func:`faithful_grades` gives) by task id and return the mean per-task faithful
    difference trained - untrained with its percentile bootstrap 95% interval: each of ``bootstrap``
    resamples draws the paired tasks with replacement (seeded: the same inputs give the same
    interval). Both must cover the same tasks."""
    import numpy as np

    ga = trained if isinstance(trained, dict) else faithful_grades(trained, what="the trained model's records")
    gb = untrained if isinstance(untrained, dict) else faithful_grades(untrained, what="the untrained model's records")
    if bootstrap < 1:
        raise PromotionError(f"bootstrap must be at least 1, got {bootstrap}")
    only_a, only_b = sorted(set(ga) - set(gb)), sorted(set(gb) - set(ga))
    if only_a or only_b:
        def show(ids):
            return ", ".join(ids[:3]) + (" ..." if len(ids) > 3 else "")
        raise PromotionError(
            "the trained and the untrained model were not evaluated on the same tasks "
            f"({len(ga)} vs {len(gb)} graded tasks; only the trained model's: {len(only_a)} {show(only_a)}; only "
            f"the untrained model's: {len(only_b)} {show(only_b)}): evaluate both on the same validation tasks")
    ids = sorted(ga)
    if not ids:
        raise PromotionError("no task with a reference in the evaluations' records: there is no faithful grade to "
                             "pair (evaluate on tasks that carry references)")
    d = np.array([ga[i] - gb[i] for i in ids], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(d), size=(bootstrap, len(d)))
    means = d[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    r = lambda x: round(float(x), 6)  # noqa: E731
    return Paired(r(d.mean()), r(lo), r(hi), len(ids), r(np.mean([ga[i] for i in ids])),
                  r(np.mean([gb[i] for i in ids])), bootstrap, seed)


def read_records(path) -> list[dict]:
    """The lines of a traces.jsonl file."""
    from pathlib import Path

    out = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PromotionError(f"{path}: cannot read the evaluation's per-task records ({exc})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                raise PromotionError(f"{path}, line {n}: not JSON ({exc}); give the traces.jsonl that "
                                     "`omtr evaluate` wrote") from None
    return out


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    rule: str
    challenger: Scores
    champion: Scores | None
    baseline: Scores | None = None  # the untrained model's scores (baseline.* tags); None: none recorded
    baseline_check: str = ""  # the gate's verdict in words
    paired: Paired | None = None  # the paired difference against the baseline; None: unknown

    def to_dict(self) -> dict:
        return {"promote": self.promote, "reason": self.reason, "rule": self.rule,
                "challenger": asdict(self.challenger), "champion": asdict(self.champion) if self.champion else None,
                "baseline": asdict(self.baseline) if self.baseline else None, "baseline_check": self.baseline_check,
                "paired": asdict(self.paired) if self.paired else None}


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


def _signed(x: float) -> str:
    return f"{x:+.3f}"


def paired_text(paired: Paired | None) -> str:
    """The paired difference in words (or why it is unknown)."""
    if paired is None:
        return ("paired difference unknown (registered without per-task records: "
                "register with both evaluations' traces.jsonl to get it)")
    return (f"paired difference {_signed(paired.diff)}, 95% interval [{_signed(paired.low)}, "
            f"{_signed(paired.high)}] over {paired.tasks} paired tasks")


def baseline_check(challenger: Scores, baseline: Scores | None, rule: str = "point",
                   paired: Paired | None = None) -> tuple[bool | None, str]:
    """The baseline gate, on faithful success only: (True, why) when the version beats the
    untrained model by ``rule`` (``point``: its faithful success is strictly above
    ``baseline.faithful``; ``ci``: the paired interval's lower end is above 0), (False, why)
    otherwise (a tie, or more planner success alone, is no promotion); (None, why) when no baseline
    was recorded. ``why`` names both faithful rates and the paired difference."""
    c = challenger
    if baseline is None or baseline.faithful is None:
        return None, f"no baseline recorded for version {c.version} (no baseline.{PRIMARY} tag): the rule alone decides"
    if c.faithful is None:
        return False, (f"version {c.version} has no faithful-success metric (metric.{PRIMARY}) to compare with the "
                       f"untrained model's {_fmt(baseline.faithful)}; register it with its evaluation's metrics.json")
    rates = (f"faithful success {_fmt(c.faithful)} against the untrained model's {_fmt(baseline.faithful)} "
             f"(baseline.{PRIMARY}), {paired_text(paired)}")
    if rule == "ci":
        if paired is None:
            return False, f"rule ci: {rates}; the ci gate needs the paired interval"
        if paired.low > 0:
            return True, f"rule ci: {rates}: the interval's lower end is above 0"
        return False, f"rule ci: {rates}: the interval's lower end is not above 0"
    if c.faithful > baseline.faithful:
        return True, f"{rates}: higher"
    if c.faithful == baseline.faithful:
        extra = ""
        if c.success is not None and baseline.success is not None and c.success > baseline.success:
            extra = (f" (planner success {_fmt(c.success)} against {_fmt(baseline.success)} does not count: "
                     "solving more without being more faithful is no improvement)")
        return False, f"{rates}: a tie is no improvement{extra}"
    return False, f"{rates}: lower"


def decide(challenger: Scores, champion: Scores | None, rule: str = "point", baseline: Scores | None = None,
           paired: Paired | None = None) -> Decision:
    """The promotion rule as a pure function: first the baseline gate (when ``baseline`` has a
    faithful-success value the version must beat it: :func:`baseline_check`), then the rule against
    the champion, on faithful success only (a tie keeps the champion)."""
    if rule not in RULES:
        raise PromotionError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    gate, check = baseline_check(challenger, baseline, rule, paired)

    def d(ok: bool, why: str) -> Decision:
        return Decision(ok, why, rule, challenger, champion, baseline, check, paired)

    if champion is not None and champion.version == challenger.version:
        return d(False, f"version {challenger.version} is already the champion")
    c, k = challenger, champion
    if gate is False:
        return d(False, f"{check}: version {c.version} is not more faithful than the model training started from "
                        "(use --force to promote it anyway)")
    if champion is None:
        return d(True, "there is no champion yet")
    if c.faithful is None:
        return d(False, f"version {c.version} has no faithful-success metric (tag metric.faithful); "
                        "register it with an evaluation's metrics.json, or use --force")
    if k.faithful is None:
        return d(True, f"champion {k.version} has no faithful-success metric; version {c.version} has {_fmt(c.faithful)}")
    if rule == "ci":
        if c.faithful_ci_low is None:
            return d(False, f"rule ci: version {c.version} has no confidence interval (metric.faithful_ci_low)")
        if c.faithful_ci_low > k.faithful:
            return d(True, f"rule ci: the lower end of version {c.version}'s faithful-success interval "
                           f"({_fmt(c.faithful_ci_low)}) is above champion {k.version}'s {_fmt(k.faithful)}")
        return d(False, f"rule ci: the lower end of version {c.version}'s faithful-success interval "
                        f"({_fmt(c.faithful_ci_low)}) is not above champion {k.version}'s {_fmt(k.faithful)}")
    if c.faithful != k.faithful:
        better = c.faithful > k.faithful
        return d(better, f"faithful success {_fmt(c.faithful)} vs champion {k.version}'s {_fmt(k.faithful)}: "
                         + ("higher" if better else "lower"))
    extra = ""
    if c.success is not None and k.success is not None and c.success != k.success:
        extra = (f"; planner success {_fmt(c.success)} vs its {_fmt(k.success)} does not decide")
    return d(False, f"faithful success tied with champion {k.version} at {_fmt(c.faithful)}{extra}: a tie is no "
                    "promotion, the champion stays (use --force to replace it)")


def metric_tags(metrics: dict, prefix: str = METRIC_PREFIX) -> dict[str, str]:
    """Version tags from an evaluation's metrics.json (top-level values and overall intervals);
    ``prefix`` ``baseline.`` gives the same names for the untrained model's evaluation."""
    tags = {}
    for k in ("faithful", "success", "calls", "drift", "tasks"):
        if metrics.get(k) is not None:
            tags[f"{prefix}{k}"] = str(metrics[k])
    overall = metrics.get("overall") or {}
    for k in ("faithful", "success"):
        ci = (overall.get(k) or {}).get("ci") or [None, None]
        if ci[0] is not None:
            tags[f"{prefix}{k}_ci_low"], tags[f"{prefix}{k}_ci_high"] = str(ci[0]), str(ci[1])
    return tags


def baseline_mismatch(metrics: dict | None, baseline: dict) -> str | None:
    """Why ``baseline`` (the untrained model's metrics.json) cannot stand beside ``metrics`` (the
    version's), or None: both must come from the same validation tasks, budget, token limit and
    seed. Only what both files' provenance records is compared (hand-written files have none)."""
    pa, pb = (metrics or {}).get("provenance") or {}, baseline.get("provenance") or {}
    if not pa or not pb:
        return None
    checks = (("task set", lambda p: (p.get("tasks") or {}).get("task_set")),
              ("budget", lambda p: p.get("budget")),
              ("max_new_tokens", lambda p: (p.get("eval") or {}).get("max_new_tokens")),
              ("seed", lambda p: (p.get("eval") or {}).get("seed")))
    for what, get in checks:
        a, b = get(pa), get(pb)
        if a is not None and b is not None and a != b:
            shown = (f"{(pa.get('tasks') or {}).get('count')} vs {(pb.get('tasks') or {}).get('count')} tasks, "
                     "or the same ids with other text") if what == "task set" else f"{a!r} vs {b!r}"
            return (f"the baseline was evaluated with another {what} than the version ({shown}); evaluate the "
                    "untrained model on the same validation tasks with the same settings")
    return None


def run_artifact(run_id: str, artifact: str, dst: str, *, what: str = "run", tracking_uri: str | None = None) -> str:
    """Download ``artifact`` of an MLflow run into ``dst``; PromotionError naming the run when it has none."""
    import mlflow
    from mlflow.exceptions import MlflowException

    _client(tracking_uri)
    try:
        return mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact, dst_path=dst)
    except (MlflowException, OSError) as exc:
        msg = getattr(exc, "message", str(exc)).splitlines()[0]
        raise PromotionError(f"{what} {run_id}: no {artifact} artifact ({msg})") from None


def baseline_from_run(run_id: str, tracking_uri: str | None = None) -> dict:
    """The metrics.json artifact of an evaluation run (``omtr evaluate --track``'s run)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="omtr-baseline-") as tmp:
        path = run_artifact(run_id, "metrics.json", tmp, what="baseline run", tracking_uri=tracking_uri)
        with open(path, encoding="utf-8") as f:
            return json.load(f)


def records_from_run(run_id: str, *, what: str = "evaluation run", tracking_uri: str | None = None) -> list[dict]:
    """The traces.jsonl artifact of an evaluation run: its per-task records."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="omtr-traces-") as tmp:
        return read_records(run_artifact(run_id, "traces.jsonl", tmp, what=what, tracking_uri=tracking_uri))


def _check_records(grades: dict[str, int], metrics: dict | None, who: str) -> None:
    """The per-task grades must be the ones behind ``metrics``' faithful success (the same evaluation)."""
    want = (metrics or {}).get("faithful")
    if want is None or not grades:
        return
    got = sum(grades.values()) / len(grades)
    n = (metrics or {}).get("tasks")
    if abs(got - float(want)) > 1e-3 or (isinstance(n, int) and n < len(grades)):
        raise PromotionError(f"{who}'s per-task records give faithful success {got:.4g} over {len(grades)} tasks, but "
                             f"its metrics.json says {float(want):.4g} over {n} tasks: the records and the metrics come "
                             "from different evaluations; give the traces.jsonl written beside that metrics.json")


def _client(tracking_uri: str | None = None):
    import mlflow
    from mlflow import MlflowClient

    from omtr.paths import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def register(model_dir: str, *, name: str = DEFAULT_NAME, metrics: dict | None = None, train_run_id: str | None = None,
             eval_run_id: str | None = None, limits=None, baseline: dict | None = None,
             baseline_run_id: str | None = None, records: list[dict] | None = None,
             baseline_records: list[dict] | None = None, bootstrap: int = PAIRED_BOOTSTRAP, seed: int = PAIRED_SEED,
             tracking_uri: str | None = None, experiment: str = "omtr-register") -> dict:
    """Log ``model_dir`` as a pyfunc, register it as a new version of ``name`` with the metrics and
    run links as tags, and give it the alias ``challenger``. ``baseline``: the untrained model's
    metrics.json on the same validation tasks (the model training started from), written as
    ``baseline.*`` tags beside ``metric.*``; without it the version has no baseline and
    :func:`promote` judges it against the champion alone. ``records`` and ``baseline_records``: the
    two evaluations' per-task records (traces.jsonl lines); given both, the paired faithful
    difference (:func:`paired_faithful`, ``bootstrap`` resamples, ``seed``) is tagged as
    ``baseline.faithful_diff`` and its interval. Returns ``{name, version, run_id, model_uri,
    baseline, paired}``."""
    import mlflow

    from omtr.tracking import start_run
    from omtr.tracking.pyfunc import log_role_model

    paired = None
    if baseline is not None:
        why = baseline_mismatch(metrics, baseline)
        if why:
            raise PromotionError(why)
        if records is not None and baseline_records is not None:
            ga = faithful_grades(records, what="the trained model's records")
            gb = faithful_grades(baseline_records, what="the untrained model's records")
            _check_records(ga, metrics, "the trained model")
            _check_records(gb, baseline, "the untrained model")
            paired = paired_faithful(ga, gb, bootstrap=bootstrap, seed=seed)
        else:
            missing = " and ".join(w for w, r in (("the trained model's", records),
                                                  ("the untrained model's", baseline_records)) if r is None)
            log.warning("no per-task records of %s evaluation (traces.jsonl): the paired faithful difference is "
                        "unknown; rule point still applies, rule ci will refuse the version", missing)
    client = _client(tracking_uri)
    with start_run(experiment, "register", tracking_uri) as run:
        info = log_role_model(model_dir, limits=limits)
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()
                                if k in ("faithful", "success", "calls", "drift") and v is not None})
        if paired is not None:
            mlflow.log_metrics({"paired.faithful_diff": paired.diff, "paired.faithful_diff_low": paired.low,
                                "paired.faithful_diff_high": paired.high, "paired.tasks": paired.tasks})
        links = {k: v for k, v in (("omtr.train_run_id", train_run_id), ("omtr.eval_run_id", eval_run_id)) if v}
        if links:
            mlflow.set_tags(links)
        mv = mlflow.register_model(info.model_uri, name)
        run_id = run.info.run_id
    tags = {**metric_tags(metrics or {}), **links, "omtr.register_run_id": run_id}
    base = metric_tags(baseline, BASELINE_PREFIX) if baseline is not None else {}
    if base:
        model = ((baseline.get("provenance") or {}).get("model") or {}).get("spec")
        tags.update(base, **{k: v for k, v in (("omtr.baseline_run_id", baseline_run_id),
                                                ("omtr.baseline_model", model)) if v})
        log.info("version %s: baseline (the untrained model) faithful %s, success %s%s", mv.version,
                 base.get("baseline.faithful"), base.get("baseline.success"),
                 f" from run {baseline_run_id}" if baseline_run_id else "")
        if paired is not None:
            tags.update(paired.tags())
            log.info("version %s: faithful success %s against the untrained model's %s, %s", mv.version,
                     _fmt(paired.trained), _fmt(paired.untrained), paired_text(paired))
    else:
        log.info("version %s: no baseline given: registered without baseline.* tags, so promotion will "
                 "not compare it with the model training started from", mv.version)
    for k, v in tags.items():
        client.set_model_version_tag(name, mv.version, k, v)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    return {"name": name, "version": str(mv.version), "run_id": run_id, "model_uri": info.model_uri,
            "baseline": {k[len(BASELINE_PREFIX):]: v for k, v in base.items()} or None,
            "paired": asdict(paired) if paired else None}


def promote(name: str, version: str | int, *, rule: str = "point", force: bool = False,
            tracking_uri: str | None = None) -> Decision:
    """Apply the rule to ``version`` against the current champion; move the aliases when it wins
    (or with ``force``). The decision is tagged on the version and logged to the active run."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    version = str(version)
    try:
        mv = client.get_model_version(name, version)
    except MlflowException as exc:
        raise PromotionError(f"no version {version} of registered model {name!r} ({exc.message.splitlines()[0]})") from None
    challenger = Scores.from_tags(version, mv.tags)
    baseline = Scores.from_tags(version, mv.tags, BASELINE_PREFIX)
    if baseline.faithful is None:
        baseline = None
    paired = Paired.from_tags(mv.tags) if baseline is not None else None
    champion = None
    try:
        cur = client.get_model_version_by_alias(name, CHAMPION)
        champion = Scores.from_tags(str(cur.version), cur.tags)
    except MlflowException:
        pass
    decision = decide(challenger, champion, rule, baseline, paired)
    if baseline is None:
        log.info("%s version %s: %s", name, version, decision.baseline_check)
    if force and not decision.promote and not (champion and champion.version == version):
        decision = replace(decision, promote=True, reason=f"forced (the rule said no: {decision.reason})")
    if decision.promote:
        client.set_registered_model_alias(name, CHAMPION, version)
        try:
            if str(client.get_model_version_by_alias(name, CHALLENGER).version) == version:
                client.delete_registered_model_alias(name, CHALLENGER)
        except MlflowException:
            pass
    elif not (champion and champion.version == version):
        client.set_registered_model_alias(name, CHALLENGER, version)
    client.set_model_version_tag(name, version, "omtr.promotion", json.dumps(decision.to_dict()))
    log.info("%s version %s: %s", name, version, decision_line(decision, name))
    _log_decision(decision, name)
    return decision


def decision_line(decision: Decision, name: str) -> str:
    """The decision in one line: promoted or not and why; with a baseline, both faithful rates, the
    paired difference and its interval, and the number of paired tasks."""
    v = decision.challenger.version
    head = f"{name} version {v} " + ("is now champion" if decision.promote else "not promoted")
    line = f"{head}: {decision.reason}"
    if decision.baseline is not None and decision.baseline_check not in decision.reason:
        line += f" (baseline gate: {decision.baseline_check})"
    return line


def _log_decision(decision: Decision, name: str) -> None:
    import mlflow

    if mlflow.active_run() is None:
        return
    d = decision.to_dict()
    mlflow.log_params({"promotion.rule": decision.rule, "promotion.model": name,
                       "promotion.version": decision.challenger.version,
                       "promotion.champion_before": decision.champion.version if decision.champion else "none"})
    mlflow.set_tags({"promotion.promoted": str(decision.promote).lower(), "promotion.reason": decision.reason[:5000],
                     "promotion.baseline": decision.baseline_check[:5000]})
    if decision.paired is not None:
        p = decision.paired
        mlflow.log_metrics({"promotion.faithful_diff": p.diff, "promotion.faithful_diff_low": p.low,
                            "promotion.faithful_diff_high": p.high, "promotion.paired_tasks": p.tasks})
    mlflow.log_dict(d, "promotion.json")
