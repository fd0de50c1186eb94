"""Gripper: a robot with a left and a right gripper carries balls between rooms.

PlanBench has no Gripper; omtr generates it in the same style. Every instance is solvable (the
robot can reach every room and carry any ball); ``_constructive_plan`` moves misplaced balls two at
a time when they share a source and destination room.

The statement names every object the problem declares: the typed domain has no fact about a room by
itself, so a room is named only where the robot or a ball is in it at the start or in the goal, and
``_cover_rooms`` sees to it that every declared room is (a sentence listing the rooms would be a
clause with no atom of the reference behind it). The grippers are "the left gripper" and "the right
gripper", the words of the statement's clauses that name nothing.
"""

from __future__ import annotations

import random
from collections import Counter

from omtr.tasks.generators import Family, Instance, range_option, register, statement
from omtr.tasks.strips import render_problem

GRIPPER_DOMAIN = """(define (domain gripper-omtr)
  (:requirements :strips :typing)
  (:types room ball gripper)
  (:predicates (at-robby ?r - room)
               (at ?b - ball ?r - room)
               (free ?g - gripper)
               (carry ?b - ball ?g - gripper))
  (:action move
    :parameters (?from ?to - room)
    :precondition (at-robby ?from)
    :effect (and (at-robby ?to) (not (at-robby ?from))))
  (:action pick
    :parameters (?b - ball ?r - room ?g - gripper)
    :precondition (and (at ?b ?r) (at-robby ?r) (free ?g))
    :effect (and (carry ?b ?g) (not (at ?b ?r)) (not (free ?g))))
  (:action drop
    :parameters (?b - ball ?r - room ?g - gripper)
    :precondition (and (carry ?b ?g) (at-robby ?r))
    :effect (and (at ?b ?r) (free ?g) (not (carry ?b ?g)))))
"""

GRIPPER_NL = """A robot with two grippers, a left one and a right one, carries balls between rooms. Each gripper carries at most one ball at a time. These are the actions:

Move from one room to another room: possible only when the robot is in the first room. Afterwards the robot is in the second room and no longer in the first.
Pick a ball in a room with a gripper: possible only when the ball and the robot are both in that room and the gripper is free. Afterwards the gripper carries the ball, the ball is no longer in the room, and the gripper is no longer free.
Drop a ball in a room from a gripper: possible only when the gripper carries the ball and the robot is in that room. Afterwards the ball is in the room, the gripper is free, and the gripper no longer carries the ball."""

DEFAULT_OPTIONS = {"rooms": "2..3"}


def _check(options: dict) -> dict:
    o = {**DEFAULT_OPTIONS, **options}
    return {"rooms": range_option(o["rooms"], "rooms", 2)}


def _fact(atom) -> str:
    pred, *args = atom
    nm = [a.replace("room", "room_").replace("ball", "ball_") for a in args]
    if pred == "at-robby":
        return f"the robot is in {nm[0]}"
    if pred == "at":
        return f"{nm[0]} is in {nm[1]}"
    if pred == "free":
        return f"the {nm[0]} gripper is free"
    if pred == "carry":
        return f"the {nm[1]} gripper carries {nm[0]}"
    raise ValueError(pred)


def _cover_rooms(rooms: list[str], robot: str, where: dict[str, str], goal_of: dict[str, str]):
    """(robot, where, goal_of) with every room holding the robot or a ball at the start or in the
    goal, so that the statement names every room. A draw that already does is returned as it is;
    otherwise, for each unnamed room in turn, one position (the robot's, a ball's start or its goal)
    whose room is held by another position too moves to it, chosen by a generator seeded with the
    draw itself (deterministic, and the caller's stream is left as it was). A ball whose start or
    goal moves to a room no position held is misplaced afterwards, so some ball still is."""
    slots = [("robot", "")] + [("where", b) for b in where] + [("goal", b) for b in goal_of]
    at = {("robot", ""): robot, **{("where", b): r for b, r in where.items()},
          **{("goal", b): r for b, r in goal_of.items()}}
    unnamed = [r for r in rooms if r not in set(at.values())]
    if not unnamed:
        return robot, where, goal_of
    if len(rooms) > len(slots):
        raise ValueError(f"{len(rooms)} rooms cannot all be named with {len(where)} balls")
    fix = random.Random(repr((rooms, robot, sorted(where.items()), sorted(goal_of.items()))))
    for room in unnamed:
        held = Counter(at.values())
        at[fix.choice([s for s in slots if held[at[s]] > 1])] = room
    return (at[("robot", "")], {b: at[("where", b)] for b in where}, {b: at[("goal", b)] for b in goal_of})


def sample_gripper(rng: random.Random, size: int, options: dict) -> Instance:
    # at most one room per position the statement can name it by: the robot's, each ball's start and goal
    n_rooms = min(rng.randint(*options["rooms"]), 2 * size + 1)
    rooms = [f"room{i}" for i in range(1, n_rooms + 1)]
    balls = [f"ball{i}" for i in range(1, size + 1)]
    robot = rng.choice(rooms)
    while True:
        where = {b: rng.choice(rooms) for b in balls}
        goal_of = {b: rng.choice(rooms) for b in balls}
        if any(where[b] != goal_of[b] for b in balls):
            break
    robot, where, goal_of = _cover_rooms(rooms, robot, where, goal_of)
    objects = {**{r: "room" for r in rooms}, **{b: "ball" for b in balls}, "left": "gripper", "right": "gripper"}
    init = [("at-robby", robot), ("free", "left"), ("free", "right")] + [("at", b, where[b]) for b in balls]
    goal = [("at", b, goal_of[b]) for b in balls]
    return Instance(
        objects=objects,
        init=init,
        goal=goal,
        domain_pddl=GRIPPER_DOMAIN,
        problem_pddl=render_problem("gripper-omtr", "gripper-omtr", objects, init, goal),
        nl_domain=GRIPPER_NL,
        nl_problem=statement([_fact(a) for a in init], [_fact(a) for a in goal]),
        plan=_constructive_plan(robot, where, goal_of),
        size=size,
        meta={"rooms": len(rooms), "balls": size},
    )


def _constructive_plan(robot: str, where: dict[str, str], goal_of: dict[str, str]) -> list[str]:
    plan: list[str] = []
    groups: dict[tuple[str, str], list[str]] = {}
    for b in where:
        if where[b] != goal_of[b]:
            groups.setdefault((where[b], goal_of[b]), []).append(b)
    for (src, dst), bs in groups.items():
        for i in range(0, len(bs), 2):
            load = bs[i : i + 2]
            if robot != src:
                plan.append(f"(move {robot} {src})")
                robot = src
            for b, g in zip(load, ("left", "right")):
                plan.append(f"(pick {b} {src} {g})")
            plan.append(f"(move {src} {dst})")
            robot = dst
            for b, g in zip(load, ("left", "right")):
                plan.append(f"(drop {b} {dst} {g})")
    return plan


register(
    Family(
        name="gripper",
        size_unit="balls",
        default_min=2,
        default_max=8,
        limit_min=1,
        limit_max=40,
        sample=sample_gripper,
        options={"rooms": "number of rooms, N or A..B (default 2..3); at most 2 x balls + 1, since every room "
                         "holds the robot or a ball at the start or in the goal"},
        check_options=_check,
        description="a two-gripper robot carrying balls between rooms",
    )
)
