"""Build tests/data/handwritten_tasks.jsonl: English written by hand, reference problems from hand-listed facts
(run from the repository root: PYTHONPATH=src python tests/data/make_handwritten_tasks.py)."""
import json
from omtr.tasks.library import shipped_domains

D = {d.name: d.domain for d in shipped_domains()}
NAMES = {"blocksworld": "blocksworld-4ops", "gripper": "gripper-omtr", "logistics": "logistics-strips",
         "depots": "depots", "mystery_blocksworld": "mystery-4ops"}


def bw(blocks, towers, goal):
    """towers: bottom-first lists; goal: (x, y) pairs x on y, or ('table', x)."""
    init = ["(handempty)"]
    for t in towers:
        init.append(f"(ontable {t[0]})")
        for lo, hi in zip(t, t[1:]):
            init.append(f"(on {hi} {lo})")
        init.append(f"(clear {t[-1]})")
    g = [f"(ontable {y})" if x == "table" else f"(on {x} {y})" for x, y in goal]
    return f"(define (problem p) (:domain blocksworld-4ops) (:objects {' '.join(blocks.split())})\n (:init {' '.join(init)})\n (:goal (and {' '.join(g)})))"


def gr(rooms, balls, robot, where, goal, robot_goal=None):
    init = [f"(at-robby {robot})", "(free left)", "(free right)"] + [f"(at {b} {r})" for b, r in where.items()]
    g = [f"(at {b} {r})" for b, r in goal.items()] + ([f"(at-robby {robot_goal})"] if robot_goal else [])
    return (f"(define (problem p) (:domain gripper-omtr) (:objects {' '.join(rooms)} - room {' '.join(balls)} - ball "
            f"left right - gripper)\n (:init {' '.join(init)})\n (:goal (and {' '.join(g)})))")


def lg(cities, trucks, planes, packages, at, goal):
    """cities: {city: {loc: is_airport}}; at: {thing: loc}."""
    objs, init = [], []
    for c, locs in cities.items():
        objs.append(c); init.append(f"(city {c})")
        for l, ap in locs.items():
            objs.append(l); init += [f"(location {l})", f"(in-city {l} {c})"] + ([f"(airport {l})"] if ap else [])
    for t in trucks: objs.append(t); init.append(f"(truck {t})")
    for a in planes: objs.append(a); init.append(f"(airplane {a})")
    for p in packages: objs.append(p); init.append(f"(obj {p})")
    init += [f"(at {x} {l})" for x, l in at.items()]
    g = [f"(at {p} {l})" for p, l in goal.items()]
    return f"(define (problem p) (:domain logistics-strips) (:objects {' '.join(objs)})\n (:init {' '.join(init)})\n (:goal (and {' '.join(g)})))"


def dp(objs, init, goal):
    return f"(define (problem p) (:domain depots) (:objects {objs})\n (:init {' '.join(init)})\n (:goal (and {' '.join(goal)})))"


