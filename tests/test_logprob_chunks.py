"""Token log-probabilities a chunk of positions at a time (``logprob_chunk``, omtr.model.logprobs)
equal the whole batch's vocabulary-wide path (``logprob_chunk=0``): values and the gradients of
every trainable parameter, grammar off / plain / scoped, temperature 1 and 0.7, ragged completions,
frozen and trainable (tied) backbone, the reference policy; and on SmolLM2 for a fixed batch."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from omtr.config import ConfigError, ModelConfig  # noqa: E402
from omtr.policy import Sampling  # noqa: E402

PROMPTS = [
    [{"role": "user", "content": "Stack block a on block b."}],
    [{"role": "system", "content": "Write PDDL."}, {"role": "user", "content": "Move both balls to room b, then stop."}],
    [{"role": "user", "content": "Deliver the package."}],
]
CHUNK = 5  # positions: several chunks per row, boundaries that fall inside rows


def _use(m, chunk):
    m.cfg = m.cfg.replace(logprob_chunk=chunk) if chunk else m.cfg.replace(logprob_chunk=0)



def _moved_micro(scale: float):
    """The micro model with its adapters and role vectors moved by seeded noise of ``scale``."""
    from omtr.model import build_model

    m = build_model("micro")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_" in name or name.startswith("role_embeddings"):
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return m

@pytest.fixture(scope="module")
def micro():
    """A micro model with every role parameter non-trivial (LoRA B starts at zero) and a grammar
    whose bounds let random weights finish a spec."""
    torch.set_num_threads(1)
    from omtr.model.limits import GrammarLimits

    m = _moved_micro(0.3)
    m.set_grammar_limits(GrammarLimits(name_len=4, ws=2, types=2, predicates=2, predicate_args=2, actions=1,
                                       parameters=2, literals=2, objects=3, init=3, goal=2, atom_args=2))
    return m


@pytest.fixture(scope="module")
def completions(micro):
    """Per constraint: completions sampled under it at 0.7, cut to ragged lengths (a prefix of a
    sequence the grammar accepts is one it accepts)."""
    out = {}
    for mode in ("off", "plain", "scoped"):
        gens = micro.generate("actor", PROMPTS, Sampling(greedy=False, temperature=0.7, max_new_tokens=60, seed=2),
                              constraint=mode)
        out[mode] = (gens, [g.token_ids[: max(1, len(g.token_ids) - 17 * b)] for b, g in enumerate(gens)])
    return out


def _run(m, chunk, comps, temperature, mode, **kw):
    """Log-probs, mask and every trainable parameter's gradient of a position-weighted sum."""
    _use(m, chunk)
    m.zero_grad(set_to_none=True)
    lp, mask = m.token_logprobs("actor", PROMPTS, comps, temperature=temperature, constraint=mode, **kw)
    weights = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)  # every position its own weight
    (lp * weights).sum().backward()
    return lp.detach(), mask, _grads(m)


def _grads(m):
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in m.named_parameters() if p.requires_grad}


def _assert_same(a, b, *, atol=1e-5, rtol=1e-4):
    lp0, mask0, g0 = a
    lp1, mask1, g1 = b
    assert torch.equal(mask0, mask1)
    assert torch.allclose(lp0, lp1, atol=atol), (lp0 - lp1).abs().max()
    assert set(g0) == set(g1)
    missing = [n for n in g0 if (g0[n] is None) != (g1[n] is None)]
    assert not missing, missing
    for n in g0:
        if g0[n] is None:
            continue
        scale = g0[n].abs().max().item()
        assert torch.allclose(g0[n], g1[n], atol=atol + rtol * scale), (n, (g0[n] - g1[n]).abs().max().item(), scale)


