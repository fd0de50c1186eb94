"""BlocksWorld (4 operators) and Mystery BlocksWorld (the same dynamics under unrelated names).

Instances are random initial towers and random goal towers over the same blocks; the goal lists
the ``on`` relations of the goal towers (as PlanBench does). Any arrangement is reachable from any
other, and ``_constructive_plan`` builds a plan with the classic "move a block straight to its
final place if it can, otherwise put a misplaced block on the table" strategy.
"""

from __future__ import annotations

import random

from omtr.pddl.plan import format_step, parse_step
from omtr.tasks.generators import Family, GenerationError, Instance, join_facts, register, statement
from omtr.tasks.strips import render_problem

COLOURS = (
    "red", "blue", "orange", "yellow", "white", "magenta", "black", "cyan", "green", "violet",
    "silver", "gold", "brown", "pink", "grey", "purple", "teal", "maroon", "olive", "navy",
)
LETTERS = "abcdefghijklmnopqrst"
MAX_BLOCKS = len(COLOURS)

# canonical predicate / action names (the plain BlocksWorld vocabulary)
CANON_PREDICATES = ("clear", "ontable", "handempty", "holding", "on")
CANON_ACTIONS = ("pick-up", "put-down", "stack", "unstack")


def _domain_pddl(name: str, p: dict[str, str], a: dict[str, str]) -> str:
    """The 4-operator domain under a vocabulary ``p`` (predicates) and ``a`` (actions)."""
    c, t, e, h, o = (p[k] for k in CANON_PREDICATES)
    return f"""(define (domain {name})
  (:requirements :strips)
  (:predicates ({c} ?x) ({t} ?x) ({e}) ({h} ?x) ({o} ?x ?y))
  (:action {a['pick-up']}
    :parameters (?x)
    :precondition (and ({c} ?x) ({t} ?x) ({e}))
    :effect (and ({h} ?x) (not ({c} ?x)) (not ({t} ?x)) (not ({e}))))
  (:action {a['put-down']}
    :parameters (?x)
    :precondition ({h} ?x)
    :effect (and ({c} ?x) ({e}) ({t} ?x) (not ({h} ?x))))
  (:action {a['stack']}
    :parameters (?x ?y)
    :precondition (and ({h} ?x) ({c} ?y))
    :effect (and ({o} ?x ?y) ({c} ?x) ({e}) (not ({h} ?x)) (not ({c} ?y))))
  (:action {a['unstack']}
    :parameters (?x ?y)
    :precondition (and ({o} ?x ?y) ({c} ?x) ({e}))
    :effect (and ({h} ?x) ({c} ?y) (not ({o} ?x ?y)) (not ({c} ?x)) (not ({e})))))
"""


IDENTITY_P = {k: k for k in CANON_PREDICATES}
IDENTITY_A = {k: k for k in CANON_ACTIONS}
BLOCKSWORLD_DOMAIN = _domain_pddl("blocksworld-4ops", IDENTITY_P, IDENTITY_A)

BLOCKSWORLD_NL = """I have a collection of blocks that I rearrange with one hand, one block at a time. A block is clear when no block sits on it and I am not holding it. Four moves are available:

Pick up a block: allowed only when the block is clear, it rests on the table, and my hand is empty. Afterwards I am holding that block; it is no longer on the table or clear, and my hand is no longer empty.
Put down a block: allowed only when I am holding that block. Afterwards it rests on the table and is clear, my hand is empty, and I am no longer holding it.
Stack a block on top of another block: allowed only when I am holding the first block and the second block is clear. Afterwards the first block is on top of the second and is clear, my hand is empty, I am no longer holding the first block, and the second block is no longer clear.
Unstack a block from on top of another block: allowed only when the first block is on top of the second, the first block is clear, and my hand is empty. Afterwards I am holding the first block, the second block is clear, the first block is no longer on top of the second or clear, and my hand is no longer empty."""


def _bw_fact(atom, name: dict[str, str]) -> str:
    pred, args = atom[0], [name[x] for x in atom[1:]]
    if pred == "clear":
        return f"the {args[0]} block is clear"
    if pred == "ontable":
        return f"the {args[0]} block is on the table"
    if pred == "handempty":
        return "the hand is empty"
    if pred == "holding":
        return f"I am holding the {args[0]} block"
    if pred == "on":
        return f"the {args[0]} block is on top of the {args[1]} block"
    raise ValueError(f"unknown blocksworld predicate {pred}")


# ----------------------------------------------------------------------------- Mystery vocabulary

# PlanBench's classic obfuscation (the names are a published fact of the benchmark).
PLANBENCH_MYSTERY = (
    {"clear": "province", "ontable": "planet", "handempty": "harmony", "holding": "pain", "on": "craves"},
    {"pick-up": "attack", "put-down": "succumb", "stack": "overcome", "unstack": "feast"},
)

