"""Rollout engines on the micro model: the interface on both engines, the fast engine's weights
follow the policy after an optimizer step, PPO's recomputed old log-probs are the policy's own,
grammar masks are identical across engines, the CLI switches and generation progress lines."""

import logging

import pytest

torch = pytest.importorskip("torch")

from omtr.policy import Generation, Sampling  # noqa: E402
from omtr.rollout import ENGINE_NAMES, UnknownEngine, check_engine_name, make_engine  # noqa: E402

PROMPTS = [[{"role": "system", "content": "You write PDDL for planning tasks, carefully."},
            {"role": "user", "content": f"Put block b{i} on the table, then stack b{i + 1} on it."}]
           for i in range(3)]
GREEDY = Sampling(greedy=True, max_new_tokens=16)


@pytest.fixture(scope="module")
def micro():
    torch.set_num_threads(1)
    from omtr.model import build_model

    m = build_model("micro")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-zero LoRA deltas, so merging them matters
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m


def test_unknown_engine_lists_the_known_ones():
    with pytest.raises(UnknownEngine) as exc:
        check_engine_name("vllm")
    for name in ENGINE_NAMES:
        assert name in str(exc.value)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_engine_interface(micro, name):
    eng = make_engine(name, micro)
    gens = eng.generate("actor", PROMPTS, GREEDY, constraint="off")
    assert len(gens) == len(PROMPTS) and all(isinstance(g, Generation) for g in gens)
    for g in gens:
        assert 0 < len(g.token_ids) == len(g.logprobs) <= GREEDY.max_new_tokens
        assert g.finish_reason in ("stop", "length") and g.timings["prefill_ms"] > 0
    assert eng.judge(PROMPTS[:1])[0] == pytest.approx(micro.judge(PROMPTS[:1])[0])
    assert isinstance(eng.refresh(), float) and eng.memory_bytes() >= 0
    with pytest.raises(ValueError, match="actor or editor"):
        eng.generate("judge", PROMPTS, GREEDY)


@pytest.mark.parametrize("constraint", ["off", "plain"])
def test_fast_engine_in_fp32_is_the_policy(micro, constraint):
    """Without int8 the fast engine computes what hf does: same tokens, log-probs to rounding."""
    ref = micro.generate("editor", PROMPTS, GREEDY, constraint=constraint)
    out = make_engine("fast", micro, quantize=False).generate("editor", PROMPTS, GREEDY, constraint=constraint)
    for a, b in zip(ref, out):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


@pytest.mark.parametrize("constraint", ["plain", "scoped"])
def test_sparse_head_gives_the_full_heads_choices(micro, constraint, monkeypatch):
    """Multiplying only the head rows the grammar allows gives the masked distribution the full
    head gives: in fp32, the same greedy tokens and log-probs to rounding, and the sampled tokens'
    log-probs are the policy's own."""
    import omtr.rollout.fast as fast_mod

    monkeypatch.setattr(fast_mod, "SPARSE_HEAD_TOKENS", 0)
    dense = make_engine("fast", micro, quantize=False)
    ref = dense.generate("actor", PROMPTS, GREEDY, constraint=constraint)
    assert dense.head_steps["sparse"] == 0
    monkeypatch.setattr(fast_mod, "SPARSE_HEAD_TOKENS", 10**9)
    sparse = make_engine("fast", micro, quantize=False)
    out = sparse.generate("actor", PROMPTS, GREEDY, constraint=constraint)
    assert sparse.head_steps["full"] == 0 and sparse.head_steps["sparse"] > 0
    for a, b in zip(ref, out):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    sampling = Sampling(greedy=False, temperature=0.7, top_p=1.0, max_new_tokens=16, seed=2)
    gens = sparse.generate("actor", PROMPTS, sampling, constraint=constraint)
    lp, mask = micro.token_logprobs("actor", PROMPTS, [g.token_ids for g in gens], temperature=0.7,
                                    constraint=constraint)
    for row, g in enumerate(gens):
        assert max(abs(x - y) for x, y in zip(g.logprobs, lp[row].tolist())) < 1e-4


def test_identical_prompts_are_prefilled_once_and_sampled_apart(micro):
    """The samples of one task share a prompt: the fast engine prefills it once and copies its keys
    and values to each row. Greedy rows of one prompt equal that prompt's own greedy answer (fp32:
    the hf engine's), and sampled rows still differ from each other."""
    fast = make_engine("fast", micro, quantize=False)
    alone = micro.generate("actor", PROMPTS[:2], GREEDY, constraint="plain")
    rows = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0]]
    prefilled = []
    forward = fast._forward

    def spy(rw, x, pos, prefix, cache, mask, **kw):
        if cache is not None and x.shape[1] > 1 and kw.get("at") is None:
            prefilled.append(x.shape[0])  # rows in the prefill pass (not a jump-forward step)
        return forward(rw, x, pos, prefix, cache, mask, **kw)

    fast._forward = spy
    out = fast.generate("actor", rows, GREEDY, constraint="plain")
    fast._forward = forward
    assert prefilled == [2]  # two distinct prompts among four rows
    assert [g.token_ids for g in out] == [alone[0].token_ids, alone[1].token_ids, alone[0].token_ids,
                                          alone[0].token_ids]
    for g, ref in zip(out, [alone[0], alone[1], alone[0], alone[0]]):
        assert max(abs(x - y) for x, y in zip(g.logprobs, ref.logprobs)) < 1e-4
    sampled = fast.generate("actor", [PROMPTS[0]] * 6, Sampling(greedy=False, temperature=1.0, max_new_tokens=16, seed=3),
                            constraint="off")
    assert len({tuple(g.token_ids) for g in sampled}) > 1
    lp, mask = micro.token_logprobs("actor", [PROMPTS[0]] * 6, [g.token_ids for g in sampled], temperature=1.0,
                                    grammar=False)
    for b, g in enumerate(sampled):  # each row's log-probs are the policy's on its own tokens
        assert lp[b, :len(g.token_ids)].tolist() == pytest.approx(g.logprobs, abs=1e-4)


