"""Logistics: trucks move packages within a city, airplanes fly them between airports.

Every city has one airport (its location 0) and at least one truck, and there is at least one
airplane when there are several cities, so every package can reach every location: instances are
solvable by construction, and ``_constructive_plan`` writes a plan (truck to airport, plane to the
destination city, truck to the destination) that the generator replays under the emitted PDDL.
"""

from __future__ import annotations

import random

from omtr.tasks.generators import Family, Instance, range_option, register, statement
from omtr.tasks.strips import render_problem

LOGISTICS_DOMAIN = """(define (domain logistics-omtr)
  (:requirements :strips :typing)
  (:types physobj location city - object
          package vehicle - physobj
          truck airplane - vehicle
          airport - location)
  (:predicates (at ?x - physobj ?l - location)
               (in ?p - package ?v - vehicle)
               (in-city ?l - location ?c - city))
  (:action load-truck
    :parameters (?p - package ?t - truck ?l - location)
    :precondition (and (at ?t ?l) (at ?p ?l))
    :effect (and (in ?p ?t) (not (at ?p ?l))))
  (:action unload-truck
    :parameters (?p - package ?t - truck ?l - location)
    :precondition (and (at ?t ?l) (in ?p ?t))
    :effect (and (at ?p ?l) (not (in ?p ?t))))
  (:action load-airplane
    :parameters (?p - package ?a - airplane ?l - airport)
    :precondition (and (at ?a ?l) (at ?p ?l))
    :effect (and (in ?p ?a) (not (at ?p ?l))))
  (:action unload-airplane
    :parameters (?p - package ?a - airplane ?l - airport)
    :precondition (and (at ?a ?l) (in ?p ?a))
    :effect (and (at ?p ?l) (not (in ?p ?a))))
  (:action drive-truck
    :parameters (?t - truck ?from - location ?to - location ?c - city)
    :precondition (and (at ?t ?from) (in-city ?from ?c) (in-city ?to ?c))
    :effect (and (at ?t ?to) (not (at ?t ?from))))
  (:action fly-airplane
    :parameters (?a - airplane ?from - airport ?to - airport)
    :precondition (at ?a ?from)
    :effect (and (at ?a ?to) (not (at ?a ?from)))))
"""

LOGISTICS_NL = """I move packages between locations with trucks and airplanes. Every location belongs to exactly one city, and each city has one location that is an airport. Trucks stay within their city; airplanes fly between airports. These are the actions:

Load a package into a truck at a location: possible only when the truck and the package are both at that location. Afterwards the package is in the truck and no longer at the location.
Unload a package from a truck at a location: possible only when the truck is at that location and the package is in the truck. Afterwards the package is at the location and no longer in the truck.
Load a package into an airplane at an airport: possible only when the airplane and the package are both at that airport. Afterwards the package is in the airplane and no longer at the airport.
Unload a package from an airplane at an airport: possible only when the airplane is at that airport and the package is in the airplane. Afterwards the package is at the airport and no longer in the airplane.
Drive a truck from one location to another location in a city: possible only when the truck is at the first location and both locations are in that city. Afterwards the truck is at the second location and no longer at the first.
Fly an airplane from one airport to another airport: possible only when the airplane is at the first airport. Afterwards the airplane is at the second airport and no longer at the first."""

DEFAULT_OPTIONS = {"cities": "2..3", "locations": "1..3", "planes": "1..2", "trucks_per_city": "1"}


def _nl_name(obj: str) -> str:
    kind = {"p": "package", "t": "truck", "a": "airplane", "c": "city", "l": "location"}[obj[0]]
    return f"{kind}_{obj[1:].replace('-', '_')}"


def _check(options: dict) -> dict:
    o = {**DEFAULT_OPTIONS, **options}
    return {
        "cities": range_option(o["cities"], "cities", 1),
        "locations": range_option(o["locations"], "locations", 1),
        "planes": range_option(o["planes"], "planes", 1),
        "trucks_per_city": range_option(o["trucks_per_city"], "trucks_per_city", 1),
    }


