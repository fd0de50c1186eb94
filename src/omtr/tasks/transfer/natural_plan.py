"""NATURAL PLAN (Zheng et al., 2024; github.com/google-deepmind/natural-plan): Trip Planning and
Calendar Scheduling — loaders for the official JSON files, the official-style answer checks, and
small generators of tasks in the same format so the loaders and checks are exercised for real.

Official files (downloaded by users; CC-BY-4.0): ``data/trip_planning.json`` and
``data/calendar_scheduling.json``, each a JSON object keyed by example id with ``prompt_0shot``,
``prompt_5shot``, ``golden_plan`` and task fields — trip: ``cities`` and ``durations``
('**'-separated), ``num_cities``; calendar: ``num_people``, ``num_days``, ``duration``.

Scoring, as the benchmark describes it:
* trip: parse the answer's "Day X-Y" stay spans into (city, days) and count it correct only if the
  whole sequence equals the gold ``cities``/``durations`` (flight days count for both cities);
* calendar: the first "Day, HH:MM - HH:MM" in the answer must equal the gold slot exactly.
The parsers here are omtr's own implementation of those rules.
"""

from __future__ import annotations

import itertools
import json
import random
import re

from omtr.tasks.records import Task, TaskFormatError

# ----------------------------------------------------------------------------- trip planning

CITIES = (
    "Oslo", "Dubrovnik", "Vienna", "Lisbon", "Krakow", "Porto", "Riga", "Seville", "Bucharest", "Tallinn",
    "Munich", "Zurich", "Helsinki", "Prague", "Florence", "Nice", "Valencia", "Split", "Brussels", "Stockholm",
    "Athens", "Budapest", "Dublin", "Venice", "Reykjavik", "Lyon", "Geneva", "Hamburg", "Warsaw", "Naples",
)
_EVENTS = ("attend a wedding", "attend a workshop", "meet a friend", "visit relatives", "see a concert", "attend a conference")


def _spans(order: list[str], durations: dict[str, int]) -> list[tuple[str, int, int]]:
    out, start = [], 1
    for c in order:
        end = start + durations[c] - 1
        out.append((c, start, end))
        start = end  # the flight day counts for both cities
    return out


def _valid_orders(cities, durations, flights, fixed) -> list[tuple[str, ...]]:
    ok = []
    for perm in itertools.permutations(cities):
        if any(frozenset(p) not in flights for p in zip(perm, perm[1:])):
            continue
        spans = {c: (s, e) for c, s, e in _spans(list(perm), durations)}
        if all(spans[c][0] <= a and b <= spans[c][1] for c, (a, b) in fixed.items()):
            ok.append(perm)
    return ok


def trip_example(rng: random.Random, n_cities: int) -> dict:
    order = rng.sample(CITIES, n_cities)
    durations = {c: rng.randint(2, 5) for c in order}
    total = sum(durations.values()) - (n_cities - 1)
    flights = {frozenset(p) for p in zip(order, order[1:])}
    for a, b in itertools.combinations(order, 2):  # extra direct flights make the order a puzzle
        if rng.random() < 0.35:
            flights.add(frozenset((a, b)))
    spans = {c: (s, e) for c, s, e in _spans(order, durations)}
    fixed: dict[str, tuple[int, int]] = {}
    candidates = order[:]
    rng.shuffle(candidates)
    while len(_valid_orders(order, durations, flights, fixed)) > 1:
        c = candidates.pop()
        s, e = spans[c]
        fixed[c] = (s, e) if e - s < 2 else tuple(sorted(rng.sample(range(s, e + 1), 2)))  # type: ignore[assignment]
        if not candidates:
            fixed = {c: spans[c] for c in order}
            break
    lines = [f"You plan to visit {n_cities} European cities for {total} days in total. You only take direct flights between cities."]
    events = {}
    for c in sorted(order, key=lambda _: rng.random()):
        lines.append(f"You want to spend {durations[c]} days in {c}.")
        if c in fixed:
            ev = rng.choice(_EVENTS)
            events[c] = ev
            a, b = fixed[c]
            lines.append(f"You will {ev} in {c} between day {a} and day {b}.")
    pairs = sorted(tuple(sorted(f)) for f in flights)
    lines.append("\nThese cities have direct flights:\n" + ", ".join(f"{a} and {b}" for a, b in pairs) + ".")
    lines.append(f"\nFind a trip plan that visits these cities for {total} days, flying directly between them.")
    problem = "\n".join(lines)
    plan = [f"Here is the trip plan for visiting the {n_cities} European cities for {total} days:\n"]
    for i, (c, s, e) in enumerate(_spans(order, durations)):
        if i == 0:
            plan.append(f"**Day {s}-{e}:** Arriving in {c} and visit {c} for {durations[c]} days.")
        else:
            plan.append(f"**Day {s}:** Fly from {order[i - 1]} to {c}.")
            plan.append(f"**Day {s}-{e}:** Visit {c} for {durations[c]} days.")
    return {
        "cities": "**".join(order),
        "durations": "**".join(str(durations[c]) for c in order),
        "num_cities": n_cities,
        "problem": problem,
        "golden_plan": "\n".join(plan),
    }