def test_rows_of_different_families_are_generated_in_groups_with_the_same_results(micro):
    """A batch mixing two families (each with its own long demonstration) shares only the system
    message: the fast engine generates each family's rows as a group, each group's common prefix
    computed once, with the answers a call per family gives; a batch that shares its prompt is not
    split, and the answers come back in the prompts' order."""
    fast = make_engine("fast", micro, quantize=False)
    demo = {f: " ".join(f"{f} example step {k}: move the {f} thing {k} to place {k + 1}." for k in range(12))
            for f in ("blocks", "balls")}

    def prompt(f, i):
        return [{"role": "system", "content": "You write PDDL for planning tasks, carefully."},
                {"role": "user", "content": f"{demo[f]} Now the task: move {f} item {i} to place {i + 2}."}]

    rows = [prompt("blocks", 0), prompt("balls", 0), prompt("blocks", 1), prompt("balls", 1), prompt("blocks", 2)]
    sampling = Sampling(greedy=True, max_new_tokens=4)
    out = fast.generate("actor", rows, sampling, constraint="off")
    assert fast.last_groups == [3, 2]
    family = ["blocks", "balls", "blocks", "balls", "blocks"]
    alone = {f: fast.generate("actor", [r for r, g in zip(rows, family) if g == f], sampling, constraint="off")
             for f in ("blocks", "balls")}
    assert fast.last_groups == [2]
    expect = [alone["blocks"][0], alone["balls"][0], alone["blocks"][1], alone["balls"][1], alone["blocks"][2]]
    for g, ref in zip(out, expect):
        assert g.token_ids == ref.token_ids
        assert max(abs(x - y) for x, y in zip(g.logprobs, ref.logprobs)) < 1e-4
    policy = micro.generate("actor", rows, sampling, constraint="off")
    assert [g.token_ids for g in policy] == [g.token_ids for g in out]
    fast.generate("actor", PROMPTS, sampling, constraint="off")
    assert fast.last_groups == [3], "prompts that differ only in their last words stay one batch"


def test_int8_engine_is_smaller_and_close(micro):
    fast = make_engine("fast", micro)
    fp32 = make_engine("fast", micro, quantize=False, share_fp32=False)  # fp32 copies of every fused slot
    gen = ("actor", "editor")  # the Judge's weights are fp32 in both
    assert fast.memory_bytes(gen) < 0.6 * fp32.memory_bytes(gen)
    sampling = Sampling(greedy=False, temperature=0.7, top_p=1.0, max_new_tokens=16, seed=1)
    gens = fast.generate("actor", PROMPTS, sampling, constraint="off")
    lp, mask = micro.token_logprobs("actor", PROMPTS, [g.token_ids for g in gens], temperature=0.7, grammar=False)
    engine_lp = torch.tensor([g.logprobs + [0.0] * (lp.shape[1] - len(g.logprobs)) for g in gens])
    kl = float(((engine_lp - lp.detach()) * mask).sum() / mask.sum())  # KL(engine || policy) on the engine's samples
    assert abs(kl) < 0.1


def test_fp32_linears_with_nothing_merged_are_the_policys_own_tensors(micro):
    """A slot kept in fp32 whose adapters run beside it (``keep_fp32=("down",)``) is the policy's
    weight itself, not a copy, and is not counted as the engine's memory. Otherwise the down
    projection is int8 for decode steps plus a wide copy for many-token passes: a bf16 copy of its
    own, or in fp32 the policy's tensor (no bytes beyond the int8 slot's)."""
    fp32_down = make_engine("fast", micro, keep_fp32=("down",))
    dec = getattr(micro.base_model, micro.base_model.base_model_prefix)
    own = {p.data_ptr() for p in micro.base_model.parameters()}
    for L, layer in zip(fp32_down.weights["actor"].layers, dec.layers):
        down = getattr(L.down, "base", L.down)
        policy_down = getattr(layer.mlp.down_proj, "base_layer", layer.mlp.down_proj)
        assert down.weight.data_ptr() == policy_down.weight.data_ptr()
        assert L.qkv.weight_bias()[0].int_repr().data_ptr() not in own  # a merged, quantized slot is the engine's
    bf16 = make_engine("fast", micro, prefill_wide="bf16")
    for L in bf16.weights["actor"].layers:
        down = getattr(L.down, "base", L.down)
        assert down.wide.weight.dtype == torch.bfloat16 and down.wide.weight.data_ptr() not in own
    fp32_wide = make_engine("fast", micro, prefill_wide="fp32")  # the wide copy is the policy's own tensor
    for L, layer in zip(fp32_wide.weights["actor"].layers, dec.layers):
        down = getattr(L.down, "base", L.down)
        policy_down = getattr(layer.mlp.down_proj, "base_layer", layer.mlp.down_proj)
        assert down.wide.weight.data_ptr() == policy_down.weight.data_ptr()
    int8_down = make_engine("fast", micro, bf16_prefill=())  # down in int8 only: 1 byte a weight
    assert fp32_down.memory_bytes() < int8_down.memory_bytes() < bf16.memory_bytes()
    assert fp32_wide.memory_bytes() == int8_down.memory_bytes()
    assert make_engine("fast", micro).prefill_wide in ("bf16", "fp32")


