"""The role model on the micro backbone: shapes, role switching, the Judge, log-probs, memory,
save/load and the reference policy."""

import re

import pytest

torch = pytest.importorskip("torch")

from omtr.config import model_profile  # noqa: E402
from omtr.policy import Generation, Policy, Sampling  # noqa: E402

PROMPTS = [
    [{"role": "user", "content": "Stack block a on block b."}],
    [{"role": "system", "content": "Write PDDL."}, {"role": "user", "content": "Move both balls to room b, then stop."}],
    [{"role": "user", "content": "Deliver the package."}],
]
GREEDY = Sampling(greedy=True, max_new_tokens=12)


@pytest.fixture(scope="module")
def micro():
    torch.set_num_threads(1)  # a tiny model runs fastest (and steadiest on a busy machine) on one thread
    from omtr.model import build_model

    return build_model("micro")


@pytest.fixture(scope="module")
def perturbed():
    """A micro model whose role parameters are all non-trivial (LoRA B starts at zero)."""
    from omtr.model import build_model

    m = build_model("micro")
    _perturb(m, seed=5)
    return m


def _perturb(m, seed, only=None):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if only is not None and not any(f".{r}." in name for r in only):
                continue
            if "lora_" in name or (only is None and (name.startswith("role_embeddings") or name.startswith("judge_head"))):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)


def _free(m, role, prompts=PROMPTS, sampling=GREEDY, **kw):
    return m.generate(role, prompts, sampling, grammar=False, **kw)


def test_is_a_policy_and_generations_have_the_contract_shapes(micro):
    assert isinstance(micro, Policy)
    gens = _free(micro, "actor")
    assert len(gens) == len(PROMPTS) and all(isinstance(g, Generation) for g in gens)
    prompt_lens = [len(s) for s in micro.encode_prompts(PROMPTS)]
    for g, n in zip(gens, prompt_lens):
        assert len(g.token_ids) == len(g.logprobs) >= 1
        assert all(lp <= 0.0 for lp in g.logprobs)
        assert g.prompt_tokens == n
        assert g.finish_reason in ("stop", "length")
        assert g.timings["prefill_ms"] > 0 and g.timings["decode_ms"] > 0
    with pytest.raises(ValueError, match="judge"):
        micro.generate("judge", PROMPTS, GREEDY)


def test_roles_switch_adapters_and_role_vectors():
    from omtr.model import build_model

    m = build_model("micro")
    comp = [g.token_ids for g in _free(m, "actor")]
    actor0, _ = m.token_logprobs("actor", PROMPTS, comp, grammar=False)
    assert m.lm.active_adapter == "actor"
    editor0, _ = m.token_logprobs("editor", PROMPTS, comp, grammar=False)
    assert m.lm.active_adapter == "editor"
    assert not torch.allclose(actor0, editor0), "roles differ by their role vectors even before training"
    _perturb(m, seed=1, only=("editor",))
    actor1, _ = m.token_logprobs("actor", PROMPTS, comp, grammar=False)
    editor1, _ = m.token_logprobs("editor", PROMPTS, comp, grammar=False)
    assert torch.allclose(actor0, actor1, atol=1e-6), "changing the Editor's adapter must not move the Actor"
    assert not torch.allclose(editor0, editor1, atol=1e-3)


