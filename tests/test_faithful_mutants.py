"""The mutation suite over the four families: the checker's proof (issue 4)."""

from __future__ import annotations

import random

import pytest

from omtr.faithfulness import check
from omtr.faithfulness.mutators import (
    FAITHFUL,
    FAMILIES,
    MUTATORS,
    accuracy,
    confusion_table,
    family_specs,
    format_table,
    rename_all,
    run_suite,
)

N_PER_FAMILY = 4


@pytest.fixture(scope="module", params=["planbench", "generators"])
def suite(request):
    return request.param, run_suite(FAMILIES, n_per_family=N_PER_FAMILY, seed=11, source=request.param)


def test_every_mutator_applies_somewhere(suite):
    source, rows = suite
    applied = {r.mutator for r in rows}
    # mutators that need a feature a family lacks are allowed to skip it, but each runs somewhere
    missing = {m.name for m in MUTATORS} - applied
    if source == "planbench":
        missing -= {"types_to_predicates"}  # PlanBench domains are untyped
    else:
        missing -= {"predicates_to_types", "add_universal_type"}  # generated domains are typed
    assert not missing, f"mutators never applied ({source}): {sorted(missing)}"


def test_mutation_targets_per_family(suite):
    source, rows = suite
    table = format_table(rows)
    print(f"\n[{source}]\n{table}")
    acc = accuracy(rows)
    assert set(acc) == set(FAMILIES)
    for family, a in acc.items():
        wrong = [r for r in rows if r.family == family and not r.verdict_ok]
        assert a["verdict_accuracy"] == 1.0, f"{family}: verdict wrong on {wrong[:3]}\n{table}"
        assert a["first_category_accuracy"] >= 0.95, f"{family}: first category below 95%\n{table}"
        assert a["n"] >= 15 * N_PER_FAMILY


def test_confusion_table_shape(suite):
    _, rows = suite
    table = confusion_table(rows)
    for family, by_expected in table.items():
        assert by_expected[FAITHFUL].get(FAITHFUL, 0) == sum(by_expected[FAITHFUL].values())
        total = sum(sum(c.values()) for c in by_expected.values())
        assert total == sum(1 for r in rows if r.family == family)


@pytest.mark.parametrize("family", ["blocksworld", "mystery_blocksworld", "logistics", "depots"])
def test_planbench_reference_vs_itself_and_renamed(family):
    for sid, d, p in family_specs(family, 8, seed=5, source="planbench"):
        assert check((d, p), (d, p)).faithful, sid
        rd, rp = rename_all(d, p, random.Random(sid))
        assert "(on " not in rp and "(at " not in rp  # really renamed
        report = check((d, p), (rd, rp))
        assert report.faithful, (sid, report.findings)