def test_the_wide_format_follows_the_cpus_bf16_speed(micro, monkeypatch, caplog):
    """``prefill_wide=auto``: bf16 copies only where the CPU has native bf16 and its bf16 products
    are the faster; elsewhere fp32, said in one info line. A one-token row takes the int8 step, a
    many-token pass the wide copy (fp32: the plain product, to the bit); a bad name is an error."""
    import logging

    import torch.nn.functional as F

    from omtr.model import precision
    from omtr.rollout import fast

    monkeypatch.setattr(precision, "bf16_support", lambda device="cpu": (True, ""))
    monkeypatch.setattr(precision, "bf16_pays", lambda device="cpu": (False, "bf16 measured slower"))
    with caplog.at_level(logging.INFO, logger="omtr.rollout"):
        assert fast._wide_format("auto") == "fp32"
    assert any("fp32, as bf16 measured slower" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(precision, "bf16_pays", lambda device="cpu": (True, ""))
    assert fast._wide_format("auto") == "bf16"
    monkeypatch.setattr(precision, "bf16_support", lambda device="cpu": (False, "no native bf16"))
    assert fast._wide_format("auto") == "fp32"
    assert fast._wide_format("bf16") == "bf16"
    with pytest.raises(fast.EngineError, match="prefill_wide 'fp16'"):
        fast._wide_format("fp16")
    monkeypatch.setenv("OMTR_PREFILL_WIDE", "bf16")  # no prefill_wide given: the environment's
    assert fast._wide_format(None) == "bf16" and make_engine("fast", micro).prefill_wide == "bf16"
    monkeypatch.setenv("OMTR_PREFILL_WIDE", "half")
    with pytest.raises(fast.EngineError, match="OMTR_PREFILL_WIDE 'half'"):
        fast._wide_format(None)
    monkeypatch.delenv("OMTR_PREFILL_WIDE")
    assert make_engine("fast", micro, prefill_wide="auto").prefill_wide == "fp32"  # the patched probe

    torch.manual_seed(0)
    w, x = torch.randn(24, 40), torch.randn(1, 9, 40)
    lin = fast._PrefillWideLinear(w, None, "fp32")
    assert torch.equal(lin(x), F.linear(x, w))
    assert torch.equal(lin(x[:, :1]), lin.step(x[:, :1])) and not torch.equal(lin(x[:, :1]), F.linear(x[:, :1], w))
    assert fast._PrefillWideLinear(w, None, "bf16")(x).dtype == torch.float32


def test_judge_fp32_slots_share_the_policys_tensors_with_the_same_scores(micro):
    """The Judge's fused gate/up (fp32, its adapters beside it) holds the policy's own gate and up
    weights side by side instead of a concatenated copy: less memory, the same scores bit for bit
    and the same generations (``share_fp32=False`` is the copy)."""
    shared = make_engine("fast", micro, prefix_block=8)
    copied = make_engine("fast", micro, prefix_block=8, share_fp32=False)
    own = {p.data_ptr() for p in micro.base_model.parameters()}
    for L in shared.weights["judge"].layers:
        parts = getattr(L.gate_up, "base", L.gate_up).parts
        assert len(parts) == 2 and all(p.weight.data_ptr() in own for p in parts)
    assert shared.memory_bytes(["judge"]) < copied.memory_bytes(["judge"])
    assert shared.memory_bytes() < copied.memory_bytes()
    prompts = _family_prompts(2)
    assert shared.judge(prompts) == copied.judge(prompts)
    _same(copied.generate("actor", PROMPTS, GREEDY, constraint="off"),
          shared.generate("actor", PROMPTS, GREEDY, constraint="off"))
    fp32 = make_engine("fast", micro, quantize=False)  # an fp32 engine: unadapted fused slots are shared too
    assert fp32.memory_bytes() < make_engine("fast", micro, quantize=False, share_fp32=False).memory_bytes()


def test_released_engine_keeps_shared_linears_and_rebuilds_the_same(micro):
    """release_caches(): the prefix cache and every role's own linears go (what a refresh after an
    optimizer step makes anew anyway); the shared ones stay; the next call rebuilds the rest and
    gives the same tokens, log-probs and Judge scores bit for bit."""
    fast = make_engine("fast", micro, prefix_block=8)
    prompts = _family_prompts(2)
    sampling = Sampling(greedy=False, temperature=0.7, top_p=1.0, max_new_tokens=16, seed=4)
    want = fast.generate("actor", PROMPTS, sampling, constraint="off")
    want_judge = fast.judge(prompts)
    held = fast.memory_bytes()
    shared = {k: v[1] for k, v in fast._built.items() if k[0] is None}
    own = sum(k[0] is not None for k in fast._built)
    assert shared and own and fast.prefix_cache.blocks > 0
    fast.release_caches()
    assert fast.prefix_cache.blocks == 0 and fast.weights == {} and fast.memory_bytes() == 0
    assert all(fast._built[k][1] is mod for k, mod in shared.items()), "shared linears are kept"
    _same(want, fast.generate("actor", PROMPTS, sampling, constraint="off"))
    assert fast.rebuilt == own, "only the roles' own linears were built again"
    assert fast.judge(prompts) == want_judge
    assert fast.memory_bytes() == held
    fast.release_caches(adapted=False)  # the prefix cache only
    assert fast.weights and fast.prefix_cache.blocks == 0


def test_masks_identical_across_engines(micro):
    """The bitmask rows the fast engine applied are those the policy rebuilds for the same tokens."""
    fast = make_engine("fast", micro)
    fast.record_masks = True
    sampling = Sampling(greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3)
    gens = fast.generate("actor", PROMPTS, sampling, constraint="plain")
    g = micro.grammar
    for b, gen in enumerate(gens):
        st = g.state(scoped=False)
        bm = g.allocate_bitmask(len(gen.token_ids))
        for j, tok in enumerate(gen.token_ids):
            st.fill(bm, j)
            assert st.accept(tok, micro.pieces[tok])
        recorded = torch.stack(fast.last_masks[b])
        assert torch.equal(recorded, bm[: len(gen.token_ids)])
    # and the policy scores every sampled token as allowed (finite log-probs)
    lp, mask = micro.token_logprobs("actor", PROMPTS, [x.token_ids for x in gens], temperature=1.0, constraint="plain")
    assert torch.isfinite(lp[mask]).all()


def test_refresh_after_an_optimizer_step_changes_outputs(micro):
    m = micro
    saved = {n: p.detach().clone() for n, p in m.named_parameters() if "lora_" in n}
    fast = make_engine("fast", m, quantize=False)
    before = fast.generate("actor", PROMPTS, GREEDY, constraint="off")
    m.train()
    opt = torch.optim.SGD([p for n, p in m.named_parameters() if "lora_" in n], lr=5.0)
    lp, mask = m.token_logprobs("actor", PROMPTS, [g.token_ids for g in before], grammar=False)
    (lp[mask].sum()).backward()  # push the greedy answers' probability down hard
    opt.step()
    m.eval()
    fast.mark_stale()
    after = fast.generate("actor", PROMPTS, GREEDY, constraint="off")
    assert fast.refreshes == 2
    assert any(a.logprobs != b.logprobs for a, b in zip(before, after))
    ref = m.generate("actor", PROMPTS, GREEDY, constraint="off")  # the engine follows the new policy
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in saved:
                p.copy_(saved[n])
            p.grad = None
    assert [g.token_ids for g in ref] == [g.token_ids for g in after]


def test_refresh_rebuilds_only_what_an_optimizer_step_changed(micro):
    """With the backbone frozen a step on the Actor's adapter re-merges only the Actor's adapted
    linears; the rest are kept (the same objects) and the result is that of a full rebuild."""
    m = micro
    fast = make_engine("fast", m)
    total = len(fast._built)
    kept = {k: mod for k, (_, mod) in fast._built.items() if k[0] != "actor"}
    lora = [p for n, p in m.named_parameters() if "lora_B" in n and ".actor." in n]
    assert lora
    saved = [p.detach().clone() for p in lora]
    with torch.no_grad():
        for p in lora:
            p.add_(0.05)
    try:
        fast.refresh()
        adapted = [k for k in fast._built if k[0] == "actor"]
        assert fast.rebuilt == len(adapted) > 0 and fast.rebuilt < total
        assert all(fast._built[k][1] is mod for k, mod in kept.items())
        fast.refresh()
        assert fast.rebuilt == 0  # nothing changed since
        reused = fast.generate("actor", PROMPTS, GREEDY, constraint="off")
        fast.refresh(reuse=False)
        assert fast.rebuilt == total
        full = fast.generate("actor", PROMPTS, GREEDY, constraint="off")
        assert [(g.token_ids, g.logprobs) for g in reused] == [(g.token_ids, g.logprobs) for g in full]
    finally:
        with torch.no_grad():
            for p, v in zip(lora, saved):
                p.copy_(v)


def test_trainer_recomputes_old_logprobs_with_the_policy(micro, tmp_path):
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import StepItem, Trainer
    from omtr.tasks.training import TrainingTask

    tasks = [TrainingTask("t0", "blocksworld", None, "Stack b1 on b2.")]
    cfg = train_profile("micro").replace(cycles=1, updates_per_cycle=1, episodes_per_batch=1, mlflow=False,
                                         save_model_every_cycle=False, validate_logs=False,
                                         rollout_engine="fast")
    tr = Trainer(cfg, tasks, tmp_path / "run", quiet=True, model=micro)
    assert not tr.exact_rollout
    sampling = Sampling(greedy=False, temperature=cfg.temperature, top_p=1.0, max_new_tokens=12, seed=2)
    engine = tr.engines[id(micro)]
    gens = engine.generate("actor", PROMPTS, sampling, grammar=False)
    items = [StepItem(ep=i, group=(0, i), role="actor", step=0, prompt=p, tokens=list(g.token_ids),
                      old_logprobs=list(g.logprobs), outcome="syntax", limited=False, judge_score=None)
             for i, (p, g) in enumerate(zip(PROMPTS, gens))]
    tr._recompute_old(items)
    kl = tr._engine_kl()
    own, mask = micro.token_logprobs("actor", PROMPTS, [g.token_ids for g in gens], temperature=cfg.temperature,
                                     grammar=False)
    for b, it in enumerate(items):
        assert it.old_logprobs == pytest.approx(own[b, : len(it.tokens)].tolist(), abs=1e-6)
    assert kl is not None and abs(kl) < 0.1


def test_rollout_engine_setting_is_checked():
    from omtr.config import ConfigError
    from omtr.rl.config import train_profile

    with pytest.raises(ConfigError, match="hf"):
        train_profile("micro").replace(rollout_engine="turbo")


def test_cli_engine_switch(tmp_path):
    import json

    from omtr.cli import main

    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "a", "nl": "Stack b1 on b2."}) + "\n")
    out = tmp_path / "traces.jsonl"
    from omtr.inference.loading import load_policy
    from omtr.inference.scripted import PolicyLoadError

    with pytest.raises(PolicyLoadError, match="unknown rollout engine 'nope'"):
        load_policy("micro", engine="nope")
    pol = load_policy("micro", engine="fast")
    assert pol.engine_name == "fast"
    rc = main(["--quiet", "infer", "--model", "micro", "--tasks", str(tasks), "--out", str(out), "--engine", "fast",
               "--budget", "1", "--max-new-tokens", "8", "--no-judge"])
    assert rc == 0 and json.loads(out.read_text().splitlines()[0])["id"] == "a"


