"""Build tests/data/handwritten_tuning.jsonl: the TUNING set of hand-written plain-English tasks (issue 43).

The plain-English reader and the rules that use it are tuned on these tasks only; the 22 tasks of
``handwritten_tasks.jsonl`` stay held out for the before/after measurement. Written by hand in the
way a user would, with phrasing not used there; the references come from hand-listed facts in the
library's domains (run from the repository root:
PYTHONPATH=src python tests/data/make_handwritten_tuning.py).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_handwritten_tasks import bw, dp, gr, lg, write  # noqa: E402

T = [
 ("tune-bw-01", "blocksworld", "Block a is on the table and block b is on a. The hand is empty. "
  "Put b on the table and then stack a on b.",
  bw("a b", [["a", "b"]], [("table", "b"), ("a", "b")])),
 ("tune-bw-02", "blocksworld", "We have blocks x, y and z. x is on y, y is on z and z is on the table. "
  "Nothing is on x. I want z on top of x.",
  bw("x y z", [["z", "y", "x"]], [("z", "x")])),
 ("tune-bw-03", "blocksworld", "Blocks d and e are on the table, and block f sits on top of block d. Put e onto f.",
  bw("d e f", [["d", "f"], ["e"]], [("e", "f")])),
 ("tune-bw-04", "blocksworld", "The stack is a on b on c, with c on the table. Move c onto a.",
  bw("a b c", [["c", "b", "a"]], [("c", "a")])),
 ("tune-bw-05", "blocksworld", "The yellow block and the orange block are both on the table, and the hand is empty. "
  "Stack the yellow block on the orange block.",
  bw("yellow orange", [["yellow"], ["orange"]], [("yellow", "orange")])),
 ("tune-bw-06", "blocksworld", "Blocks m, n and o are on the table. Build a tower: o on n and n on m.",
  bw("m n o", [["m"], ["n"], ["o"]], [("o", "n"), ("n", "m")])),
 ("tune-bw-07", "blocksworld", "Block k is on block j, j is on the table, and block l is on the table too. "
  "The hand holds nothing. I need j on top of l.",
  bw("j k l", [["j", "k"], ["l"]], [("j", "l")])),
 ("tune-bw-08", "blocksworld", "a is on b, b is on the table and c is on the table. Clear b by moving a onto c.",
  bw("a b c", [["b", "a"], ["c"]], [("a", "c")])),
 ("tune-gr-01", "gripper", "The robot is in room r1 and both grippers are empty. Balls b1 and b2 are in room r2. "
  "Bring b1 and b2 to room r1.",
  gr(["r1", "r2"], ["b1", "b2"], "r1", {"b1": "r2", "b2": "r2"}, {"b1": "r1", "b2": "r1"})),
 ("tune-gr-02", "gripper", "There are two rooms, west and east. The robot is in west, and ball1 is in east. "
  "Move ball1 to west.",
  gr(["west", "east"], ["ball1"], "west", {"ball1": "east"}, {"ball1": "west"})),
 ("tune-gr-03", "gripper", "Ball a is in room1, ball b is in room2, and the robot is in room1 with both grippers free. "
  "I want ball a in room2 and ball b in room1.",
  gr(["room1", "room2"], ["a", "b"], "room1", {"a": "room1", "b": "room2"}, {"a": "room2", "b": "room1"})),
 ("tune-gr-04", "gripper", "Three balls, ball1, ball2 and ball3, are in room3. The robot is in room1. "
  "Take ball2 to room1.",
  gr(["room1", "room3"], ["ball1", "ball2", "ball3"], "room1", {f"ball{i}": "room3" for i in (1, 2, 3)},
     {"ball2": "room1"})),
 ("tune-lg-01", "logistics", "There is one city with two spots, s1 and s2. Truck tr1 and package pk are at s1. "
  "Deliver pk to s2.",
  lg({"city": {"s1": False, "s2": False}}, ["tr1"], [], ["pk"], {"tr1": "s1", "pk": "s1"}, {"pk": "s2"})),
 ("tune-lg-02", "logistics", "Package pk1 is at airport ap1 in city c1. Plane pl1 is at airport ap2 in city c2. "
  "Deliver pk1 to ap2.",
  lg({"c1": {"ap1": True}, "c2": {"ap2": True}}, [], ["pl1"], ["pk1"], {"pk1": "ap1", "pl1": "ap2"}, {"pk1": "ap2"})),
 ("tune-dp-01", "depots", "Depot d has hoist h1 and two pallets, pa and pb. Crate c1 is on pa and pb is clear. "
  "Hoist h1 is available. Move c1 onto pb.",
  dp("d - depot h1 - hoist pa pb - pallet c1 - crate",
     ["(at h1 d)", "(available h1)", "(at pa d)", "(at pb d)", "(at c1 d)", "(on c1 pa)", "(clear c1)",
      "(clear pb)"], ["(on c1 pb)"])),
 ("tune-dp-02", "depots", "In depot0, crate c2 is on crate c1 and c1 is on pallet p0. Pallet p1 is also in depot0, "
  "and hoist h0 there is available. Put c2 on p1.",
  dp("depot0 - depot h0 - hoist p0 p1 - pallet c1 c2 - crate",
     ["(at h0 depot0)", "(available h0)", "(at p0 depot0)", "(at p1 depot0)", "(at c1 depot0)", "(at c2 depot0)",
      "(on c1 p0)", "(on c2 c1)", "(clear c2)", "(clear p1)"], ["(on c2 p1)"])),
]

if __name__ == "__main__":
    write("tests/data/handwritten_tuning.jsonl", T, split="val")
    print(len(T))
