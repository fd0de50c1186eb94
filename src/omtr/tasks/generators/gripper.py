"""Gripper: a robot with a left and a right gripper carries balls between rooms.

PlanBench has no Gripper; omtr generates it in the same style. Every instance is solvable (the
robot can reach every room and carry any ball); ``_constructive_plan`` moves misplaced balls two at
a time when they share a source and destination room.
"""

from __future__ import annotations

import random

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


def sample_gripper(rng: random.Random, size: int, options: dict) -> Instance:
    rooms = [f"room{i}" for i in range(1, rng.randint(*options["rooms"]) + 1)]
    balls = [f"ball{i}" for i in range(1, size + 1)]
    robot = rng.choice(rooms)
    while True:
        where = {b: rng.choice(rooms) for b in balls}
        goal_of = {b: rng.choice(rooms) for b in balls}
        if any(where[b] != goal_of[b] for b in balls):
            break
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
        options={"rooms": "number of rooms, N or A..B (default 2..3)"},
        check_options=_check,
        description="a two-gripper robot carrying balls between rooms",
    )
)
