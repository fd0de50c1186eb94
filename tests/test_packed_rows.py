"""Packed rows (``pack_rows``, omtr.model.checkpointing.packed_rows): a micro-batch's rows go through
the layers as one row without padding over their shared prompt prefix. The attention (one pass of
every row against the prefix, a causal pass per row, merged by log-sum-exp, and the kernel's
backward on each part with the merged result) equals one masked attention in values and in the
gradients of queries, keys and values; log-probabilities, Judge scores and every trainable
parameter's gradient equal the padded batch's, with and without gradients, checkpointing and a
prefix block; on SmolLM2 for a fixed batch too."""

import contextlib

import pytest

torch = pytest.importorskip("torch")

from omtr.config import ConfigError, ModelConfig  # noqa: E402
from omtr.policy import Sampling  # noqa: E402

GROUP = [[{"role": "system", "content": "Write PDDL."},
          {"role": "user", "content": "Move both balls to room b, then stop."}]] * 4


def _reference(q, k, v, prefix, lengths, scale):
    """One masked attention per row in float64: the prefix's keys, then the row's own, causal."""
    H, KV = q.shape[1], k.shape[1]
    outs, off = [], 0
    for n in lengths:
        keys = torch.cat([k[:, :, :prefix], k[:, :, prefix + off:prefix + off + n]], dim=2)
        vals = torch.cat([v[:, :, :prefix], v[:, :, prefix + off:prefix + off + n]], dim=2)
        keys, vals = keys.repeat_interleave(H // KV, dim=1), vals.repeat_interleave(H // KV, dim=1)
        mask = torch.ones((n, prefix + n), dtype=torch.bool)
        mask[:, prefix:] = torch.ones((n, n), dtype=torch.bool).tril()
        s = (q[:, :, off:off + n].double() @ keys.double().transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        outs.append(torch.softmax(s, dim=-1) @ vals.double())
        off += n
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("prefix", [0, 11])
@pytest.mark.parametrize("heads", [(4, 2), (3, 3)], ids=["grouped", "plain"])
def test_packed_attention_equals_one_masked_attention_with_its_gradients(prefix, heads):
    from omtr.model.checkpointing import _PackedAttention

    H, KV = heads
    lengths, D = (1, 5, 17, 3), 8
    N = sum(lengths)
    g = torch.Generator().manual_seed(3)
    q = torch.randn((1, H, N, D), generator=g).requires_grad_(True)
    k = torch.randn((1, KV, prefix + N, D), generator=g).requires_grad_(True)
    v = torch.randn((1, KV, prefix + N, D), generator=g).requires_grad_(True)
    grad = torch.randn((1, H, N, D), generator=g)
    scale = D ** -0.5

    ref = _reference(q, k, v, prefix, lengths, scale)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad.double())
    out, lse = _PackedAttention.apply(q, k, v, scale, prefix, lengths, None)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    assert torch.allclose(out.double(), ref, atol=1e-5), (out.double() - ref).abs().max()
    for name, a, b in zip("qkv", grads, ref_grads):
        assert torch.allclose(a.double(), b.double(), atol=1e-5), (name, (a.double() - b.double()).abs().max())
    assert lse.shape == (1, H, N) and torch.isfinite(lse).all()

    # a recomputation given the kept output skips the kernels and has the same gradients
    again, _ = _PackedAttention.apply(q, k, v, scale, prefix, lengths, (out.detach(), lse))
    assert torch.equal(again, out)
    for a, b in zip(torch.autograd.grad(again, (q, k, v), grad), grads):
        assert torch.equal(a, b)


def test_packed_attention_names_its_misuse():
    from omtr.model.checkpointing import packed_attention, packed_rows

    q = torch.zeros((1, 2, 5, 4))
    k = torch.zeros((1, 2, 7, 4))
    with pytest.raises(RuntimeError, match="outside a packed-rows pass"):
        packed_attention(None, q, k, k, None)

    class Config:
        _attn_implementation = "sdpa"

    cfg = Config()
    with packed_rows(cfg, 3, (2, 2)):
        assert cfg._attn_implementation != "sdpa"
        with pytest.raises(RuntimeError, match="do not match a prefix of 3 and rows of 4 tokens"):
            packed_attention(None, q, k, k, None)
        with pytest.raises(RuntimeError, match="pack_rows=false"):
            packed_attention(None, q, k, k, None, dropout=0.1)
    assert cfg._attn_implementation == "sdpa"


@pytest.fixture(scope="module")
def micro():
    """The micro model (grouped-query heads) with moved adapters and role vectors."""
    torch.set_num_threads(1)
    from omtr.model import build_model

    m = build_model("micro")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_" in name or name.startswith("role_embeddings"):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    assert m.base_model.config.num_key_value_heads < m.base_model.config.num_attention_heads
    return m


@pytest.fixture(scope="module")
def comps(micro):
    """Ragged completions of the group's prompt (rows of different lengths: a padded batch pads)."""
    gens = micro.generate("actor", GROUP, Sampling(greedy=False, temperature=0.7, max_new_tokens=40, seed=4),
                          constraint="off")
    return [g.token_ids[: max(2, len(g.token_ids) - 9 * b)] for b, g in enumerate(gens)]


@pytest.fixture()
def packed(monkeypatch):
    """The rows each packed pass carried (so an equality never comes from both runs padding)."""
    from omtr.model.roles import RoleModel

    calls = []
    real = RoleModel._packed_rows
    monkeypatch.setattr(RoleModel, "_packed_rows",
                        lambda self, lm, stored, seqs, *a: calls.append(len(seqs)) or real(self, lm, stored, seqs, *a))
    return calls


def _grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad and p.grad is not None}


