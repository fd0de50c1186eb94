"""``omtr train``: multi-role RL from planner feedback (PPO for Actor and Editor, the Judge's loss)."""

from __future__ import annotations

import os

from omtr.cli import CliError, add_command

EXAMPLES = """  omtr tasks generate --family blocksworld --n 40 --max-objects 3 --seed 0 --split train --out T.jsonl
  omtr train --tasks T.jsonl --out runs/demo                      # the small CPU demo (SmolLM2), minutes
  omtr train --tasks T.jsonl --out runs/demo --resume             # continue a stopped run
  omtr train --model micro --profile micro --tasks T.jsonl --out runs/micro -q
  omtr train --tasks T.jsonl --out runs/shaped --set reward=shaped --set cycles=4
  omtr train --tasks T.jsonl --out runs/probed --probe HELDOUT.jsonl --probe-n 8   # a held-out faithful curve
  omtr train --tasks T.jsonl --out runs/grpo --set advantage=group --set samples_per_task=4
  omtr train --profile paper --tasks T.jsonl --out runs/paper --config configs/train/paper.yaml
  deepspeed --num_gpus 8 -m omtr train --profile paper --tasks T.jsonl --out runs/paper \\
      --set deepspeed=configs/deepspeed/zero2_bf16.json      # data parallel: each rank its share

A run directory holds config.json, checkpoints/ (every cycle and every checkpoint_every_updates
updates; `latest` names the newest), episodes/cycle-NNNN/update-NNNNNN.parquet (one row per role
step, validated before the update uses it, with the suite's report beside it), metrics.jsonl,
training_curve.png and model/ (a model directory for `omtr infer --model`). Every run logs to
MLflow ($MLFLOW_TRACKING_URI, default ./mlruns.db). SIGTERM writes a checkpoint and exits with
status 143; --resume continues from it. Profiles: small (the default, a CPU demo), paper, micro.
Under a launcher (deepspeed, torchrun) each rank rolls out its share of every batch; rank 0 writes
metrics.jsonl, MLflow and model/, each rank its own episode log (update-NNNNNN.rank-RRRR.parquet).
--probe FILE grades the policy's greedy answers on held-out tasks (with references, read by the
evaluation side only) every --probe-every updates: probe_faithful, probe_drift, probe_judge_auc_fd
go to metrics.jsonl and MLflow beside the update's figures, never into a reward.

Config keys (--set key=value, or a JSON/YAML --config file):
"""


