"""Judge separation utilities: partition, mean ± sd, rank AUC, drift distribution."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from omtr.faithfulness import check
from omtr.faithfulness.separation import (
    auc,
    drift_distribution,
    drift_rate,
    group_of,
    mean_sd,
    partition,
    separation,
)


def _auc_bruteforce(pos, neg):
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auc_known_values():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1, 0.2], [0.9, 0.8]) == 0.0
    assert auc([0.5, 0.5], [0.5, 0.5]) == 0.5
    assert auc([0.3, 0.7], [0.5]) == 0.5
    assert math.isnan(auc([], [0.1]))
    assert math.isnan(auc([0.1], []))


def test_auc_matches_pairwise_definition_with_ties():
    rng = random.Random(0)
    for _ in range(50):
        pos = [rng.choice([0.1, 0.2, 0.5, 0.7, 0.9]) for _ in range(rng.randint(1, 12))]
        neg = [rng.choice([0.1, 0.2, 0.5, 0.7, 0.9]) for _ in range(rng.randint(1, 12))]
        assert auc(pos, neg) == pytest.approx(_auc_bruteforce(pos, neg))


def test_mean_sd():
    assert mean_sd([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert mean_sd([4.0]) == (4.0, 0.0)
    m, sd = mean_sd([])
    assert math.isnan(m) and math.isnan(sd)


@dataclass
class Cand:
    solved: bool
    faithful: bool | None
    judge_score: float
    categories: list = field(default_factory=list)


def test_partition_and_separation():
    cands = [
        Cand(False, None, 0.1), Cand(False, None, 0.3),
        Cand(True, False, 0.5, ["goal_weakened"]), Cand(True, False, 0.6, ["goal_weakened", "init_changed"]),
        Cand(True, False, 0.4, ["precondition_dropped"]),
        Cand(True, True, 0.9), Cand(True, True, 0.8), Cand(True, True, 0.55),
    ]
    parts = partition(cands)
    assert [len(parts[g]) for g in "UDF"] == [2, 3, 3]
    sep = separation(cands)
    assert sep["U"]["n"] == 2 and sep["U"]["judge_mean"] == pytest.approx(0.2)
    assert sep["F"]["judge_mean"] == pytest.approx((0.9 + 0.8 + 0.55) / 3)
    assert sep["auc_f_vs_d"] == pytest.approx(_auc_bruteforce([0.9, 0.8, 0.55], [0.5, 0.6, 0.4]))
    dist = drift_distribution(cands)
    assert dist["n"] == 3 and dist["counts"] == {"goal_weakened": 2, "precondition_dropped": 1}
    assert sum(dist["shares"].values()) == pytest.approx(1.0)
    assert drift_rate(cands) == pytest.approx(0.5)


def test_dict_candidates_with_reports(benchmarks):
    base = benchmarks / "planbench" / "instances" / "blocksworld"
    d = (base / "generated_domain.pddl").read_text()
    p = (base / "generated_basic" / "instance-1.pddl").read_text()
    weak = p.replace("(on c b)", "")
    good, bad = check((d, p), (d, p)), check((d, p), (d, weak))
    cands = [
        {"solved": True, "report": good.to_dict(), "judge_score": 0.8},
        {"solved": True, "report": bad, "judge_score": 0.7},
        {"solved": False, "judge_score": 0.2},
    ]
    assert [group_of(c) for c in cands] == ["F", "D", "U"]
    assert drift_distribution(cands)["counts"] == {"goal_weakened": 1}
    assert separation(cands)["auc_f_vs_d"] == 1.0


def test_solved_without_verdict_is_an_error():
    with pytest.raises(ValueError, match="faithfulness verdict"):
        group_of({"solved": True, "judge_score": 0.3})
