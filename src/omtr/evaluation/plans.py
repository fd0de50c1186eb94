"""Plan generation, PlanBench's own protocol: the LLM writes the plan, VAL checks it (evaluation only).

``--policy plan:zero-shot`` asks PlanBench's zero-shot question (the leaderboard's prompt: the
domain text and the statement, then "What is the plan to achieve my goal? Just give the actions in
the plan."); ``plan:cot`` asks it to think step by step first and give the plan after ``[PLAN]``.
The answer is read back into PDDL actions with the task's PlanBench configuration — its NL action
templates (``stack the {} on top of the {}``) and object names (``a`` -> ``red block``) — the way
PlanBench turns an LLM's plan into PDDL; lines already written as ``(action arg ...)`` are taken as
they are, and lines that are no action are skipped (and counted). The plan is then checked by VAL
against the task's **reference** domain and problem, so the score is PlanBench's plan accuracy,
reported beside the formalisation results.

Only PlanBench tasks can be scored this way (generated tasks have no NL action templates): other
planning tasks are left out and counted as ``excluded``. Transfer tasks are answered in text as
usual.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any, Sequence

from omtr.policy import Messages, Sampling

log = logging.getLogger(__name__)

ZERO_SHOT_QUESTION = "What is the plan to achieve my goal? Just give the actions in the plan."
COT_QUESTION = ("What is the plan to achieve my goal? Think step by step about the actions and their effects. "
                "Then write the line [PLAN] followed by the actions of the plan, one per line, and end with [PLAN END].")
METHODS = ("zero-shot", "cot")


class PlanPolicyError(ValueError):
    """A plan policy that cannot be built (unknown method)."""


def planbench_config(task) -> str | None:
    """The PlanBench configuration a task comes from (``blocksworld_3``), or None."""
    source = str((getattr(task, "meta", None) or {}).get("source") or "")
    return source.split("/")[1] if source.startswith("planbench/") else None


@lru_cache(maxsize=16)
def load_config(name: str) -> dict:
    import yaml

    from omtr.tasks.planbench_data import shipped_root

    return yaml.safe_load((shipped_root() / "configs" / f"{name}.yaml").read_text(encoding="utf-8"))


def object_names(objects: Sequence[str], config: dict) -> dict[str, str]:
    """NL name (lower case) -> PDDL object, from the configuration's ``encoded_objects``."""
    from omtr.tasks.planbench import _object_name

    encoded = {str(k): v for k, v in config["encoded_objects"].items()}
    return {_object_name(o, encoded).lower(): o for o in objects}


def _templates(config: dict) -> list[tuple[str, re.Pattern, int]]:
    out = []
    for action, template in config["actions"].items():
        parts = [re.escape(p.strip().lower()) for p in template.split("{}")]
        body = r"\s+(?:the\s+)?(.+?)\s*".join(parts) if len(parts) > 1 else parts[0]
        body = body.replace(r"\ ", r"\s+")
        out.append((str(action).lower(), re.compile(rf"^{body}$"), template.count("{}")))
    return sorted(out, key=lambda x: -len(x[1].pattern))  # the most specific template first


_PDDL_STEP = re.compile(r"^\(\s*([A-Za-z][\w-]*)((?:\s+[\w-]+)*)\s*\)$")
_NUMBERING = re.compile(r"^(?:\d+[.):]\s*|[-*•]\s*|step\s*\d+\s*[:.]\s*)", re.IGNORECASE)


def read_plan(text: str, task) -> tuple[list[str], int]:
    """(PDDL actions, lines skipped) read from an LLM's answer for a PlanBench task."""
    from omtr.tasks.strips import problem_atoms

    config = load_config(planbench_config(task))
    objects, _, _ = problem_atoms(task.reference.problem)
    names = object_names(objects, config)
    templates = _templates(config)
    body = text
    if "[PLAN]" in body:
        body = body.split("[PLAN]")[-1]
    body = body.split("[PLAN END]")[0]
    plan, skipped = [], 0
    for raw in body.splitlines():
        line = _NUMBERING.sub("", raw.strip()).strip().rstrip(".").strip()
        if not line:
            continue
        m = _PDDL_STEP.match(line)
        if m:
            plan.append(f"({m.group(1).lower()}{m.group(2).lower()})")
            continue
        step = _nl_step(line.lower(), templates, names)
        if step is None:
            skipped += 1
        else:
            plan.append(step)
    return plan, skipped


