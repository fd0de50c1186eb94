"""The model registry: register a role model with its evaluation, promote versions with aliases.

A new version gets the alias ``challenger``. :func:`promote` moves ``champion`` to it only when it
beats the current champion on the validation split (or there is no champion), by one of the rules
in :data:`RULES`:

* ``point`` (default): higher faithful success wins; a tie goes to higher solver success, then to
  fewer planner calls on average; a full tie keeps the champion.
* ``ci``: the challenger's faithful success must be better beyond noise: the lower end of its 95%
  bootstrap interval is above the champion's faithful success. No tie-breaks.

The baseline gate comes first: a version that carries ``baseline.*`` tags (the untrained model's
evaluation on the same validation tasks, the model training started from) is refused unless its
faithful success, the metric both rules rank by first, is strictly above ``baseline.faithful``, or
equal to it with a planner success strictly above ``baseline.success`` (the rule's own tie-break).
A version without baseline tags is judged by the rule alone (the decision says no baseline was
recorded). ``force`` overrides both the gate and the rule.

Every decision (rule, both versions' inputs, the baseline, the outcome and why) is returned as a
dict, written to the version's ``omtr.promotion`` tag, and logged to the active MLflow run when
there is one. Evaluation metrics live on each version as tags (``metric.faithful``,
``metric.success``, ``metric.calls``, ``metric.faithful_ci_low``/``_high`` ...), the untrained
model's as ``baseline.*`` with the same names, with ``omtr.eval_run_id``, ``omtr.train_run_id`` and
``omtr.baseline_run_id`` linking to the runs behind them.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass

log = logging.getLogger("omtr.registry")

DEFAULT_NAME = "omtr-role-model"
CHAMPION, CHALLENGER = "champion", "challenger"
RULES = ("point", "ci")
METRIC_PREFIX, BASELINE_PREFIX = "metric.", "baseline."
PRIMARY = "faithful"  # the metric both rules rank by first, and the one the baseline gate compares
METRIC_TAGS = ("faithful", "success", "calls", "drift", "faithful_ci_low", "faithful_ci_high",
               "success_ci_low", "success_ci_high", "tasks")


class PromotionError(Exception):
    """A request the registry cannot serve (unknown model or version, missing metrics)."""


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
        def num(key):
            v = tags.get(f"{prefix}{key}")
            try:
                x = float(v)
            except (TypeError, ValueError):
                return None
            return None if math.isnan(x) else x

        return cls(version, num("faithful"), num("success"), num("calls"), num("faithful_ci_low"), num("faithful_ci_high"))


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    rule: str
    challenger: Scores
    champion: Scores | None
    baseline: Scores | None = None  # the untrained model's scores (baseline.* tags); None: none recorded
    baseline_check: str = ""  # the gate's verdict in words

    def to_dict(self) -> dict:
        return {"promote": self.promote, "reason": self.reason, "rule": self.rule,
                "challenger": asdict(self.challenger), "champion": asdict(self.champion) if self.champion else None,
                "baseline": asdict(self.baseline) if self.baseline else None, "baseline_check": self.baseline_check}


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


def baseline_check(challenger: Scores, baseline: Scores | None) -> tuple[bool | None, str]:
    """The baseline gate: (True, why) when the version's faithful success is strictly above the
    untrained model's, or equal to it with a strictly higher planner success (no less faithful and
    solving more); (False, why) otherwise; (None, why) when there is nothing to compare."""
    c = challenger
    if baseline is None or baseline.faithful is None:
        return None, f"no baseline recorded for version {c.version} (no baseline.{PRIMARY} tag): the rule alone decides"
    if c.faithful is None:
        return None, f"version {c.version} has no faithful-success metric to compare with its baseline"
    if c.faithful > baseline.faithful:
        return True, (f"faithful success {_fmt(c.faithful)} beats the untrained model's {_fmt(baseline.faithful)} "
                      f"(baseline.{PRIMARY})")
    if c.faithful == baseline.faithful and c.success is not None and baseline.success is not None:
        if c.success > baseline.success:
            return True, (f"faithful success {_fmt(c.faithful)} equals the untrained model's and planner success "
                          f"{_fmt(c.success)} beats its {_fmt(baseline.success)} (baseline.{PRIMARY}, baseline.success)")
        return False, (f"faithful success {_fmt(c.faithful)} does not beat the untrained model's "
                       f"{_fmt(baseline.faithful)} (baseline.{PRIMARY}), nor planner success {_fmt(c.success)} its "
                       f"{_fmt(baseline.success)}")
    return False, (f"faithful success {_fmt(c.faithful)} does not beat the untrained model's "
                   f"{_fmt(baseline.faithful)} (baseline.{PRIMARY})")


def decide(challenger: Scores, champion: Scores | None, rule: str = "point", baseline: Scores | None = None) -> Decision:
    """The promotion rule as a pure function: first the baseline gate (when ``baseline`` has a
    faithful-success value the version must beat it: :func:`baseline_check`), then the rule against the champion."""
    if rule not in RULES:
        raise PromotionError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")
    gate, check = baseline_check(challenger, baseline)

    def d(ok: bool, why: str) -> Decision:
        return Decision(ok, why, rule, challenger, champion, baseline, check)

    if champion is not None and champion.version == challenger.version:
        return d(False, f"version {challenger.version} is already the champion")
    c, k = challenger, champion
    if gate is False:
        return d(False, f"{check}: version {c.version} is no better than the model training started from "
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
    if c.success is not None and k.success is not None and c.success != k.success:
        better = c.success > k.success
        return d(better, f"faithful success tied at {_fmt(c.faithful)}; solver success {_fmt(c.success)} vs "
                         f"champion {k.version}'s {_fmt(k.success)}: " + ("higher" if better else "lower"))
    if c.calls is not None and k.calls is not None and c.calls != k.calls:
        better = c.calls < k.calls
        return d(better, f"faithful and solver success tied ({_fmt(c.faithful)}, {_fmt(c.success)}); average "
                         f"planner calls {_fmt(c.calls)} vs champion {k.version}'s {_fmt(k.calls)}: "
                         + ("fewer" if better else "more"))
    return d(False, f"tied with champion {k.version} on faithful success, solver success and calls; "
                    "the champion stays (use --force to replace it)")


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


def baseline_from_run(run_id: str, tracking_uri: str | None = None) -> dict:
    """The metrics.json artifact of an evaluation run (``omtr evaluate --track``'s run)."""
    import tempfile

    import mlflow
    from mlflow.exceptions import MlflowException

    _client(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="omtr-baseline-") as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="metrics.json", dst_path=tmp)
        except (MlflowException, OSError) as exc:
            msg = getattr(exc, "message", str(exc)).splitlines()[0]
            raise PromotionError(f"baseline run {run_id}: no metrics.json artifact ({msg})") from None
        with open(path, encoding="utf-8") as f:
            return json.load(f)


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
             baseline_run_id: str | None = None,
             tracking_uri: str | None = None, experiment: str = "omtr-register") -> dict:
    """Log ``model_dir`` as a pyfunc, register it as a new version of ``name`` with the metrics and
    run links as tags, and give it the alias ``challenger``. ``baseline``: the untrained model's
    metrics.json on the same validation tasks (the model training started from), written as
    ``baseline.*`` tags beside ``metric.*``; without it the version has no baseline and
    :func:`promote` judges it by the rule alone. Returns ``{name, version, run_id, model_uri, baseline}``."""
    import mlflow

    from omtr.tracking import start_run
    from omtr.tracking.pyfunc import log_role_model

    if baseline is not None:
        why = baseline_mismatch(metrics, baseline)
        if why:
            raise PromotionError(why)
    client = _client(tracking_uri)
    with start_run(experiment, "register", tracking_uri) as run:
        info = log_role_model(model_dir, limits=limits)
        if metrics:
            mlflow.log_metrics({k: float(v) for k, v in metrics.items()
                                if k in ("faithful", "success", "calls", "drift") and v is not None})
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
    else:
        log.info("version %s: no baseline given: registered without baseline.* tags, so promotion will "
                 "not compare it with the model training started from", mv.version)
    for k, v in tags.items():
        client.set_model_version_tag(name, mv.version, k, v)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    return {"name": name, "version": str(mv.version), "run_id": run_id, "model_uri": info.model_uri,
            "baseline": {k[len(BASELINE_PREFIX):]: v for k, v in base.items()} or None}


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
    champion = None
    try:
        cur = client.get_model_version_by_alias(name, CHAMPION)
        champion = Scores.from_tags(str(cur.version), cur.tags)
    except MlflowException:
        pass
    decision = decide(challenger, champion, rule, baseline)
    if baseline is None:
        log.info("%s version %s: %s", name, version, decision.baseline_check)
    if force and not decision.promote and not (champion and champion.version == version):
        decision = Decision(True, f"forced (the rule said no: {decision.reason})", rule, challenger, champion,
                            baseline, decision.baseline_check)
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
    _log_decision(decision, name)
    return decision


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
    mlflow.log_dict(d, "promotion.json")
