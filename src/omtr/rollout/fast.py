"""The ``fast`` CPU rollout engine.

What makes it faster than the role model's own ``generate`` on a CPU:

- **Merged weights.** Each generating role's attention adapters are added into a copy of the
  linears they adapt (``W + s·B·A``), so a step runs one matmul per linear instead of three; the
  role vectors are copied in. The MLP's linears (most of the backbone) stay one copy shared by the
  roles, each role's adapters applied beside it as two thin matmuls (``unmerged``), so adapting
  the MLP does not copy it per role. Linears no adapter touches are shared by the roles.
- **int8 linears** (``torch.ao`` dynamic quantization: int8 weights, per-row scales, activations
  quantized on the fly), the LM head included: about 5x less time in the vocabulary projection.
  ``quantize=False`` keeps fp32 (then the engine matches the policy to float rounding).
- **Fused projections and a lean decoder.** q/k/v are one linear, gate/up one linear; a
  decoder written for the Llama/Qwen2 family (RMSNorm, RoPE, grouped-query attention, SwiGLU)
  with its own KV cache: a batch's prompts are grouped into segments by the prefix they share
  (a family's prompts: role vectors, system prompt, demonstration, given domain, description);
  each segment's prefix is held once as a batch of one and never repeated per row; each row's
  own tokens and answer sit in a per-row cache that grows in blocks and shrinks when sequences
  finish. All rows decode together, each attending to its segment's prefix. In the rows' prefill
  a segment's rows attend to its prefix as one long batch of one and to their own tokens causally,
  two flash passes merged by log-sum-exp (:func:`_split_attention`; ``split_attention=False``:
  one masked pass).
- **A prefix cache across prompts and calls** (:mod:`omtr.rollout.prefix_cache`, the way of vLLM's
  automatic prefix caching and SGLang's RadixAttention): a prefix is computed in chunks of
  ``prefix_block`` tokens from the prompt's start, and full chunks are kept as blocks found by
  the tokens before them; a later prompt (same batch or a later call: the next batch, a served
  request, the Judge's prompts) that starts with the same blocks computes only what follows.
  Bounded (``prefix_cache_mb``, least recently used blocks go first), dropped on every refresh,
  and exact: the chunks are the same with the cache off (``prefix_cache=False``, where no
  computation is shared between different prompts), so greedy tokens and log-probs are equal.
- **The Judge on the engine**: its adapter merged into fp32 weights (its scores are the policy's
  to float rounding), its prompts through the same prefill and prefix cache.
- **The MLP's down projection** in int8 for decode steps and, for passes over many tokens, in
  bf16 where the CPU's bf16 products pay and in fp32 (the policy's own weights) elsewhere (its
  inputs at the role-vector positions are too large for a per-tensor int8 scale; see
  :class:`_PrefillWideLinear`, ``prefill_wide``).
- **Only the head rows the grammar allows.** When the tokens any row may take next are few
  (names in scope, keywords, parentheses), only those rows of the head are multiplied (fp32, the
  policy's own weights), so the step skips the full vocabulary's logits, softmax and argmax; a row
  whose token is forced skips the head altogether.
- **Jump-forward decoding** (``jump_forward``, on unless ``$OMTR_JUMP_FORWARD=off``): where the
  grammar then allows a row one token only (the rest of a keyword, a forced name, closing
  parentheses: about a quarter of a PDDL answer's tokens), the row takes it at once, and the
  whole run goes through the decoder with the token the row chose before it, in one step: each
  row writes its own columns of its cache, so rows with runs of different lengths decode
  together. The tokens are those of one token a step (the masked distribution gives such a
  token probability 1); the grammar's masks are then computed on the decoding thread, which
  meets them in the run anyway.
- **The same decoding loop and masks** as :meth:`omtr.model.roles.RoleModel.generate`: the
  same :class:`omtr.model.grammar.GrammarState` per row (plain or scoped, given domains), forced
  tokens, early stop, logprobs of the masked distribution at the sampling temperature. Without
  jump-forward decoding the next step's masks are computed on a helper thread while the decoder
  runs.

The engine is a snapshot: :meth:`FastEngine.refresh` re-merges from the policy (the trainer asks
for it after every optimizer step; a parameter change is also noticed on its own through the
tensors' version counters). Only linears whose sources changed are merged and quantized again:
with a frozen backbone, those an adapter touches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omtr.config import ROLE_NAMES
from omtr.model.roles import GENERATING_ROLES, MIN_SHARED_PREFIX, DecodedRows, _sample_top_p
from omtr.policy import Generation, Messages, Sampling
from omtr.rollout import PREFIX_CACHE_MB, OverModel
from omtr.rollout.prefix_cache import PrefixCache

log = logging.getLogger("omtr.rollout")

SUPPORTED = ("llama", "qwen2")  # model_type values whose decoder this engine reproduces
BLOCK = 64  # KV cache growth, in tokens
# The prefix cache (omtr.rollout.prefix_cache): prompt prefixes are computed in chunks of this many
# tokens from the prompt's start, cache or not, and full chunks are kept as blocks. SmolLM2 on 2
# cores, a 1,389-token BlocksWorld prompt: one pass 866 tokens/s, chunks of 256 765/s, of 128 677/s,
# of 64 501/s; a family's shared prefix (1,308 of those tokens) reaches 1,280 in blocks of 256 or 128.
PREFIX_BLOCK = 256
# Segments (groups of prompts with a prefix of their own) a batch is split into at most.
# SmolLM2 on 2 cores: a 1,389-token prompt as a prefix (a batch of one, in chunks) ran at ~770
# prompt tokens/s; four prompts of 1,389-2,328 tokens side by side as rows at ~210/s.
MAX_SEGMENTS = 8
JUDGE_BATCH = 8  # Judge prompts scored together (their own tokens pass through the network at once)
# A decode step multiplies only the head rows of the tokens the grammar allows when they are at
# most this many (over the step's rows): the int8 head over SmolLM2's 49,152 tokens costs ~3 ms a
# step at batch 8 on one core, 2,048 fp32 rows ~0.3 ms.
SPARSE_HEAD_TOKENS = 2048


class EngineError(ValueError):
    pass


class _Int8Linear:
    """A dynamically quantized int8 linear (int8 weights with one scale per output row,
    activations quantized on the fly), what ``torch.ao``'s ``quantize_dynamic`` with
    ``per_channel_dynamic_qconfig`` makes, packed once (``torch.ao``'s module packs three times)."""

    __slots__ = ("_packed", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        import warnings

        from torch.ao.quantization.observer import PerChannelMinMaxObserver

        w = weight.detach().float()
        # the observer of per_channel_dynamic_qconfig: symmetric, qint8, per output row
        obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        obs(w)
        scale, zero = obs.calculate_qparams()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's deprecation notice for quantized tensors (the kernels stay)
            qw = torch.quantize_per_channel(w, scale.double(), zero.long(), 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.detach().float())
        self.out_features = w.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed, reduce_range=True)

    def weight_bias(self):
        """The int8 weight and the fp32 bias (unpacked copies)."""
        return torch.ops.quantized.linear_unpack(self._packed)


class _Bf16Linear:
    """A linear with bf16 weights (inputs cast to bf16, the product back to fp32, fp32 bias)."""

    __slots__ = ("weight", "bias", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight = weight.detach().to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().float().clone()
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y + self.bias

    def nbytes(self) -> int:
        return self.weight.numel() * 2 + (0 if self.bias is None else self.bias.numel() * 4)


class _PrefillWideLinear:
    """int8 for decode steps (one token a row); for passes over many tokens a row (the shared
    prefix, the rows' prefill) a wide copy, bf16 where this CPU's bf16 products pay, else fp32.

    Why, for the MLP's down projection: its inputs reach ~2,600 at the role-vector positions of
    the prefix pass and ~85 elsewhere. int8's activation scale is one per tensor, so in a pass
    over those positions the small inputs of every other position are rounded away: int8 down
    everywhere tripled the engine-vs-policy KL (0.32-0.37 against 0.10-0.15 a token, SmolLM2,
    BlocksWorld prompts, scoped grammar, 3 seeds); with these passes in bf16 (a per-element
    exponent) and the decode steps in int8 it stayed at 0.10-0.15, and a decode step is ~10%
    shorter than with bf16 throughout. fp32 has a per-element exponent too, and is the faster
    wide format on most CPUs: a [1000, 1536] x [1536, 576] product on a 2-core AMD EPYC without
    native bf16 ran at 149 GFLOP/s in fp32 and 20 in (emulated) bf16; on a Xeon with
    avx512_bf16 but no AMX at ~340 against ~185 (:func:`omtr.model.precision.bf16_pays`). An fp32
    wide copy of an unmerged base is the policy's own tensor (no bytes of its own)."""

    __slots__ = ("wide", "step", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, wide: str = "bf16"):
        self.wide = _Bf16Linear(weight, bias) if wide == "bf16" else _linear(weight, bias)
        self.step = _Int8Linear(weight, bias)
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(x) if x.dim() == 3 and x.shape[1] == 1 else self.wide(x)


PREFILL_WIDE = ("auto", "bf16", "fp32")
PREFILL_WIDE_ENV = "OMTR_PREFILL_WIDE"  # the engine's prefill_wide where none is given


def _wide_format(name: str | None) -> str:
    """The format of the int8 slots' copies for many-token passes: ``name``, or when None
    ``$OMTR_PREFILL_WIDE``, or ``auto``: bf16 where the CPU has native bf16 and its bf16 products
    are faster than its fp32 ones (the update's rule, :func:`omtr.model.precision.bf16_preferred`),
    else fp32; one info line says which and why."""
    from omtr.model.precision import bf16_preferred

    source = "prefill_wide"
    if name is None:
        name, source = os.environ.get(PREFILL_WIDE_ENV) or "auto", PREFILL_WIDE_ENV
    if name not in PREFILL_WIDE:
        raise EngineError(f"{source} {name!r}: choose one of {', '.join(PREFILL_WIDE)}")
    if name != "auto":
        return name
    ok, why = bf16_preferred("cpu")
    if not ok:
        log.info("fast engine: many-token passes of the down projection in fp32, as %s", why)
    return "bf16" if ok else "fp32"


JUMP_FORWARD_ENV = "OMTR_JUMP_FORWARD"  # the engine's jump_forward where none is given: on or off


def _jump_forward(value: bool | None) -> bool:
    """The engine's ``jump_forward``: ``value``, or when None ``$OMTR_JUMP_FORWARD`` (``on``/``off``,
    also 1/0, true/false), on where unset."""
    if value is not None:
        return bool(value)
    raw = os.environ.get(JUMP_FORWARD_ENV, "").strip().lower()
    if raw in ("", "on", "1", "true", "yes"):
        return True
    if raw in ("off", "0", "false", "no"):
        return False
    raise EngineError(f"{JUMP_FORWARD_ENV}={raw!r}: set it to on or off")


def _single_token(row: torch.Tensor) -> int | None:
    """The one token a grammar bitmask row [words] allows, or None where it allows none or several."""
    w = row.numpy()
    nz = np.flatnonzero(w)
    if len(nz) != 1:
        return None
    x = int(w[nz[0]]) & 0xFFFFFFFF
    if x & (x - 1):
        return None
    return int(nz[0]) * 32 + x.bit_length() - 1


def _int8_bytes(mod: _Int8Linear) -> int:
    w, b = mod.weight_bias()
    n = w.int_repr().numel() + (w.q_per_channel_scales().numel() * 8 if w.qscheme() in (
        torch.per_channel_affine, torch.per_channel_symmetric) else 8)
    return n + (b.numel() * 4 if b is not None else 0)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An fp32 ``nn.Linear`` around ``weight``/``bias`` themselves (no copy: a policy's own fp32
    tensor stays shared), without the random initialisation of a fresh layer."""
    lin = torch.nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None)
    lin.weight = nn.Parameter(weight.detach().float(), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias.detach().float(), requires_grad=False)
    return lin


class _Cat:
    """Linears side by side (a fused q/k/v or gate/up slot) whose outputs are concatenated: each
    part is an fp32 ``nn.Linear`` around the policy's own tensors (:func:`_linear`), so an fp32
    slot with nothing merged in holds no copy of its weights. The output equals one linear over the
    concatenated weights (each output column is its own dot product; tested bit for bit)."""

    __slots__ = ("parts", "out_features")

    def __init__(self, parts: list):
        self.parts = parts
        self.out_features = sum(p.out_features for p in parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


class _Adapted:
    """A linear shared by the roles plus one role's LoRA deltas applied on the fly:
    ``y = base(x) + (x Aᵀ) Bᵀ``, with the modules' A matrices stacked and their B matrices (scaled)
    on a block diagonal, so a fused slot (gate/up) takes one pair of thin matmuls. The MLP's
    linears are most of the backbone: merged per role, they would be copied once per role."""

    __slots__ = ("base", "At", "Bt", "out_features")

    def __init__(self, base, mods, role: str):
        As, blocks, rows = [], [], 0
        outs = []
        for mod in mods:
            lin = mod.base_layer if hasattr(mod, "base_layer") else mod
            outs.append(lin.weight.shape[0])
        total_out = sum(outs)
        for mod, out in zip(mods, outs):
            if hasattr(mod, "lora_A") and role in mod.lora_A:
                A = mod.lora_A[role].weight.detach().float()
                B = mod.lora_B[role].weight.detach().float() * float(mod.scaling[role])
                block = B.new_zeros((total_out, A.shape[0]))
                block[rows:rows + out] = B
                As.append(A)
                blocks.append(block)
            rows += out
        self.base = base
        self.At = torch.cat(As).t().contiguous()  # [in, sum r]
        self.Bt = torch.cat(blocks, dim=1).t().contiguous()  # [sum r, out]
        self.out_features = total_out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        lead = x.shape[:-1]
        # y += (x A^T) B^T, the add fused into the second product
        return y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]) @ self.At, self.Bt).view(*lead, -1)


def _stamp(t: torch.Tensor | None):
    """What identifies a tensor's current contents: its storage, in-place version and shape."""
    return None if t is None else (t.data_ptr(), t._version, tuple(t.shape), t.dtype)


class _Layer:
    __slots__ = ("in_norm", "post_norm", "qkv", "o", "gate_up", "down")


class _RoleWeights:
    """One role's decoder: per-layer linears (some shared with the other role), norms, head."""

    def __init__(self):
        self.layers: list[_Layer] = []
        self.norm = None
        self.embed = None  # [V, H] fp32, the policy's own tensor (not copied)
        self.head = None
        self.head_rows = None  # [V, H] fp32, the policy's own head weight where no adapter touches it
        self.head_bias = None
        self.role_vectors = None  # [R, H]


class FastEngine(OverModel):
    """A CPU rollout engine over a :class:`~omtr.model.roles.RoleModel` (see the module doc)."""

    engine_name = "fast"

    def __init__(self, model, *, quantize: bool = True, threads: int | None = None,
                 keep_fp32: Sequence[str] = (), bf16_prefill: Sequence[str] = ("down",), prefill_wide: str | None = None,
                 unmerged: Sequence[str] = ("gate_up", "down"), prefix_cache: bool = True,
                 prefix_cache_mb: float = PREFIX_CACHE_MB, prefix_block: int = PREFIX_BLOCK,
                 share_fp32: bool = True, split_attention: bool = True, jump_forward: bool | None = None):
        cfg = model.base_model.config
        if getattr(cfg, "model_type", None) not in SUPPORTED:
            raise EngineError(f"the fast engine decodes {', '.join(SUPPORTED)} models; this backbone is "
                              f"{getattr(cfg, 'model_type', '?')!r}: use --engine hf")
        if model.device.type != "cpu":
            raise EngineError(f"the fast engine runs on CPU; the model is on {model.device}: use --engine hf")
        self.model = model
        self.quantize = quantize
        self.keep_fp32 = tuple(keep_fp32)  # slots (qkv, o, gate_up, down, head) left in fp32
        self.bf16_prefill = tuple(bf16_prefill)  # int8 slots that also keep a wide copy for many-token passes
        # None: $OMTR_PREFILL_WIDE, else auto (bf16 where this CPU's bf16 products pay, else fp32)
        self.prefill_wide = _wide_format(prefill_wide) if quantize and self.bf16_prefill else "fp32"
        self.unmerged = tuple(unmerged)  # slots whose adapters run beside one shared base (_Adapted)
        # fp32 slots of several unmerged linears (the Judge's gate/up) as the policy's own tensors side
        # by side (_Cat) rather than one concatenated copy (SmolLM2: 212 MB less); False: the copy
        self.share_fp32 = bool(share_fp32)
        # the rows' prefill attention in two flash passes merged by their log-sum-exp (_split_attention);
        # False: one masked pass over [prefix; own keys] per segment (the earlier path)
        self.split_attention = bool(split_attention)
        # a row's run of tokens the grammar leaves no choice over goes through the decoder in the
        # step that chose the token before it (_generate); None: $OMTR_JUMP_FORWARD, else on
        self.jump_forward = _jump_forward(jump_forward)
        self.exact = not quantize
        self.threads = threads
        self.H = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or self.H // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        dec = getattr(model.base_model, model.base_model.base_model_prefix)
        rot = dec.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float().cpu().clone()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.weights: dict[str, _RoleWeights] = {}
        self._version = None
        self._stale = True
        if prefix_cache_mb < 0:
            raise EngineError(f"prefix_cache_mb must be 0 or more, got {prefix_cache_mb}")
        self.prefix_block = int(prefix_block)
        self.prefix_cache = PrefixCache(self.prefix_block, int(prefix_cache_mb * 2**20))
        self.use_prefix_cache = bool(prefix_cache)
        # prompt tokens computed / found in the cache, time to the first new token (see reset_stats)
        self.prefill_stats = {"computed_tokens": 0, "cached_tokens": 0, "prefill_s": 0.0}
        self.first_token_s: float | None = None
        self._stats_t0 = time.perf_counter()
        self._built: dict[tuple, tuple] = {}  # (role or None, layer, slot) -> (source stamps, module)
        self.rebuilt = 0  # linears the last refresh made anew
        self.refresh_s = 0.0
        self.refreshes = 0
        self.record_masks = False  # tests: keep each row's bitmask rows of the last generate
        self.last_masks: list[list] | None = None
        self.last_groups: list[int] = []  # distinct prompts of each prefix segment of the last call (_segments)
        self._grammar_pool = None
        self.head_steps = {"sparse": 0, "full": 0}  # decode steps by how the head was applied (_next_token)
        self.refresh()

    # ------------------------------------------------------------------ Policy members

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def set_prefix_cache(self, on: bool, mb: float | None = None) -> None:
        """Turn the prefix cache on or off (``mb``: a new bound in MiB; the cache starts empty)."""
        self.use_prefix_cache = bool(on)
        if mb is not None:
            if mb < 0:
                raise EngineError(f"prefix_cache_mb must be 0 or more, got {mb}")
            self.prefix_cache = PrefixCache(self.prefix_block, int(mb * 2**20))
        self.prefix_cache.clear()

    def release_caches(self, *, adapted: bool = True) -> None:
        """Drop what the next refresh after an optimizer step makes anew anyway, so that it is not
        held through the update: the prefix cache's blocks and, with ``adapted``, every linear of
        one role's own (those its adapters are merged into or applied beside: with a frozen
        backbone every role-specific one, the Judge's fp32 attention included). Linears the roles
        share (unadapted bases, the head) stay. The next call refreshes first and computes the same
        values bit for bit (the same sources, the same builds). The trainer calls it after each
        rollout (``lean_memory``)."""
        self.prefix_cache.clear()
        if adapted and self.weights:
            self._built = {k: v for k, v in self._built.items() if k[0] is None}
            self.weights = {}
            self._stale = True

    def reset_stats(self) -> None:
        """Start counting prefill tokens and the time to the first new token anew."""
        self.prefill_stats = {"computed_tokens": 0, "cached_tokens": 0, "prefill_s": 0.0}
        self.first_token_s = None
        self._stats_t0 = time.perf_counter()

    def cache_report(self) -> dict:
        """The prefix cache's state and counters, and the prefill counters since :meth:`reset_stats`."""
        c = self.prefix_cache
        return {"on": self.use_prefix_cache, "block_tokens": c.block, "bound_mb": round(c.capacity / 2**20, 1),
                "blocks": c.blocks, "mb": round(c.bytes / 2**20, 1), **c.stats.to_dict(),
                **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.prefill_stats.items()},
                "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 3)}

    # ------------------------------------------------------------------ weights

    def mark_stale(self) -> None:
        self._stale = True

    def _current(self) -> bool:
        return not self._stale and self._version == self.model._params_version()

    @torch.no_grad()
    def refresh(self, *, reuse: bool = True) -> float:
        """Take the policy's current adapters and role vectors; returns seconds.

        Each engine linear (fused q/k/v, o, gate/up, down, head, per role where an adapter
        touches it, shared otherwise) is keyed by what it is made of: the base weights and, where
        adapted, the role's LoRA A/B and scaling, each by storage and in-place version. With
        ``reuse`` one whose sources did not change since the last refresh is kept as it is: with a
        frozen backbone an optimizer step re-merges and re-quantizes only the adapted attention
        linears and copies the MLP adapters anew (their shared bases and the head stay).
        ``reuse=False`` rebuilds everything."""
        from peft.tuners.lora import LoraLayer

        t0 = time.perf_counter()
        m = self.model
        base = m.base_model
        dec = getattr(base, base.base_model_prefix)
        previous = self._built if reuse else {}
        built: dict[tuple, tuple] = {}
        rebuilt = 0

        def adapted_by(mod, role) -> bool:
            return isinstance(mod, LoraLayer) and role in mod.lora_A and not getattr(mod, "merged", False)

        def fetch(key: tuple, stamps: tuple, build):
            nonlocal rebuilt
            hit = built.get(key)
            if hit is None:
                old = previous.get(key)
                if old is not None and old[0] == stamps:
                    hit = old
                else:
                    hit = (stamps, build())
                    rebuilt += 1
                built[key] = hit
            return hit[1]

        def make(slot: str, key: tuple, mods, role: str, quantize: bool) -> nn.Module:
            key = (quantize, *key)  # the Judge's fp32 linears apart from the generating roles' int8 ones
            adapted = any(adapted_by(mod, role) for mod in mods)
            base_stamps, lora_stamps = [], []
            for mod in mods:
                lin = mod.base_layer if isinstance(mod, LoraLayer) else mod
                base_stamps += [_stamp(lin.weight), _stamp(lin.bias)]
                if adapted_by(mod, role):
                    lora_stamps += [_stamp(mod.lora_A[role].weight), _stamp(mod.lora_B[role].weight),
                                    float(mod.scaling[role])]
            base_stamps = tuple(base_stamps)
            if not adapted:  # unadapted linears are shared by the roles
                return fetch((None, *key), base_stamps, lambda: self._build(slot, mods, role, adapted_by, quantize))
            if slot in self.unmerged and not any(getattr(mod, "use_dora", {}).get(role) for mod in mods):
                base = fetch((None, *key), base_stamps,
                             lambda: self._build(slot, mods, role, lambda m, r: False, quantize))
                return fetch((role, *key), base_stamps + tuple(lora_stamps), lambda: _Adapted(base, mods, role))
            return fetch((role, *key), base_stamps + tuple(lora_stamps),
                         lambda: self._build(slot, mods, role, adapted_by, quantize))

        weights = {}
        # The Judge reads the last hidden state (no head) in fp32: its scores are the policy's own,
        # to float rounding, so the reward's s_J and the Judge's AUC do not move with the engine.
        for role in (*GENERATING_ROLES, "judge"):
            quantize = self.quantize and role != "judge"
            rw = _RoleWeights()
            for i, layer in enumerate(dec.layers):
                L = _Layer()
                a, mlp = layer.self_attn, layer.mlp
                L.in_norm = layer.input_layernorm.weight.detach().float().clone()
                L.post_norm = layer.post_attention_layernorm.weight.detach().float().clone()
                for slot, mods in (("qkv", (a.q_proj, a.k_proj, a.v_proj)), ("o", (a.o_proj,)),
                                   ("gate_up", (mlp.gate_proj, mlp.up_proj)), ("down", (mlp.down_proj,))):
                    setattr(L, slot, make(slot, (i, slot), mods, role, quantize))
                rw.layers.append(L)
            rw.norm = dec.norm.weight.detach().float().clone()
            rw.embed = dec.embed_tokens.weight.detach()
            rw.role_vectors = m.role_embeddings[ROLE_NAMES.index(role)].detach().float().clone()
            weights[role] = rw
            if role == "judge":
                continue
            head = base.get_output_embeddings()
            rw.head = make("head", ("head",), (head,), role, quantize)
            if not adapted_by(head, role):
                lin = head.base_layer if isinstance(head, LoraLayer) else head
                rw.head_rows = lin.weight.detach().float()
                rw.head_bias = None if lin.bias is None else lin.bias.detach().float()
        self.weights = weights
        self._built = built
        self.rebuilt = rebuilt
        self.prefix_cache.clear()  # keys and values of the old weights
        self._version = m._params_version()
        self._stale = False
        s = time.perf_counter() - t0
        self.refresh_s += s
        self.refreshes += 1
        log.debug("fast engine refreshed in %.2f s (%d of %d linears rebuilt)", s, rebuilt, len(built))
        return s

    def _build(self, slot: str, mods, role: str, adapted_by, quantize: bool) -> nn.Module:
        """One engine linear: the modules' weights concatenated (rows), the role's LoRA deltas
        added where it adapts them, then int8 unless the slot is kept in fp32."""
        ws, bs = [], []
        for mod in mods:
            lin = mod.base_layer if hasattr(mod, "base_layer") else mod
            w = lin.weight.detach().float()
            if adapted_by(mod, role):
                w = w + mod.get_delta_weight(role).float()
            ws.append(w)
            bs.append(None if lin.bias is None else lin.bias.detach().float())
        quantize = quantize and slot not in self.keep_fp32
        if (not quantize and self.share_fp32 and len(ws) > 1
                and not any(adapted_by(mod, role) for mod in mods)):
            return _Cat([_linear(w, b) for w, b in zip(ws, bs)])
        bias = None if all(b is None for b in bs) else torch.cat(
            [b if b is not None else torch.zeros(w.shape[0]) for b, w in zip(bs, ws)])
        weight = torch.cat(ws) if len(ws) > 1 else ws[0]
        if quantize and slot in self.bf16_prefill:
            return _PrefillWideLinear(weight, bias, self.prefill_wide)
        if quantize:
            return _Int8Linear(weight, bias)
        # Merged or concatenated weights are new tensors; a single fp32 linear with nothing merged in
        # is the policy's own tensor, shared, not copied (a refresh rebuilds the engine's linears
        # when the policy's weights change; a frozen backbone never does).
        return _linear(weight, bias)

    def memory_bytes(self, roles: Sequence[str] | None = None) -> int:
        """Bytes of the weights this engine holds beyond the policy's (merged and quantized copies,
        norms, role vectors) for ``roles`` (default: all, the Judge's fp32 weights included); the
        embedding table is the policy's own. The prefix cache is apart (:meth:`cache_report`)."""
        seen: set[int] = set()
        total = 0
        own = {p.data_ptr() for p in self.model.base_model.parameters()}

        def mod_bytes(mod) -> int:
            if id(mod) in seen:
                return 0
            seen.add(id(mod))
            if isinstance(mod, _Adapted):
                return mod_bytes(mod.base) + 4 * (mod.At.numel() + mod.Bt.numel())
            if isinstance(mod, _Cat):
                return sum(mod_bytes(p) for p in mod.parts)
            if isinstance(mod, _PrefillWideLinear):
                return mod_bytes(mod.wide) + _int8_bytes(mod.step)
            if isinstance(mod, _Bf16Linear):
                return mod.nbytes()
            if isinstance(mod, _Int8Linear):
                return _int8_bytes(mod)
            return sum(p.numel() * p.element_size() for p in mod.parameters() if p.data_ptr() not in own)

        for role, rw in self.weights.items():
            if roles is not None and role not in roles:
                continue
            for L in rw.layers:
                total += L.in_norm.numel() * 4 + L.post_norm.numel() * 4
                for slot in ("qkv", "o", "gate_up", "down"):
                    total += mod_bytes(getattr(L, slot))
            total += (mod_bytes(rw.head) if rw.head is not None else 0) + rw.norm.numel() * 4 + rw.role_vectors.numel() * 4
        return total

    def _grammar_thread(self):
        """One helper thread for the grammar masks (created on first use)."""
        if self._grammar_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._grammar_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omtr-grammar")
        return self._grammar_pool

    # ------------------------------------------------------------------ the decoder

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _rope(self, pos: torch.Tensor):
        freqs = pos.float().unsqueeze(-1) * self.inv_freq  # [B, S, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        sin = emb.sin() * self.rope_scale
        sin[..., : freqs.shape[-1]].neg_()  # rotate_half's sign, folded in: x*cos + [x2, x1]*[-sin, sin]
        return (emb.cos() * self.rope_scale).unsqueeze(2), sin.unsqueeze(2)  # [B,S,1,d]

    @staticmethod
    def _rotate(x, cos, sin):
        """RoPE with ``sin`` carrying the rotation's sign on its first half (:meth:`_rope`): the
        halves of each head swapped in one flip, no negation."""
        d = x.shape[-1]
        return x * cos + x.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2) * sin

    def _forward(self, rw: _RoleWeights, x: torch.Tensor, pos: torch.Tensor, prefix: list | None,
                 cache: "_RowCache | None", own_mask: torch.Tensor | None, *, past: tuple | None = None,
                 seg_of: torch.Tensor | None = None) -> torch.Tensor:
        """Run the decoder over ``x`` [B, S, H] at positions ``pos`` [B, S]; returns the final hidden
        states (before the last norm).

        A prompt prefix's chunk (``past`` = (K, V, a): per layer keys and values [L, kv, P, d] of the
        whole prefix, the first ``a`` positions filled): a batch of one whose keys and values are
        written at ``a`` and that attends to the ``a`` before it and causally to itself.

        The rows (``cache``: their own keys and values, the new ones appended): ``prefix`` is a list
        of segments, each per layer (Kᵀ [kv, d, P], V [kv, P, d]), and ``seg_of`` [B] the segment
        of each row (None: one segment for all rows); a row attends to its segment's prefix and to
        its own keys that ``own_mask`` [B, S, T] shows (True = visible).

        Attention: a prefix chunk and the rows' prefill (S > 1) go through PyTorch's fused
        ``scaled_dot_product_attention`` (blockwise, grouped-query heads without copies; for the
        rows the segment's prefix keys are put in front of each row's own); a decode step (S = 1)
        multiplies against each segment's prefix once for its rows (no per-row copy of it)."""
        B, S, _ = x.shape
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        g = nh // nkv
        cos, sin = self._rope(pos)
        scale = d ** -0.5
        chunk_mask = hidden = None
        segs: list[tuple[list, torch.Tensor | None, torch.Tensor | None]] = []  # (prefix, rows, their prefill mask)
        if cache is not None:
            if seg_of is None or len(prefix) == 1:
                segs = [(prefix[0], None, None)]
            else:
                for k, pre in enumerate(prefix):
                    idx = torch.nonzero(seg_of == k).flatten()
                    if len(idx):
                        segs.append((pre, idx, None))
            if S == 1:
                hidden = ~own_mask.unsqueeze(1)  # [B, 1, 1, T]: the rows' own keys a decode query does not see
            elif self.split_attention:
                lens = own_mask[:, -1].sum(-1).tolist()  # each row's own tokens (the last position is always one)
            else:
                full = []
                for pre, idx, _ in segs:
                    m = own_mask if idx is None else own_mask[idx]
                    P = pre[0][0].shape[2]
                    full.append((pre, idx, torch.cat([m.new_ones((m.shape[0], S, P)), m], dim=-1).unsqueeze(1)))
                segs = full  # [b, 1, S, P+T] each
        elif past is not None and past[2] > 0:
            a = past[2]
            chunk_mask = torch.cat([torch.ones((S, a), dtype=torch.bool),
                                    torch.tril(torch.ones((S, S), dtype=torch.bool))], dim=1)
        for i, L in enumerate(rw.layers):
            h = self._rms(x, L.in_norm)
            qkv = L.qkv(h)
            qk = self._rotate(qkv[..., : (nh + nkv) * d].view(B, S, nh + nkv, d), cos, sin)  # q and k rotated at once
            q, k = qk[:, :, :nh], qk[:, :, nh:]
            v = qkv[..., (nh + nkv) * d:].view(B, S, nkv, d)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, kv, S, d]
            if cache is None:  # a prefix chunk (a batch of one) after the ``a`` positions before it
                Ka, Va, a = past
                Ka[i, :, a:a + S] = k[0]
                Va[i, :, a:a + S] = v[0]
                keys, vals = Ka[i, :, :a + S].unsqueeze(0), Va[i, :, :a + S].unsqueeze(0)
                if chunk_mask is None:
                    att = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, is_causal=True, enable_gqa=True)
                else:
                    att = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=chunk_mask,
                                                         enable_gqa=True)
                att = att.transpose(1, 2).reshape(B, S, nh * d)
            elif S > 1 and self.split_attention:  # the rows' prefill: prefix and own keys apart, merged
                K, V = cache.append(i, k, v)  # [B, kv, T, d]
                att = _split_attention(q.transpose(1, 2), K, V, [(pre[i], idx) for pre, idx, _ in segs], lens)
                att = att.transpose(1, 2).reshape(B, S, nh * d)
            elif S > 1:  # the rows' prefill: each row's keys are [its segment's prefix; own tokens]
                K, V = cache.append(i, k, v)  # [B, kv, T, d]
                qt = q.transpose(1, 2)
                att = qt.new_empty(qt.shape) if len(segs) > 1 else None
                for pre, idx, mask in segs:
                    KpT, Vp = pre[i]
                    Kr, Vr, qr = (K, V, qt) if idx is None else (K[idx], V[idx], qt[idx])
                    b = Kr.shape[0]
                    Kf = torch.cat([KpT.transpose(-1, -2).unsqueeze(0).expand(b, -1, -1, -1), Kr], dim=2)
                    Vf = torch.cat([Vp.unsqueeze(0).expand(b, -1, -1, -1), Vr], dim=2)
                    o = F.scaled_dot_product_attention(qr, Kf, Vf, attn_mask=mask, enable_gqa=True)
                    if att is None:
                        att = o
                    else:
                        att[idx] = o
                att = att.transpose(1, 2).reshape(B, S, nh * d)
            else:  # a decode step: the g query heads of a kv head side by side, no copies of K/V
                qh = q.view(B, nkv, g, d)
                K, V = cache.append(i, k, v)  # [B, kv, T, d]
                s_r = (qh @ K.transpose(-1, -2)).masked_fill_(hidden, float("-inf"))  # [B, kv, g, T]: all rows at once
                if len(segs) == 1:
                    KpT, Vp = segs[0][0][i]  # [kv, d, P] and [kv, P, d], shared by every row
                    P = KpT.shape[2]
                    qp = qh.transpose(0, 1).reshape(nkv, B * g, d)
                    s_p = (qp @ KpT).view(nkv, B, g, P).transpose(0, 1)  # [B, kv, g, P]
                    p = torch.softmax(torch.cat([s_p, s_r], dim=-1).mul_(scale), dim=-1)
                    pp = p[..., :P].transpose(0, 1).reshape(nkv, B * g, P)
                    o = (pp @ Vp).view(nkv, B, g, d).transpose(0, 1) + p[..., P:] @ V  # [B, kv, g, d]
                else:  # each segment's prefix for its rows; the rows' own keys and values for all at once
                    p_r = torch.empty_like(s_r)
                    o = qh.new_empty((B, nkv, g, d))
                    for pre, idx, _ in segs:
                        KpT, Vp = pre[i]
                        P, b = KpT.shape[2], len(idx)
                        qp = qh[idx].transpose(0, 1).reshape(nkv, b * g, d)
                        s_p = (qp @ KpT).view(nkv, b, g, P).transpose(0, 1)  # [b, kv, g, P]
                        p = torch.softmax(torch.cat([s_p, s_r[idx]], dim=-1).mul_(scale), dim=-1)
                        pp = p[..., :P].transpose(0, 1).reshape(nkv, b * g, P)
                        o[idx] = (pp @ Vp).view(nkv, b, g, d).transpose(0, 1)
                        p_r[idx] = p[..., P:]
                    o += p_r @ V
                att = o.reshape(B, 1, nh * d)
            x = x + L.o(att)
            h = self._rms(x, L.post_norm)
            gate, up = L.gate_up(h).chunk(2, dim=-1)
            x = x + L.down(F.silu(gate) * up)
        return x

    def _next_token(self, rw: _RoleWeights, hid: torch.Tensor, bitmask, g, temperature: float, greedy: bool,
                    top_p: float, rng) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose the next token of rows ``hid`` [n, H] (final-normed last hidden states) under their
        grammar rows ``bitmask`` (None: unconstrained); returns (token ids [n], their log-probs [n]
        in the masked distribution at ``temperature``).

        Where the tokens any row may take are few (names the scope allows, keywords, closing
        parentheses; ``SPARSE_HEAD_TOKENS`` at most) and the head is not adapted, only those rows
        of the head are multiplied, in fp32 (the policy's own weights, exact): the masked
        distribution is the same without the full vocabulary's logits. Otherwise the role's head
        (int8) gives all logits and the mask is applied to them."""
        cols = None
        if bitmask is not None and rw.head_rows is not None:
            union = np.bitwise_or.reduce(bitmask.numpy(), axis=0)
            bits = np.unpackbits(union.view(np.uint8), bitorder="little")[: rw.head_rows.shape[0]]
            if int(bits.sum()) <= SPARSE_HEAD_TOKENS:
                cols = torch.from_numpy(np.flatnonzero(bits))
        if cols is None:
            self.head_steps["full"] += 1
            logits = rw.head(hid).float()
            if bitmask is not None:
                g.apply(logits, bitmask)
        else:
            self.head_steps["sparse"] += 1
            logits = hid @ rw.head_rows.index_select(0, cols).t()
            if rw.head_bias is not None:
                logits = logits + rw.head_bias[cols]
            allowed = ((bitmask[:, cols >> 5] >> (cols & 31)) & 1).bool()
            logits.masked_fill_(~allowed, float("-inf"))
        logp = torch.log_softmax(logits / temperature, dim=-1)
        pick = logp.argmax(-1) if greedy else _sample_top_p(logp, top_p, rng)
        lp = logp.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
        return (pick if cols is None else cols[pick]), lp

    # ------------------------------------------------------------------ prompt prefixes and the prefill

    def _segments(self, seqs: list[list[int]]) -> list[tuple[list[int], int]]:
        """Distinct prompts ``seqs`` grouped by the prefix they share: ``[(rows, p)]``, each
        segment's rows and the length of its shared prefix (a row keeps at least one token of its
        own). Prompts whose common prefix is ``MIN_SHARED_PREFIX`` tokens longer than the whole
        batch's share a segment (a family's prompts); the others are a segment each (together
        past ``MAX_SEGMENTS``); a prompt alone in its segment is all prefix but its last token. Segments depend on the batch alone, never on the cache's contents, so
        the results are the same with the cache on or off."""
        U = len(seqs)
        if U == 1:
            return [([0], len(seqs[0]) - 1)]
        common = min(len(os.path.commonprefix(seqs)), min(len(s) for s in seqs) - 1)
        order = sorted(range(U), key=lambda i: seqs[i])
        groups: list[list[int]] = [[order[0]]]
        for i in order[1:]:
            if len(os.path.commonprefix([seqs[groups[-1][0]], seqs[i]])) >= common + MIN_SHARED_PREFIX:
                groups[-1].append(i)
            else:
                groups.append([i])
        # A prompt that shares nothing beyond the batch's prefix is a segment of its own (all of it
        # computed as a prefix, in chunks, and cached: a batch of one is several times faster than
        # many long rows side by side) while the segments are at most MAX_SEGMENTS; past that the
        # lone prompts make one segment together (each segment costs a decode step an attention
        # pass of its own).
        alone = sorted(i for grp in groups if len(grp) == 1 for i in grp)
        shared = [sorted(grp) for grp in groups if len(grp) > 1]
        if not shared and 2 * common >= min(len(s) for s in seqs):
            return [(list(range(U)), common)]  # prompts alike but for their ends: one segment
        if len(shared) + len(alone) <= MAX_SEGMENTS:
            groups = shared + [[i] for i in alone]
        else:
            groups = shared + ([alone] if alone else [])
        if len(groups) == 1:
            return [(list(range(U)), common)]
        out = []
        for rows in sorted(groups, key=min):
            sub = [seqs[i] for i in rows]
            shortest = min(len(x) for x in sub)
            out.append((rows, shortest - 1 if len(sub) == 1 else min(len(os.path.commonprefix(sub)), shortest - 1)))
        return out

    def _prefix(self, role: str, rw: _RoleWeights, tokens: list[int], *, use_cache: bool, bar=None) -> list:
        """Keys and values of ``[e_ρ; tokens]`` (a batch of one), per layer (Kᵀ [kv, d, P], V [kv, P, d]).

        Computed in chunks of ``prefix_block`` tokens from the prompt's start, cache or not (so a
        cached block is bit for bit what its chunk computes). With ``use_cache`` the chunks that
        cached blocks cover are taken from the cache and the full chunks computed are kept in it."""
        C = self.prefix_block
        R = rw.role_vectors.shape[0]
        n = len(tokens)
        K = torch.empty((len(rw.layers), self.n_kv, R + n, self.head_dim))
        V = torch.empty_like(K)
        cache = self.prefix_cache if use_cache else None
        path = cache.match(role, tokens) if cache is not None else []
        a = 0
        for node in path:
            k, v = node.payload
            K[:, :, a:a + k.shape[2]] = k
            V[:, :, a:a + k.shape[2]] = v
            a += k.shape[2]
        done = len(path) * C
        self.prefill_stats["cached_tokens"] += done
        if bar is not None and done:
            bar.prefill(done, cached=True)
        pinned = list(path)
        parent = path[-1] if path else None
        if cache is not None:
            cache.pin(pinned)
        try:
            for start in range(done, max(n, 1), C):
                chunk = tokens[start:start + C]
                emb = F.embedding(torch.tensor([chunk], dtype=torch.long), rw.embed).float() if chunk else \
                    torch.zeros((1, 0, self.H))
                x = torch.cat([rw.role_vectors.unsqueeze(0), emb], dim=1) if start == 0 else emb
                b = a + x.shape[1]
                self._forward(rw, x, torch.arange(a, b).unsqueeze(0), None, None, None, past=(K, V, a))
                if cache is not None and len(chunk) == C:
                    kv = (K[:, :, a:b].clone(), V[:, :, a:b].clone())
                    node = cache.insert(role, parent, chunk, kv, 2 * kv[0].numel() * kv[0].element_size())
                    if node is None:
                        cache = None  # not kept (the bound): the chain stops here
                    else:
                        cache.pin([node])
                        pinned.append(node)
                        parent = node
                a = b
                self.prefill_stats["computed_tokens"] += len(chunk)
                if bar is not None:
                    bar.prefill(len(chunk))
        finally:
            self.prefix_cache.unpin(pinned)
        return [(K[i].transpose(-1, -2).contiguous(), V[i]) for i in range(len(rw.layers))]

    def _prefill(self, role: str, rw: _RoleWeights, seqs: list[list[int]], bar=None):
        """The forward pass over prompts ``seqs``: each segment's prefix (:meth:`_segments`,
        :meth:`_prefix`) as a batch of one, then the distinct prompts' own tokens as one batch on
        top. Identical prompts (the samples of one task) are computed once.

        With the prefix cache off, no computation is shared between different prompts: each
        distinct prompt computes its segment's prefix itself (the same chunks, so the same keys
        and values, as with the cache on: only the time differs).

        Returns (last hidden states [U, H] before the final norm, the rows' cache, the segments'
        prefixes, each distinct row's segment [U], next positions [U, 1], ``inverse``: the
        distinct row of each of ``seqs``)."""
        R = rw.role_vectors.shape[0]
        longest = max(len(s) for s in seqs)
        if self.max_positions and R + longest > self.max_positions:
            raise EngineError(f"a prompt of {longest} tokens (with the {R} role vectors) is longer than the model's "
                              f"context of {self.max_positions} positions: shorten the task or its given domain")
        first_of: dict[tuple[int, ...], int] = {}
        inverse = [first_of.setdefault(tuple(s), len(first_of)) for s in seqs]
        distinct = [list(s) for s in first_of]
        U = len(distinct)
        segments = self._segments(distinct)
        self.last_groups = [len(rows) for rows, _ in segments]
        p_of = [0] * U
        seg_of = torch.zeros(U, dtype=torch.long)
        for k, (rows, p) in enumerate(segments):
            for i in rows:
                p_of[i], seg_of[i] = p, k
        own = [s[p_of[i]:] for i, s in enumerate(distinct)]
        reps = [1 if self.use_prefix_cache else len(rows) for rows, _ in segments]
        if bar is not None:
            bar.start_prefill(sum(r * p for r, (_, p) in zip(reps, segments)) + sum(len(o) for o in own))
        prefixes = []
        for (rows, p), r in zip(segments, reps):
            for _ in range(r):
                kv = self._prefix(role, rw, distinct[rows[0]][:p], use_cache=self.use_prefix_cache, bar=bar)
            prefixes.append(kv)
        S = max(len(o) for o in own)
        ids = torch.full((U, S), self.model.tokenizer.pad_token_id, dtype=torch.long)
        valid = torch.zeros((U, S), dtype=torch.bool)
        pos = torch.zeros((U, S), dtype=torch.long)
        for i, o in enumerate(own):
            ids[i, S - len(o):] = torch.tensor(o, dtype=torch.long)
            valid[i, S - len(o):] = True
            start = R + p_of[i]
            pos[i, :S - len(o)] = start
            pos[i, S - len(o):] = torch.arange(start, start + len(o))
        cache = _RowCache(len(rw.layers), U, self.n_kv, self.head_dim, S + BLOCK)
        cache.valid[:, :S] = valid
        mask = torch.tril(torch.ones((S, S), dtype=torch.bool)).unsqueeze(0) & valid.unsqueeze(1)  # [U, S, T]
        h = self._forward(rw, F.embedding(ids, rw.embed).float(), pos, prefixes, cache, mask, seg_of=seg_of)
        self.prefill_stats["computed_tokens"] += sum(len(o) for o in own)
        if bar is not None:
            bar.prefill(sum(len(o) for o in own))
            bar.end_prefill()
        return h[:, -1], cache, prefixes, seg_of, pos[:, -1:] + 1, inverse

    # ------------------------------------------------------------------ the Judge

    @torch.no_grad()
    def judge(self, prompts: Sequence[Messages], *, batch_size: int = JUDGE_BATCH) -> list[float]:
        """s_J for each prompt: the policy's Judge (its adapter and role vectors merged into fp32
        weights, its head) on this engine's prefill and prefix cache, in batches of at most
        ``batch_size`` alike prompts; in the prompts' order."""
        from omtr.model.batching import alike_chunks, prompt_text

        if not prompts:
            return []
        m = self.model
        with self._running():
            t0 = time.perf_counter()
            rw = self.weights["judge"]
            seqs = m.encode_prompts(prompts)
            out: list[float] = [0.0] * len(prompts)
            head = m.judge_head
            for chunk in alike_chunks([prompt_text(p) for p in prompts], batch_size):
                hid, _, _, _, _, inverse = self._prefill("judge", rw, [seqs[i] for i in chunk])
                s = torch.sigmoid(head(self._rms(hid, rw.norm).to(head.weight.dtype)).float()).squeeze(-1)
                for j, i in enumerate(chunk):
                    out[i] = float(s[inverse[j]])
            self.prefill_stats["prefill_s"] += time.perf_counter() - t0
            return out

    # ------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, role: str, prompts: Sequence[Messages], sampling: Sampling, *,
                 stop_when: Callable[[str], bool] | None = None, grammar: bool | None = None,
                 constraint: str | None = None, domains: Sequence[str | None] | None = None,
                 objects: Sequence[Sequence[str] | None] | None = None) -> list[Generation]:
        """:meth:`omtr.model.roles.RoleModel.generate`'s contract, on this engine's weights."""
        from omtr.progress import GenerationProgress

        if role not in GENERATING_ROLES:
            raise ValueError(f"generate takes role actor or editor, not {role!r}; the Judge scores with judge()")
        if not prompts:
            return []
        m = self.model
        with self._running():
            mode = m._constraint(grammar, constraint)
            given = m._given(domains, len(prompts))
            objs = m._objects(objects, len(prompts))
            bar = GenerationProgress(role, len(prompts))
            seqs = m.encode_prompts(prompts)
            gens = self._generate(m, role, seqs, sampling, sampling.seed, stop_when, mode, given, bar, objs)
            bar.close()
            if not (self.record_masks and mode != "off"):
                self.last_masks = None
            return gens

    @contextlib.contextmanager
    def _running(self):
        """A call on the engine: the weights current with the policy, torch on the engine's threads
        (restored after)."""
        if not self._current():
            self.refresh()
        prev_threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if self.threads:
                torch.set_num_threads(prev_threads)

    def _generate(self, m, role, seqs, sampling, seed, stop_when, mode, given, bar, objs=None) -> list[Generation]:
        """The batch's generation: the prefill (:meth:`_prefill`), then every row decoded together,
        each row attending to its segment's prefix."""
        rw = self.weights[role]
        g = m.grammar if mode != "off" else None
        pieces = m.pieces
        eos = m.tokenizer.eos_token_id
        rng = torch.Generator(device="cpu")
        rng.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(7), "little"))
        temperature = 1.0 if sampling.greedy else sampling.temperature
        B = len(seqs)
        waiting = 0
        limits = m.answer_limits(sampling, seqs, mode, given, objs)

        t0 = time.perf_counter()
        # Identical prompts (the samples of one task) are prefilled once: their keys, values and
        # first logits are copied to each of their rows.
        h, cache, prefix, seg_of, next_pos, inverse = self._prefill(role, rw, seqs, bar)
        hid = self._rms(h, rw.norm)
        if inverse != list(range(B)):
            idx = torch.tensor(inverse)
            cache.select(idx)
            hid, next_pos, seg_of = hid[idx], next_pos[idx], seg_of[idx]
        prefill_ms = 1000 * (time.perf_counter() - t0)
        self.prefill_stats["prefill_s"] += prefill_ms / 1000
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self._stats_t0

        rows = DecodedRows(B, g, mode, given, objs, pieces, eos, stop_when, limits)
        states, tokens = rows.states, rows.tokens
        masks: list[list] | None = [[] for _ in range(B)] if (self.record_masks and g) else None
        active = list(range(B))
        wait_s = 0.0  # what of the grammar's work (rows.grammar_s) the decoding loop waited for

        # Jump-forward decoding: after a row's chosen token, the tokens the grammar then leaves no
        # choice over (one token allowed: a keyword's rest, a forced name, a closing parenthesis) are
        # taken at once, with log-prob 0 as in the masked distribution, and go through the decoder
        # with it in the same step; the masks of the row's next step come from that walk, so the
        # grammar runs on this thread (the helper thread is for ``jump_forward=False``).
        jump = self.jump_forward and g is not None

        def fill(which: list[int]):
            tg = time.perf_counter()
            bm = g.allocate_bitmask(len(which))
            fs = [states[i].fill(bm, row) for row, i in enumerate(which)]
            if jump:  # a row left one token takes it without the head
                fs = [f if f is not None else _single_token(bm[row]) for row, f in enumerate(fs)]
            return bm, fs, time.perf_counter() - tg

        def run_on(i: int) -> list[int] | None:
            """Row ``i``'s tokens the grammar leaves no choice over, taken; None where it finished.
            The mask of its next free step goes to ``upcoming``."""
            run: list[int] = []
            while True:
                tg = time.perf_counter()
                bm = g.allocate_bitmask(1)
                f = states[i].fill(bm, 0)
                tok = f if f is not None else _single_token(bm[0])
                rows.grammar_s += time.perf_counter() - tg
                if tok is None:
                    upcoming[i] = bm[0]
                    return run
                if masks is not None:
                    masks[i].append(bm[0].clone())
                run.append(tok)
                if not rows.take(i, tok, 0.0):
                    return None

        # The next step's masks are computed on a helper thread while the decoder runs (they need
        # only the tokens accepted so far); the step then waits for them before the head.
        pending = None
        upcoming: dict[int, torch.Tensor] = {}  # jump: each running row's mask for its next step
        rows.start()
        for _ in range(max(limits)):
            forced: list[int | None] = [None] * len(active)
            bitmask = None
            if g:
                tw = time.perf_counter()
                if upcoming:
                    bitmask, took = torch.stack([upcoming.pop(i) for i in active]), 0.0
                else:
                    bitmask, forced, took = pending.result() if pending is not None else fill(active)
                pending = None
                wait_s += time.perf_counter() - tw
                rows.grammar_s += took
                if masks is not None:
                    for row, i in enumerate(active):
                        masks[i].append(bitmask[row].clone())
            # A forced token (the only one the grammar allows) has log-prob 0 in the masked
            # distribution; only the other rows need the head.
            free = [row for row, f in enumerate(forced) if f is None]
            choice = torch.tensor([0 if f is None else f for f in forced], dtype=torch.long)
            chosen = torch.zeros(len(active))
            if free:
                sel = None if len(free) == len(active) else torch.tensor(free)
                tok, lp = self._next_token(rw, hid if sel is None else hid[sel],
                                           None if bitmask is None else (bitmask if sel is None else bitmask[sel]),
                                           g, temperature, sampling.greedy, sampling.top_p, rng)
                if sel is None:
                    choice, chosen = tok, lp
                else:
                    choice[sel], chosen[sel] = tok, lp
            chosen_lp = chosen.tolist()
            choice_list = choice.tolist()
            keep: list[int] = []
            runs: list[list[int]] = []  # jump: each kept row's tokens after its chosen one
            before = sum(len(tokens[i]) for i in active)
            for row, i in enumerate(active):
                if not rows.take(i, choice_list[row], chosen_lp[row]):
                    continue
                run = run_on(i) if jump else []
                if run is not None:
                    keep.append(row)
                    runs.append(run)
            bar.step(sum(len(tokens[i]) for i in active) - before, len(keep) + waiting)
            if not keep:
                break
            if len(keep) < len(active):
                idx = torch.tensor(keep)
                cache.select(idx)
                next_pos, choice, hid, seg_of = next_pos[idx], choice[idx], hid[idx], seg_of[idx]
                active = [active[r] for r in keep]
            n = len(active)
            if jump:
                hid, next_pos = self._jump_step(rw, choice, runs, next_pos, prefix, cache, seg_of)
                continue
            if g:
                pending = self._grammar_thread().submit(fill, list(active))
            x = F.embedding(choice.view(n, 1), rw.embed).float()
            cache.reserve(1)
            cache.valid[:, cache.length] = True
            step_mask = cache.valid[:, :cache.length + 1].view(n, 1, -1)
            h = self._forward(rw, x, next_pos, prefix, cache, step_mask, seg_of=seg_of)
            hid = self._rms(h[:, -1], rw.norm)
            next_pos = next_pos + 1
        self.last_masks = masks
        return rows.generations(m.tokenizer, seqs, {"prefill_ms": prefill_ms, "grammar_wait_ms": 1000 * wait_s})

    def _jump_step(self, rw: _RoleWeights, choice: torch.Tensor, runs: list[list[int]], next_pos: torch.Tensor,
                   prefix: list, cache: "_RowCache", seg_of: torch.Tensor):
        """A decode step of jump-forward decoding: each row's chosen token and the run after it
        (``runs``, maybe empty) through the decoder at once (:meth:`_forward_packed`), each row's
        tokens at its own columns of the cache from its own end. Returns the rows' final-normed
        hidden states after their last token [n, H] and their next positions [n, 1]."""
        n = len(runs)
        lens = torch.tensor([1 + len(r) for r in runs])
        ids = torch.tensor([t for r, run in enumerate(runs) for t in (int(choice[r]), *run)], dtype=torch.long)
        tok_row = torch.repeat_interleave(torch.arange(n), lens)  # [N]: each token's row
        first = torch.cumsum(lens, 0) - lens  # each row's first token in the packed order
        tok_off = torch.arange(len(ids)) - first[tok_row]  # [N]: its place among its row's new tokens
        at = cache.ends
        cols = at[tok_row] + tok_off
        S = int(lens.max())
        cache.reserve(int(at.max()) + S - cache.length)
        cache.valid[tok_row, cols] = True
        h = self._forward_packed(rw, F.embedding(ids, rw.embed).float(), next_pos.view(-1)[tok_row] + tok_off,
                                 prefix, cache, seg_of, tok_row, tok_off, cols, S)
        cache.ends = at + lens
        last = first + lens - 1
        return self._rms(h[last], rw.norm), next_pos + lens.view(n, 1)

    def _forward_packed(self, rw: _RoleWeights, x: torch.Tensor, pos: torch.Tensor, prefix: list,
                        cache: "_RowCache", seg_of: torch.Tensor, tok_row: torch.Tensor, tok_off: torch.Tensor,
                        cols: torch.Tensor, S: int) -> torch.Tensor:
        """The decoder over a jump-forward step's ``N`` tokens, packed (no padding) [N, H] at
        positions ``pos`` [N]: token ``t`` is row ``tok_row[t]``'s ``tok_off[t]``-th new token,
        written at its column ``cols[t]``; ``S`` is the most tokens a row has. Returns the final
        hidden states (before the last norm) [N, H].

        The linears see only the real tokens, as one-token rows (the int8 decode path). Attention
        as in a decode step: the queries against their segment's prefix packed (one product per
        segment, no copy of its keys), against the rows' own keys with the queries laid out per
        row [B, kv, g*S, d] (a row with fewer tokens has zero queries there, never read back); the
        two parts' scores share one softmax per query, and each query sees its row's own columns up
        to its own."""
        N = x.shape[0]
        B = cache.valid.shape[0]
        nh, nkv, d = self.n_heads, self.n_kv, self.head_dim
        g = nh // nkv
        G = g * S
        scale = d ** -0.5
        cos, sin = self._rope(pos.view(N, 1))  # [N, 1, 1, d]
        T = max(cache.length, int(cols.max()) + 1)
        span = torch.arange(T)
        # [B, 1, g*S, T]: what a row's query j does not see (its row's columns past its own, padding)
        vis = cache.valid[:, :T].unsqueeze(1) & (span.view(1, 1, T) <= (cache.ends.view(B, 1) + torch.arange(S)).unsqueeze(-1))
        hidden = ~vis.unsqueeze(1).expand(B, g, S, T).reshape(B, 1, G, T)
        if len(prefix) == 1:
            segs = [(prefix[0], None)]
        else:
            segs = [(pre, torch.nonzero(seg_of[tok_row] == k).flatten()) for k, pre in enumerate(prefix)]
            segs = [(pre, idx) for pre, idx in segs if len(idx)]
        x = x.view(N, 1, -1)
        for i, L in enumerate(rw.layers):
            h = self._rms(x, L.in_norm)
            qkv = L.qkv(h)
            qk = self._rotate(qkv[..., : (nh + nkv) * d].view(N, 1, nh + nkv, d), cos, sin)
            q, k = qk[:, 0, :nh], qk[:, 0, nh:]  # [N, nh, d], [N, kv, d]
            v = qkv[:, 0, (nh + nkv) * d:].view(N, nkv, d)
            K, V = cache.write_at(i, k, v, tok_row, cols, T)  # [B, kv, T, d]
            qpad = q.new_zeros((B, S, nh, d))
            qpad[tok_row, tok_off] = q
            qh = qpad.transpose(1, 2).reshape(B, nkv, G, d)
            s_r = (qh @ K.transpose(-1, -2)).masked_fill_(hidden, float("-inf"))  # [B, kv, g*S, T]
            s_r = s_r.view(B, nkv, g, S, T)[tok_row, :, :, tok_off]  # [N, kv, g, T]: the real queries'
            qg = q.view(N, nkv, g, d)
            o = q.new_empty((N, nkv, g, d))
            p_r = torch.empty_like(s_r)
            for pre, idx in segs:
                KpT, Vp = pre[i]
                P = KpT.shape[2]
                qs = qg if idx is None else qg[idx]
                b = qs.shape[0]
                s_p = (qs.transpose(0, 1).reshape(nkv, b * g, d) @ KpT).view(nkv, b, g, P).transpose(0, 1)
                p = torch.softmax(torch.cat([s_p, s_r if idx is None else s_r[idx]], dim=-1).mul_(scale), dim=-1)
                op = (p[..., :P].transpose(0, 1).reshape(nkv, b * g, P) @ Vp).view(nkv, b, g, d).transpose(0, 1)
                if idx is None:
                    o, p_r = op, p[..., P:]
                else:
                    o[idx], p_r[idx] = op, p[..., P:]
            ppad = p_r.new_zeros((B, S, nkv, g, T))
            ppad[tok_row, tok_off] = p_r
            own = ppad.permute(0, 2, 3, 1, 4).reshape(B, nkv, G, T) @ V  # [B, kv, g*S, d]
            o = o + own.view(B, nkv, g, S, d)[tok_row, :, :, tok_off]
            x = x + L.o(o.reshape(N, 1, nh * d))
            h = self._rms(x, L.post_norm)
            gate, up = L.gate_up(h).chunk(2, dim=-1)
            x = x + L.down(F.silu(gate) * up)
        return x.view(N, -1)