def sample_logistics(rng: random.Random, size: int, options: dict) -> Instance:
    n_cities = rng.randint(*options["cities"])
    n_planes = rng.randint(*options["planes"])
    objects: dict[str, str] = {}
    init: list[tuple[str, ...]] = []
    locs_of: dict[str, list[str]] = {}
    truck_of: dict[str, str] = {}
    pos: dict[str, str] = {}
    city_of: dict[str, str] = {}
    n_trucks = 0
    for c in range(n_cities):
        city = f"c{c}"
        locs = [f"l{c}-{i}" for i in range(rng.randint(*options["locations"]))]
        locs_of[city] = locs
        for i, loc in enumerate(locs):
            objects[loc] = "airport" if i == 0 else "location"
            city_of[loc] = city
        for _ in range(rng.randint(*options["trucks_per_city"])):
            t = f"t{n_trucks}"
            n_trucks += 1
            objects[t] = "truck"
            truck_of.setdefault(city, t)
            pos[t] = rng.choice(locs)
            city_of[t] = city
    airports = [locs_of[f"c{c}"][0] for c in range(n_cities)]
    for a in range(n_planes):
        objects[f"a{a}"] = "airplane"
        pos[f"a{a}"] = rng.choice(airports)
    for c in range(n_cities):
        objects[f"c{c}"] = "city"
    all_locs = [loc for locs in locs_of.values() for loc in locs]
    packages = [f"p{i}" for i in range(size)]
    goal_of: dict[str, str] = {}
    while True:
        for p in packages:
            pos[p] = rng.choice(all_locs)
            goal_of[p] = rng.choice(all_locs)
        if any(pos[p] != goal_of[p] for p in packages):
            break
    for p in packages:
        objects[p] = "package"
    for loc, city in city_of.items():
        if loc.startswith("l"):
            init.append(("in-city", loc, city))
    init.extend(("at", x, pos[x]) for x in sorted(pos, key=lambda x: (x[0], int(x[1:]))))
    goal = [("at", p, goal_of[p]) for p in packages]
    plan = _constructive_plan(dict(pos), goal_of, city_of, locs_of, truck_of, n_planes)

    nl_init = [f"{_nl_name(a)} is an airport" for a in airports]
    nl_init += [f"{_nl_name(loc)} is in the city {_nl_name(c)}" for loc, c in sorted(city_of.items()) if loc.startswith("l")]
    nl_init += [f"{_nl_name(x)} is at {_nl_name(loc)}" for (_, x, loc) in init if _ == "at"]
    nl_goal = [f"{_nl_name(p)} is at {_nl_name(g)}" for (_, p, g) in goal]
    return Instance(
        objects=objects,
        init=init,
        goal=goal,
        domain_pddl=LOGISTICS_DOMAIN,
        problem_pddl=render_problem("logistics-omtr", "logistics-omtr", objects, init, goal),
        nl_domain=LOGISTICS_NL,
        nl_problem=statement(nl_init, nl_goal),
        plan=plan,
        size=size,
        meta={"cities": n_cities, "airplanes": n_planes, "trucks": n_trucks, "packages": size},
    )


def _constructive_plan(pos, goal_of, city_of, locs_of, truck_of, n_planes) -> list[str]:
    plan: list[str] = []
    plane = "a0"

    def drive(t: str, to: str) -> None:
        if pos[t] != to:
            plan.append(f"(drive-truck {t} {pos[t]} {to} {city_of[t]})")
            pos[t] = to

    def by_truck(p: str, src: str, dst: str) -> None:
        if src == dst:
            return
        t = truck_of[city_of[src]]
        drive(t, src)
        plan.append(f"(load-truck {p} {t} {src})")
        drive(t, dst)
        plan.append(f"(unload-truck {p} {t} {dst})")

    for p, dst in goal_of.items():
        src = pos[p]
        if src == dst:
            continue
        cs, cd = city_of[src], city_of[dst]
        if cs == cd:
            by_truck(p, src, dst)
            continue
        a_src, a_dst = locs_of[cs][0], locs_of[cd][0]
        by_truck(p, src, a_src)
        if pos[plane] != a_src:
            plan.append(f"(fly-airplane {plane} {pos[plane]} {a_src})")
            pos[plane] = a_src
        plan.append(f"(load-airplane {p} {plane} {a_src})")
        plan.append(f"(fly-airplane {plane} {a_src} {a_dst})")
        pos[plane] = a_dst
        plan.append(f"(unload-airplane {p} {plane} {a_dst})")
        by_truck(p, a_dst, dst)
        pos[p] = dst
    return plan


register(
    Family(
        name="logistics",
        size_unit="packages",
        default_min=1,
        default_max=4,
        limit_min=1,
        limit_max=30,
        sample=sample_logistics,
        options={
            "cities": "number of cities, N or A..B (default 2..3)",
            "locations": "locations per city including its airport, N or A..B (default 1..3)",
            "planes": "number of airplanes, N or A..B (default 1..2)",
            "trucks_per_city": "trucks in each city, N or A..B (default 1)",
        },
        check_options=_check,
        description="trucks within cities, airplanes between airports, packages to deliver",
    )
)