def test_generation_progress_lines(micro, caplog, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    from omtr.progress import GenerationProgress

    caplog.set_level(logging.INFO, logger="omtr.progress")
    bar = GenerationProgress("actor", 4, first_s=0.0, every_s=0.0)
    bar.step(4, 3)
    bar.step(3, 0)
    bar.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "omtr.progress"]
    assert lines and "0/4 sequences running" in lines[-2] and "7 new tokens" in lines[-2] and "tokens/s" in lines[0]
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="omtr.progress")  # what --quiet sets
    bar = GenerationProgress("actor", 4, first_s=0.0, every_s=0.0)
    bar.step(4, 0)
    bar.close()
    assert not [r for r in caplog.records if r.name == "omtr.progress"]
    monkeypatch.setenv("CI", "1")
    caplog.set_level(logging.INFO, logger="omtr.progress")
    assert not GenerationProgress("actor", 1).enabled


def _family_prompts(n_per=2, families=("blocks", "balls")):
    demo = {f: " ".join(f"{f} example step {k}: move the {f} thing {k} to place {k + 1}." for k in range(12))
            for f in families}
    return [[{"role": "system", "content": "You write PDDL for planning tasks, carefully."},
             {"role": "user", "content": f"{demo[f]} Now the task: move {f} item {i} to place {i + 2}."}]
            for i in range(n_per) for f in families]


def _same(a, b):
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for x, y in zip(a, b):
        assert x.logprobs == y.logprobs, "log-probs equal, not merely close"


@pytest.mark.parametrize("quantize", [True, False])
def test_prefix_cache_is_exact(micro, quantize):
    """Greedy tokens and log-probs with the prefix cache equal those without it: in one call
    (a family's prompts share their blocks), in later calls (blocks found in the cache), for
    prompts of mixed families, for the Judge; and the cache is used."""
    rows = _family_prompts(3)
    off = make_engine("fast", micro, quantize=quantize, prefix_cache=False, prefix_block=8)
    on = make_engine("fast", micro, quantize=quantize, prefix_block=8)
    want = off.generate("actor", rows, GREEDY, constraint="plain")
    assert off.prefix_cache.blocks == 0 and off.prefill_stats["cached_tokens"] == 0
    first = on.generate("actor", rows, GREEDY, constraint="plain")
    _same(want, first)
    assert on.last_groups == [3, 3] and on.prefix_cache.blocks > 0
    assert on.prefill_stats["cached_tokens"] > 0, "the second prompt of a family finds the first one's blocks"
    assert on.prefill_stats["computed_tokens"] < off.prefill_stats["computed_tokens"] / 2
    before = on.prefill_stats["computed_tokens"]
    again = on.generate("actor", rows, GREEDY, constraint="plain")  # a later call: the prefixes are cached
    _same(want, again)
    assert on.prefill_stats["computed_tokens"] - before < before / 3
    for single in (rows[1:2], rows[4:5]):  # a request alone (serving): all prefix but its last token
        _same(off.generate("actor", single, GREEDY, constraint="plain"),
              on.generate("actor", single, GREEDY, constraint="plain"))
    judge = [[{"role": "system", "content": "Judge PDDL."}] + r[1:] + [{"role": "user", "content": f"spec {i}"}]
             for i, r in enumerate(rows)]
    assert off.judge(judge) == on.judge(judge) == on.judge(judge)


def test_judge_is_the_policys_and_uses_the_cache(micro):
    fast = make_engine("fast", micro, prefix_block=8)
    prompts = _family_prompts(2)
    ref = micro.judge(prompts)
    got = fast.judge(prompts)
    assert got == pytest.approx(ref, abs=1e-5)
    computed = fast.prefill_stats["computed_tokens"]
    assert fast.judge(prompts) == got and fast.prefill_stats["computed_tokens"] - computed < computed / 3