def test_judge_scores_are_probabilities_and_train_only_judge_parameters(micro):
    scores = micro.judge(PROMPTS)
    assert len(scores) == 3 and all(0.0 < s < 1.0 for s in scores)
    micro.zero_grad()
    s = micro.judge_scores(PROMPTS)
    assert s.shape == (3,) and s.requires_grad
    s.sum().backward()
    grads = {n: p.grad for n, p in micro.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert "judge_head.weight" in grads and "role_embeddings" in grads
    assert any(".judge." in n for n in grads)
    assert not any(".actor." in n or ".editor." in n for n in grads)
    assert not any("lora_" not in n and n not in ("judge_head.weight", "judge_head.bias", "role_embeddings")
                   for n in grads), "a frozen backbone gets no gradient"
    rg = micro.role_embeddings.grad
    assert rg[1].abs().sum() > 0 and rg[0].abs().sum() == 0 and rg[2].abs().sum() == 0
    micro.zero_grad()


def test_token_logprobs_equal_the_generation_logprobs_with_and_without_grammar(micro):
    from omtr.model.limits import GrammarLimits

    sampled = Sampling(greedy=False, temperature=0.7, top_p=0.9, max_new_tokens=20, seed=3)
    gens = _free(micro, "editor", sampling=sampled)
    lp, mask = micro.token_logprobs("editor", PROMPTS, [g.token_ids for g in gens], temperature=0.7, grammar=False)
    assert lp.shape == mask.shape == (3, max(len(g.token_ids) for g in gens))
    assert lp.requires_grad
    for b, g in enumerate(gens):
        assert mask[b].sum() == len(g.token_ids)
        assert torch.allclose(lp[b, :len(g.token_ids)], torch.tensor(g.logprobs), atol=1e-4)
    micro.set_grammar_limits(GrammarLimits(name_len=4, ws=2, types=2, predicates=2, predicate_args=2, actions=1,
                                           parameters=2, literals=2, objects=3, init=3, goal=2, atom_args=2))
    whole = Sampling(greedy=False, temperature=0.7, top_p=0.9, max_new_tokens=500, seed=3)
    gens = micro.generate("actor", PROMPTS, whole, grammar=True)
    assert all(g.finish_reason == "stop" for g in gens), "complete specs, forced domain names included"
    lp, _ = micro.token_logprobs("actor", PROMPTS, [g.token_ids for g in gens], temperature=0.7, grammar=True)
    free, _ = micro.token_logprobs("actor", PROMPTS, [g.token_ids for g in gens], temperature=0.7, grammar=False)
    for b, g in enumerate(gens):
        assert torch.allclose(lp[b, :len(g.token_ids)], torch.tensor(g.logprobs), atol=1e-4)
        dom = re.search(r"\(define \(domain ([^)]+)\)", g.text).group(1)
        assert re.search(r"\(:domain ([^)]+)\)", g.text).group(1) == dom, "forced to the domain's name"
    assert (lp >= free - 1e-5).all() and (lp > free + 1e-3).any(), "the constrained distribution renormalises"


def test_generation_stops_early_per_sequence_and_at_the_token_limit(micro):
    seen = []

    def stop_when(text):
        seen.append(text)
        return len(text) >= 8

    gens = micro.generate("actor", PROMPTS, Sampling(greedy=True, max_new_tokens=64), grammar=False, stop_when=stop_when)
    for g in gens:
        assert g.finish_reason == "stop" and len(g.token_ids) < 64
        assert len(g.text) >= 8
        assert len(micro.tokenizer.decode(g.token_ids[:-1])) < 8, "stopped at the first token that satisfied it"
    assert seen and all(isinstance(t, str) for t in seen)
    gens = _free(micro, "actor", sampling=Sampling(greedy=True, max_new_tokens=7))
    assert all(g.finish_reason == "length" and len(g.token_ids) == 7 for g in gens)


def test_batched_generation_equals_one_prompt_at_a_time(micro):
    batch = _free(micro, "actor")
    for prompt, g in zip(PROMPTS, batch):
        (alone,) = _free(micro, "actor", prompts=[prompt])
        assert alone.token_ids == g.token_ids
        assert torch.allclose(torch.tensor(alone.logprobs), torch.tensor(g.logprobs), atol=1e-4)


def test_sampling_is_seeded(micro):
    s = Sampling(greedy=False, temperature=0.7, top_p=0.95, max_new_tokens=16, seed=11)
    a = [g.token_ids for g in _free(micro, "actor", sampling=s)]
    b = [g.token_ids for g in _free(micro, "actor", sampling=s)]
    c = [g.token_ids for g in _free(micro, "actor", sampling=Sampling(greedy=False, max_new_tokens=16, seed=12))]
    assert a == b and a != c


def test_parameter_memory_of_three_roles_is_at_most_110_percent(micro):
    rep = micro.parameter_report()
    counted = sum(p.numel() for p in micro.parameters())
    assert rep["parameters"]["total"] == counted
    assert rep["parameters"]["backbone"] == sum(p.numel() for n, p in micro.lm.named_parameters() if "lora_" not in n)
    assert rep["memory_ratio"] <= 1.10
    assert rep["memory_ratio"] == pytest.approx(counted / rep["parameters"]["backbone"])
    assert sum(rep["role_share"].values()) + rep["shared_share"] == pytest.approx(1.0)
    assert all(0.005 < s < 0.05 for s in rep["role_share"].values())
    assert rep["parameters"]["judge"] > rep["parameters"]["actor"], "the Judge also owns its head"


def test_save_and_load_give_identical_outputs(perturbed, tmp_path):
    from omtr.model import RoleModel, load_model

    before_gen = _free(perturbed, "editor")
    before_judge = perturbed.judge(PROMPTS)
    comp = [g.token_ids for g in before_gen]
    before_lp, _ = perturbed.token_logprobs("actor", PROMPTS, comp, grammar=False)
    perturbed.save(tmp_path / "m")
    assert {p.name for p in (tmp_path / "m").iterdir()} >= {"omtr-model.json", "adapters", "roles.safetensors",
                                                          "tokenizer", "backbone"}
    loaded = load_model(str(tmp_path / "m"))
    assert isinstance(loaded, RoleModel)
    after_gen = _free(loaded, "editor")
    assert [g.token_ids for g in after_gen] == [g.token_ids for g in before_gen]
    assert [g.logprobs for g in after_gen] == [g.logprobs for g in before_gen]
    assert loaded.judge(PROMPTS) == before_judge
    after_lp, _ = loaded.token_logprobs("actor", PROMPTS, comp, grammar=False)
    assert torch.equal(after_lp, before_lp)
    assert torch.equal(loaded.initial_role_embeddings, perturbed.initial_role_embeddings)
    # a fresh model of the same profile is different: the test would notice a load that ignored the files
    from omtr.model import build_model

    assert build_model("micro").judge(PROMPTS) != before_judge


def test_save_is_atomic_and_load_rejects_other_folders(perturbed, tmp_path, monkeypatch):
    from omtr.model import RoleModel

    with pytest.raises(FileNotFoundError, match="omtr model init"):
        RoleModel.load(tmp_path)
    out = perturbed.save(tmp_path / "m")
    marker = (out / "omtr-model.json").read_text()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        perturbed.save(out)
    assert (out / "omtr-model.json").read_text() == marker, "a failed save keeps the old directory"
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "and leaves no temporary folder"


def test_reference_policy_is_the_initial_policy():
    from omtr.model import build_model

    init = build_model("micro")
    comp = [g.token_ids for g in _free(init, "actor")]
    ref0, _ = init.token_logprobs("actor", PROMPTS, comp, grammar=False)
    trained = build_model("micro")
    _perturb(trained, seed=2)
    moved, _ = trained.token_logprobs("actor", PROMPTS, comp, grammar=False)
    assert not torch.allclose(moved, ref0, atol=1e-3)
    with trained.reference():
        ref, _ = trained.token_logprobs("actor", PROMPTS, comp, grammar=False)
    assert torch.allclose(ref, ref0, atol=1e-5)
    again, _ = trained.token_logprobs("actor", PROMPTS, comp, grammar=False)
    assert torch.allclose(again, moved), "adapters come back after the block"

    tb = build_model(model_profile("micro").replace(train_backbone=True))
    assert any(p.requires_grad for n, p in tb.lm.named_parameters() if "lora_" not in n)
    with pytest.raises(RuntimeError, match="keep_reference"):
        with tb.reference():
            pass
    with torch.no_grad():
        for n, p in tb.lm.named_parameters():
            if "lora_" not in n:
                p.mul_(1.5)
    tb.keep_reference()
    with tb.reference():
        ref_tb, _ = tb.token_logprobs("actor", PROMPTS, comp, grammar=False)
    assert torch.allclose(ref_tb, ref0, atol=1e-5)


def test_paper_profile_shares_on_a_shape_only_qwen7b():
    """Qwen2.5-7B's shape on the meta device: the paper profile's accounting without any weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from omtr.model.backbone import Backbone, build_micro_tokenizer
    from omtr.model.roles import RoleModel

    shape = Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
    with torch.device("meta"):
        qwen = Qwen2ForCausalLM(shape).to(torch.bfloat16)
    cfg = model_profile("paper")
    assert cfg.dtype == "bfloat16" and cfg.train_backbone and not cfg.grammar
    tok = build_micro_tokenizer(1024)
    with torch.device("meta"):  # adapters too: no memory, no initialisation work
        m = RoleModel(cfg, Backbone(qwen, tok, {"kind": "hf", "id": "shape-only"}))
    rep = m.parameter_report()
    assert 7.5e9 < rep["parameters"]["backbone"] < 7.7e9
    assert all(0.014 < s < 0.0167 for s in rep["role_share"].values()), rep["role_share"]
    assert rep["shared_share"] > 0.95
    assert rep["memory_ratio"] <= 1.10, rep["memory_ratio"]


SHARED = ("You translate planning tasks written in English into PDDL for a classical planner. Answer with "
          "the domain and then the problem, nothing else. Use lower-case names and declare every predicate.")
SHARED_PROMPTS = [[{"role": "system", "content": SHARED}, {"role": "user", "content": t}]
                  for t in ("Stack block a on block b.", "Move both balls to room b.", "Deliver the package to the depot now.")]


def test_a_shared_prompt_prefix_is_computed_once_with_the_same_results(perturbed):
    """Prefix sharing changes how the batch is computed, not what it computes: generation log-probs,
    token log-probs (with gradients) and their gradients equal those of the plain batch; the stored
    prefix is reused while the parameters stay and dropped when they change."""
    m = perturbed
    seqs = m.encode_prompts(SHARED_PROMPTS)
    common = len(__import__("os").path.commonprefix(seqs))
    assert common >= 32, "the prompts share the system message"
    sampled = Sampling(greedy=False, temperature=0.8, max_new_tokens=10, seed=11)
    calls = []
    hook = m.base_model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: calls.append(kw["inputs_embeds"].shape), with_kwargs=True)
    try:
        m.forget_prefixes()
        m.share_prefix = False
        plain = _free(m, "actor", SHARED_PROMPTS, sampled)
        plain_lp, _ = m.token_logprobs("actor", SHARED_PROMPTS, [g.token_ids for g in plain], temperature=0.8, grammar=False)
        m.zero_grad()
        plain_lp.sum().backward()
        plain_grad = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        assert calls[0][:2] == (3, len(seqs[0]) + m.cfg.role_vectors + max(map(len, seqs)) - len(seqs[0]))
        m.share_prefix = True
        calls.clear()
        shared = _free(m, "actor", SHARED_PROMPTS, sampled)
        assert calls[0][:2] == (1, m.cfg.role_vectors + common), "the prefix runs once, as a batch of one"
        assert calls[1][0] == 3 and calls[1][1] == max(map(len, seqs)) - common
        for a, b in zip(plain, shared):
            assert a.token_ids[:3] == b.token_ids[:3]
            n = min(len(a.token_ids), len(b.token_ids))
            k = next((i for i in range(n) if a.token_ids[i] != b.token_ids[i]), n)
            assert torch.allclose(torch.tensor(a.logprobs[:k]), torch.tensor(b.logprobs[:k]), atol=1e-4)
        calls.clear()
        again = _free(m, "actor", SHARED_PROMPTS, sampled)
        assert calls[0][0] == 3, "the stored prefix is reused: no batch-of-one pass"
        assert [g.token_ids for g in again] == [g.token_ids for g in shared]
        shared_lp, _ = m.token_logprobs("actor", SHARED_PROMPTS, [g.token_ids for g in plain], temperature=0.8, grammar=False)
        assert torch.allclose(shared_lp, plain_lp, atol=1e-4)
        m.zero_grad()
        shared_lp.sum().backward()
        for n, g in plain_grad.items():
            got = m.get_parameter(n).grad
            assert (got - g).norm() <= 1e-3 * g.norm() + 1e-6, n
        m.zero_grad()
        with torch.no_grad():
            m.role_embeddings.add_(0.01)  # a parameter changes in place: the stored prefix is stale
        calls.clear()
        _free(m, "actor", SHARED_PROMPTS, sampled)
        assert calls[0][0] == 1, "a changed parameter forces a new prefix pass"
    finally:
        hook.remove()
        m.share_prefix = True
        with torch.no_grad():
            m.role_embeddings.sub_(0.01)


def test_grammar_limits_of_the_config_bound_the_answer_and_travel_with_the_model(tmp_path):
    """ModelConfig.grammar_limits tightens the grammar's repetitions (the small profile uses it so
    that SmolLM2 closes its spec instead of repeating an action until the budget ends); the bounds
    are saved with the model; unknown bounds are refused by name."""
    from omtr.config import ConfigError, ModelConfig
    from omtr.model import build_model
    from omtr.model.roles import RoleModel
    from omtr.rl.config import TrainConfig

    cfg = model_profile("micro").replace(grammar_limits={"actions": 1, "predicates": 2, "literals": 2, "init": 2,
                                                         "goal": 1, "objects": 2, "types": 1, "name_len": 4})
    m = build_model(cfg)
    gens = m.generate("actor", PROMPTS, Sampling(greedy=False, temperature=1.0, max_new_tokens=600, seed=2), grammar=True)
    for g in gens:
        assert g.finish_reason == "stop", "the bounded grammar closes the spec"
        assert g.text.count("(:action") <= 1
    m.save(tmp_path / "m")
    assert RoleModel.load(tmp_path / "m").cfg.grammar_limits == cfg.grammar_limits
    assert model_profile("small").grammar_limits["actions"] >= 4, "BlocksWorld needs four actions"
    with pytest.raises(ConfigError, match="'action'"):
        ModelConfig(grammar_limits={"action": 3})
    with pytest.raises(ConfigError, match="'init'"):
        TrainConfig(grammar_limits={"init": 0})
    assert TrainConfig().with_overrides(['grammar_limits={"actions": 6}']).grammar_limits == {"actions": 6}
    with pytest.raises(ConfigError, match="JSON object"):
        TrainConfig().with_overrides(["grammar_limits={actions: 6}"])


def test_token_logprobs_of_identical_prompts_whose_completions_start_alike(perturbed):
    """The samples of one task (identical prompts) often begin their answers alike: the shared
    prefix must stop at the prompts, or the completions' first positions would have no logits."""
    m = perturbed
    prompts = [SHARED_PROMPTS[0]] * 3
    comps = [[5, 6, 7, 8, 9], [5, 6, 10], [5, 6]]
    shared, mask = m.token_logprobs("actor", prompts, comps, grammar=False)
    try:
        m.share_prefix = False
        plain, plain_mask = m.token_logprobs("actor", prompts, comps, grammar=False)
    finally:
        m.share_prefix = True
    assert torch.equal(mask, plain_mask) and mask.sum() == 10
    assert torch.allclose(shared, plain, atol=1e-4)