# Pools for fresh vocabularies; none of these words says anything about blocks, hands or towers.
_UNARY_WORDS = (
    "lantern", "meadow", "comet", "harbor", "quartz", "violin", "orchard", "prism", "tundra", "sonnet",
    "saffron", "marble", "canyon", "glacier", "beacon", "ember", "thistle", "nebula", "juniper", "cobalt",
    "falcon", "lagoon", "pepper", "riddle", "tangent", "velvet", "walnut", "zephyr", "cipher", "monsoon",
)
_NULLARY_WORDS = ("harmony", "serenity", "twilight", "silence", "bounty", "solstice", "reverie", "equinox", "stillness", "jubilee")
_BINARY_WORDS = ("craves", "admires", "echoes", "fancies", "mirrors", "shadows", "resents", "envies", "trails", "greets", "haunts", "courts")
_ACTION_WORDS = (
    "attack", "succumb", "feast", "overcome", "whisper", "ignite", "polish", "wander", "summon", "banish",
    "kindle", "gather", "scatter", "ferment", "carve", "juggle", "murmur", "sprinkle", "dazzle", "ponder",
)


def random_vocabulary(rng: random.Random) -> tuple[dict[str, str], dict[str, str]]:
    u = rng.sample(_UNARY_WORDS, 3)
    preds = {"clear": u[0], "ontable": u[1], "holding": u[2], "handempty": rng.choice(_NULLARY_WORDS), "on": rng.choice(_BINARY_WORDS)}
    acts = dict(zip(CANON_ACTIONS, rng.sample(_ACTION_WORDS, 4)))
    return preds, acts


def _mystery_fact(atom, p: dict[str, str], name: dict[str, str]) -> str:
    pred, args = atom[0], [f"object {name[x]}" for x in atom[1:]]
    word = p[pred]
    if pred == "handempty":
        return word
    if pred == "on":
        return f"{args[0]} {word} {args[1]}"
    return f"{word} {args[0]}"


