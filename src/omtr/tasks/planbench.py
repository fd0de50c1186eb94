"""Import PlanBench's own files (configs, domain PDDL, instances, one-shot prompts) as task records.

PlanBench (Valmeekam et al., NeurIPS 2023 Datasets and Benchmarks; github.com/karthikv792/LLMs-Planning,
folder ``plan-bench/``) states each instance in natural language by rendering its PDDL with the
templates of ``configs/<dom>.yaml``: the init and goal atoms are each sorted by "predicate args",
rendered with ``predicates[pred]`` and the object names of ``encoded_objects`` (atoms whose template
is empty are dropped), and joined as "x, y and z"; for the BlocksWorld configs '-' becomes a space.
The domain text is the config's ``domain_intro``, except where the one-shot prompts carry a longer
version (Logistics adds examples); the prompt version is the one models were evaluated on, so it
wins. The task's ``nl`` is ``domain text + "\\n[STATEMENT]\\n" + statement``, as in the prompts.

Point omtr at a checkout with ``omtr tasks import-planbench PATH/plan-bench`` (or a folder holding
``configs/``, ``instances/`` and optionally ``prompts/`` and ``plan_generation/``).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from omtr.jsonl import JsonlError, read_jsonl
from omtr.pddl.plan import read_plan
from omtr.tasks.generators import STATEMENT_SEP, join_facts
from omtr.tasks.records import ReferenceSpec, Task
from omtr.tasks.strips import problem_atoms

log = logging.getLogger(__name__)

# PlanBench config name -> omtr family
CONFIGS = {
    "blocksworld": "blocksworld",
    "blocksworld_3": "blocksworld",
    "mystery_blocksworld": "mystery_blocksworld",
    "mystery_blocksworld_3": "mystery_blocksworld",
    "logistics": "logistics",
    "depots": "depots",
}


class PlanBenchError(ValueError):
    """A PlanBench folder that cannot be imported; the message says what is missing."""


def find_root(path) -> Path:
    """The PlanBench data folder at ``path`` (or at ``path/planbench``). ``path`` may also be the
    shipped copy (:func:`omtr.tasks.planbench_data.shipped_root`), read in place from its archive."""
    p = path if hasattr(path, "is_dir") and not isinstance(path, str) else Path(path)
    for cand in (p, p / "planbench", p / "plan-bench"):
        if (cand / "configs").is_dir() and (cand / "instances").is_dir():
            return cand
    raise PlanBenchError(
        f"{p} is not a PlanBench folder (expected configs/ and instances/ inside). PlanBench comes from "
        "github.com/karthikv792/LLMs-Planning (folder plan-bench/); clone it and pass that folder, "
        "or set OMTR_BENCHMARKS to a folder holding planbench/"
    )


def select_configs(names: list[str] | None) -> list[str]:
    """Config names for a list of families or config names (None: all)."""
    if not names:
        return list(CONFIGS)
    out: list[str] = []
    for n in names:
        hits = [c for c, fam in CONFIGS.items() if n in (c, fam)]
        if not hits:
            raise PlanBenchError(f"unknown PlanBench family {n!r}; choose from {sorted(set(CONFIGS) | set(CONFIGS.values()))}")
        out.extend(h for h in hits if h not in out)
    return out


def _load_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _object_name(obj: str, encoded: dict[str, str]) -> str:
    if obj in encoded:
        return encoded[obj]
    keys = sorted((k for k in encoded if obj.startswith(k)), key=len, reverse=True)
    if not keys:
        raise PlanBenchError(f"object {obj!r} has no entry in the config's encoded_objects")
    return encoded[keys[0]].format(*re.findall(r"\d+", obj[len(keys[0]):]))


def render_facts(atoms, config: dict, blocks_style: bool) -> str:
    preds: dict[str, str] = config["predicates"]
    encoded: dict[str, str] = {str(k): v for k, v in config["encoded_objects"].items()}
    facts = []
    for atom in sorted(atoms, key=lambda a: a[0] + " " + " ".join(a[1:])):
        template = preds.get(atom[0])
        if template is None:
            raise PlanBenchError(f"predicate {atom[0]!r} has no template in the config")
        if not template:
            continue
        facts.append(template.format(*[_object_name(x, encoded) for x in atom[1:]]))
    text = join_facts(facts)
    if blocks_style:
        text = text.replace("-", " ").replace("ontable", "on the table")
    return text


def _prompt_domain_text(root: Path, name: str) -> str | None:
    path = root / "prompts" / name / "task_1_plan_generation.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    texts = {inst["query"].split(STATEMENT_SEP, 1)[0] for inst in data.get("instances", []) if STATEMENT_SEP in inst.get("query", "")}
    if len(texts) != 1:
        log.warning("prompts/%s: %d different domain texts; using the config's domain_intro", name, len(texts))
        return None
    return texts.pop()


def _gold_plans(root: Path, name: str) -> dict[int, list[str]]:
    """Gold plans by instance id: from ``plan_generation/<name>.jsonl`` when present (PDDL object
    names), else from the one-shot prompts' ``ground_truth_plan`` (checked against the problem's
    objects later, since BlocksWorld ground truths name blocks by colour)."""
    path = root / "plan_generation" / f"{name}.jsonl"
    out: dict[int, list[str]] = {}
    if path.exists():
        try:
            for n, row in read_jsonl(path, what="PlanBench plan file"):
                try:
                    out[int(row["instance_id"])] = list(row["gold_plan"])
                except (KeyError, TypeError, ValueError):
                    raise PlanBenchError(f'{path}:{n}: expected {{"instance_id": N, "gold_plan": [...]}}') from None
        except JsonlError as exc:
            raise PlanBenchError(str(exc)) from None
        return out
    prompts = root / "prompts" / name / "task_1_plan_generation.json"
    if prompts.exists():
        for inst in json.loads(prompts.read_text(encoding="utf-8")).get("instances", []):
            plan = [str(step) for step in read_plan(str(inst.get("ground_truth_plan", "")))]
            if plan:
                out[int(inst["instance_id"])] = plan
    return out


def _plan_uses_objects(plan: list[str], objects: set[str]) -> bool:
    return all(arg in objects for step in read_plan(plan) for arg in step.args)


def import_config(root: str | Path, name: str, *, split: str | None = "test") -> list[Task]:
    """Task records for every ``instance-N.pddl`` (N >= 1) of one PlanBench config."""
    root = find_root(root)
    cfg_path = root / "configs" / f"{name}.yaml"
    if not cfg_path.exists():
        raise PlanBenchError(f"{cfg_path} is missing; cannot import {name}")
    config = _load_yaml(cfg_path)
    inst_dir = root / "instances" / config["instance_dir"]
    domain_path = root / "instances" / config["domain_file"]
    if not inst_dir.is_dir() or not domain_path.exists():
        raise PlanBenchError(f"{name}: {inst_dir} or {domain_path} is missing")
    domain_text = domain_path.read_text(encoding="utf-8")
    nl_domain = _prompt_domain_text(root, name) or config["domain_intro"]
    gold = _gold_plans(root, name)
    pattern = re.compile(config.get("instances_template", "instance-{}.pddl").replace(".", r"\.").replace("{}", r"(\d+)") + "$")
    files = sorted(
        ((int(m.group(1)), f) for f in inst_dir.iterdir() if (m := pattern.match(f.name))), key=lambda x: x[0]
    )
    blocks_style = "blocksworld" in name
    family = CONFIGS.get(name, name)
    tasks = []
    for iid, f in files:
        if iid < 1:  # instance-0 of Mystery is not part of PlanBench's instance range
            continue
        problem_text = f.read_text(encoding="utf-8")
        objects, init, goal = problem_atoms(problem_text)
        stmt = (
            f"As initial conditions I have that, {render_facts(init, config, blocks_style)}.\n"
            f"My goal is to have that {render_facts(goal, config, blocks_style)}."
        )
        n_objects = len(objects)
        meta = {
            "source": f"planbench/{name}/{f.name}",
            "variant": name,
            "instance_id": iid,
            "n_objects": n_objects,
        }
        if iid in gold and _plan_uses_objects(gold[iid], set(objects)):
            meta["gold_plan"] = gold[iid]
            meta["plan_length"] = len(gold[iid])
        tasks.append(
            Task(
                id=f"planbench-{name}-{iid}",
                family=family,
                split=split,
                nl=nl_domain + STATEMENT_SEP + stmt,
                reference=ReferenceSpec(domain_text, problem_text),
                meta=meta,
            )
        )
    log.info("planbench %s: %d tasks", name, len(tasks))
    return tasks


def import_planbench(root: str | Path, families: list[str] | None = None, *, split: str | None = "test") -> list[Task]:
    root = find_root(root)
    tasks: list[Task] = []
    for name in select_configs(families):
        if not (root / "configs" / f"{name}.yaml").exists():
            log.warning("planbench: no configs/%s.yaml; skipped", name)
            continue
        tasks.extend(import_config(root, name, split=split))
    return tasks
