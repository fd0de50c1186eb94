"""``omtr promote``: move the ``champion`` alias to a version when it beats the current champion."""

from __future__ import annotations

from omtr.cli import CliError, add_command

EXAMPLES = """  omtr promote --name omtr-role-model --version 3            # champion iff more faithful than the current one
  omtr promote --name omtr-role-model --version 3 --rule ci  # only if better beyond the 95% interval
  omtr promote --name omtr-role-model --version 2 --force    # roll back / override the rule

Promotion compares FAITHFUL success only: planner success and planner calls never decide, and a
tie is no promotion (a model that solves more without being more faithful stays challenger).
First the baseline gate: a version registered with baseline.* tags (the untrained model it was
trained from, evaluated on the same validation tasks) is refused unless, by rule `point`, its
faithful success is strictly above baseline.faithful, or, by rule `ci`, the lower end of the
paired 95% interval of the per-task difference (baseline.faithful_diff_low) is above 0. A version
registered without per-task records has no paired difference (reported as unknown): rule point
still applies, rule ci refuses it. A version without baseline tags goes to the champion alone.
Against the champion, rule `point`: strictly higher faithful success wins; rule `ci`: the lower end
of the version's faithful-success bootstrap interval must be above the champion's value.
--force overrides the gate and the rule. The outcome is one line: promoted or not, why, both
faithful rates, the paired difference and its interval, and the number of paired tasks. The
decision, baseline included, is the version's omtr.promotion tag. Exit status: 0 promoted,
1 refused (the reason is printed), 2 usage or unknown version.
"""


def register(sub) -> None:
    p = add_command(
        sub, "promote",
        help="promote a registered version to champion if it is more faithful than the current champion",
        description=("Compare a registered version's evaluation tags with the champion's by the promotion "
                     "rule and move the `champion` alias to it when it wins (or with --force); otherwise "
                     "it keeps the alias `challenger`. The decision and its inputs are tagged on the "
                     "version and logged to MLflow."),
        examples=EXAMPLES,
    )
    p.add_argument("--name", default="omtr-role-model", help="registered model name (default omtr-role-model)")
    p.add_argument("--version", required=True, help="the version to promote")
    p.add_argument("--rule", default="point", choices=("point", "ci"), help="promotion rule (default point)")
    p.add_argument("--force", action="store_true", help="make it champion whatever the baseline gate and the rule say")
    p.add_argument("--json", metavar="FILE", help="also write the decision as JSON here")
    p.add_argument("--experiment", default="omtr-promote", help="MLflow experiment of the decision's run")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json

    from omtr.tracking import start_run
    from omtr.tracking.registry import PromotionError, decision_line, promote

    try:
        with start_run(args.experiment, f"promote-{args.name}-v{args.version}"):
            d = promote(args.name, args.version, rule=args.rule, force=args.force)
    except PromotionError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(d.to_dict(), fh, indent=2)
            fh.write("\n")
    if d.baseline is None:
        print(d.baseline_check)
    print(decision_line(d, args.name))
    return 0 if d.promote else 1