def test_prefix_cache_is_dropped_on_refresh_and_bounded(micro, caplog):
    fast = make_engine("fast", micro, prefix_block=8)
    fast.generate("actor", PROMPTS, GREEDY, constraint="off")
    assert fast.prefix_cache.blocks > 0
    fast.mark_stale()
    fast.reset_stats()
    fast.generate("actor", PROMPTS[:1], GREEDY, constraint="off")  # the refresh drops the old blocks first
    assert fast.prefix_cache.stats.cleared >= 2  # made empty, then dropped by the refresh
    assert fast.prefill_stats["cached_tokens"] == 0, "nothing of the old weights is reused"
    want = make_engine("fast", micro, prefix_cache=False, prefix_block=8).generate("actor", PROMPTS, GREEDY,
                                                                                   constraint="off")
    tiny = make_engine("fast", micro, prefix_block=8, prefix_cache_mb=0.001)  # smaller than one block
    with caplog.at_level(logging.WARNING, logger="omtr.rollout"):
        _same(want, tiny.generate("actor", PROMPTS, GREEDY, constraint="off"))
        _same(want, tiny.generate("actor", PROMPTS, GREEDY, constraint="off"))
    assert tiny.prefix_cache.blocks == 0
    assert sum("caches nothing" in r.getMessage() for r in caplog.records) == 1
    small = make_engine("fast", micro, prefix_block=8, prefix_cache_mb=0.05)  # a few blocks: LRU
    _same(want, small.generate("actor", PROMPTS, GREEDY, constraint="off"))
    _same(want, small.generate("actor", PROMPTS, GREEDY, constraint="off"))
    assert small.prefix_cache.bytes <= small.prefix_cache.capacity
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        make_engine("fast", micro, prefix_cache_mb=-1)


def test_prefill_progress_lines(micro, caplog, monkeypatch):
    from omtr.progress import GenerationProgress

    monkeypatch.delenv("CI", raising=False)
    with caplog.at_level(logging.INFO, logger="omtr.progress"):
        bar = GenerationProgress("actor", 2, first_s=0.0, every_s=0.0)
        bar.start_prefill(300)
        bar.prefill(128, cached=True)
        bar.prefill(172)
        bar.end_prefill()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "prefilling (actor): 300/300 prompt tokens (128 from the prefix cache)" in text
    assert "tokens/s computed" in text


def test_cli_prefix_cache_switch(tmp_path):
    """--prefix-cache on|off on infer and evaluate: the same greedy traces; evaluate reports the
    prefill (tokens computed and found in the cache) in metrics.json; a negative bound is refused."""
    import json

    from omtr.cli import main
    from omtr.tasks.generators import generate
    from omtr.tasks.records import write_tasks

    tasks = tmp_path / "t.jsonl"
    write_tasks(tasks, generate("blocksworld", 3, 5, verify=False) + generate("gripper", 2, 5, verify=False))
    traces = {}
    for switch in ("on", "off"):
        out = tmp_path / f"infer-{switch}.jsonl"
        rc = main(["--quiet", "infer", "--model", "micro", "--tasks", str(tasks), "--out", str(out), "--engine", "fast",
                   "--budget", "1", "--max-new-tokens", "6", "--prefix-cache", switch])
        assert rc == 0
        traces[switch] = {r["id"]: [s["text"] for s in r["steps"]] for r in map(json.loads, out.read_text().splitlines())}
    assert traces["on"] == traces["off"]
    metrics = {}
    for switch in ("on", "off"):
        out = tmp_path / f"eval-{switch}"
        rc = main(["--quiet", "evaluate", "--policy", "model", "--model", "micro", "--tasks", str(tasks), "--out", str(out),
                   "--engine", "fast", "--budget", "1", "--max-new-tokens", "6", "--prefix-cache", switch,
                   "--no-report", "--no-episode-log", "--bootstrap", "0"])
        assert rc == 0
        metrics[switch] = json.loads((out / "metrics.json").read_text())
    on, off = metrics["on"]["prefix_cache"], metrics["off"]["prefix_cache"]
    assert on["on"] is True and off["on"] is False and off["cached_tokens"] == 0
    assert on["computed_tokens"] < off["computed_tokens"] and on["first_token_s"] is not None
    assert main(["--quiet", "infer", "--model", "micro", "--tasks", str(tasks), "--out", str(tmp_path / "x.jsonl"),
                 "--engine", "fast", "--prefix-cache-mb", "-1"]) != 0


def test_task_eta_waits_for_a_whole_batch():
    from omtr.progress import Progress

    bar = Progress(26, "tasks", quiet=True, batch=26)
    bar.update(1)
    assert "ETA after the first batch of 26" in bar.line()
    bar.update(25)
    assert "ETA 0s" in bar.line()
    assert "ETA" in Progress(3, "tasks", quiet=True).line()