@pytest.fixture()
def counted(monkeypatch):
    """How often the chunked path ran (so an equality can never come from both runs taking the old one)."""
    import omtr.model.logprobs as lp

    calls = []
    real = lp._ChunkedLogprobs.apply
    monkeypatch.setattr(lp._ChunkedLogprobs, "apply", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    return calls


@pytest.mark.parametrize("mode", ["off", "scoped"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_and_gradients_equal_the_full_batch_path(micro, completions, counted, mode, temperature):
    gens, comps = completions[mode]
    assert len({len(c) for c in comps}) == len(comps), "ragged lengths"
    full = _run(micro, 0, comps, temperature, mode)
    assert not counted
    chunked = _run(micro, CHUNK, comps, temperature, mode)
    assert counted == [sum(len(c) for c in comps)], "the completion positions alone, through the chunked path"
    _assert_same(full, chunked)
    grads = chunked[2]
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_" in n)
    assert grads["role_embeddings"].abs().sum() > 0
    assert all(grads[n] is None for n in grads if ".editor." in n or ".judge." in n), "inactive adapters"
    lp, mask = chunked[0], chunked[1]
    assert (lp[~mask] == 0).all()
    if temperature == 0.7:  # and both equal what the sampler saw
        for b, (g, c) in enumerate(zip(gens, comps)):
            assert torch.allclose(lp[b, :len(c)], torch.tensor(g.logprobs[:len(c)]), atol=1e-4)


def test_chunked_path_applies_the_masks_and_the_temperature(micro, completions):
    """The checks above would be vacuous if masks or temperature did nothing on these tokens."""
    _, comps = completions["scoped"]
    _use(micro, CHUNK)
    with torch.no_grad():
        scoped, mask = micro.token_logprobs("actor", PROMPTS, comps, temperature=0.7, constraint="scoped")
        free, _ = micro.token_logprobs("actor", PROMPTS, comps, temperature=0.7, constraint="off")
        hot, _ = micro.token_logprobs("actor", PROMPTS, comps, temperature=1.0, constraint="scoped")
    assert (scoped[mask] > free[mask] + 1e-3).any() and (scoped[mask] >= free[mask] - 1e-5).all()
    assert (scoped[mask] - hot[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_chunk_sizes_and_a_trainable_tied_backbone(completions, chunk):
    """Frozen backbone off: the head's weight (tied to the input embeddings) trains, and its
    gradient (recomputed per chunk in the backward pass) equals autograd's on the full logits."""
    from omtr.model import build_model

    m = build_model("micro")
    m.cfg = m.cfg.replace(train_backbone=True)
    m._set_trainable()
    head = m.base_model.get_output_embeddings()
    assert head.weight.requires_grad and head.weight is m.base_model.get_input_embeddings().weight
    _, comps = completions["plain"]
    full = _run(m, 0, comps, 0.7, "plain")
    chunked = _run(m, chunk, comps, 0.7, "plain")
    _assert_same(full, chunked)
    assert chunked[2][next(n for n, p in m.named_parameters() if p is head.weight)].abs().sum() > 0


def test_reference_policy_and_no_grad(micro, completions):
    _, comps = completions["scoped"]
    out = {}
    for chunk in (0, CHUNK):
        _use(micro, chunk)
        with micro.reference(), torch.no_grad():
            out[chunk] = micro.token_logprobs("actor", PROMPTS, comps, temperature=0.7, constraint="scoped")[0]
    assert not out[CHUNK].requires_grad
    assert torch.allclose(out[0], out[CHUNK], atol=1e-5)


def test_chunked_function_against_log_softmax():
    """omtr.model.logprobs alone: bias, a mask, temperature, gradients of hidden, weight and bias."""
    from omtr.model.logprobs import chunked_token_logprobs

    g = torch.Generator().manual_seed(0)
    N, H, V = 23, 8, 50
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64).float().requires_grad_()
    head = torch.nn.Linear(H, V)
    targets = torch.randint(0, V, (N,), generator=g)
    banned = torch.rand(N, V, generator=g) < 0.4
    banned[torch.arange(N), targets] = False

    def apply_mask(z, rows):  # rows: indices into `banned`, standing in for a bitmask
        z.masked_fill_(banned[rows.squeeze(1)], float("-inf"))

    rows = torch.arange(N).unsqueeze(1)
    got = chunked_token_logprobs(hidden, head, targets, temperature=0.7, chunk=4, bitmask=rows, apply_mask=apply_mask)
    w = torch.randn(N, generator=g)
    (got * w).sum().backward()
    mine = [hidden.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()]
    hidden.grad = head.weight.grad = head.bias.grad = None
    z = (head(hidden) / 0.7).masked_fill(banned, float("-inf"))
    want = torch.log_softmax(z, -1).gather(1, targets.unsqueeze(1)).squeeze(1)
    (want * w).sum().backward()
    assert torch.allclose(got, want, atol=1e-5)
    for a, b in zip(mine, [hidden.grad, head.weight.grad, head.bias.grad]):
        assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError):
        chunked_token_logprobs(hidden, head, targets, chunk=0)


def test_logprob_chunk_setting():
    assert ModelConfig().logprob_chunk > 0
    with pytest.raises(ConfigError, match="logprob_chunk"):
        ModelConfig(logprob_chunk=-1)
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import build_models

    cfg = train_profile("micro").with_overrides(["logprob_chunk=0"])
    assert cfg.logprob_chunk == 0
    models = build_models(cfg)
    assert models["actor"].cfg.logprob_chunk == 0
    with pytest.raises(ConfigError, match="logprob_chunk"):
        train_profile("micro").with_overrides(["logprob_chunk=-3"])


@pytest.mark.slow
def test_smollm2_chunked_equals_full_for_a_fixed_batch():
    from omtr.model import build_model
    from omtr.model.backbone import BackboneError

    try:
        m = build_model("small")
    except BackboneError as exc:
        pytest.skip(str(exc))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # LoRA B starts at zero: make the adapters' gradients depend on A and B
        for name, p in m.named_parameters():
            if "lora_B" in name and ".actor." in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
    prompts = [[{"role": "user", "content": "Write PDDL: block a is on the table; put block a on block b."}],
               [{"role": "user", "content": "A robot in room a must carry ball1 from room a to room b."}]]
    gens = m.generate("actor", prompts, Sampling(greedy=False, temperature=0.7, seed=0, max_new_tokens=40),
                      constraint="plain")
    comps = [gens[0].token_ids, gens[1].token_ids[:23]]
    out = {}
    for chunk in (0, 16):
        _use(m, chunk)
        m.zero_grad(set_to_none=True)
        lp, mask = m.token_logprobs("actor", prompts, comps, temperature=0.7, constraint="plain")
        (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
        out[chunk] = (lp.detach(), mask, _grads(m))
    _assert_same(out[0], out[16], atol=2e-5, rtol=1e-3)
    assert torch.allclose(out[16][0][0, :len(comps[0])], torch.tensor(gens[0].logprobs), atol=1e-3)


# ------------------------------------------------------------------ activation checkpointing

GROUP = [PROMPTS[1]] * 3  # one task's samples: a shared prompt prefix, computed once (the ReplayCache path)


@pytest.fixture()
def checkpoints(monkeypatch):
    """How many decoder-layer forward passes ran under torch's checkpoint."""
    import omtr.model.checkpointing as ck

    calls = []
    real = ck.checkpoint
    monkeypatch.setattr(ck, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _with_ckpt(m, on):
    m.cfg = m.cfg.replace(activation_checkpointing=on)


@pytest.mark.parametrize("prompts", [GROUP, PROMPTS], ids=["shared-prefix", "distinct"])
@pytest.mark.parametrize("chunk", [0, CHUNK])
def test_checkpointed_layers_give_the_same_logprobs_and_gradients(micro, completions, checkpoints, prompts, chunk):
    _, comps = completions["scoped"]
    out = {}
    for on in (False, True):
        _with_ckpt(micro, on)
        _use(micro, chunk)
        micro.zero_grad(set_to_none=True)
        lp, mask = micro.token_logprobs("actor", prompts, comps, temperature=0.7, constraint="off")
        (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
        out[on] = (lp.detach(), mask, _grads(micro))
        if not on:
            assert not checkpoints
    _with_ckpt(micro, True)
    from omtr.model.checkpointing import decoder_layers

    layers = len(decoder_layers(micro.base_model))
    assert len(checkpoints) >= layers, "every decoder layer ran under checkpoint"
    _assert_same(out[False], out[True])
    assert out[True][2]["role_embeddings"].abs().sum() > 0


def test_spread_picks_an_even_share_of_the_layers():
    from omtr.model.checkpointing import spread

    layers = list(range(30))
    assert spread(layers, 1.0) == layers
    assert spread(layers, 0.5) == list(range(0, 30, 2))
    assert len(spread(layers, 0.25)) == 8 and spread(layers, 0.25)[0] == 0
    assert spread(layers, 0.01) == [0]  # at least one
    assert spread([7, 8, 9], 0.5) == [7, 8]


def test_checkpoint_layers_is_checked_and_a_share_gives_the_same_values(micro, completions, checkpoints):
    from omtr.config import ConfigError, ModelConfig
    from omtr.model.checkpointing import decoder_layers
    from omtr.rl.config import train_profile

    for bad in (0, 1.5, -0.2, True, "half"):
        with pytest.raises(ConfigError, match="checkpoint_layers"):
            ModelConfig(checkpoint_layers=bad)
    with pytest.raises(ConfigError, match="checkpoint_layers"):
        train_profile("micro").replace(checkpoint_layers=2.0)
    _, comps = completions["scoped"]
    n = len(decoder_layers(micro.base_model))
    out = {}
    for share in (1.0, 0.5):
        micro.cfg = micro.cfg.replace(activation_checkpointing=True, checkpoint_layers=share)
        checkpoints.clear()
        micro.zero_grad(set_to_none=True)
        lp, mask = micro.token_logprobs("actor", PROMPTS, comps, temperature=0.7, constraint="off")
        (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
        out[share] = (lp.detach(), mask, _grads(micro), len(checkpoints))
    micro.cfg = micro.cfg.replace(checkpoint_layers=1.0)
    # each forward pass that trains runs round(share * n) layers under checkpoint
    assert out[1.0][3] > 0 and out[0.5][3] * n == out[1.0][3] * max(1, round(0.5 * n))
    _assert_same(out[1.0][:3], out[0.5][:3])


def test_checkpointed_judge_scores_and_gradients(micro, checkpoints):
    prompts = [PROMPTS[0] + [{"role": "assistant", "content": "(define (domain d))"}],
               PROMPTS[0] + [{"role": "assistant", "content": "(define (problem p) (:domain d))"}]]
    out = {}
    for on in (False, True):
        _with_ckpt(micro, on)
        micro.zero_grad(set_to_none=True)
        s = micro.judge_scores(prompts)
        (s * torch.tensor([1.0, -2.0])).sum().backward()
        out[on] = (s.detach(), _grads(micro))
    _with_ckpt(micro, True)
    assert checkpoints
    assert torch.allclose(out[False][0], out[True][0], atol=1e-6)
    g0, g1 = out[False][1], out[True][1]
    assert g1["judge_head.weight"].abs().sum() > 0
    for n in g0:
        assert (g0[n] is None) == (g1[n] is None), n
        if g0[n] is not None:
            assert torch.allclose(g0[n], g1[n], atol=1e-6 + 1e-4 * g0[n].abs().max().item()), n


def test_no_checkpointing_without_gradients(micro, completions, checkpoints):
    _, comps = completions["off"]
    _with_ckpt(micro, True)
    with torch.no_grad():
        micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
    assert not checkpoints


# ------------------------------------------------------------------ bf16 autocast (update_dtype)

def test_bf16_falls_back_to_fp32_with_one_line_where_the_cpu_lacks_it(monkeypatch, caplog):
    import logging

    import omtr.model.precision as P

    monkeypatch.setattr(P, "_cpu_flags", lambda: {"avx2", "avx512f"})
    with caplog.at_level(logging.WARNING, logger="omtr.model.precision"):
        assert P.resolve_update_dtype("bf16", "cpu") == "fp32"
        assert P.resolve_update_dtype("fp32", "cpu") == "fp32"
    lines = [r for r in caplog.records if r.name == "omtr.model.precision"]
    assert len(lines) == 1 and "bf16" in lines[0].getMessage() and "fp32" in lines[0].getMessage()
    with pytest.raises(ValueError, match="update_dtype"):
        P.resolve_update_dtype("fp16", "cpu")
    with pytest.raises(ConfigError, match="update_dtype"):
        from omtr.rl.config import train_profile

        train_profile("micro").with_overrides(["update_dtype=fp16"])


def test_auto_is_bf16_where_native_and_faster_and_fp32_without_a_warning_elsewhere(monkeypatch, caplog):
    """update_dtype=auto (the small profile's): bf16 where the CPU has it and its products measure
    faster than fp32 ones, quietly fp32 where not (one info line saying why)."""
    import logging

    import omtr.model.precision as P
    from omtr.rl.config import train_profile

    assert train_profile("small").update_dtype == "auto"
    monkeypatch.setattr(P, "_cpu_flags", lambda: {"avx2", "avx512f"})
    with caplog.at_level(logging.WARNING, logger="omtr.model.precision"):
        assert P.resolve_update_dtype("auto", "cpu") == "fp32"
    assert not [r for r in caplog.records if r.name == "omtr.model.precision"]
    monkeypatch.setattr(P, "_cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    native, _ = P.bf16_support("cpu")  # the flag, and oneDNN's bf16 kernels in this torch on this CPU
    monkeypatch.setattr(P, "bf16_pays", lambda device="cpu": (True, ""))
    assert P.resolve_update_dtype("auto", "cpu") == ("bf16" if native else "fp32")
    if not native:
        return
    monkeypatch.setattr(P, "bf16_pays", lambda device="cpu": (False, "bf16 products measured slower"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="omtr.model.precision"):
        assert P.resolve_update_dtype("auto", "cpu") == "fp32"
        assert P.resolve_update_dtype("bf16", "cpu") == "bf16", "asked for by name: kept"
    lines = [r for r in caplog.records if r.name == "omtr.model.precision"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "slower" in lines[0].getMessage()


def test_bf16_probe_measures_once_per_process():
    import omtr.model.precision as P

    first = P.bf16_pays("cpu")
    assert P.bf16_pays("cpu") is first, "cached: one probe per process"
    pays, why = first
    assert isinstance(pays, bool) and (pays or "GFLOP/s" in why)
    assert P.bf16_pays("cuda:0") == (True, "")


def test_trainer_with_bf16_on_a_cpu_without_it_trains_in_fp32(tmp_path, micro, monkeypatch, caplog):
    import logging

    import omtr.model.precision as P
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.tasks.training import TrainingTask

    monkeypatch.setattr(P, "_cpu_flags", lambda: set())
    cfg = train_profile("micro").with_overrides(["update_dtype=bf16", "mlflow=false"])
    tasks = [TrainingTask("t0", "blocksworld", None, "Put block a on the table.")]
    with caplog.at_level(logging.WARNING, logger="omtr.model.precision"):
        tr = Trainer(cfg, tasks, tmp_path / "run", quiet=True, model=micro)
    assert tr.update_dtype == "fp32"
    assert sum(r.name == "omtr.model.precision" for r in caplog.records) == 1
    with tr._precision():
        assert not torch.is_autocast_enabled("cpu")


@pytest.fixture(scope="module")
def micro_mild():
    """A micro model whose adapters and role vectors moved as far as training moves them (the
    ``micro`` fixture's large random steps make its activations chaotic enough that bf16's
    rounding turns its gradients around: a bound on bf16 needs a model in a trained regime)."""
    return _moved_micro(0.05)


def test_bf16_autocast_stays_close_to_fp32(micro_mild, completions):
    """The effect on the log-probabilities and the gradient; the head and the results stay fp32."""
    import omtr.model.precision as P

    ok, why = P.bf16_support("cpu")
    if not ok:
        pytest.skip(why)
    m = micro_mild
    _, comps = completions["off"]
    _use(m, CHUNK)
    out = {}
    for name in ("fp32", "bf16", "bf16 again"):
        m.zero_grad(set_to_none=True)
        with P.update_autocast(name.split()[0], "cpu"):
            lp, mask = m.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
        (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
        out[name] = (lp.detach(), torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    lp32, lp16 = out["fp32"][0], out["bf16"][0]
    assert lp16.dtype == torch.float32 and out["bf16"][1].dtype == torch.float32
    assert not torch.equal(lp32, lp16), "the autocast changed the arithmetic"
    assert torch.equal(lp16, out["bf16 again"][0]), "deterministic: old and new log-probs of a batch agree"
    diff = (lp32 - lp16)[mask].abs()
    assert diff.mean() < 0.01 and diff.max() < 0.05, (diff.mean().item(), diff.max().item())
    cos = torch.nn.functional.cosine_similarity(out["fp32"][1], out["bf16"][1], dim=0)
    assert cos > 0.99, cos.item()


def test_adapter_inputs_are_not_cast_back_and_forth_under_the_autocast(micro_mild, completions):
    """peft would cast a bf16 activation to the fp32 adapter's dtype, which the autocast casts back
    for the adapter's product: skipped on a one-dtype model (omtr.model.precision), with the same
    log-probabilities and gradients and fewer copies."""
    import omtr.model.precision as P
    from peft.tuners.tuners_utils import BaseTunerLayer
    from torch.utils._python_dispatch import TorchDispatchMode

    m = micro_mild
    adapters = [mod for mod in m.lm.modules() if isinstance(mod, BaseTunerLayer)]
    assert adapters and all(mod.cast_input_dtype_enabled is False for mod in adapters), "set when the model is built"
    _, comps = completions["off"]
    _use(m, CHUNK)

    class Copies(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                Copies.n += 1
            return func(*args, **(kwargs or {}))

    out = {}
    try:
        for enabled in (True, False):  # peft's casts, then none
            for mod in adapters:
                mod.cast_input_dtype_enabled = enabled
            m.zero_grad(set_to_none=True)
            Copies.n = 0
            with Copies(), P.update_autocast("bf16", "cpu"):
                lp, mask = m.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
            (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
            out[enabled] = (lp.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None},
                            Copies.n)
    finally:
        for mod in adapters:
            mod.cast_input_dtype_enabled = False
    assert torch.equal(out[True][0], out[False][0])
    assert out[True][1].keys() == out[False][1].keys()
    for n, g in out[True][1].items():
        assert torch.allclose(g, out[False][1][n], rtol=1e-5, atol=1e-7), n
    assert out[False][2] < out[True][2], (out[False][2], out[True][2])


def test_adapter_input_casts_stay_on_a_mixed_dtype_model():
    """A bf16 backbone under fp32 adapters (a GPU's setup) needs peft's casts outside an autocast."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from omtr.model import build_model
    from omtr.model.adapters import skip_adapter_input_casts

    m = build_model("micro")
    adapters = [mod for mod in m.lm.modules() if isinstance(mod, BaseTunerLayer)]
    for mod in adapters:
        mod.cast_input_dtype_enabled = True
        mod.base_layer.to(torch.bfloat16)
    assert skip_adapter_input_casts(m.lm) == 0
    assert all(mod.cast_input_dtype_enabled for mod in adapters)


# ------------------------------------------------------------------ one prompt prefix for several micro-batches

def _decoder_calls(m):
    """A list that grows by the rows of every decoder forward pass: its batch size, or the number of
    rows a packed pass carries in its one row (omtr.model.checkpointing.packed_rows)."""
    from omtr.model import checkpointing as ck

    base = m.base_model
    decoder = getattr(base, base.base_model_prefix)
    calls = []

    def rows(mod, args, kw):
        layout = getattr(ck._packed, "value", None)
        calls.append(len(layout[1]) if layout else kw["inputs_embeds"].shape[0])

    handle = decoder.register_forward_pre_hook(rows, with_kwargs=True)
    return calls, handle


@pytest.mark.parametrize("ckpt", [False, True])
def test_prefix_block_computes_a_shared_prompt_once_with_the_same_values_and_gradients(micro, completions, ckpt):
    """One task's samples in two micro-batches, each with its own backward pass: inside
    ``prefix_block`` the prompt's pass runs once and its gradient is summed, as two passes give."""
    _, comps = completions["scoped"]
    _with_ckpt(micro, ckpt)
    _use(micro, CHUNK)
    parts = [[0, 1], [2, 0], [1]]  # the last a lone row
    out = {}
    try:
        for block in (False, True):
            micro.zero_grad(set_to_none=True)
            calls, handle = _decoder_calls(micro)
            lps = []
            try:
                with micro.prefix_block() if block else contextlib.nullcontext():
                    for part in parts:
                        lp, mask = micro.token_logprobs("actor", [GROUP[i] for i in part], [comps[i] for i in part],
                                                        temperature=0.7, constraint="off")
                        (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
                        lps.append(lp.detach())
            finally:
                handle.remove()
            out[block] = (lps, _grads(micro), calls)
    finally:
        _with_ckpt(micro, True)
    assert out[False][2] == [1, 2, 1, 2, 1], "a prefix pass (batch of one) before each micro-batch's rows; a lone row whole"
    assert out[True][2] == [1, 2, 2, 1], "the later micro-batches reuse the first one's prefix"
    for a, b in zip(out[False][0], out[True][0]):
        assert torch.allclose(a, b, atol=1e-5)
    g0, g1 = out[False][1], out[True][1]
    assert {n for n in g0 if g0[n] is not None} == {n for n in g1 if g1[n] is not None}
    for n in g0:
        if g0[n] is not None:
            scale = g0[n].abs().max().item()
            assert torch.allclose(g0[n], g1[n], atol=1e-6 + 1e-4 * scale), n
    assert g1["role_embeddings"].abs().sum() > 0, "the prefix's gradient reached the role vectors"


def test_prefix_block_without_gradients_and_when_left_by_an_error(micro, completions):
    _, comps = completions["scoped"]
    _use(micro, CHUNK)
    with torch.no_grad():
        plain = [micro.token_logprobs("actor", [GROUP[i] for i in part], [comps[i] for i in part],
                                      temperature=0.7, constraint="off")[0] for part in ([0, 1], [2, 0])]
        calls, handle = _decoder_calls(micro)
        try:
            with micro.prefix_block():
                shared = [micro.token_logprobs("actor", [GROUP[i] for i in part], [comps[i] for i in part],
                                               temperature=0.7, constraint="off")[0] for part in ([0, 1], [2, 0])]
        finally:
            handle.remove()
    assert calls == [1, 2, 2], "one prefix pass, then the rows of each micro-batch"
    for a, b in zip(plain, shared):
        assert torch.allclose(a, b, atol=1e-5)
    micro.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="stop"):
        with micro.prefix_block():
            micro.token_logprobs("actor", GROUP[:2], comps[:2], temperature=0.7, constraint="off")
            raise RuntimeError("stop")
    assert all(p.grad is None for p in micro.parameters()), "nothing ran backward"
    assert micro._prefix_block is None


def test_fused_adapter_products_equal_peft_and_skip_its_elementwise_passes(micro_mild, completions):
    """``base(x) + scaling * A(x) Bᵀ`` as one addmm (omtr.model.adapters) against peft's own forward
    (product, scale, sum): the same log-probabilities and gradients, fewer elementwise passes."""
    from peft.tuners.lora.layer import Linear
    from torch.utils._python_dispatch import TorchDispatchMode

    m = micro_mild
    layers = [mod for mod in m.lm.modules() if type(mod) is Linear]
    assert layers and all("forward" in vars(mod) for mod in layers), "set when the model is built"
    _, comps = completions["off"]
    _use(m, CHUNK)

    class Ops(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.seen.append(func)
            return func(*args, **(kwargs or {}))

    fused = {mod: vars(mod)["forward"] for mod in layers}
    out = {}
    try:
        for name in ("peft", "fused"):
            for mod in layers:
                if name == "peft":
                    del mod.forward
                else:
                    mod.forward = fused[mod]
            m.zero_grad(set_to_none=True)
            Ops.seen = []
            with Ops():
                lp, mask = m.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
            (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
            out[name] = (lp.detach(), mask, _grads(m), list(Ops.seen))
    finally:
        for mod in layers:
            mod.forward = fused[mod]
    _assert_same(out["peft"][:3], out["fused"][:3])
    assert out["fused"][3].count(torch.ops.aten.addmm.default) >= len(layers) // 3
    elementwise = (torch.ops.aten.mul.Tensor, torch.ops.aten.add.Tensor)
    assert sum(f in elementwise for f in out["fused"][3]) < sum(f in elementwise for f in out["peft"][3])
    with m.lm.disable_adapter():  # the reference policy: peft's own path, the adapters left out
        base = m.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")[0]
    assert not torch.allclose(base, out["fused"][0])


def test_checkpointed_layers_keep_the_attention_for_the_recomputation(micro, completions):
    """On a CPU the backward pass's recomputation takes each layer's attention output back instead of
    running the attention kernel again (omtr.model.checkpointing.kept_sdpa); the values and
    gradients stay those of the layers without checkpointing (the test above)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from omtr.model.checkpointing import decoder_layers

    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    class Kernels(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Kernels.n += func is kernel
            return func(*args, **(kwargs or {}))

    _, comps = completions["scoped"]
    _use(micro, CHUNK)
    _with_ckpt(micro, True)
    micro.cfg = micro.cfg.replace(pack_rows=False)  # the padded batch (packed rows: tests/test_packed_rows.py)
    layers = len(decoder_layers(micro.base_model))
    assert micro.base_model.config._attn_implementation == "sdpa"
    micro.zero_grad(set_to_none=True)
    try:
        with Kernels():
            lp, _ = micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
            forward = Kernels.n
            (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
    finally:
        micro.cfg = micro.cfg.replace(pack_rows=True)
    assert forward == 2 * layers, "the prefix's pass and the rows' ran the kernel in every layer"
    assert Kernels.n == forward + layers, "the recomputation ran the prefix's attention only (no mask), not the rows'"
    assert micro.base_model.config._attn_implementation == "sdpa", "switched only inside the layers' calls"
    from omtr.model import checkpointing as ck

    assert ck._mask_memo[0] is not None
    ck.forget_masks()  # what the trainer does after an update
    assert ck._mask_memo == [None, None, None]


def test_fused_adapters_setting_switches_back_to_peft(tmp_path):
    from peft.tuners.lora.layer import Linear

    from omtr.config import ModelConfig
    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.tasks.training import TrainingTask

    m = build_model("micro")
    layers = [mod for mod in m.lm.modules() if type(mod) is Linear]
    assert all("forward" in vars(mod) for mod in layers)
    cfg = train_profile("micro").with_overrides(["fused_adapters=false", "mlflow=false"])
    tr = Trainer(cfg, [TrainingTask("t0", "blocksworld", None, "Put block a on the table.")], tmp_path / "run",
                 quiet=True, model=m)
    assert tr.models["actor"].cfg.fused_adapters is False
    assert not any("forward" in vars(mod) for mod in layers), "peft's own forward pass"
    assert ModelConfig.from_dict(m.cfg.to_dict()).fused_adapters is False, "saved with the model"


def test_replayed_masks_are_kept_for_a_later_pass_over_the_same_steps(micro, completions, monkeypatch):
    """The old-log-prob pass and the PPO pass replay the grammar over the same steps: the second
    takes the first's mask rows (same values), a new config or grammar replays again, and the
    store is bounded and emptied by forget_masks."""
    import omtr.model.roles as R

    _, comps = completions["scoped"]
    _use(micro, CHUNK)
    micro.forget_masks()
    replays = []
    real = R.RoleModel._replay_bitmask

    def counted(self, comps_, *a, **k):
        if k.get("keys") is None:  # an actual replay, not a lookup
            replays.append(len(comps_))
        return real(self, comps_, *a, **k)

    monkeypatch.setattr(R.RoleModel, "_replay_bitmask", counted)
    with torch.no_grad():
        first = micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="scoped")[0]
        assert replays == [len(comps)] and micro._mask_rows_bytes > 0
        again = micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="scoped")[0]
        assert replays == [len(comps)], "every row's masks came from the store"
        part = micro.token_logprobs("actor", GROUP[:2], [comps[1], comps[2][:-1]], temperature=0.7,
                                    constraint="scoped")[0]
        assert replays == [len(comps), 1], "only the row not seen before is replayed"
        micro.cfg = micro.cfg.replace(logprob_chunk=CHUNK + 1)  # a new config: its masks may differ
        micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="scoped")
        assert replays == [len(comps), 1, len(comps)]
    assert torch.equal(first, again)
    assert torch.equal(part[0, :len(comps[1])], first[1, :len(comps[1])])
    micro.forget_masks()
    assert not micro._mask_rows and micro._mask_rows_bytes == 0
    monkeypatch.setattr(R, "MASK_ROWS_BYTES", 1)
    micro.cfg = micro.cfg.replace(logprob_chunk=CHUNK)
    with torch.no_grad():
        bounded = micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="scoped")[0]
    assert torch.equal(bounded, first)
    assert not micro._mask_rows, "the store keeps at most MASK_ROWS_BYTES"
    assert not micro._mask_rows and micro._mask_rows_bytes == 0


def test_bf16_jacobian_keeps_the_values_and_the_gradient_of_confident_tokens():
    """Under a bf16 autocast the log-probs stay the fp32 head's, bit for bit; the Jacobian's
    product is bf16 with the target's share taken out first, so where the sampled token's
    probability is near 1 (most of a trained policy's tokens) the gradient stays within bf16's
    rounding of float64's; the plain ``p W`` in bf16 would cancel against ``W[t]`` there."""
    from omtr.model.logprobs import chunked_token_logprobs

    g = torch.Generator().manual_seed(1)
    N, H, V = 48, 64, 3000
    head = torch.nn.Linear(H, V, bias=False)
    head.weight.requires_grad_(False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.3)
    hidden = torch.randn(N, H, generator=g) * 11.0
    targets = (hidden @ head.weight.t()).argmax(-1)
    W, h64 = head.weight.double(), hidden.double()
    p = torch.softmax(h64 @ W.t(), -1)
    pt = p.gather(1, targets.unsqueeze(1)).squeeze(1)
    assert pt.median() > 0.99, "the case this test is about: confident tokens"
    want = W[targets] - p @ W  # d log p(t) / d h in float64

    def run(bf16):
        h = hidden.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            lp = chunked_token_logprobs(h, head, targets, chunk=16)
        lp.sum().backward()
        return lp.detach(), h.grad.double()

    (lp32, g32), (lp16, g16) = run(False), run(True)
    assert torch.equal(lp32, lp16)
    assert not torch.equal(g32, g16), "under the autocast the Jacobian's product is bf16"

    rows = (1 - pt) > 1e-4  # fp32's own softmax resolves these (beyond, the gradient is ~0 anyway)
    assert rows.sum() > N // 2

    def rel(x):
        return ((x - want).norm(dim=1) / want.norm(dim=1))[rows].max().item()

    plain = W[targets] - (p.bfloat16() @ W.bfloat16()).double()
    assert rel(g32) < 1e-3
    assert rel(g16) < 2e-2, rel(g16)
    assert rel(plain) > 10 * rel(g16), (rel(plain), rel(g16))


def test_training_passes_never_run_the_lm_head(micro, completions):
    """The Judge's scores and the chunked log-probs need the decoder's final states only: the LM
    head (whose whole weight a bf16 autocast would cast at every call for one position's logits)
    does not run in them, with or without gradients; generation still runs it."""
    head = micro.base_model.get_output_embeddings()
    calls = []
    hook = head.register_forward_hook(lambda mod, args, out: calls.append(tuple(args[0].shape)))
    _, comps = completions["off"]
    judged = [PROMPTS[0] + [{"role": "assistant", "content": "(define (domain d))"}],
              PROMPTS[0] + [{"role": "assistant", "content": "(define (problem p) (:domain d))"}]]
    try:
        _use(micro, CHUNK)
        micro.zero_grad(set_to_none=True)
        lp, _ = micro.token_logprobs("actor", PROMPTS, comps, temperature=0.7, constraint="off")
        (lp.sum() + micro.judge_scores(judged).sum()).backward()
        with torch.no_grad():
            micro.token_logprobs("actor", PROMPTS, comps, temperature=0.7, constraint="off")
            micro.judge(judged)
        assert calls == []
        micro.generate("actor", PROMPTS[:1], Sampling(greedy=True, max_new_tokens=2), constraint="off")
        assert calls, "the hook sees the head where it runs"
    finally:
        hook.remove()
        micro.zero_grad(set_to_none=True)