def register(sub) -> None:
    from omtr.rl.config import help_table  # stdlib + omtr.config only

    p = add_command(
        sub, "train",
        help="train the role model from planner feedback (PPO for Actor/Editor, calibrated Judge)",
        description=(
            "Cycles of rollout (the episode loop at temperature 0.7) -> rewards from the planner's "
            "verdicts -> advantages -> validated episode log -> PPO/Judge update, with checkpoints, "
            "resume and MLflow tracking."
        ),
        examples=EXAMPLES + help_table(),
    )
    p.add_argument("--model", default=None, metavar="DIR|PROFILE",
                   help="model directory or profile (micro, small, paper); default: the training profile's")
    p.add_argument("--tasks", required=True, metavar="TRAIN.jsonl", help="training task records ({id, nl} per line)")
    p.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory (checkpoints, logs, model)")
    p.add_argument("--profile", default="small", help="training profile: small (default), paper, micro")
    p.add_argument("--config", default=None, metavar="FILE", help="JSON or YAML file of config keys")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change one config key (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue RUN_DIR from its latest checkpoint")
    p.add_argument("--max-updates", type=int, default=None, metavar="N",
                   help="stop (with a checkpoint) after N more updates")
    p.add_argument("--probe", default=None, metavar="HELDOUT.jsonl",
                   help="held-out task records WITH references (omtr tasks generate/planbench): a faithful probe "
                        "after updates, logged as probe_* metrics; never trained on")
    p.add_argument("--probe-n", type=int, default=8, metavar="N", help="probe tasks (the file's first N; default 8)")
    p.add_argument("--probe-every", type=int, default=1, metavar="K", help="probe every K updates (and after the last)")
    p.add_argument("--probe-samples", type=int, default=0, metavar="S",
                   help="also S samples at 0.7 per probe task, pooled for the Judge's AUC between faithful and "
                        "unfaithful specs (default 0: greedy answers only)")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json
    from pathlib import Path

    from omtr.config import ConfigError
    from omtr.rl.config import TrainConfig, train_profile
    from omtr.tasks.training import TaskFormatError, load_training_tasks

    out = Path(args.out)
    try:
        if args.resume:
            saved = out / "config.json"
            if not saved.is_file():
                raise CliError(f"{out}: nothing to resume (no config.json); start the run without --resume")
            cfg = TrainConfig.from_dict(json.loads(saved.read_text()))
            if args.overrides or args.config or args.model:
                raise CliError("--resume continues the run with its saved config; drop --set/--config/--model")
        else:
            if (out / "checkpoints").exists():
                raise CliError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
            cfg = train_profile(args.profile).with_overrides(args.overrides, args.config)
            if args.model:
                cfg = cfg.replace(model=args.model)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    except FileNotFoundError as exc:
        raise CliError(f"--config: {exc}") from None
    from omtr.rl.memory import ask_huge_pages

    ask_huge_pages(cfg.huge_pages)  # before anything imports torch: its allocator reads it once
    try:
        tasks = load_training_tasks(args.tasks)
    except TaskFormatError as exc:
        raise CliError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"--tasks {args.tasks}: cannot read ({exc})") from None
    if not tasks:
        raise CliError(f"--tasks {args.tasks}: no tasks")

    probe = None
    if args.probe:
        # The evaluation side reads the references; the trainer only receives the probe's numbers.
        from omtr.evaluation.probe import FaithfulProbe
        from omtr.tasks.records import TaskFormatError as RecordError

        if args.probe_n < 1 or args.probe_every < 1 or args.probe_samples < 0:
            raise CliError("--probe-n and --probe-every must be at least 1, --probe-samples at least 0")
        try:
            probe = FaithfulProbe.from_file(args.probe, args.probe_n, max_new_tokens=cfg.max_new_tokens,
                                            samples=args.probe_samples, seed=cfg.seed)
        except (RecordError, ValueError) as exc:
            raise CliError(f"--probe {args.probe}: {exc}") from None
        except OSError as exc:
            raise CliError(f"--probe {args.probe}: cannot read ({exc})") from None
        seen = {t.nl.strip() for t in tasks}
        shared = [t.id for t in probe.tasks if t.nl.strip() in seen]
        if shared:
            raise CliError(f"--probe {args.probe}: task(s) {', '.join(shared[:5])} state a training task's text; "
                           "a probe must be held out")

    from omtr.rl.trainer import EpisodeLogInvalid, Trainer

    try:
        trainer = Trainer(cfg, tasks, out, resume=args.resume, quiet=args.quiet, probe=probe,
                          probe_every=args.probe_every)
    except (ConfigError, ValueError) as exc:
        raise CliError(f"cannot start training: {exc}") from None
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    from omtr.rl.distributed import leave_process_group

    clean = False
    try:
        status = trainer.run(max_updates=args.max_updates)
        clean = True
    except EpisodeLogInvalid as exc:  # raised on every rank alike (a collective verdict)
        clean = True
        print(f"omtr train: the episode log failed validation; training stopped before the update:\n{exc}")
        return 1
    finally:
        leave_process_group(clean=clean)
    if not trainer.coll.is_main:  # under a launcher, rank 0 reports for the run
        return 143 if status == "stopped" else 0
    last = trainer.history[-1] if trainer.history else {}
    print(f"{status}: update {trainer.update}/{cfg.total_updates}, episodes {trainer.episodes_done}, "
          f"planner calls {trainer.planner_calls}")
    if last:
        print(f"last update: success {last.get('success_rate', 0):.2f}, R_A {last.get('reward_actor', float('nan')):.3f}, "
              f"rollout {last.get('rollout_tokens_per_s', 0):.1f} tok/s, update {last.get('update_tokens_per_s', 0):.1f} tok/s")
    print(f"run: {out}")
    return 143 if status == "stopped" else 0
