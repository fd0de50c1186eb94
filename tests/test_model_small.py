"""SmolLM2-135M-Instruct (the ``small`` profile) for real: load, generate with and without grammar."""

import pytest

pytest.importorskip("torch")


@pytest.mark.slow
def test_smollm2_loads_and_writes_grammar_constrained_pddl(tmp_path):
    from omtr.model import build_model, load_model
    from omtr.model.backbone import BackboneError
    from omtr.policy import Sampling
    from omtr.solver.lint import lint

    try:
        m = build_model("small")
    except BackboneError as exc:
        pytest.skip(str(exc))
    rep = m.parameter_report()
    assert 130e6 < rep["parameters"]["backbone"] < 140e6
    # three roles' LoRA (r=16 on attention and MLP, ~3.6% of the backbone each) on one shared backbone
    assert 1.0 < rep["memory_ratio"] <= 1.12
    prompts = [
        [{"role": "system", "content": "Answer with a PDDL domain and then a PDDL problem, nothing else."},
         {"role": "user", "content": "A robot in room a must carry ball1 from room a to room b."}],
        [{"role": "user", "content": "Write PDDL: block a is on the table; put block a on block b."}],
    ]
    gens = m.generate("actor", prompts, Sampling(greedy=True, max_new_tokens=48), grammar=True)
    for g in gens:
        assert g.text.startswith("(define (domain "), g.text[:200]
        assert len(g.token_ids) == len(g.logprobs) and g.prompt_tokens > 20
    free = m.generate("actor", prompts, Sampling(greedy=True, max_new_tokens=24), grammar=False)
    assert all(g.text.strip() for g in free)
    # a complete spec under the grammar parses in lint
    (full,) = m.generate("actor", prompts[:1], Sampling(greedy=False, seed=0, max_new_tokens=600), grammar=True)
    if full.finish_reason == "stop":
        i = full.text.index("(define (problem")
        r = lint(full.text[:i], full.text[i:])
        assert r.error is None or r.error.category.value != "syntax", r.error
    scores = m.judge(prompts)
    assert all(0 < s < 1 for s in scores)
    # the model directory points at the cached conversion and reloads identically
    m.save(tmp_path / "small")
    assert not (tmp_path / "small" / "backbone").exists()
    again = load_model(str(tmp_path / "small"))
    assert again.judge(prompts) == scores
    assert [g.token_ids for g in again.generate("actor", prompts, Sampling(greedy=True, max_new_tokens=48))] == \
        [g.token_ids for g in gens]
