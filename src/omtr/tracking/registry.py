"""The model registry: register a role model with its evaluation, promote versions with aliases.

A new version gets the alias ``challenger``. :func:`promote` moves ``champion`` to it only when it
beats the current champion on the validation split (or there is no champion), by one of the rules
in :data:`RULES`:

* ``point`` (default): higher faithful success wins; a tie goes to higher solver success, then to
  fewer planner calls on average; a full tie keeps the champion.
* ``ci``: the challenger's faithful success must be better beyond noise: the lower end of its 95%
  bootstrap interval is above the champion's faithful success. No tie-breaks.

Every decision (rule, both versions' inputs, the outcome and why) is returned as a dict, written
to the version's ``omtr.promotion`` tag, and logged to the active MLflow run when there is one.
Evaluation metrics live on each version as tags (``metric.faithful``, ``metric.success``,
``metric.calls``, ``metric.faithful_ci_low``/``_high`` ...), with ``omtr.eval_run_id`` and
``omtr.train_run_id`` linking to the runs behind them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

DEFAULT_NAME = "omtr-role-model"
CHAMPION, CHALLENGER = "champion", "challenger"
RULES = ("point", "ci")
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
    def from_tags(cls, version: str, tags: dict) -> "Scores":
        def num(key):
            v = tags.get(f"metric.{key}")
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

    def to_dict(self) -> dict:
        return {"promote": self.promote, "reason": self.reason, "rule": self.rule,
                "challenger": asdict(self.challenger), "champion": asdict(self.champion) if self.champion else None}


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.4g}"


def decide(challenger: Scores, champion: Scores | None, rule: str = "point") -> Decision:
    """The promotion rule as a pure function."""
    if rule not in RULES:
        raise PromotionError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")

    def d(ok: bool, why: str) -> Decision:
        return Decision(ok, why, rule, challenger, champion)

    if champion is None:
        return d(True, "there is no champion yet")
    if champion.version == challenger.version:
        return d(False, f"version {challenger.version} is already the champion")
    c, k = challenger, champion
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


def metric_tags(metrics: dict) -> dict[str, str]:
    """Version tags from an evaluation's metrics.json (top-level values and overall intervals)."""
    tags = {}
    for k in ("faithful", "success", "calls", "drift", "tasks"):
        if metrics.get(k) is not None:
            tags[f"metric.{k}"] = str(metrics[k])
    overall = metrics.get("overall") or {}
    for k in ("faithful", "success"):
        ci = (overall.get(k) or {}).get("ci") or [None, None]
        if ci[0] is not None:
            tags[f"metric.{k}_ci_low"], tags[f"metric.{k}_ci_high"] = str(ci[0]), str(ci[1])
    return tags


def _client(tracking_uri: str | None = None):
    import mlflow
    from mlflow import MlflowClient

    from omtr.paths import default_tracking_uri

    uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def register(model_dir: str, *, name: str = DEFAULT_NAME, metrics: dict | None = None, train_run_id: str | None = None,
             eval_run_id: str | None = None, limits=None,
             tracking_uri: str | None = None, experiment: str = "omtr-register") -> dict:
    """Log ``model_dir`` as a pyfunc, register it as a new version of ``name`` with the metrics and
    run links as tags, and give it the alias ``challenger``. Returns ``{name, version, run_id, model_uri}``."""
    import mlflow

    from omtr.tracking import start_run
    from omtr.tracking.pyfunc import log_role_model

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
    for k, v in tags.items():
        client.set_model_version_tag(name, mv.version, k, v)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    return {"name": name, "version": str(mv.version), "run_id": run_id, "model_uri": info.model_uri}


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
    champion = None
    try:
        cur = client.get_model_version_by_alias(name, CHAMPION)
        champion = Scores.from_tags(str(cur.version), cur.tags)
    except MlflowException:
        pass
    decision = decide(challenger, champion, rule)
    if force and not decision.promote and not (champion and champion.version == version):
        decision = Decision(True, f"forced (the rule said no: {decision.reason})", rule, challenger, champion)
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
    mlflow.set_tags({"promotion.promoted": str(decision.promote).lower(), "promotion.reason": decision.reason[:5000]})
    mlflow.log_dict(d, "promotion.json")