_TRIP_INTRO = "You are an expert at planning trips. You are given a few constraints regarding the cities to visit and the durations of staying at each city. Here are some examples of tasks and solutions:\n\n"


def _with_prompts(examples: list[dict], intro: str) -> dict:
    out = {}
    for i, ex in enumerate(examples):
        shots = [examples[(i + k) % len(examples)] for k in range(1, 6)] if len(examples) > 1 else []
        shot_txt = "".join(f"TASK: {s['problem']}\nSOLUTION: {s['golden_plan']}\n\n" for s in shots)
        body = {k: v for k, v in ex.items() if k not in ("problem", "_id")}
        body["prompt_0shot"] = f"TASK: {ex['problem']}\nSOLUTION:"
        body["prompt_5shot"] = intro + shot_txt + f"TASK: {ex['problem']}\nSOLUTION:"
        out[ex["_id"]] = body
    return out


def generate_trip(n: int, seed: int, *, cities: tuple[int, int] = (3, 6)) -> dict:
    rng = random.Random(f"omtr:trip:{seed}")
    exs = []
    for i in range(n):
        ex = trip_example(rng, rng.randint(*cities))
        ex["_id"] = f"trip_planning_example_{i}"
        exs.append(ex)
    return _with_prompts(exs, _TRIP_INTRO)


def parse_trip(answer: str, cities: list[str]) -> list[tuple[str, int]]:
    """(city, days) for every 'Day X-Y' stay span in the answer, in order."""
    out = []
    for line in answer.splitlines():
        m = re.search(r"Day\s*(\d+)\s*-\s*(\d+)", line, re.IGNORECASE)
        if not m:
            continue
        rest = line[m.end():]
        found = sorted((rest.find(c), c) for c in cities if c in rest)
        out.append((found[0][1] if found else "?", int(m.group(2)) - int(m.group(1)) + 1))
    return out


def score_trip(task: Task, answer: str) -> bool:
    cities = task.meta["cities"].split("**")
    durations = [int(x) for x in task.meta["durations"].split("**")]
    return parse_trip(answer, cities) == list(zip(cities, durations))


# ----------------------------------------------------------------------------- calendar scheduling

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
PEOPLE = (
    "Alice", "Bruno", "Chen", "Dana", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas",
    "Kemal", "Lucia", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara",
)
START_H, END_H = 9, 17  # work hours
SLOTS = (END_H - START_H) * 2  # half-hour slots per day


def _clock(slot: int) -> str:
    minutes = START_H * 60 + 30 * slot
    return f"{minutes // 60}:{minutes % 60:02d}"