@pytest.mark.parametrize("pack", [True, False])
def test_judge_scores_share_the_prompt_prefix_with_the_same_scores_and_gradients(perturbed, pack):
    """s_J goes through the shared-prefix forward pass: the specs of one task share most of their
    prompt, computed once as a batch of one; scores and their gradients equal the plain batch's.
    The rows' own tokens then go through as one packed row (pack_rows, on a CPU) or as a padded
    batch of three."""
    m = perturbed
    cfg_before = m.cfg
    m.cfg = m.cfg.replace(pack_rows=pack)
    task = [{"role": "system", "content": SHARED}, {"role": "user", "content": "Stack block a on block b. Spec: "}]
    prompts = [[task[0], {"role": "user", "content": task[1]["content"] + s}]
               for s in ("(on a b)", "(on b a) (clear a)", "(holding a)")]
    calls = []
    hook = m.base_model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: calls.append(kw["inputs_embeds"].shape), with_kwargs=True)
    try:
        m.share_prefix = False
        m.zero_grad()
        plain = m.judge_scores(prompts)
        plain.sum().backward()
        plain_grad = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        assert len(calls) == 1 and calls[0][0] == 3
        m.share_prefix = True
        calls.clear()
        m.zero_grad()
        shared = m.judge_scores(prompts)
        shared.sum().backward()
        assert [c[0] for c in calls] == [1, 1 if pack else 3], "the common prefix runs once, then the rows' own tokens"
        seqs = m.encode_prompts(prompts)
        own = [len(s) - 32 for s in seqs]  # at most what each row does not share
        assert calls[1][1] <= (sum(own) if pack else max(own)), "the rows' pass holds only what they do not share"
        assert torch.allclose(shared, plain, atol=1e-5)
        assert "judge_head.weight" in plain_grad
        for n, g in plain_grad.items():
            got = m.get_parameter(n).grad
            assert (got - g).norm() <= 1e-3 * g.norm() + 1e-6, n
        m.zero_grad()
        mixed = prompts + SHARED_PROMPTS  # judge() keeps the prompts' order whatever the chunks
        assert m.judge(mixed, batch_size=2) == pytest.approx(m.judge(mixed, batch_size=1), abs=1e-5)
    finally:
        hook.remove()
        m.share_prefix = True
        m.cfg = cfg_before
        m.zero_grad()