T = [
 ("hw-bw-01", "blocksworld", "There are two blocks, a and b, on the table. Put a on b.",
  bw("a b", [["a"], ["b"]], [("a", "b")])),
 ("hw-bw-02", "blocksworld", "I have three blocks stacked up: c is at the bottom, b sits on c and a is on top of b. "
  "Please reverse the stack so that c ends up on top and a is at the bottom.",
  bw("a b c", [["c", "b", "a"]], [("c", "b"), ("b", "a")])),
  ("hw-bw-03", "blocksworld", "Block x is lying on block y, and block z is on the table next to them. "
  "I want y on top of z.",
  bw("x y z", [["y", "x"], ["z"]], [("y", "z")])),
 ("hw-bw-04", "blocksworld", "Four blocks a, b, c and d are all on the table. Build one tower with d at the bottom, "
  "then c, then b, and a at the very top.",
  bw("a b c d", [["a"], ["b"], ["c"], ["d"]], [("c", "d"), ("b", "c"), ("a", "b")])),
 ("hw-bw-05", "blocksworld", "The red block is on the blue block and the green block is on the table. Move the "
  "red block onto the green one.",
  bw("red blue green", [["blue", "red"], ["green"]], [("red", "green")])),
 ("hw-bw-06", "blocksworld", "Unstack everything: block p is on block q, q is on block r and r is on the table. "
  "I'd like all three blocks on the table.",
  bw("p q r", [["r", "q", "p"]], [("table", "p"), ("table", "q"), ("table", "r")])),
 ("hw-bw-07", "blocksworld", "On the table there are two towers of blocks: a on b, and c on d. Swap them around so that b is on a and d is on c.",
  bw("a b c d", [["b", "a"], ["d", "c"]], [("b", "a"), ("d", "c")])),
 ("hw-bw-08", "blocksworld", "Stack block e on block f. Right now block f has block g on it, and e is on the table.",
  bw("e f g", [["f", "g"], ["e"]], [("e", "f")])),
 ("hw-gr-01", "gripper", "A robot with two grippers, left and right, is in room1. Ball1 and ball2 are also in room1. "
  "Carry both balls to room2.",
  gr(["room1", "room2"], ["ball1", "ball2"], "room1", {"ball1": "room1", "ball2": "room1"}, {"ball1": "room2", "ball2": "room2"})),
 ("hw-gr-02", "gripper", "My robot is standing in the kitchen with empty grippers. The ball named red is in the "
  "hall. Get the red ball into the kitchen.",
  gr(["kitchen", "hall"], ["red"], "kitchen", {"red": "hall"}, {"red": "kitchen"})),
 ("hw-gr-03", "gripper", "Three balls b1, b2 and b3 lie in room a, the robot is in room b. Move b1 to room b and b3 to "
  "room c, and leave b2 where it is.",
  gr(["a", "b", "c"], ["b1", "b2", "b3"], "b", {"b1": "a", "b2": "a", "b3": "a"}, {"b1": "b", "b3": "c", "b2": "a"})),
 ("hw-gr-04", "gripper", "The robot needs to bring ball x from room one to room two and then come back to room one. "
  "It starts in room one, both grippers free.",
  gr(["one", "two"], ["x"], "one", {"x": "one"}, {"x": "two"}, robot_goal="one")),
 ("hw-gr-05", "gripper", "Swap the balls: ball p is in the lab and ball q is in the office. I want p in the office and q in "
  "the lab. The robot waits in the lab with both of its grippers free.",
  gr(["lab", "office"], ["p", "q"], "lab", {"p": "lab", "q": "office"}, {"p": "office", "q": "lab"})),
 ("hw-gr-06", "gripper", "There are four balls, ball1 to ball4, in room2, and the robot is in room1. Bring all of them to room1.",
  gr(["room1", "room2"], ["ball1", "ball2", "ball3", "ball4"], "room1", {f"ball{i}": "room2" for i in range(1, 5)},
     {f"ball{i}": "room1" for i in range(1, 5)})),
 ("hw-lg-01", "logistics", "A package p1 waits at the post office in Boston. Deliver it to the Boston airport. "
  "There is a truck t1 at the Boston airport.",
  lg({"boston": {"postoffice": False, "bostonairport": True}}, ["t1"], [], ["p1"], {"t1": "bostonairport", "p1": "postoffice"},
     {"p1": "bostonairport"})),
 ("hw-lg-02", "logistics", "Ship parcel p from the airport of city A to the airport of city B. Airplane plane1 is parked at city A's airport.",
  lg({"a": {"airporta": True}, "b": {"airportb": True}}, [], ["plane1"], ["p"], {"plane1": "airporta", "p": "airporta"},
     {"p": "airportb"})),
 ("hw-lg-03", "logistics", "I have two cities, paris and rome, each with an airport and a depot. A package is at the paris depot "
  "and must end up at the rome depot. Each city has one truck at its airport, and an airplane is at the paris airport.",
  lg({"paris": {"parisairport": True, "parisdepot": False}, "rome": {"romeairport": True, "romedepot": False}},
     ["paristruck", "rometruck"], ["airplane"], ["package"],
     {"paristruck": "parisairport", "rometruck": "romeairport", "airplane": "parisairport", "package": "parisdepot"},
     {"package": "romedepot"})),
 ("hw-lg-04", "logistics", "Within one city there are two locations, north and south, and truck t is at north. "
  "Move packages p1 and p2 from north to south.",
  lg({"city": {"north": False, "south": False}}, ["t"], [], ["p1", "p2"], {"t": "north", "p1": "north", "p2": "north"},
     {"p1": "south", "p2": "south"})),
 ("hw-lg-05", "logistics", "Fly the two packages, pkg1 and pkg2, from the airport in city1 to the airport in city2 with the airplane "
  "that is waiting at the city2 airport.",
  lg({"city1": {"airport1": True}, "city2": {"airport2": True}}, [], ["airplane"], ["pkg1", "pkg2"],
     {"airplane": "airport2", "pkg1": "airport1", "pkg2": "airport1"}, {"pkg1": "airport2", "pkg2": "airport2"})),
 ("hw-dp-01", "depots", "In the depot, crate c1 sits on pallet p1 and pallet p2 is empty. Hoist h is free. Put crate c1 on pallet p2.",
  dp("depot - depot h - hoist p1 p2 - pallet c1 - crate",
     ["(at h depot)", "(available h)", "(at p1 depot)", "(at p2 depot)", "(at c1 depot)", "(on c1 p1)", "(clear c1)",
      "(clear p2)"], ["(on c1 p2)"])),
 ("hw-dp-02", "depots", "Crate c is on pallet p0 in depot d0. Use truck t, which is at depot d0, and the hoists h0 at d0 and "
  "h1 at the distributor s0, to move the crate onto pallet p1 at the distributor.",
  dp("d0 - depot s0 - distributor t - truck h0 h1 - hoist p0 p1 - pallet c - crate",
     ["(at t d0)", "(at h0 d0)", "(at h1 s0)", "(available h0)", "(available h1)", "(at p0 d0)", "(at p1 s0)",
      "(at c d0)", "(on c p0)", "(clear c)", "(clear p1)"], ["(on c p1)"])),
 ("hw-my-01", "mystery_blocksworld", "Harmony holds, objects a and b are both planets and both provinces. Make object a crave object b.",
  "(define (problem p) (:domain mystery-4ops) (:objects a b)\n (:init (harmony) (planet a) (planet b) (province a) (province b))\n (:goal (and (craves a b))))"),
]



def write(path: str, tasks, split: str = "test") -> None:
    with open(path, "w") as fh:
        for i, fam, nl, prob in tasks:
            fh.write(json.dumps({"id": i, "family": fam, "split": split, "nl": nl,
                                 "reference": {"domain": D[fam], "problem": prob},
                                 "meta": {"source": "handwritten"}}) + "\n")


if __name__ == "__main__":
    write("tests/data/handwritten_tasks.jsonl", T)
    print(len(T))
