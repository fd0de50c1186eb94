"""ProntoQA-style deductive reasoning: omtr's own generator, a loader and the answer check.

ProntoQA (Saparov & He, ICLR 2023; github.com/asaparov/prontoqa) builds a fictional ontology,
states it as rules ("Every wumpus is a tumpus."), names an entity's concept and asks whether a
property follows after k hops. Its JSON output maps example ids to objects whose
``test_example`` holds ``question``, ``query`` ("True or false: ..."), ``chain_of_thought`` and
``answer`` ("True"/"False"); ``load`` reads that layout (and a plain list of such examples).

The generator here is written from that description: 1-5 hops, made-up concept words, distractor
rules (the queried property with the opposite sign on a concept the entity does not belong to,
and unrelated properties on chain concepts), rules shuffled. Scoring: exact match of the final
true/false after normalisation (lower case, last "true"/"false" word in the answer).
"""

from __future__ import annotations

import json
import random
import re

from omtr.tasks.records import Task, TaskFormatError

_SYLLABLES = ("wum", "tum", "yum", "zum", "rom", "dum", "lem", "gor", "vum", "brim", "sterp", "impus", "jom", "numpus", "kar", "fip", "lorp", "shum", "grim", "tav")
_ADJECTIVES = (
    ("shy", "bold"), ("bitter", "sweet"), ("bright", "dull"), ("cold", "hot"), ("small", "large"), ("fast", "slow"),
    ("happy", "sad"), ("wooden", "metallic"), ("opaque", "transparent"), ("liquid", "solid"), ("red", "blue"),
    ("kind", "mean"), ("loud", "quiet"), ("sour", "spicy"), ("nervous", "calm"), ("floral", "fruity"),
)
_NAMES = ("Alex", "Wren", "Sally", "Max", "Rex", "Fae", "Sam", "Polly", "Stella", "Nora", "Leo", "Ivy")

HOPS = (1, 5)


def _concepts(rng: random.Random, n: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add(rng.choice(_SYLLABLES[:10]) + rng.choice(_SYLLABLES[10:]) if rng.random() < 0.5 else rng.choice(_SYLLABLES) + "pus")
    out = sorted(words)
    rng.shuffle(out)
    return out


def _plural(w: str) -> str:
    return w + "es" if w.endswith("s") else w + "s"


def _rule_is(a: str, b: str, rng: random.Random) -> str:
    return rng.choice((f"Every {a} is a {b}.", f"Each {a} is a {b}.", f"{_plural(a).capitalize()} are {_plural(b)}."))


def _rule_prop(a: str, adj: str, neg: bool, rng: random.Random) -> str:
    if neg:
        return rng.choice((f"Every {a} is not {adj}.", f"{_plural(a).capitalize()} are not {adj}.", f"Each {a} is not {adj}."))
    return rng.choice((f"Every {a} is {adj}.", f"{_plural(a).capitalize()} are {adj}.", f"Each {a} is {adj}."))


def generate_example(rng: random.Random, hops: int) -> dict:
    n_chain = hops  # concepts C0..C_{hops-1}; property on the last one
    words = _concepts(rng, n_chain + 2)
    chain, distract = words[:n_chain], words[n_chain:]
    entity = rng.choice(_NAMES)
    adj_pairs = rng.sample(_ADJECTIVES, min(len(_ADJECTIVES), n_chain + 1))
    q_adj = rng.choice(adj_pairs[0])
    prop_neg = rng.random() < 0.5  # the top concept's property is "not q_adj"
    query_neg = rng.random() < 0.5
    answer = (not prop_neg) != query_neg  # the entity has q_adj iff not prop_neg

    chain_rules = [_rule_is(chain[i], chain[i + 1], rng) for i in range(n_chain - 1)]
    chain_rules.append(_rule_prop(chain[-1], q_adj, prop_neg, rng))
    rules = list(chain_rules)
    # distractors: the opposite claim about q_adj on a concept the entity is not, hooked into the chain
    rules.append(_rule_prop(distract[0], q_adj, not prop_neg, rng))
    rules.append(_rule_is(distract[0], rng.choice(chain), rng))
    rules.append(_rule_is(distract[1], distract[0], rng))
    for i, c in enumerate(chain[:-1]):  # unrelated properties on chain concepts
        rules.append(_rule_prop(c, rng.choice(adj_pairs[i + 1]), rng.random() < 0.5, rng))
    rng.shuffle(rules)
    question = " ".join(rules) + f" {entity} is a {chain[0]}."
    query = f"True or false: {entity} is {'not ' if query_neg else ''}{q_adj}."
    cot = [f"{entity} is a {chain[0]}."]
    for i in range(n_chain - 1):
        cot += [chain_rules[i], f"{entity} is a {chain[i + 1]}."]
    cot += [chain_rules[-1], f"{entity} is {'not ' if prop_neg else ''}{q_adj}."]
    return {"question": question, "query": query, "chain_of_thought": cot, "answer": "True" if answer else "False", "hops": hops}


def generate(n: int, seed: int, *, hops: tuple[int, int] = HOPS) -> dict:
    """``n`` examples in ProntoQA's JSON layout, hops cycling through ``hops``."""
    rng = random.Random(f"omtr:prontoqa:{seed}")
    lo, hi = hops
    out = {}
    for i in range(n):
        h = lo + i % (hi - lo + 1)
        out[f"example{i + 1}"] = {"test_example": generate_example(rng, h)}
    return out


def to_tasks(raw: dict | list, *, split: str | None = "test", source: str = "prontoqa") -> list[Task]:
    items = raw.items() if isinstance(raw, dict) else ((f"example{i + 1}", x) for i, x in enumerate(raw))
    tasks = []
    for key, ex in items:
        test = ex.get("test_example", ex) if isinstance(ex, dict) else None
        if not isinstance(test, dict) or not {"question", "query", "answer"} <= set(test):
            raise TaskFormatError(f"ProntoQA example {key!r}: expected test_example with question, query and answer")
        hops = test.get("hops")
        if hops is None and test.get("chain_of_thought"):
            hops = max(1, (len(test["chain_of_thought"]) - 1) // 2)
        tasks.append(
            Task(
                id=f"prontoqa-{key}",
                family="prontoqa",
                split=split,
                nl=f"{test['question']}\n{test['query']}",
                reference=None,
                meta={"answer": str(test["answer"]), "hops": hops, "source": source},
            )
        )
    return tasks


def load(path: str, *, split: str | None = "test") -> list[Task]:
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    return to_tasks(raw, split=split, source=f"prontoqa:{path}")


def normalise(answer: str) -> str | None:
    words = re.findall(r"\b(true|false)\b", answer.lower())
    return words[-1] if words else None


def score(task: Task, answer: str) -> bool:
    return normalise(answer) == str(task.meta["answer"]).strip().lower()