def test_alike_chunks_put_alike_prompts_together_and_keep_every_one():
    """Micro-batches hold alike prompts (the samples of one task), at most `size` each, every
    position once; prompts that share only a short beginning go to different chunks."""
    from omtr.model.batching import alike_chunks

    a = "system: translate. user: stack block a on block b and then put c on the table " * 3
    b = "system: translate. user: move both balls from room a to room b with the left gripper " * 3
    texts = [a + "x", b + "x", a + "y", b + "y", a + "z", b + "z", a + "w"]
    chunks = alike_chunks(texts, 3)
    assert sorted(i for c in chunks for i in c) == list(range(len(texts)))
    assert all(len(c) <= 3 for c in chunks)
    for c in chunks:
        assert len({texts[i][:40] for i in c}) == 1, "a chunk mixes two tasks"
    assert sorted(len(c) for c in chunks) == [1, 3, 3]
    assert alike_chunks([], 4) == []
    with pytest.raises(ValueError, match="chunk size"):
        alike_chunks(texts, 0)


def test_alike_chunks_by_length_pad_less_and_keep_tasks_apart():
    """With lengths (a sample's completion tokens), the samples of one task are cut into chunks of
    about one length: the padded size of the chunks (each row padded to its chunk's longest) is the
    smallest a cut of that task's run into chunks of `size` can give, and no chunk mixes two tasks."""
    from omtr.model.batching import alike_chunks

    a = "system: translate. user: stack block a on block b and then put c on the table " * 3
    b = "system: translate. user: move both balls from room a to room b with the left gripper " * 3
    texts = [a] * 8 + [b] * 3
    lengths = [877, 253, 565, 260, 575, 526, 242, 430, 40, 900, 41]
    chunks = alike_chunks(texts, 4, lengths=lengths)
    assert sorted(i for c in chunks for i in c) == list(range(len(texts)))
    for c in chunks:
        assert len({texts[i] for i in c}) == 1, "a chunk mixes two tasks"

    def padded(cs):
        return sum(len(c) * max(lengths[i] for i in c) for c in cs)

    assert padded(chunks) == 4 * 430 + 4 * 877 + 3 * 900
    assert padded(chunks) < padded(alike_chunks(texts, 4))  # in the order they came: 4 x 575 + 4 x 877 + ...
    with pytest.raises(ValueError, match="lengths"):
        alike_chunks(texts, 4, lengths=[1, 2])