def test_a_prompt_longer_than_the_context_is_a_clear_error(micro):
    from omtr.rollout.fast import EngineError

    fast = make_engine("fast", micro)
    long = [[{"role": "user", "content": "stack the blocks " * (fast.max_positions // 2)}]]
    with pytest.raises(EngineError, match="longer than the model's context"):
        fast.generate("actor", long, GREEDY, constraint="off")
    with pytest.raises(EngineError, match="longer than the model's context"):
        fast.judge(long)


def test_engine_defaults_to_fast_on_cpu_and_is_in_the_provenance(tmp_path, monkeypatch):
    """No --engine: a role model on a CPU generates on the fast engine (int8, prefix cache), hf on
    request; the engine an evaluation ran on is in run.json, metrics.json and the MLflow run."""
    import json

    from omtr.cli import main
    from omtr.inference.loading import load_policy
    from omtr.rollout import engine_info
    from omtr.rollout.fast import _wide_format

    wide = _wide_format("auto")  # bf16 or fp32, by this CPU
    assert engine_info(load_policy("micro")) == {"engine": "fast", "int8": True, "prefill_wide": wide,
                                                 "jump_forward": True, "prefix_cache": True, "prefix_cache_mb": 1024.0}
    assert load_policy("micro", engine="auto").engine_name == "fast"
    ref = load_policy("micro", engine="hf")
    assert not hasattr(ref, "engine_name") or ref.engine_name == "hf"
    assert engine_info(ref) == {"engine": "hf"}

    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"id": "a", "family": "blocksworld", "nl": "Stack b1 on b2."}) + "\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    seen = {}
    for engine in (None, "hf"):
        out = tmp_path / f"eval-{engine}"
        argv = ["--quiet", "evaluate", "--policy", "model", "--model", "micro", "--tasks", str(tasks), "--out",
                str(out), "--budget", "1", "--max-new-tokens", "8", "--bootstrap", "0", "--no-report",
                "--prefix-cache", "off", "--track", "--experiment", "engines"]
        assert main(argv + (["--engine", engine] if engine else [])) == 0
        run = json.loads((out / "run.json").read_text())
        seen[engine] = run["provenance"]["engine"]
        assert json.loads((out / "metrics.json").read_text())["provenance"]["engine"] == seen[engine]
    assert seen[None] == {"engine": "fast", "int8": True, "prefill_wide": wide, "jump_forward": True,
                          "prefix_cache": False, "prefix_cache_mb": 1024.0}
    assert seen["hf"] == {"engine": "hf"}

    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("engines")
    params = sorted((r.data.params["engine"], r.data.params.get("engine.int8"), r.data.params.get("engine.prefill_wide"))
                    for r in client.search_runs([exp.experiment_id]))
    assert params == [("fast", "True", wide), ("hf", None, None)]


def _update_once(micro, tmp_path, reuse: bool, refused: bool = False, **settings):
    """One update of two groups (two minibatches) on fixed engine samples, from the same parameters:
    the items' old log-probs after the update and the trained parameters."""
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import StepItem, Trainer
    from omtr.tasks.training import TrainingTask

    tasks = [TrainingTask("t0", "blocksworld", None, "Stack b1 on b2.")]
    cfg = train_profile("micro").replace(cycles=1, updates_per_cycle=1, episodes_per_batch=4, samples_per_task=2,
                                         advantage="group", whiten_advantages=False, minibatches=2,
                                         micro_batch_size=2, mlflow=False, save_model_every_cycle=False,
                                         validate_logs=False, rollout_engine="fast", use_judge=False,
                                         reuse_first_logprobs=reuse).replace(**settings)
    tr = Trainer(cfg, tasks, tmp_path / f"run-{reuse}-{len(list(tmp_path.iterdir()))}", quiet=True, model=micro)
    sampling = Sampling(greedy=False, temperature=cfg.temperature, top_p=1.0, max_new_tokens=12, seed=3)
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    gens = tr.engines[id(micro)].generate("actor", prompts, sampling, grammar=False)
    items = [StepItem(ep=i, group=(0, i // 2), role="actor", step=0, prompt=p, tokens=list(g.token_ids),
                      old_logprobs=list(g.logprobs), outcome="solved", limited=False, judge_score=None,
                      reward=float(i % 2), score=float(i % 2))
             for i, (p, g) in enumerate(zip(prompts, gens))]
    tr._recompute_old(items, [])
    pending = sum(it.old_pending for it in items)
    if refused:  # a token whose replayed mask refused it: the policy's old log-prob is -inf
        items[3].old_logprobs[0] = float("-inf")
    tr._advantages(items)
    judge = []
    if cfg.use_judge:  # Judge prompts of one task: a shared prefix, two per minibatch
        from omtr.rl.steps import JudgeItem

        judge = [JudgeItem([{"role": "user", "content": f"Task: stack b1 on b2. Spec {k}: (on b1 b2)"}], k % 2 == 0, k)
                 for k in range(4)]
    stats = tr._update(items, judge)
    params = {n: p.detach().clone() for n, p in micro.named_parameters() if p.requires_grad}
    if refused:
        return params, stats
    return [list(it.old_logprobs) for it in items], params, pending, tr._engine_kl()


def test_first_minibatch_takes_its_old_logprobs_from_its_own_forward_pass(micro, tmp_path):
    """reuse_first_logprobs: the first optimizer step's samples skip the separate old-log-prob pass;
    their old log-probs, the engine's gap and the trained parameters equal the separate pass's."""
    start = {n: p.detach().clone() for n, p in micro.named_parameters() if p.requires_grad}

    def restore():
        with torch.no_grad():
            for n, p in micro.named_parameters():
                if n in start:
                    p.copy_(start[n])

    try:
        old_sep, params_sep, pending_sep, kl_sep = _update_once(micro, tmp_path, reuse=False)
        restore()
        old_re, params_re, pending_re, kl_re = _update_once(micro, tmp_path, reuse=True)
    finally:
        restore()
    assert pending_sep == 0 and pending_re == 2  # one group of two samples left to the first step
    for a, b in zip(old_sep, old_re):
        assert a == pytest.approx(b, abs=1e-5)
    assert kl_re == pytest.approx(kl_sep, abs=1e-5)
    moved = [n for n in params_sep if not torch.equal(params_sep[n], start[n])]
    assert moved  # the update trained something
    for n in params_sep:
        torch.testing.assert_close(params_re[n], params_sep[n], atol=1e-6, rtol=1e-5)


def test_a_token_the_replay_refuses_is_left_out_of_the_loss(micro, tmp_path):
    """An old log-prob of -inf (the policy's replayed masks refuse a token the engine sampled) is
    left out of the PPO loss and counted, not turned into NaN parameters."""
    start = {n: p.detach().clone() for n, p in micro.named_parameters() if p.requires_grad}
    try:
        params, stats = _update_once(micro, tmp_path, reuse=False, refused=True)
    finally:
        with torch.no_grad():
            for n, p in micro.named_parameters():
                if n in start:
                    p.copy_(start[n])
    assert all(torch.isfinite(p).all() for p in params.values())
    assert any(not torch.equal(params[n], start[n]) for n in params)
    assert 0 < stats["actor_unscorable_share"] < 1


def test_a_prompt_prefix_once_per_step_trains_as_one_per_micro_batch(micro, tmp_path):
    """prompt_prefix_once: one task's samples in micro-batches of one row, then the Judge's items,
    in each optimizer step: the prefix goes through the network once per step (its gradient summed,
    flushed before the Judge's turn) and the trained parameters equal a prefix pass per micro-batch."""
    from omtr.model.roles import RoleModel

    start = {n: p.detach().clone() for n, p in micro.named_parameters() if p.requires_grad}
    calls = []
    real = RoleModel._keep_block_prefix

    def counted(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    def restore():
        with torch.no_grad():
            for n, p in micro.named_parameters():
                if n in start:
                    p.copy_(start[n])

    settings = dict(micro_batch_size=1, use_judge=True, judge_micro_batch_size=1)
    try:
        RoleModel._keep_block_prefix = counted
        *_, params_once, _, _ = _update_once(micro, tmp_path, reuse=True, prompt_prefix_once=True, **settings)
        once = len(calls)
        restore()
        *_, params_each, _, _ = _update_once(micro, tmp_path, reuse=True, prompt_prefix_once=False, **settings)
    finally:
        RoleModel._keep_block_prefix = real
        restore()
    assert once > 0 and len(calls) == once, "prefixes stored only with prompt_prefix_once"
    moved = [n for n in params_once if not torch.equal(params_once[n], start[n])]
    assert any(".judge." in n for n in moved) and any(".actor." in n for n in moved)
    for n in params_once:  # the same sums in another order: float rounding
        torch.testing.assert_close(params_once[n], params_each[n], atol=1e-5, rtol=1e-4)


def test_split_attention_equals_one_masked_pass_over_prefix_and_rows():
    """The rows' prefill attention as two flash passes (the segment's prefix for all its rows at
    once, each row's own tokens causally) merged by log-sum-exp equals one masked pass over
    ``[prefix; own keys]``: left-padded rows of different lengths, two segments, a segment without
    a prefix, grouped-query heads."""
    import torch.nn.functional as F

    from omtr.rollout.fast import _split_attention

    torch.manual_seed(3)
    B, S, nh, kv, d = 4, 23, 6, 2, 16
    lens = [23, 9, 1, 15]
    qt = torch.randn(B, S, nh, d).transpose(1, 2)  # the engine's layout: a transposed view
    K, V = torch.randn(B, kv, S, d), torch.randn(B, kv, S, d)
    valid = torch.zeros(B, S, dtype=torch.bool)
    for r, n in enumerate(lens):
        valid[r, S - n:] = True
    own = torch.tril(torch.ones(S, S, dtype=torch.bool)).unsqueeze(0) & valid.unsqueeze(1)
    for P0, P1 in ((31, 7), (0, 12)):
        prefixes = [(torch.randn(kv, P, d).transpose(-1, -2).contiguous(), torch.randn(kv, P, d)) for P in (P0, P1)]
        idx = [torch.tensor([0, 2]), torch.tensor([1, 3])]
        out = _split_attention(qt, K, V, list(zip(prefixes, idx)), lens)
        for (KpT, Vp), rows in zip(prefixes, idx):
            P = KpT.shape[-1]
            mask = torch.cat([torch.ones(len(rows), S, P, dtype=torch.bool), own[rows]], -1).unsqueeze(1)
            Kf = torch.cat([KpT.transpose(-1, -2).unsqueeze(0).expand(len(rows), -1, -1, -1), K[rows]], 2)
            Vf = torch.cat([Vp.unsqueeze(0).expand(len(rows), -1, -1, -1), V[rows]], 2)
            ref = F.scaled_dot_product_attention(qt[rows], Kf, Vf, attn_mask=mask, enable_gqa=True)
            for j, r in enumerate(rows.tolist()):
                a = S - lens[r]
                assert torch.allclose(out[r, :, a:], ref[j, :, a:], atol=1e-5), (P, r)
                assert torch.isfinite(out[r]).all()


def test_split_attention_in_the_engine_gives_the_masked_paths_tokens_and_scores(micro):
    """On the exact engine (no int8), the split prefill attention (the default) and the earlier
    masked pass give the same greedy tokens, log-probs and Judge scores (to float rounding), with
    prompts of two families (two segments) and the prefix cache on and off."""
    prompts = _family_prompts(3)
    for cache in (True, False):
        split = make_engine("fast", micro, quantize=False, prefix_block=8, prefix_cache=cache)
        masked = make_engine("fast", micro, quantize=False, prefix_block=8, prefix_cache=cache, split_attention=False)
        assert split.split_attention and not masked.split_attention
        a = split.generate("actor", prompts, GREEDY, constraint="off")
        b = masked.generate("actor", prompts, GREEDY, constraint="off")
        assert split.last_groups == masked.last_groups and len(split.last_groups) == 2  # two segments
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        for x, y in zip(a, b):
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4
        assert max(abs(p - q) for p, q in zip(split.judge(prompts), masked.judge(prompts))) < 1e-5


@pytest.mark.parametrize("lean,heap_mb", [(True, 32.0), (True, 1.0), (False, 32.0)])
def test_the_micro_batches_that_train_take_mid_sized_blocks_from_a_trimmed_heap(micro, tmp_path, monkeypatch,
                                                                                lean, heap_mb):
    """Under lean_memory the old-log-prob pass and each optimizer step's micro-batches (PPO, Judge)
    run with glibc's mmap threshold at lean_heap_mb (their blocks from the heap), the heap trimmed
    after each micro-batch, and the threshold back at MMAP_THRESHOLD before anything else runs;
    lean_heap_mb=1 and no lean_memory set nothing. The trained parameters do not depend on it
    (allocation only)."""
    import omtr.rl.memory as M
    from omtr.rl.config import train_profile
    from omtr.rl.update import UpdateMixin

    for bad in (-1, 64):  # glibc caps its mmap threshold at 32 MiB
        with pytest.raises(Exception, match="lean_heap_mb must be between 0 and 32"):
            train_profile("micro").replace(lean_heap_mb=bad)
    start = {n: p.detach().clone() for n, p in micro.named_parameters() if p.requires_grad}
    events = []
    monkeypatch.setattr(M, "fix_mmap_threshold", lambda n=M.MMAP_THRESHOLD: events.append(("threshold", n)) or True)
    monkeypatch.setattr(M, "trim_heap", lambda: events.append(("trim",)) or True)
    real_jobs, real_old = UpdateMixin._run_jobs, UpdateMixin._old_passes

    def marked(self, jobs, *a, **k):
        events.append(("jobs", tuple(kind for kind, *_ in jobs if kind != "value")))
        return real_jobs(self, jobs, *a, **k)

    def old_marked(self, todo, *a, **k):
        events.append(("old", -(-len(todo) // self.cfg.micro_batch_size)))
        return real_old(self, todo, *a, **k)

    monkeypatch.setattr(UpdateMixin, "_run_jobs", marked)
    monkeypatch.setattr(UpdateMixin, "_old_passes", old_marked)
    try:
        params, *_ = _update_once(micro, tmp_path, reuse=False, use_judge=True, lean_memory=lean, lean_heap_mb=heap_mb)
    finally:
        with torch.no_grad():
            for n, p in micro.named_parameters():
                if n in start:
                    p.copy_(start[n])
    at = [i for i, e in enumerate(events) if e[0] in ("jobs", "old")]
    assert [events[i][0] for i in at] == ["old", "jobs", "jobs"]
    assert all("judge" in events[i][1] and "ppo" in events[i][1] for i in at[1:])
    if not lean or heap_mb <= 1:
        assert all(e[0] in ("jobs", "old") for e in events)
        return
    for k, i in enumerate(at):  # the events of the old-log-prob pass and of each optimizer step
        mine = events[i + 1:at[k + 1] if k + 1 < len(at) else len(events)]
        heap = ("threshold", int(heap_mb * (1 << 20)))
        if events[i][0] == "old":  # the pass's heap is set up around it
            n_micro = events[i][1]
            assert events[i - 1] == heap
        else:  # each optimizer step's, at its first micro-batch
            n_micro = len(events[i][1])
            assert mine.pop(0) == heap
        assert n_micro >= 1
        assert mine[:n_micro] == [("trim",)] * n_micro, "a trim after each micro-batch"
        assert mine[n_micro:2 + n_micro] == [("threshold", M.MMAP_THRESHOLD), ("trim",)]


def _family_prompt(f: str, i: int):
    demo = " ".join(f"{f} example step {k}: move the {f} thing {k} to place {k + 1}." for k in range(12))
    return [{"role": "system", "content": "You write PDDL for planning tasks, carefully."},
            {"role": "user", "content": f"{demo} Now the task: move {f} item {i} to place {i + 2}."}]


@pytest.mark.parametrize("constraint", ["plain", "scoped"])
def test_jump_forward_gives_the_step_by_step_answers_in_fewer_passes(micro, constraint):
    """Jump-forward decoding takes a run of tokens the grammar leaves no choice over in the step
    that chose the token before it. In fp32 the greedy answers (tokens, log-probs, the masks
    applied) are those of one token a step and of the policy's own generate, in fewer decoder
    passes. Sampled rows that part ways (runs of different lengths in one step, so each row writes
    its own cache columns; two prefix segments) still get the policy's own log-probs for every
    token they took."""
    sampling = Sampling(greedy=True, max_new_tokens=48)
    out, passes, masks = {}, {}, {}
    engines = {jf: make_engine("fast", micro, quantize=False, jump_forward=jf) for jf in (False, True)}
    for jf, eng in engines.items():
        eng.record_masks = True
        calls = []
        forward = eng._forward
        eng._forward = lambda *a, _f=forward, _c=calls, **kw: (_c.append(a[1].shape[1]), _f(*a, **kw))[1]
        out[jf] = eng.generate("actor", PROMPTS, sampling, constraint=constraint)
        passes[jf] = len(calls)
        masks[jf] = [torch.stack(x) for x in eng.last_masks]
        del eng._forward
    assert passes[True] < passes[False]
    ref = micro.generate("actor", PROMPTS, sampling, constraint=constraint)
    for b, r in enumerate(ref):
        assert out[True][b].token_ids == out[False][b].token_ids == r.token_ids
        assert max(abs(x - y) for x, y in zip(out[True][b].logprobs, r.logprobs)) < 1e-4
        assert torch.equal(masks[True][b], masks[False][b])

    jf = engines[True]
    lens = []
    step = jf._jump_step

    def spy(rw, choice, runs, *a):
        lens.append([len(r) for r in runs])
        return step(rw, choice, runs, *a)

    jf._jump_step = spy
    rows = [_family_prompt("blocks", 0), _family_prompt("balls", 0), _family_prompt("blocks", 1), PROMPTS[0],
            _family_prompt("balls", 1)]
    sampled = Sampling(greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=48, seed=4)
    gens = jf.generate("actor", rows, sampled, constraint=constraint)
    assert len(jf.last_groups) > 1
    assert any(len(set(k)) > 1 for k in lens), "a step with rows whose runs differ in length"
    lp, mask = micro.token_logprobs("actor", rows, [g.token_ids for g in gens], temperature=1.0,
                                    constraint=constraint)
    for b, g in enumerate(gens):
        assert lp[b, :len(g.token_ids)].tolist() == pytest.approx(g.logprobs, abs=1e-4)


def test_jump_forward_setting_and_single_token_masks(micro, monkeypatch):
    """``jump_forward`` is on unless the engine or ``$OMTR_JUMP_FORWARD`` says off, is in the
    evaluation's provenance, and a value that is neither is an error naming it; a mask row counts
    as one token only where exactly one bit is set (the sign bit of an int32 word included)."""
    from omtr.rollout import engine_info
    from omtr.rollout.fast import EngineError, _single_token

    assert make_engine("fast", micro).jump_forward and engine_info(make_engine("fast", micro))["jump_forward"]
    monkeypatch.setenv("OMTR_JUMP_FORWARD", "off")
    eng = make_engine("fast", micro)
    assert not eng.jump_forward and engine_info(eng)["jump_forward"] is False
    assert make_engine("fast", micro, jump_forward=True).jump_forward  # the engine's own setting decides
    monkeypatch.setenv("OMTR_JUMP_FORWARD", "sometimes")
    with pytest.raises(EngineError, match="OMTR_JUMP_FORWARD='sometimes'"):
        make_engine("fast", micro)
    row = torch.zeros(4, dtype=torch.int32)
    assert _single_token(row) is None
    row[2] = 1 << 5
    assert _single_token(row) == 2 * 32 + 5
    row[2] = -2**31  # bit 31
    assert _single_token(row) == 2 * 32 + 31
    row[2] = 3
    assert _single_token(row) is None
    row[2], row[0] = 1, 1
    assert _single_token(row) is None


def test_row_cache_growth_and_row_drops_keep_the_policys_tokens(micro, monkeypatch):
    """The rows' key/value cache grows one layer at a time and drops finished rows one layer at a
    time (so the old and new caches never stand side by side whole). With growth every 3 columns it
    grows and drops rows many times in one answer; sampled rows that end at different steps still
    get the policy's own log-prob for every token."""
    from omtr.rollout import fast

    monkeypatch.setattr(fast, "BLOCK", 3)
    grew, dropped = [], []
    reserve, select = fast._RowCache.reserve, fast._RowCache.select

    def spy_reserve(self, n):
        cap, lists = self.valid.shape[1], (self.k, self.v)
        reserve(self, n)
        assert self.k is lists[0] and self.v is lists[1], "grown in place"
        if self.valid.shape[1] > cap:
            grew.append(self.valid.shape[1])
            assert all(t.shape[2] == self.valid.shape[1] for t in self.k + self.v)

    def spy_select(self, idx):
        lists = (self.k, self.v)
        select(self, idx)
        assert self.k is lists[0] and self.v is lists[1], "rows dropped in place"
        dropped.append(len(idx))
        assert all(t.shape[0] == len(idx) for t in self.k + self.v)

    monkeypatch.setattr(fast._RowCache, "reserve", spy_reserve)
    monkeypatch.setattr(fast._RowCache, "select", spy_select)
    eng = make_engine("fast", micro, quantize=False)
    rows = [_family_prompt("blocks", 0), _family_prompt("balls", 0), PROMPTS[0], PROMPTS[1]]
    sampled = Sampling(greedy=False, temperature=1.0, top_p=1.0, max_new_tokens=40, seed=1)
    gens = eng.generate("actor", rows, sampled, constraint="off")  # seed 1: one row stops early
    assert len(grew) > 3, "the cache grew several times"
    assert len({len(g.token_ids) for g in gens}) > 1 and dropped, "rows ended apart and were dropped"
    lp, _ = micro.token_logprobs("actor", rows, [g.token_ids for g in gens], temperature=1.0, constraint="off")
    for b, g in enumerate(gens):
        assert lp[b, :len(g.token_ids)].tolist() == pytest.approx(g.logprobs, abs=1e-4)