def _close(a, b, what):
    """Gradients equal within fp32 rounding: the micro model's moved weights make its gradients
    sensitive (the padded batch's own fp32 gradients are ~1e-3 of a parameter's largest from float64's),
    so per parameter 1e-3 of its largest entry, and 1e-4 over all of them; a wrong mask gives far more."""
    assert a.keys() == b.keys(), what
    for n in a:
        scale = a[n].abs().max().item()
        assert torch.allclose(a[n], b[n], atol=1e-6 + 1e-3 * scale), (what, n, (a[n] - b[n]).abs().max().item())
    x, y = torch.cat([a[n].flatten() for n in a]), torch.cat([b[n].flatten() for n in a])
    assert (x - y).norm() / x.norm() < 1e-4, what


def _logprobs(m, comps, pack, *, ckpt=True, block=False, grad=True):
    m.cfg = m.cfg.replace(pack_rows=pack, activation_checkpointing=ckpt, logprob_chunk=7)
    m.zero_grad(set_to_none=True)
    lps = []
    with contextlib.ExitStack() as stack:
        if not grad:
            stack.enter_context(torch.no_grad())
        if block:
            stack.enter_context(m.prefix_block())
        for part in ([0, 1, 2], [3, 1]) if block else ([0, 1, 2, 3],):
            lp, mask = m.token_logprobs("actor", [GROUP[i] for i in part], [comps[i] for i in part],
                                        temperature=0.7, constraint="off")
            if grad:
                (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
            lps.append(lp.detach()[mask])
    return torch.cat(lps), (_grads(m) if grad else {})


@pytest.mark.parametrize("ckpt,block", [(True, False), (False, False), (True, True)],
                         ids=["checkpointed", "kept", "prefix-block"])
def test_packed_rows_give_the_padded_batchs_logprobs_and_gradients(micro, comps, packed, ckpt, block):
    try:
        pad = _logprobs(micro, comps, False, ckpt=ckpt, block=block)
        assert not packed
        pack = _logprobs(micro, comps, True, ckpt=ckpt, block=block)
    finally:
        micro.cfg = micro.cfg.replace(pack_rows=True, activation_checkpointing=True)
    assert packed == ([3, 2] if block else [4])
    assert torch.allclose(pad[0], pack[0], atol=1e-5), (pad[0] - pack[0]).abs().max()
    _close(pad[1], pack[1], "gradients")
    assert pack[1]["role_embeddings"].abs().sum() > 0, "the prefix's gradient reached the role vectors"


def test_packed_rows_without_gradients(micro, comps, packed):
    """The old-log-prob pass: no gradients, the prefix from a plain forward pass's cache."""
    try:
        pad, _ = _logprobs(micro, comps, False, grad=False)
        pad_block, _ = _logprobs(micro, comps, False, grad=False, block=True)
        pack, _ = _logprobs(micro, comps, True, grad=False)
        pack_block, _ = _logprobs(micro, comps, True, grad=False, block=True)
    finally:
        micro.cfg = micro.cfg.replace(pack_rows=True)
    assert packed == [4, 3, 2], "the block's second micro-batch packs over the stored prefix"
    assert torch.allclose(pad, pack, atol=1e-5)
    assert torch.allclose(pad_block, pack_block, atol=1e-5)


def test_packed_judge_scores_and_gradients(micro, packed):
    prompts = [[{"role": "system", "content": "Judge the spec."},
                {"role": "user", "content": "Task: stack a on b.\nSpec: " + "(on a b) " * n}] for n in (1, 6, 3)]
    out = {}
    try:
        for pack in (False, True):
            micro.cfg = micro.cfg.replace(pack_rows=pack)
            micro.zero_grad(set_to_none=True)
            s = micro.judge_scores(prompts)
            (s * torch.tensor([1.0, -2.0, 0.5])).sum().backward()
            out[pack] = (s.detach(), _grads(micro))
    finally:
        micro.cfg = micro.cfg.replace(pack_rows=True)
    assert packed == [3]
    assert torch.allclose(out[False][0], out[True][0], atol=1e-6)
    _close(out[False][1], out[True][1], "judge gradients")


def test_no_packing_without_a_shared_prefix_or_with_one_row(micro, comps, packed):
    prompts = [[{"role": "user", "content": "Stack block a on block b."}],
               [{"role": "user", "content": "Deliver the package."}]]
    micro.token_logprobs("actor", prompts, comps[:2], temperature=0.7, constraint="off")
    micro.token_logprobs("actor", GROUP[:1], comps[:1], temperature=0.7, constraint="off")
    assert not packed


def test_packed_recomputation_keeps_the_attention(micro, comps):
    """Checkpointed layers keep the packed attention's output: the backward pass's recomputation
    runs the forward kernel for the prefix's own pass only."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from omtr.model.checkpointing import decoder_layers

    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    class Kernels(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Kernels.n += func is kernel
            return func(*args, **(kwargs or {}))

    micro.cfg = micro.cfg.replace(pack_rows=True, activation_checkpointing=True, logprob_chunk=7)
    layers = len(decoder_layers(micro.base_model))
    micro.zero_grad(set_to_none=True)
    with Kernels():
        lp, _ = micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
        forward = Kernels.n
        lp.sum().backward()
    assert forward == layers + layers * (len(GROUP) + 1), "prefix pass; then per layer one prefix part and a part per row"
    assert Kernels.n == forward + layers, "the recomputation ran the prefix's own attention only"
    assert micro.base_model.config._attn_implementation == "sdpa"


def test_pack_rows_setting_is_checked_and_reaches_the_model(tmp_path):
    from omtr.model import build_model
    from omtr.rl.config import train_profile
    from omtr.rl.trainer import Trainer
    from omtr.tasks.training import TrainingTask

    with pytest.raises(ConfigError, match="pack_rows must be true or false"):
        ModelConfig(pack_rows="yes")
    assert ModelConfig().pack_rows is True
    cfg = train_profile("micro").with_overrides(["pack_rows=false", "mlflow=false"])
    tr = Trainer(cfg, [TrainingTask("t0", "blocksworld", None, "Put block a on the table.")], tmp_path / "run",
                 quiet=True, model=build_model("micro"))
    assert tr.models["actor"].cfg.pack_rows is False


@pytest.mark.slow
def test_smollm2_packed_rows_equal_the_padded_batch():
    """SmolLM2 (9 query heads over 3 key heads, 30 layers): one task's prompt with four ragged
    completions, log-probabilities and every trainable gradient, packed against padded."""
    from omtr.model import build_model

    torch.set_num_threads(2)
    m = build_model("small")
    m.train()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.01)
    prompt = [{"role": "user", "content": "Blocks a, b and c are on the table. Stack a on b and b on c."}]
    ids = m.tokenizer("(define (domain blocks) (:predicates (on ?x ?y) (clear ?x) (ontable ?x)))")["input_ids"]
    rows = [ids[:n] for n in (len(ids), 9, 17, 2)]
    out = {}
    for pack in (False, True):
        m.cfg = m.cfg.replace(pack_rows=pack, logprob_chunk=16)
        m.zero_grad(set_to_none=True)
        lp, mask = m.token_logprobs("actor", [prompt] * 4, rows, temperature=0.7, constraint="off")
        (lp * torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)).sum().backward()
        out[pack] = (lp.detach()[mask], _grads(m))
    assert torch.allclose(out[False][0], out[True][0], atol=1e-4), (out[False][0] - out[True][0]).abs().max()
    a, b = [torch.cat([v.flatten() for v in o[1].values()]) for o in (out[False], out[True])]
    assert out[False][1].keys() == out[True][1].keys()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 1 - 1e-6
    assert ((a - b).norm() / a.norm()) < 1e-4


def test_a_callers_hidden_states_are_the_rows_not_the_packed_row(micro, comps, packed):
    """The trainer's reference pass reads the decoder's hidden states through a hook
    (omtr.rl.update._capture_hidden): under packing it gets the rows as a padded batch's."""
    from omtr.rl.update import _capture_hidden

    seen = {}
    try:
        for pack in (False, True):
            micro.cfg = micro.cfg.replace(pack_rows=pack, logprob_chunk=7)
            with torch.no_grad(), _capture_hidden(micro) as cap:
                micro.token_logprobs("actor", GROUP, comps, temperature=0.7, constraint="off")
            seen[pack] = cap["hidden"]
    finally:
        micro.cfg = micro.cfg.replace(pack_rows=True)
    assert packed == [4] and micro.hidden_sink is None
    assert seen[True].shape == seen[False].shape
    for b, c in enumerate(comps):  # the positions the trainer reads: the prompt's last and the completion's
        n = len(c)
        a, x = seen[True][b, -(n + 1):], seen[False][b, -(n + 1):]
        assert torch.allclose(a, x, atol=1e-4), (a - x).abs().max()
