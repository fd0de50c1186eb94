"""How well a problem's facts line up with the facts its task states in English (annotation-free).

The planner cannot tell a spec of the task from a spec of an easier task of the model's own making:
a 135M model rewarded for any plan writes one object named after the domain and a goal it reaches
in one step (see the README's "Does it learn?"). This module scores the other half, from the task's
own text and the generated problem only (never a reference): each clause of the statement ("the red
block is on top of the blue block") should have an atom over the objects it names, in the same part
(initial state or goal) and in the same order, and each atom of the problem should stand for such a
clause.

* The statement is the text after the task's last ``[STATEMENT]`` line (the PlanBench layout the
  task suites use); the words of the text before it (the domain's description) are not names.
* A statement's *names* are its words that are not words of the description: colours, ``ball_1``,
  ``room_2``. The goal part starts at the first sentence that says "goal".
* Clauses are split at commas, "and", full stops and semicolons; a clause's key is the names it holds
  in order. An atom's key is its arguments as names: an argument is the name it spells (``ball1`` and
  ``ball_1`` alike) or holds as a part (``red_block`` names ``red``); an argument that names nothing
  spoils the atom's key. Clauses and atoms without names (the hand is empty; ``(handempty)``; an atom
  over objects the statement never names) are left out, so a problem over objects of its own
  making pairs with nothing and scores 0.
* Clauses and atoms are paired one to one within a part: 1 for the same names in the same order,
  0.5 for the same names in another order. The score is the F1 of those pairings:
  ``2 * paired / (clauses + atoms)``, in [0, 1].

It returns None when it cannot judge: a text without ``[STATEMENT]``, or a statement with no names.
It does not read predicates (the given domain's names rarely appear in the English), so it cannot
tell ``(clear red)`` from ``(ontable red)``; the planner's verdict and the rest of the reward have
to. The statement is read by :func:`omtr.statement.read_statement`, as scoped decoding reads it.
"""

from __future__ import annotations

from typing import Sequence

from omtr.statement import (  # noqa: F401  (statement_parts and the names are part of this module's API)
    STATEMENT, TEMPLATE_WORDS, _norm, name_of as _name_of, name_parts, read_statement, statement_parts,
)


def _atom_keys(atoms: Sequence[Sequence[str]], names: set[str]) -> list[tuple]:
    keys = []
    for atom in atoms:
        args = [str(x) for x in list(atom)[1:]]
        if not args:
            continue
        key = tuple(_name_of(a, names) for a in args)
        if all(k is None for k in key):
            continue  # over objects the statement does not name (the left gripper): no clause to pair with
        keys.append(key if all(k is not None for k in key) else ("\0unnamed",))
    return keys


def _paired(clause_keys: list[tuple], atom_keys: list[tuple]) -> float:
    """One-to-one pairing credit: exact (same order) matches first, then same names in any order."""
    free = list(atom_keys)
    credit = 0.0
    rest = []
    for k in clause_keys:
        if k in free:
            free.remove(k)
            credit += 1.0
        else:
            rest.append(k)
    for k in rest:
        for j, a in enumerate(free):
            if sorted(a, key=str) == sorted(k):
                del free[j]
                credit += 0.5
                break
    return credit


def grounding_score(nl: str, problem_text: str | None) -> float | None:
    """The F1 of the statement's clauses against the problem's init and goal atoms (module doc):
    1 when every named clause has its atom and every atom its clause; 0 when the problem does not
    parse or names nothing of the statement; None when the text gives nothing to judge by."""
    reading = read_statement(nl)  # the one reading of the English (omtr.statement)
    names = set(reading.norm_names)
    if not names or reading.layout == "plain":  # free English's reading is partial: nothing to score by
        return None

    ck_init, ck_goal = (list(k) for k in reading.facts)
    if not ck_init and not ck_goal:
        return None
    if not problem_text:
        return 0.0
    from omtr.pddl.model import SpecError, conjunction_literals, parse_problem

    try:
        prob = parse_problem(problem_text)
    except (SpecError, RecursionError):
        return 0.0
    goal = conjunction_literals(prob.goal)
    goal_atoms = [a for a, neg in (goal or []) if not neg]
    ak_init = _atom_keys(prob.init, names)
    ak_goal = _atom_keys(goal_atoms, names)
    if not ck_goal:  # no goal sentence: one pool
        ak_init, ak_goal = ak_init + ak_goal, []
    total = len(ck_init) + len(ck_goal) + len(ak_init) + len(ak_goal)
    if total == 0:
        return None
    paired = _paired(ck_init, ak_init) + _paired(ck_goal, ak_goal)
    return round(2.0 * paired / total, 6)
