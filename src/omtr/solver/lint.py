"""omtr's own checks, run before any planner process starts.

Fast Downward and VAL accept some malformed specs silently (a wrong predicate arity, an
undeclared parameter type) or report them misleadingly as unsolvable. The checks here catch
those in about a millisecond and name the offending element, with a suggestion where one exists.
They only reject what is genuinely wrong; dubious but legal things become warnings.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field

from omtr.config import SolverConfig
from omtr.pddl.categories import Category
from omtr.pddl.model import (
    COMPARATORS, ROOT_TYPE, Domain, Problem, SpecError, SpecLimitError, atoms_of, conjunction_literals, parse_domain,
    parse_problem, parse_typed_list,
)
from omtr.pddl.sexpr import SList, to_text
from omtr.solver.verdict import Verdict

# The requirement flags Fast Downward's translator accepts; it stops on any other flag.
PLANNER_REQUIREMENTS = (
    ":strips", ":adl", ":typing", ":negation", ":equality", ":negative-preconditions",
    ":disjunctive-preconditions", ":existential-preconditions", ":universal-preconditions",
    ":quantified-preconditions", ":conditional-effects", ":derived-predicates", ":action-costs",
)
NUMERIC_OPS = {"increase", "decrease", "assign", "scale-up", "scale-down"}


@dataclass
class LintResult:
    domain: Domain | None = None
    problem: Problem | None = None
    error: SpecError | None = None
    warnings: list[str] = field(default_factory=list)
    # Facts lint found that explain a later planner failure (e.g. actions that can never fire).
    hints: list[tuple[Category, str]] = field(default_factory=list)
    domain_text: str | None = None  # the decoded input
    problem_text: str | None = None


def decode_input(data, what: str, cfg: SolverConfig) -> str:
    """Turn raw input into text or raise a ``syntax`` SpecError that says what is wrong."""
    if data is None:
        raise SpecError(Category.SYNTAX, f"{what}: no text given (None); pass the PDDL text", file=what)
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        if len(data) > cfg.max_file_bytes:
            raise _too_large(what, len(data), cfg)
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            # Fast Downward reads files as Latin-1 (any byte is a character) and accepts non-ASCII
            # only in comments; the reader applies the same rule to the decoded text.
            data = data.decode("latin-1")
    if not isinstance(data, str):
        raise SpecError(
            Category.SYNTAX, f"{what}: expected PDDL text, got {type(data).__name__}", file=what
        )
    if len(data) > cfg.max_file_bytes and len(data.encode("utf-8", "surrogatepass")) > cfg.max_file_bytes:
        raise _too_large(what, len(data.encode("utf-8", "surrogatepass")), cfg)
    nul = data.find("\x00")
    if nul >= 0:
        line = data.count("\n", 0, nul) + 1
        raise SpecError(
            Category.SYNTAX, f"{what}: contains a NUL character at line {line}; remove binary data", line, what
        )
    if not data.strip():
        raise SpecError(Category.SYNTAX, f"{what}: empty; expected (define ({what} NAME) ...)", file=what)
    try:
        data.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(
            Category.SYNTAX, f"{what}: contains unpaired surrogate characters; write plain UTF-8 text", file=what
        ) from None
    return data


def _too_large(what: str, size: int, cfg: SolverConfig) -> SpecLimitError:
    return SpecLimitError(
        f"size limit: the {what} is {size:,} bytes, over omtr's limit of {cfg.max_file_bytes:,} bytes per file "
        "(a guard against runaway model output, not a verdict on the PDDL); raise it with "
        "SolverConfig.max_file_bytes or `omtr solve --max-file-bytes N`",
        file=what,
    )


def _suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""


def lint(domain_text, problem_text, cfg: SolverConfig | None = None) -> LintResult:
    """Parse and check a spec. ``result.error`` is set for a spec the planner must not see."""
    cfg = cfg or SolverConfig()
    res = LintResult()
    try:
        dtext = decode_input(domain_text, "domain", cfg)
        ptext = decode_input(problem_text, "problem", cfg)
        res.domain_text, res.problem_text = dtext, ptext
        res.domain = dom = parse_domain(dtext, max_depth=cfg.max_nesting)
        res.problem = prob = parse_problem(ptext, max_depth=cfg.max_nesting)
        _check_domain(dom, res)
        _check_problem(dom, prob, res)
    except SpecError as exc:
        res.error = exc
    except RecursionError:  # defensive: nesting is bounded by the reader, formulas by max_nesting
        res.error = SpecLimitError(
            "nesting limit: the spec's formulas are nested too deeply to analyse; lower the nesting or "
            "SolverConfig.max_nesting"
        )
    return res


# ----------------------------------------------------------------------------------------- domain


def _check_type(dom: Domain, t: str, where: str, line: int | None) -> None:
    for member in (t.split(":")[1:] if t.startswith("either:") else [t]):
        if member != ROOT_TYPE and member not in dom.types:
            raise SpecError(
                Category.OBJECT_TYPE,
                f"type `{member}` used in {where} is not declared in :types{_suggest(member, dom.types)}"
                + ("" if dom.types else f"; add (:types {member}) and :typing to :requirements"),
                line,
            )


def _check_domain(dom: Domain, res: LintResult) -> None:
    _check_requirements(dom.requirements, "domain")
    res.warnings.extend(dom.notes)
    # type hierarchy
    for t, parents in dom.types.items():
        for parent in parents:
            _check_type(dom, parent, f"the declaration of type `{t}`", dom.lines.get(f"type:{t}"))
        if any(t in dom.ancestors(p) for p in parents):
            raise SpecError(Category.OBJECT_TYPE, f"type `{t}` is its own ancestor (cycle in :types)", dom.lines.get(f"type:{t}"))
    for c, t in dom.constants.items():
        _check_type(dom, t, f"constant `{c}`", dom.lines.get(f"constant:{c}"))
    for p, params in dom.predicates.items():
        # An undeclared type here is an error where the predicate is used (``_check_atom``); the
        # planner and VAL accept it on a predicate nothing uses, so that is only a warning.
        for v, t in params:
            try:
                _check_type(dom, t, f"parameter {v} of predicate `{p}`", dom.lines.get(f"predicate:{p}"))
            except SpecError as exc:
                res.warnings.append(exc.message)
    if not {":typing", ":adl"} & set(dom.requirements) and (
        dom.types or any(t != ROOT_TYPE for _, t in _all_params(dom))
    ):
        res.warnings.append("types are used but :typing is not in :requirements; add it")
    used_preds: set[str] = set()
    for act in dom.actions.values():
        for v, t in act.parameters:
            _check_type(dom, t, f"parameter {v} of action `{act.name}`", act.line)
        scope = dict(act.parameters)
        for part, formula in (("precondition", act.precondition), ("effect", act.effect)):
            if formula is None:
                continue
            _check_formula(dom, formula, scope, f"action `{act.name}` {part}", used_preds, effect=part == "effect")
        _action_hints(dom, act, res)
    derived = dom.derived_predicates
    for rule in dom.derived:
        where = f"derived predicate `{rule.name}` (line {rule.line})"
        if rule.name not in dom.predicates:  # legal, but then nothing may use it (as the planner reads it)
            res.warnings.append(
                f"{where} is not declared in :predicates, so no action or goal can use it; "
                f"declare ({rule.name} ...) there"
            )
        elif len(rule.parameters) != len(dom.predicates[rule.name]):
            raise SpecError(
                Category.PREDICATE_SCHEMA,
                f"{where} has {len(rule.parameters)} parameters but `{rule.name}` is declared with "
                f"{len(dom.predicates[rule.name])}",
                rule.line,
            )
        for v, t in rule.parameters:
            _check_type(dom, t, f"parameter {v} of {where}", rule.line)
        used_preds.add(rule.name)
        _check_formula(dom, rule.body, dict(rule.parameters), where, used_preds)
    for act in dom.actions.values():
        for atom, _, _ in atoms_of(act.effect, effect=True):
            if atom[0] in derived:
                raise SpecError(
                    Category.PREDICATE_SCHEMA,
                    f"action `{act.name}` changes `{atom[0]}` in its effect, but `{atom[0]}` is a derived "
                    "predicate (defined by :derived); only its rule may make it true",
                    act.line,
                )
    for p in dom.predicates:
        if p not in used_preds:
            res.warnings.append(f"predicate `{p}` is declared but no action uses it")


def _check_requirements(flags: list[str], what: str) -> None:
    for r in flags:
        if r not in PLANNER_REQUIREMENTS:
            raise SpecError(
                Category.SYNTAX,
                f"{what} :requirements: the planner does not support {r}; it reads only "
                f"{', '.join(PLANNER_REQUIREMENTS)}: remove {r}",
            )


def _all_params(dom: Domain):
    for params in dom.predicates.values():
        yield from params
    for act in dom.actions.values():
        yield from act.parameters


def _term_type(dom: Domain, term: str, scope: dict[str, str], objects: dict[str, str] | None, where: str, line, goal: bool):
    """The type of a term, or a SpecError naming what is undeclared."""
    if term.startswith("?"):
        if term in scope:
            return scope[term]
        raise SpecError(
            Category.GOAL_CONSTRAINT if goal else Category.PREDICATE_SCHEMA,
            f"variable {term} in {where} (line {line}) is not a parameter{_suggest(term, scope)}; "
            "declare it in :parameters or quantify it",
            line,
        )
    if term in dom.constants:
        return dom.constants[term]
    if objects is not None and term in objects:
        return objects[term]
    if objects is None:
        raise SpecError(
            Category.OBJECT_TYPE,
            f"`{term}` in {where} (line {line}) is neither a parameter nor a declared constant"
            f"{_suggest(term, list(scope) + list(dom.constants))}; use a ?variable or declare it in :constants",
            line,
        )
    raise SpecError(
        Category.GOAL_CONSTRAINT if goal else Category.OBJECT_TYPE,
        f"object `{term}` in {where} is not in :objects{_suggest(term, list(objects) + list(dom.constants))}",
        line,
    )


def _check_atom(dom: Domain, atom: SList, scope, objects, where: str, used: set[str], goal: bool = False):
    pred = atom[0]
    line = atom.line
    if isinstance(pred, list):
        raise SpecError(Category.SYNTAX, f"{where}: unexpected nested list at line {line}: {to_text(atom)[:60]}", line)
    args = atom[1:]
    for a in args:
        if isinstance(a, list):
            raise SpecError(
                Category.SYNTAX if not goal else Category.GOAL_CONSTRAINT,
                f"{where}: atom {to_text(atom)[:60]} at line {line} has a nested list as an argument",
                line,
            )
    if pred == "=":
        if len(args) != 2:
            raise SpecError(Category.PREDICATE_SCHEMA, f"{where}: (= ...) takes 2 arguments at line {line}", line)
        for a in args:
            _term_type(dom, a, scope, objects, where, line, goal)
        return
    cat = Category.GOAL_CONSTRAINT if goal else Category.PREDICATE_SCHEMA
    if pred in dom.predicates:
        params = dom.predicates[pred]
    elif pred in dom.types and len(args) == 1:  # a type used as a unary predicate
        _term_type(dom, args[0], scope, objects, where, line, goal)
        return
    else:
        raise SpecError(
            cat,
            f"predicate `{pred}` used in {where} (line {line}) is not declared in :predicates"
            f"{_suggest(pred, dom.predicates)}",
            line,
        )
    used.add(pred)
    if len(args) != len(params):
        sig = " ".join(f"{v} - {t}" if t != ROOT_TYPE else v for v, t in params)
        raise SpecError(
            cat,
            f"predicate `{pred}` takes {len(params)} argument{'s' if len(params) != 1 else ''} ({pred} {sig}) "
            f"but {to_text(atom)} in {where} (line {line}) gives {len(args)}",
            line,
        )
    for a, (v, t) in zip(args, params):
        _check_type(dom, t, f"parameter {v} of predicate `{pred}`", dom.lines.get(f"predicate:{pred}"))
        at = _term_type(dom, a, scope, objects, where, line, goal)
        if t != ROOT_TYPE and not dom.is_subtype(at, t):
            raise SpecError(
                Category.GOAL_CONSTRAINT if goal else Category.OBJECT_TYPE,
                f"{to_text(atom)} in {where} (line {line}): `{a}` has type `{at}` but parameter {v} of `{pred}` "
                f"needs `{t}`",
                line,
            )


def _check_formula(dom, f, scope, where, used, *, objects=None, effect=False, goal=False):
    if not isinstance(f, list):
        raise SpecError(Category.SYNTAX, f"{where}: expected a formula, found `{f}`")
    if not f:
        return  # () is the empty conjunction
    h = f[0]
    line = f.line
    if isinstance(h, list):
        raise SpecError(
            Category.SYNTAX,
            f"{where}: a formula at line {line} starts with '(('; did you forget `and`?",
            line,
        )
    if h in ("and",):
        for g in f[1:]:
            _check_formula(dom, g, scope, where, used, objects=objects, effect=effect, goal=goal)
    elif h == "not":
        if len(f) != 2:
            raise SpecError(Category.SYNTAX, f"{where}: (not ...) takes exactly one formula at line {line}", line)
        _check_formula(dom, f[1], scope, where, used, objects=objects, effect=effect, goal=goal)
    elif h in ("or", "imply") and not effect:
        for g in f[1:]:
            _check_formula(dom, g, scope, where, used, objects=objects, goal=goal)
    elif h in ("exists", "forall"):
        if len(f) != 3 or not isinstance(f[1], list):
            raise SpecError(Category.SYNTAX, f"{where}: ({h} (?v - type) FORMULA) expected at line {line}", line)
        if effect and h == "exists":
            raise SpecError(Category.PREDICATE_SCHEMA, f"{where}: `exists` is not allowed in an effect (line {line})", line)
        vs = parse_typed_list(f[1], f"{where} {h}", allow_vars=True)
        for v, t in vs:
            _check_type(dom, t, f"{where} {h}", line)
        _check_formula(dom, f[2], {**scope, **dict(vs)}, where, used, objects=objects, effect=effect, goal=goal)
    elif h == "when" and effect:
        if len(f) != 3:
            raise SpecError(Category.SYNTAX, f"{where}: (when CONDITION EFFECT) expected at line {line}", line)
        _check_formula(dom, f[1], scope, where, used, objects=objects, goal=goal)
        _check_formula(dom, f[2], scope, where, used, objects=objects, effect=True, goal=goal)
    elif h in NUMERIC_OPS and effect:
        if len(f) != 3 or not isinstance(f[1], list) or f[1].head not in dom.functions:
            fname = f[1].head if len(f) > 1 and isinstance(f[1], list) else f[1] if len(f) > 1 else "?"
            raise SpecError(
                Category.PREDICATE_SCHEMA,
                f"{where}: ({h} ...) at line {line} needs a function declared in :functions, found `{fname}`",
                line,
            )
    elif h in COMPARATORS and not effect:
        return
    elif h in ("or", "imply", "when", "exists") or h in NUMERIC_OPS:
        raise SpecError(
            Category.PREDICATE_SCHEMA,
            f"{where}: `{h}` is not allowed here (line {line})",
            line,
        )
    else:
        _check_atom(dom, f, scope, objects, where, used, goal=goal)


def _action_hints(dom: Domain, act, res: LintResult) -> None:
    pre = conjunction_literals(act.precondition) or []
    pos = {a for a, n in pre if not n}
    neg = {a for a, n in pre if n}
    both = pos & neg
    if both:
        atom = sorted(both)[0]
        msg = (
            f"action `{act.name}` can never fire: its precondition requires both {to_text(list(atom))} "
            f"and (not {to_text(list(atom))})"
        )
        res.warnings.append(msg)
        res.hints.append((Category.PRECONDITION_EFFECT, msg))


# ---------------------------------------------------------------------------------------- problem


def _check_problem(dom: Domain, prob: Problem, res: LintResult) -> None:
    _check_requirements(prob.requirements, "problem")
    if prob.domain_name != dom.name:
        raise SpecError(
            Category.SYNTAX,
            f"problem says (:domain {prob.domain_name}) but the domain is named `{dom.name}`; make them equal",
            None,
        )
    line = prob.lines.get(":objects")
    for o, t in prob.objects.items():
        _check_type(dom, t, f"the declaration of object `{o}`", line)
        if o in dom.constants:
            raise SpecError(
                Category.OBJECT_TYPE,
                f"object `{o}` is declared in :objects but is already a domain constant "
                f"(type `{dom.constants[o]}`); remove it from :objects",
                line,
            )
    used: set[str] = set()
    init_atoms: set[tuple] = set()
    negated: dict[tuple, SList] = {}
    for a in prob.init:
        if a.head == "not":  # legal: the planner and VAL read it as "false", which it is anyway
            if len(a) != 2 or not isinstance(a[1], list) or not a[1] or a[1].head in ("not", "=", None):
                raise SpecError(
                    Category.SYNTAX,
                    f"problem :init: {to_text(a)[:60]} at line {a.line}: write a negated atom as (not (p a b))",
                    a.line,
                )
            _check_atom(dom, a[1], {}, prob.objects, ":init", used)
            negated[tuple(a[1])] = a
            continue
        if a.head == "=":  # numeric fluent initialisation (= (total-cost) 0)
            if len(a) == 3 and isinstance(a[1], list) and a[1].head in dom.functions:
                continue
            raise SpecError(
                Category.PREDICATE_SCHEMA,
                f"problem :init: {to_text(a)[:60]} at line {a.line} must set a function declared in :functions",
                a.line,
            )
        for t in a[1:]:
            if isinstance(t, str) and t.startswith("?"):
                raise SpecError(
                    Category.SYNTAX,
                    f"problem :init: {to_text(a)} at line {a.line} contains the variable {t}; the initial state is ground",
                    a.line,
                )
        _check_atom(dom, a, {}, prob.objects, ":init", used)
        init_atoms.add(tuple(a))
    both = sorted(set(negated) & init_atoms)
    if both:
        text = to_text(list(both[0]))
        raise SpecError(
            Category.SYNTAX,
            f"problem :init states {text} both true and false (not {text}) at line {negated[both[0]].line}; "
            "keep one of them",
            negated[both[0]].line,
        )
    if negated:
        res.warnings.append(
            f"problem :init lists {len(negated)} negated atom{'s' if len(negated) > 1 else ''} such as "
            f"{to_text(negated[next(iter(negated))])}; they change nothing (unlisted atoms are false)"
        )
    _check_formula(dom, prob.goal, {}, ":goal", used, objects=prob.objects, goal=True)
    _check_goal_static(dom, prob, init_atoms, res)
    _check_unused(dom, prob, res)


def _effect_predicates(dom: Domain) -> tuple[set[str], set[str]]:
    adds, dels = set(), set()
    for act in dom.actions.values():
        for atom, neg, _ in atoms_of(act.effect, effect=True):
            (dels if neg else adds).add(atom[0])
    return adds, dels


def _check_goal_static(dom: Domain, prob: Problem, init_atoms: set[tuple], res: LintResult) -> None:
    lits = conjunction_literals(prob.goal)
    if lits is None:
        return
    adds, dels = _effect_predicates(dom)
    derived = dom.derived_predicates
    for atom, neg in lits:
        if atom[0] == "=" or atom[0] in derived or atom[0] in dom.types and atom[0] not in dom.predicates:
            continue  # equality, a derived predicate (its rule decides), or a type used as a predicate
        text = to_text(list(atom))
        if not neg and atom not in init_atoms and atom[0] not in adds:
            raise SpecError(
                Category.GOAL_CONSTRAINT,
                f"goal atom {text} can never become true: it is false initially and no action adds `{atom[0]}`"
                + (" (the predicate never changes, it is static)" if atom[0] not in dels else "")
                + "; add an action effect that makes it true or fix the goal",
                prob.lines.get(":goal"),
            )
        if neg and atom in init_atoms and atom[0] not in dels:
            raise SpecError(
                Category.GOAL_CONSTRAINT,
                f"goal (not {text}) can never hold: {text} is true initially and no action deletes `{atom[0]}`",
                prob.lines.get(":goal"),
            )
    if lits and not any(a[0] in derived for a, _ in lits) and all(
        (a in init_atoms) != n for a, n in lits if a[0] != "="
    ):
        res.warnings.append(
            "goal is already true in the initial state: the empty plan solves it (likely a solver-facing "
            "shortcut, not the task)"
        )


def _check_unused(dom: Domain, prob: Problem, res: LintResult) -> None:
    mentioned: set[str] = set()
    for a in prob.init:
        mentioned.update(x for x in a[1:] if isinstance(x, str))
    for atom, _, _ in atoms_of(prob.goal):
        mentioned.update(x for x in atom[1:] if isinstance(x, str))
    unused = [o for o in prob.objects if o not in mentioned]
    if unused:
        res.warnings.append(
            f"object{'s' if len(unused) > 1 else ''} {', '.join('`%s`' % o for o in unused[:5])} "
            "appear in neither :init nor :goal"
        )


def lint_verdict(domain, problem, cfg: SolverConfig):
    """(verdict or None, lint result, lint ms)."""
    t0 = time.perf_counter()
    res = lint(domain, problem, cfg)
    ms = (time.perf_counter() - t0) * 1000
    if res.error is not None:
        e = res.error
        v = Verdict.failure(e.category, e.message, stage="lint", warnings=res.warnings,
                            too_large=isinstance(e, SpecLimitError))
        v.timings = {"lint_ms": ms, "total_ms": ms}
        return v, res, ms
    return None, res, ms
