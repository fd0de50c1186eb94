"""Plan replay under the reference model: an exact STRIPS simulator over the normal form.

The generated plan is translated step by step (generated action -> reference action with the
parameter permutation, generated objects -> reference objects) and simulated in the reference
model: positive and negative preconditions, equality, delete-then-add effects, conjunctive goal.
References that use disjunction, quantifiers or conditional effects are sent to VAL through
``omtr.solver.validate_plan`` when it is available (the simulator would be approximate there).
"""

from __future__ import annotations

import logging
from typing import Any

from omtr.faithfulness.mapping import Mapping
from omtr.faithfulness.normal import EQ, NSpec
from omtr.pddl.plan import read_plan

log = logging.getLogger(__name__)


def parse_plan(plan) -> list[list[str]]:
    """Plan text or list of step strings -> [[action, arg, ...], ...] (lower case)."""
    return [[step.name, *step.args] for step in read_plan(plan)]


def _ground(args, binding):
    out = []
    for a in args:
        if isinstance(a, int):
            out.append(binding[a])
        elif isinstance(a, str) and a.startswith("c:"):
            out.append(a[2:])
        else:
            out.append(a)
    return tuple(out)


def simulate(spec: NSpec, steps: list[tuple[str, tuple[str, ...]]]) -> tuple[bool, str]:
    """Replay ground reference steps in ``spec``; (valid, detail)."""
    state = set(spec.init)
    objects = set(spec.objects)
    for n, (name, args) in enumerate(steps, 1):
        act = spec.actions.get(name)
        if act is None:
            return False, f"step {n}: unknown action {name}"
        if len(args) != act.arity:
            return False, f"step {n}: ({name} {' '.join(args)}) has {len(args)} arguments, expected {act.arity}"
        bad = [a for a in args if a not in objects]
        if bad:
            return False, f"step {n}: ({name} {' '.join(args)}) uses unknown object {bad[0]}"
        for sym, largs, pos in sorted(act.pre, key=str):
            g = _ground(largs, args)
            holds = (len(g) == 2 and g[0] == g[1]) if sym == EQ else (sym, g) in state
            if holds != pos:
                lit = f"({sym} {' '.join(g)})".replace(" )", ")")
                return False, (f"step {n}: ({name} {' '.join(args)}) is not applicable in the reference model: "
                               f"precondition {'' if pos else 'not '}{lit} fails")
        state -= {(s, _ground(a, args)) for s, a in act.dele}
        state |= {(s, _ground(a, args)) for s, a in act.add}
    unmet = [lit for lit in sorted(spec.goal, key=str)
             if ((len(lit[1]) == 2 and lit[1][0] == lit[1][1]) if lit[0] == EQ else (lit[0], lit[1]) in state) != lit[2]]
    if unmet:
        s, a, p = unmet[0]
        return False, (f"plan ends without reaching the reference goal: {'' if p else 'not '}({s} {' '.join(a)})"
                       f"{' and %d more' % (len(unmet) - 1) if len(unmet) > 1 else ''}")
    return True, f"plan of {len(steps)} steps is valid under the reference model"


def translate_plan(gen_steps: list[list[str]], mapping: Mapping) -> tuple[list[tuple[str, tuple]], str | None]:
    ainv = {g: (r, sigma) for r, (g, sigma) in mapping.actions.items()}
    oinv = {g: r for r, g in mapping.objects.items()}
    out = []
    for n, (name, *args) in enumerate(gen_steps, 1):
        if name not in ainv:
            return out, f"step {n}: generated action {name} has no reference counterpart"
        rname, sigma = ainv[name]
        if len(args) != len(sigma):
            return out, f"step {n}: ({name} {' '.join(args)}) has {len(args)} arguments, expected {len(sigma)}"
        missing = [a for a in args if a not in oinv]
        if missing:
            return out, f"step {n}: generated object {missing[0]} has no reference counterpart"
        out.append((rname, tuple(oinv[args[sigma[i]]] for i in range(len(sigma)))))
    return out, None


def replay_plan(ref: NSpec, gen: NSpec, mapping: Mapping, plan, *, reference_texts=None,
                use_val: bool = False) -> dict[str, Any]:
    gen_steps = parse_plan(plan)
    steps, err = translate_plan(gen_steps, mapping)
    info: dict[str, Any] = {"checked": True, "steps": len(gen_steps),
                            "mapped_plan": [f"({' '.join([n, *a])})" for n, a in steps]}
    if err:
        info.update(valid=False, detail=err, by="mapping")
        return info
    complex_ref = ref.complex_goal or any(a.complex for a in ref.actions.values())
    if (use_val or complex_ref) and reference_texts is not None:
        try:
            from omtr.solver import validate_plan  # written by the environment issue
        except ImportError:
            validate_plan = None
        if validate_plan is not None:
            try:
                res = validate_plan(reference_texts[0], reference_texts[1], info["mapped_plan"])
                info.update(valid=bool(res.valid), detail=str(res.message), by="VAL")
                return info
            except Exception as exc:  # noqa: BLE001 - fall back to the simulator
                log.warning("VAL plan validation failed (%s); using the built-in simulator", exc)
    valid, detail = simulate(ref, steps)
    info.update(valid=valid, detail=detail, by="simulator")
    return info