def _nl_step(line: str, templates, names: dict[str, str]) -> str | None:
    """The PDDL step an NL line names. Where several actions share a template (Logistics:
    ``load {} into {} at {}`` is load-truck and load-airplane), the one whose name's words appear in
    its arguments' names wins (``truck_0`` -> load-truck)."""
    found: list[tuple[int, str]] = []
    for action, pattern, arity in templates:
        m = pattern.match(line)
        if not m:
            continue
        args, nl_args = [], []
        for g in m.groups():
            g = re.sub(r"^the\s+", "", g.strip())
            if g not in names:
                break
            args.append(names[g])
            nl_args.append(g)
        else:
            if len(args) == arity:
                score = sum(any(w in a for a in nl_args) for w in action.split("-"))
                found.append((score, f"({action}{''.join(' ' + a for a in args)})"))
    if not found:
        return None
    return max(found, key=lambda x: x[0])[1]


def render_plan(actions: Sequence[str], task) -> str:
    """PDDL actions as PlanBench writes them in NL (one per line), with the task's configuration."""
    from omtr.tasks.planbench import _object_name

    config = load_config(planbench_config(task))
    encoded = {str(k): v for k, v in config["encoded_objects"].items()}
    templates = {str(k).lower(): v for k, v in config["actions"].items()}
    lines = []
    for a in actions:
        name, *args = a.strip("() ").split()
        lines.append(templates[name.lower()].format(*[_object_name(x, encoded) for x in args]))
    return "\n".join(lines)


def plan_complete(text: str) -> bool:
    """Stop decoding once the plan is closed (``[PLAN END]``) or the answer repeats one line three
    times in a row (a small model's loop: nothing after it is read)."""
    if "[PLAN END]" in text:
        return True
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return len(lines) >= 3 and lines[-1] == lines[-2] == lines[-3] and text.endswith("\n")


class PlanPolicy:
    """An LLM that writes plans, not PDDL (PlanBench's protocol); sees only the NL task."""

    writes_plans = True
    uses_judge = False

    def __init__(self, backend, method: str = "zero-shot", *, plan_tokens: int | None = None):
        if method not in METHODS:
            raise PlanPolicyError(f"unknown plan method {method!r}; choose from {', '.join(METHODS)} (plan:zero-shot)")
        self.backend, self.method = backend, method
        self.name = f"plan:{method}"
        self.plan_tokens = plan_tokens or (320 if method == "zero-shot" else 640)
        self.excluded: dict[str, str] = {}

    def messages(self, nl: str) -> Messages:
        question = ZERO_SHOT_QUESTION if self.method == "zero-shot" else COT_QUESTION
        return [{"role": "user", "content": f"{nl}\n\n{question}"}]

    def plan_texts(self, nls: Sequence[str], sampling: Sampling) -> list[str]:
        s = Sampling(greedy=sampling.greedy, temperature=sampling.temperature, top_p=sampling.top_p,
                     seed=sampling.seed, max_new_tokens=min(self.plan_tokens, sampling.max_new_tokens))
        return [g.text for g in self.backend.chat([self.messages(nl) for nl in nls], s, stop_when=plan_complete)]

    # the episode loop never runs this policy; these keep it a Policy for the registry
    def generate(self, role, prompts, sampling, *, stop_when=None, domains=None):
        raise RuntimeError("a plan policy writes plans, not PDDL: evaluate it with omtr.evaluation.run.evaluate")

    def judge(self, prompts):
        return [0.5] * len(prompts)


def score_plans(policy: PlanPolicy, tasks: Sequence, sampling: Sampling, *, batch_size: int = 16,
                solver_config=None) -> list[dict[str, Any]]:
    """One trace record per task: the answer, the plan read from it, and VAL's verdict on the reference."""
    from omtr.solver.pipeline import validate_plan

    out = []
    for i in range(0, len(tasks), batch_size):
        batch = tasks[i:i + batch_size]
        texts = policy.plan_texts([t.nl for t in batch], sampling)
        for t, text in zip(batch, texts):
            plan, skipped = read_plan(text, t)
            check = validate_plan(t.reference.domain, t.reference.problem, plan, solver_config) if plan else None
            out.append({"id": t.id, "family": t.family, "kind": "plan", "answer": text, "plan": plan,
                        "skipped_lines": skipped, "valid": bool(check and check.valid),
                        "message": check.message if check else "no action could be read from the answer",
                        "plan_length": len(plan),
                        "gold_length": len((t.meta or {}).get("gold_plan") or []) or None})
    return out