def calendar_example(rng: random.Random, num_people: int, num_days: int) -> dict:
    names = rng.sample(PEOPLE, num_people)
    dur = rng.choice((1, 2))  # half-hours
    gday, gstart = rng.randrange(num_days), rng.randrange(SLOTS - dur + 1)
    busy = {p: [[False] * SLOTS for _ in range(num_days)] for p in names}
    for d in range(num_days):
        for s in range(SLOTS):
            if d == gday and gstart <= s < gstart + dur:
                continue
            for p in names:  # random extra meetings
                if rng.random() < 0.25:
                    busy[p][d][s] = True
    # close every other window of the right length so the gold slot is the only one
    for d in range(num_days):
        for s in range(SLOTS - dur + 1):
            if d == gday and s == gstart:
                continue
            window = range(s, s + dur)
            if not any(busy[p][d][t] for p in names for t in window):
                free = [t for t in window if not (d == gday and gstart <= t < gstart + dur)]
                busy[rng.choice(names)][d][rng.choice(free)] = True
    lines = [
        f"You need to schedule a meeting for {', '.join(names[:-1])} and {names[-1]} for "
        f"{'half an hour' if dur == 1 else 'one hour'} between the work hours of {START_H}:00 to {END_H}:00 on "
        f"{' or '.join(DAYS[:num_days]) if num_days > 1 else DAYS[0]}.",
        "",
        "Here are the existing schedules for everyone during the days:",
    ]
    for p in names:
        parts = []
        for d in range(num_days):
            s = 0
            while s < SLOTS:
                if busy[p][d][s]:
                    e = s
                    while e < SLOTS and busy[p][d][e]:
                        e += 1
                    parts.append(f"{DAYS[d]} during {_clock(s)} to {_clock(e)}")
                    s = e
                else:
                    s += 1
        lines.append(f"{p} has meetings on {', '.join(parts)};" if parts else f"{p} is free the entire time;")
    lines.append("\nFind a time that works for everyone's schedule. There is exactly one such time.")
    return {
        "num_people": num_people,
        "num_days": num_days,
        "duration": dur / 2,
        "problem": "\n".join(lines),
        "golden_plan": f"Here is the proposed time: {DAYS[gday]}, {_clock(gstart)} - {_clock(gstart + dur)} ",
    }


_CAL_INTRO = "You are an expert at scheduling meetings. You are given a few constraints on the existing schedule of each participant. Here are a few example tasks and solutions:\n\n"


def generate_calendar(n: int, seed: int, *, people: tuple[int, int] = (2, 5), days: tuple[int, int] = (1, 3)) -> dict:
    rng = random.Random(f"omtr:calendar:{seed}")
    exs = []
    for i in range(n):
        ex = calendar_example(rng, rng.randint(*people), rng.randint(*days))
        ex["_id"] = f"calendar_scheduling_example_{i}"
        exs.append(ex)
    return _with_prompts(exs, _CAL_INTRO)


_SLOT = re.compile(r"(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\s*,?\s*(\d{1,2}):(\d{2})\s*[-–]\s*(\d{1,2}):(\d{2})", re.IGNORECASE)


def parse_slot(text: str) -> tuple[str, int, int, int, int] | None:
    """(day, start hour, start minute, end hour, end minute) of the first slot in ``text``."""
    m = _SLOT.search(text)
    if not m:
        return None
    return (m.group(1).capitalize(), *(int(m.group(i)) for i in range(2, 6)))  # type: ignore[return-value]


def score_calendar(task: Task, answer: str) -> bool:
    gold = parse_slot(task.meta["golden_plan"])
    return gold is not None and parse_slot(answer) == gold


# ----------------------------------------------------------------------------- loading


TRIP_FIELDS = ("cities", "durations", "num_cities", "golden_plan")
CALENDAR_FIELDS = ("num_people", "num_days", "duration", "golden_plan")


def to_tasks(raw: dict, kind: str, *, split: str | None = "test", source: str = "natural-plan", prompt: str = "prompt_0shot") -> list[Task]:
    fields = TRIP_FIELDS if kind == "trip" else CALENDAR_FIELDS
    if not isinstance(raw, dict):
        raise TaskFormatError("NATURAL PLAN files are a JSON object keyed by example id")
    tasks = []
    for key, ex in raw.items():
        missing = [f for f in (*fields, prompt) if f not in ex]
        if missing:
            raise TaskFormatError(f"NATURAL PLAN {kind} example {key!r}: missing fields {missing}")
        meta = {f: ex[f] for f in fields}
        meta["source"] = source
        tasks.append(Task(id=f"{kind}-{key}", family=f"natural_plan_{kind}", split=split, nl=ex[prompt], reference=None, meta=meta))
    return tasks


def load(path: str, kind: str, *, split: str | None = "test") -> list[Task]:
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    return to_tasks(raw, kind, split=split, source=f"natural-plan:{path}")