def _split_attention(qt: torch.Tensor, K: torch.Tensor, V: torch.Tensor, segs: list, lens: list[int]) -> torch.Tensor:
    """The rows' prefill attention, ``[B, heads, S, d]``, as two flash passes per segment instead of
    one masked pass over ``[prefix; own keys]``: every query sees the whole prefix, so the segment's
    rows go through it as one long batch of one (the prefix's keys are not repeated per row, no mask
    is built); each row's own tokens then attend causally to themselves (``is_causal``: the kernel
    skips the blocks above the diagonal; the row's padding is sliced off). The two partial results
    are merged by their log-sum-exps, ``o = w o_prefix + (1 - w) o_own`` with ``w = sigmoid(lse_prefix
    - lse_own)``: the same attention to float rounding.

    ``qt`` [B, heads, S, d] (rows left-padded to S), ``K``/``V`` [B, kv, S, d] the rows' own keys and
    values, ``segs`` (``(Kᵀ [kv, d, P], V [kv, P, d])`` of the layer, the segment's rows or None for
    all), ``lens`` each row's own tokens. A padded position gets the prefix's part alone (finite;
    nothing reads it)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    B, nh, S, d = qt.shape
    out = qt.new_empty((B, nh, S, d))
    for (KpT, Vp), idx in segs:
        rows = list(range(B)) if idx is None else idx.tolist()
        b, P = len(rows), KpT.shape[-1]
        if P:
            qr = qt if idx is None else qt[idx]
            qf = qr.transpose(0, 1).reshape(1, nh, b * S, d)  # the rows one after another, as queries
            # the kernel reads keys with a unit stride in d (a transposed view gives wrong values, silently)
            Kp = KpT.transpose(-1, -2).contiguous().unsqueeze(0)
            o1, l1 = flash(qf, Kp, Vp.unsqueeze(0), 0.0, False)[:2]
            o1, l1 = o1.view(nh, b, S, d).transpose(0, 1), l1.view(nh, b, S).transpose(0, 1)
        for j, r in enumerate(rows):
            a = S - lens[r]
            o2, l2 = flash(qt[r:r + 1, :, a:], K[r:r + 1, :, a:], V[r:r + 1, :, a:], 0.0, True)[:2]
            if not P:
                out[r, :, a:] = o2[0]
                out[r, :, :a] = 0.0
                continue
            w = torch.sigmoid(l1[j, :, a:] - l2[0]).unsqueeze(-1)  # the prefix's share of each query's weight
            out[r, :, a:] = torch.lerp(o2[0], o1[j, :, a:], w)
            out[r, :, :a] = o1[j, :, :a]
    return out


class _RowCache:
    """The rows' own keys and values, per layer [B, kv, capacity, d]; ``length`` columns filled.

    Columns are shared by all rows (left padding): ``valid`` [B, capacity] says which hold a token."""

    def __init__(self, layers: int, B: int, kv: int, d: int, capacity: int):
        self.k = [torch.zeros((B, kv, capacity, d)) for _ in range(layers)]
        self.v = [torch.zeros((B, kv, capacity, d)) for _ in range(layers)]
        self.valid = torch.zeros((B, capacity), dtype=torch.bool)
        self.length = 0
        self._written = 0  # layers that appended at the current length
        # each row's columns in use (jump-forward steps: rows add different numbers of tokens, each
        # at its own end; columns past a row's end and below ``length`` are its padding)
        self.ends = torch.zeros(B, dtype=torch.long)

    def reserve(self, n: int) -> None:
        cap = self.valid.shape[1]
        if self.length + n <= cap:
            return
        grow = max(n, BLOCK)
        # One layer at a time, in place: the old block is freed before the next layer's grows, so the
        # copy costs one layer's keys (or values) beside the cache, not all the keys again (16 rows
        # of 500 columns: ~6 MB, not ~190 MB). Values unchanged.
        for blocks in (self.k, self.v):
            for i, t in enumerate(blocks):
                blocks[i] = torch.cat([t, t.new_zeros(t.shape[:2] + (grow, t.shape[3]))], dim=2)
        self.valid = torch.cat([self.valid, self.valid.new_zeros((self.valid.shape[0], grow))], dim=1)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        S = k.shape[2]
        self.reserve(S)
        a, b = self.length, self.length + S
        self.k[layer][:, :, a:b] = k
        self.v[layer][:, :, a:b] = v
        self._written += 1
        if self._written == len(self.k):
            self._written = 0
            self.length = b
            self.ends.fill_(b)
        return self.k[layer][:, :, :b], self.v[layer][:, :, :b]

    def write_at(self, layer: int, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                 b: int):
        """Write the keys and values [N, kv, d] of ``N`` tokens at their rows' columns ``cols``
        (a jump-forward step: each row's new tokens at its own end, :meth:`FastEngine._forward_packed`);
        returns every column up to ``b`` (the furthest written + 1, or the cache's length if larger;
        the step computes it once for all layers), [B, kv, b, d] each. The caller reserves the
        columns, marks them in ``valid`` and moves ``ends``."""
        self.k[layer][rows, :, cols] = k
        self.v[layer][rows, :, cols] = v
        self._written += 1
        if self._written == len(self.k):
            self._written = 0
            self.length = b
        return self.k[layer][:, :, :b], self.v[layer][:, :, :b]

    def select(self, idx: torch.Tensor) -> None:
        n = self.length
        for blocks in (self.k, self.v):  # one layer at a time, as in reserve
            for i in range(len(blocks)):
                blocks[i] = blocks[i][idx, :, :n + BLOCK].contiguous()
        self.valid = self.valid[idx, :n + BLOCK].contiguous()
        self.ends = self.ends[idx]