def mystery_domain_nl(p: dict[str, str], a: dict[str, str]) -> str:
    c, t, e, h, o = (p[k] for k in CANON_PREDICATES)

    def one(x: str) -> str:
        return f"{x} object"

    def listing(xs: list[str]) -> str:
        return join_facts(xs)

    pk, pd, st, us = (a[k] for k in CANON_ACTIONS)
    lines = [
        "I work with a set of objects and four kinds of action, with these rules:",
        "",
        f"{pk.capitalize()} object: possible only when {listing([one(c), one(t), e])} are all true. "
        f"Afterwards {one(h)} is true, and {listing([one(c), one(t), e])} become false.",
        f"{pd.capitalize()} object: possible only when {one(h)} is true. "
        f"Afterwards {listing([one(c), e, one(t)])} are true, and {one(h)} becomes false.",
        f"{st.capitalize()} object from another object: possible only when {one(h)} and "
        f"{c} other object are true. Afterwards {e}, {c} object and object {o} other object are true, "
        f"and {c} other object and {h} object become false.",
        f"{us.capitalize()} object from another object: possible only when object {o} other object, "
        f"{c} object and {e} are all true. Afterwards {h} object and {c} other object are true, and "
        f"object {o} other object, {c} object and {e} become false.",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sampling


def random_towers(rng: random.Random, blocks: list[str]) -> list[list[str]]:
    """Random arrangement: a random order cut into towers (each listed bottom to top)."""
    order = blocks[:]
    rng.shuffle(order)
    towers: list[list[str]] = []
    for b in order:
        if towers and rng.random() < 0.6:
            rng.choice(towers).append(b)
        else:
            towers.append([b])
    return towers


def _below(towers: list[list[str]]) -> dict[str, str]:
    out = {}
    for tw in towers:
        for i, b in enumerate(tw):
            out[b] = "table" if i == 0 else tw[i - 1]
    return out


def state_atoms(towers: list[list[str]]) -> list[tuple[str, ...]]:
    atoms = [("handempty",)]
    for tw in towers:
        atoms.append(("clear", tw[-1]))
        atoms.append(("ontable", tw[0]))
        atoms.extend(("on", tw[i], tw[i - 1]) for i in range(1, len(tw)))
    return atoms


def goal_atoms(towers: list[list[str]]) -> list[tuple[str, ...]]:
    return [("on", tw[i], tw[i - 1]) for tw in towers for i in range(1, len(tw))]


def constructive_plan(init_towers: list[list[str]], goal_towers: list[list[str]]) -> list[str]:
    """A valid plan from the initial towers to the goal towers (full configuration)."""
    below = _below(init_towers)
    target = _below(goal_towers)
    above: dict[str, str | None] = {b: None for b in below}
    for b, u in below.items():
        if u != "table":
            above[u] = b

    def placed(b: str) -> bool:
        while True:
            if below[b] != target[b]:
                return False
            if below[b] == "table":
                return True
            b = below[b]

    def move(b: str, dest: str) -> None:
        src = below[b]
        plan.append(f"(pick-up {b})" if src == "table" else f"(unstack {b} {src})")
        plan.append(f"(put-down {b})" if dest == "table" else f"(stack {b} {dest})")
        if src != "table":
            above[src] = None
        if dest != "table":
            above[dest] = b
        below[b] = dest

    plan: list[str] = []
    for _ in range(4 * len(below) + 4):
        misplaced = [b for b in below if not placed(b)]
        if not misplaced:
            return plan
        clear = [b for b in misplaced if above[b] is None]
        direct = [b for b in clear if target[b] == "table" or (above[target[b]] is None and placed(target[b]))]
        if direct:
            move(direct[0], target[direct[0]])
            continue
        off = [b for b in clear if below[b] != "table"]
        if not off:  # cannot happen for a forest of goal towers
            raise RuntimeError("blocksworld constructive planner is stuck")
        move(off[0], "table")
    raise RuntimeError("blocksworld constructive planner did not terminate")


def _rename_plan(plan: list[str], actions: dict[str, str]) -> list[str]:
    out = []
    for step in map(parse_step, plan):
        out.append(format_step(actions[step.name], step.args))
    return out


def _sample_towers(rng: random.Random, size: int):
    blocks = list(LETTERS[:size])
    while True:
        init_t = random_towers(rng, blocks)
        goal_t = random_towers(rng, blocks)
        goal = goal_atoms(goal_t)
        init = state_atoms(init_t)
        if goal and not set(goal) <= set(init):
            return blocks, init_t, goal_t, init, goal


def sample_blocksworld(rng: random.Random, size: int, options: dict) -> Instance:
    blocks, init_t, goal_t, init, goal = _sample_towers(rng, size)
    names = dict(zip(blocks, COLOURS))
    plan = constructive_plan(init_t, goal_t)
    objects = {b: "object" for b in blocks}
    return Instance(
        objects=objects,
        init=init,
        goal=goal,
        domain_pddl=BLOCKSWORLD_DOMAIN,
        problem_pddl=render_problem("bw-omtr", "blocksworld-4ops", objects, init, goal, typed=False),
        nl_domain=BLOCKSWORLD_NL,
        nl_problem=statement([_bw_fact(a, names) for a in sorted(init)], [_bw_fact(a, names) for a in goal]),
        plan=plan,
        size=size,
    )


def _mystery_options(options: dict) -> dict:
    vocab = options.get("vocabulary", "planbench")
    if vocab not in ("planbench", "random", "random-per-task"):
        raise GenerationError(
            f"mystery_blocksworld: vocabulary must be planbench, random (one fresh vocabulary per seed) "
            f"or random-per-task, got {vocab!r}"
        )
    return {"vocabulary": vocab}


def sample_mystery(rng: random.Random, size: int, options: dict) -> Instance:
    vocab = options["vocabulary"]
    if vocab == "planbench":
        p, a = PLANBENCH_MYSTERY
    elif vocab == "random":
        # one vocabulary per generate() call: drawn once from the run's first draw
        if "_vocab" not in options:
            options["_vocab"] = random_vocabulary(random.Random(rng.random()))
        p, a = options["_vocab"]
    else:
        p, a = random_vocabulary(rng)
    blocks, init_t, goal_t, init, goal = _sample_towers(rng, size)
    names = {b: b for b in blocks}

    def ren(atom):
        return (p[atom[0]], *atom[1:])

    m_init, m_goal = [ren(x) for x in init], [ren(x) for x in goal]
    objects = {b: "object" for b in blocks}
    return Instance(
        objects=objects,
        init=m_init,
        goal=m_goal,
        domain_pddl=_domain_pddl("mystery-4ops", p, a),
        problem_pddl=render_problem("mystery-omtr", "mystery-4ops", objects, m_init, m_goal, typed=False),
        nl_domain=mystery_domain_nl(p, a),
        nl_problem=statement(
            [_mystery_fact(x, p, names) for x in sorted(init)], [_mystery_fact(x, p, names) for x in goal]
        ),
        plan=_rename_plan(constructive_plan(init_t, goal_t), a),
        size=size,
        struct=(init, goal),
        meta={"vocabulary": vocab, "predicate_names": dict(p), "action_names": dict(a)},
    )


register(
    Family(
        name="blocksworld",
        size_unit="blocks",
        default_min=3,
        default_max=7,
        limit_min=2,
        limit_max=MAX_BLOCKS,
        sample=sample_blocksworld,
        description="4-operator BlocksWorld: random initial and goal towers",
    )
)
register(
    Family(
        name="mystery_blocksworld",
        size_unit="blocks",
        default_min=3,
        default_max=7,
        limit_min=2,
        limit_max=MAX_BLOCKS,
        sample=sample_mystery,
        options={"vocabulary": "planbench (PlanBench's names), random (fresh names per seed) or random-per-task"},
        check_options=_mystery_options,
        description="BlocksWorld with every predicate and action renamed to unrelated words",
    )
)
