"""One backbone, three roles: the Actor, the Judge and the Editor.

Each role ``ρ`` has private parameters on top of the shared backbone:

- ``role_vectors`` learned embedding vectors ``e_ρ``, put in front of the input embeddings:
  ``π(·|c, ρ) = LM([e_ρ; c])``;
- a LoRA adapter (peft), switched per batch with ``set_adapter``;
- for the Judge, a scalar head: ``s_J(x, y) = sigmoid(g([e_J; x; y]))``, ``g`` a linear map of the
  last position's final hidden state.

The backbone is frozen or trainable (``ModelConfig.train_backbone``). The reference policy of the
KL term (:meth:`RoleModel.reference`) is the policy at initialisation:

- frozen backbone: the same network with adapters disabled and the role vectors at their
  initial values (LoRA starts as a no-op, so this *is* the initial policy), at no memory cost;
- trainable backbone: the backbone moves, so disabling adapters no longer gives the initial
  policy. :meth:`RoleModel.keep_reference` loads a second, frozen copy of the initial backbone
  (one more backbone's worth of memory); without it :meth:`reference` refuses.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from omtr.config import ROLE_NAMES, ModelConfig
from omtr.model.backbone import Backbone, _ensure_pad, load_backbone, resolve_device, resolve_dtype
from omtr.model.batching import alike_chunks, prompt_text
from omtr.policy import Generation, Messages, Sampling

log = logging.getLogger("omtr.model")

MODEL_FILE = "omtr-model.json"
FORMAT_VERSION = 1
GENERATING_ROLES = ("actor", "editor")
MASK_ROWS_BYTES = 64 << 20  # the replayed grammar masks kept for a later pass over the same steps
MIN_SHARED_PREFIX = 16  # tokens: a shorter common prompt prefix is not worth a forward pass of its own


class RoleModel(nn.Module):
    """The three-role model. Implements :class:`omtr.policy.Policy`."""

    def __init__(self, cfg: ModelConfig, backbone: Backbone):
        from peft import LoraConfig, get_peft_model

        super().__init__()
        self.cfg = cfg
        self.tokenizer = backbone.tokenizer
        _ensure_pad(self.tokenizer)
        self.source = backbone.source
        base = backbone.model
        base.requires_grad_(False)
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_targets), bias="none")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.lm = get_peft_model(base, lora, adapter_name=ROLE_NAMES[0])
            for role in ROLE_NAMES[1:]:
                self.lm.add_adapter(role, lora)
        from omtr.model.adapters import skip_adapter_input_casts

        skip_adapter_input_casts(self.lm)  # one dtype throughout: peft's casts would only undo the autocast's
        self.apply_adapter_path()
        hidden = base.config.hidden_size
        param = next(base.parameters())
        self.role_embeddings = nn.Parameter(self._initial_role_vectors(base).to(param.device, torch.float32))
        self.register_buffer("initial_role_embeddings", self.role_embeddings.detach().clone())
        self.judge_head = nn.Linear(hidden, 1, device=param.device, dtype=torch.float32)
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        with torch.no_grad():
            self.judge_head.weight.copy_(torch.randn(1, hidden, generator=gen) * 0.02)
            self.judge_head.bias.zero_()
        self._role = None
        self._grammar = None
        self._mask_rows: collections.OrderedDict = collections.OrderedDict()  # replayed masks (_replay_bitmask)
        self._mask_rows_bytes = 0
        self.hidden_sink: dict | None = None  # where a packed pass puts its rows for a caller's hook (_final_hidden)
        self._pieces: list[str] | None = None
        self._reference_lm = None
        self._in_reference = False
        # Prompt-prefix sharing (see _prefill): on by default; the stored prefix per (role, policy).
        self.share_prefix = True
        self._prefixes: dict[tuple[int, bool], tuple[tuple[int, ...], int, object]] = {}
        self._checkpointing = False  # inside _checkpointed(): the decoder layers recompute in the backward pass
        self._prefix_block: list | None = None  # inside prefix_block(): the prompt prefixes computed so far
        # transformers renamed past_key_values to cache (5.24); accept either
        self._cache_kw = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.use_role(ROLE_NAMES[0])
        self.eval()

    # ------------------------------------------------------------------ construction / roles

    def apply_adapter_path(self) -> None:
        """The LoRA layers' forward pass as the config says: fused (``fused_adapters``, one addmm)
        or peft's own."""
        from omtr.model.adapters import fuse_adapter_products, unfuse_adapter_products

        if getattr(self.cfg, "fused_adapters", True):
            fuse_adapter_products(self.lm)
        else:
            unfuse_adapter_products(self.lm)

    @classmethod
    def build(cls, cfg: ModelConfig, *, device: str | None = None) -> "RoleModel":
        """A fresh three-role model on the backbone ``cfg`` names."""
        return cls(cfg, load_backbone(cfg, device=device))

    def _initial_role_vectors(self, base) -> torch.Tensor:
        """Each role's vectors start as the embeddings of its name's tokens (cycled), so a pretrained
        backbone sees in-distribution inputs at initialisation."""
        weight = base.get_input_embeddings().weight
        if weight.is_meta:  # a shape-only model (parameter accounting without loading weights)
            return torch.zeros(len(ROLE_NAMES), self.cfg.role_vectors, weight.shape[1])
        emb = weight.detach().float().cpu()
        rows = []
        for role in ROLE_NAMES:
            ids = self.tokenizer.encode(role, add_special_tokens=False) or [0]
            rows.append(torch.stack([emb[ids[i % len(ids)]] for i in range(self.cfg.role_vectors)]))
        return torch.stack(rows)  # [roles, R, H]

    @property
    def device(self) -> torch.device:
        return self.role_embeddings.device

    @property
    def base_model(self):
        return self.lm.get_base_model()

    def use_role(self, role: str) -> int:
        """Activate ``role``'s adapter; returns the role's index."""
        if role not in ROLE_NAMES:
            raise ValueError(f"unknown role {role!r}; choose one of {ROLE_NAMES}")
        if self._role != role:
            self.lm.set_adapter(role)
            self._role = role
            self._set_trainable()
        return ROLE_NAMES.index(role)

    def _set_trainable(self) -> None:
        # peft's set_adapter freezes inactive adapters; keep all role parameters trainable (an
        # inactive adapter simply gets no gradient) and the backbone as configured.
        for name, p in self.lm.named_parameters():
            p.requires_grad_(("lora_" in name) or self.cfg.train_backbone)

    # ------------------------------------------------------------------ batch construction

    def encode_prompts(self, prompts: Sequence[Messages]) -> list[list[int]]:
        out = []
        for msgs in prompts:
            text = self.tokenizer.apply_chat_template(list(msgs), add_generation_prompt=True, tokenize=False)
            out.append(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return out

    def _inputs(self, seqs: list[list[int]], role_index: int):
        """[e_ρ; left-padded tokens]: input embeddings, attention mask and position ids."""
        B, T = len(seqs), max(len(s) for s in seqs)
        ids = torch.full((B, T), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for i, s in enumerate(seqs):
            if s:
                ids[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
                mask[i, T - len(s):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        lm = self._active_lm()
        emb = lm.get_input_embeddings()(ids)
        roles = self._role_vectors()[role_index]
        rv = roles.to(emb.dtype).unsqueeze(0).expand(B, -1, -1)
        embeds = torch.cat([rv, emb], dim=1)
        attn = torch.cat([torch.ones((B, rv.shape[1]), dtype=torch.long, device=self.device), mask], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        return embeds, attn, pos

    def _role_vectors(self) -> torch.Tensor:
        return self.initial_role_embeddings if self._in_reference else self.role_embeddings

    def _active_lm(self):
        return self._reference_lm if (self._in_reference and self._reference_lm is not None) else self.lm

    # ------------------------------------------------------------------ shared prompt prefixes

    def forget_prefixes(self) -> None:
        """Drop stored prompt prefixes. Called after every optimizer step (their keys and values
        depend on the parameters); a parameter change is also detected on its own (see _prefill)."""
        self._prefixes.clear()

    def _params_version(self) -> int:
        # In-place updates (optimizer steps, load_state_dict) bump a tensor's version counter.
        return sum(p._version for p in self.parameters())

    def _prefill(self, seqs: list[list[int]], role_index: int, *, logits_to_keep: int, reuse: bool,
                 max_prefix: int | None = None, pack: bool = False, headless: bool = False):
        """The forward pass over ``[e_ρ; prompt]`` rows, sharing their common token prefix.

        Prompts of one batch mostly start alike (the system prompt and the family's
        demonstration: about 800 of SmolLM2's 930 Actor prompt tokens). That prefix goes through
        the network once, as a batch of one; its keys and values are repeated for every row and
        only each row's own tokens are computed on top. Positions and masks are those of the
        plain left-padded batch (``[e_ρ | prefix | padding | own tokens]``), so the results are the
        same up to float rounding. With ``reuse`` (generation, no gradients) the prefix is kept for
        later calls of the same role while the parameters stay unchanged.

        ``max_prefix`` caps the shared prefix: the positions whose logits are kept must lie in
        every row's own part (token log-probs: the prefix may not reach into a completion, which
        identical prompts with completions that start alike would otherwise allow).

        ``pack`` (the training passes, :meth:`_final_hidden`; where ``pack_rows`` is on and the
        attention is torch's CPU kernels): the rows' own tokens go through the network as one row,
        one after another without padding (:func:`omtr.model.checkpointing.packed_rows`); then the
        output's states are that packed row and the return is ``(output, None, lengths)``.

        ``headless`` (the passes that need only the final hidden states: the Judge and the chunked
        log-probs): the decoder runs without the LM head, whose weight a bf16 autocast would
        otherwise cast and repack at every call for a single position's logits; ``output`` then
        has ``last_hidden_state`` and no logits (``logits_to_keep`` is not used).

        Returns ``(output, attention_mask, position_ids)``; the mask covers prefix and rows, the
        position ids the rows' own part."""
        lm = self._active_lm()
        if headless:
            from omtr.model.checkpointing import decoder

            run = decoder(lm)
        else:
            run = functools.partial(lm, logits_to_keep=logits_to_keep)
        # Under _checkpointed() with gradients (never when reusing): the prefix's keys and values
        # reach the rows through a cache a layer's recomputation can replay (omtr.model.checkpointing).
        ckpt = getattr(self, "_checkpointing", False) and not reuse and torch.is_grad_enabled()
        p = len(os.path.commonprefix(seqs)) if len(seqs) > 1 else 0
        p = min(p, min(len(s) for s in seqs) - 1)  # every row keeps one token of its own
        if max_prefix is not None:
            p = min(p, max_prefix)
        stored = None
        block = self._prefix_block if (self._prefix_block is not None and not reuse and self.share_prefix) else None
        if block is not None:  # a prefix an earlier micro-batch of the block computed (a lone row included)
            cap = p if len(seqs) > 1 else min(len(seqs[0]) - 1, len(seqs[0]) if max_prefix is None else max_prefix)
            found = self._block_prefix(block, seqs[0], cap, role_index) if cap >= MIN_SHARED_PREFIX else None
            if found is not None:
                stored, p = found
            elif len(seqs) == 1 and max_prefix is not None:
                p = cap  # a lone completion's row: its prompt computed as a prefix, for the task's later micro-batches
        if reuse and self.share_prefix:
            key = (role_index, self._in_reference)
            entry = self._prefixes.get(key)
            if entry is not None:
                tokens, version, cache = entry
                n = len(tokens)
                if (version == self._params_version() and n <= min(len(s) for s in seqs) - 1
                        and all(tuple(s[:n]) == tokens for s in seqs)):
                    stored, p = cache, n
                else:
                    del self._prefixes[key]
        if stored is None and (not self.share_prefix or p < MIN_SHARED_PREFIX):
            embeds, attn, pos = self._inputs(seqs, role_index)
            out = run(inputs_embeds=embeds, attention_mask=attn, position_ids=pos, use_cache=reuse)
            return out, attn, pos
        R = self.cfg.role_vectors
        if stored is None:
            ids = torch.tensor([seqs[0][:p]], dtype=torch.long, device=self.device)
            emb = lm.get_input_embeddings()(ids)
            rv = self._role_vectors()[role_index].to(emb.dtype).unsqueeze(0)
            pre = torch.cat([rv, emb], dim=1)
            pos0 = torch.arange(R + p, device=self.device).unsqueeze(0)
            replay = {}
            if ckpt:
                from omtr.model.checkpointing import ReplayCache, decoder_layers

                replay = {self._cache_kw: ReplayCache(len(decoder_layers(lm)))}
            keep1 = run if headless else functools.partial(lm, logits_to_keep=1)
            out0 = keep1(inputs_embeds=pre, attention_mask=torch.ones((1, R + p), dtype=torch.long, device=self.device),
                         position_ids=pos0, use_cache=True, **replay)
            stored = (ReplayCache(len(decoder_layers(lm)), past=replay[self._cache_kw].own()) if ckpt
                      else _cache_of(out0))
            if block is not None:
                stored = self._keep_block_prefix(block, tuple(seqs[0][:p]), role_index, out0, stored, ckpt)
            if reuse:
                self._prefixes[(role_index, self._in_reference)] = (tuple(seqs[0][:p]), self._params_version(), stored)
        B = len(seqs)
        if pack and B > 1 and not reuse and getattr(self.cfg, "pack_rows", True):
            from omtr.model.checkpointing import packing_applies

            if packing_applies(lm.config, self.device):
                return self._packed_rows(lm, stored, seqs, p, run)
        if reuse:
            cache = copy.deepcopy(stored)  # the stored prefix stays a batch of one, unextended
        else:
            cache = stored
        cache.batch_repeat_interleave(B)  # a ReplayCache expands its batch of one instead
        rows = [s[p:] for s in seqs]
        S = max(len(r) for r in rows)
        ids = torch.full((B, S), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, S), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, S - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, S - len(r):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        attn = torch.cat([torch.ones((B, R + p), dtype=torch.long, device=self.device), mask], dim=1)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)[:, R + p:]
        emb = lm.get_input_embeddings()(ids)
        out = run(inputs_embeds=emb, attention_mask=attn, position_ids=pos, use_cache=True,
                  **{self._cache_kw: cache})
        return out, attn, pos

    def _packed_rows(self, lm, stored, seqs: list[list[int]], p: int, run):
        """The rows' own tokens over a stored prefix (its cache, a batch of one) as one packed row:
        no padding goes through the layers, each row's positions continue the prefix's, and its
        attention sees the prefix and its own earlier tokens (omtr.model.checkpointing.packed_rows).
        ``run`` is the forward pass :meth:`_prefill` chose (the model, or its decoder alone).
        Returns ``(output, None, lengths)``."""
        from omtr.model.checkpointing import ReplayCache, packed_rows

        if isinstance(stored, ReplayCache):
            past = stored.layers_past()
        else:  # a plain forward pass's cache
            past = [(layer.keys, layer.values) for layer in stored.layers]
        cache = ReplayCache(len(past), past=past)
        R = self.cfg.role_vectors
        rows = [s[p:] for s in seqs]
        lengths = [len(r) for r in rows]
        ids = torch.tensor([[t for r in rows for t in r]], dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(R + p, R + p + n, device=self.device) for n in lengths]).unsqueeze(0)
        attn = torch.ones((1, R + p + ids.shape[1]), dtype=torch.long, device=self.device)
        emb = lm.get_input_embeddings()(ids)
        with packed_rows(lm.config, R + p, lengths):
            out = run(inputs_embeds=emb, attention_mask=attn, position_ids=pos, use_cache=True,
                      **{self._cache_kw: cache})
        return out, None, lengths

    @contextlib.contextmanager
    def prefix_block(self):
        """Inside: a prompt prefix goes through the network once for the whole block, not once per
        micro-batch (the samples of one task, cut into micro-batches, all begin with their prompt).

        Without gradients (the old-log-prob pass) a later micro-batch takes the stored keys and
        values as they are. With gradients (one optimizer step's micro-batches, each with its own
        backward pass inside the block) it takes fp32 leaf copies of them: each micro-batch's
        backward pass adds its share of their gradient there, and on leaving the block the
        prefix's own pass is run backward once with the sum, which puts the same gradient on the
        parameters as one prefix pass per micro-batch (up to the order of float additions). So
        every backward pass of the block must run inside it, and the optimizer step after it.
        Leaving it by an exception drops what is stored without a backward pass."""
        if self._prefix_block is not None:
            yield
            return
        self._prefix_block = []
        try:
            yield
            self.flush_prefix_block()
        finally:
            self._prefix_block = None

    def flush_prefix_block(self) -> None:
        """Inside :meth:`prefix_block`: run the stored prefixes' own passes backward with the
        gradient their micro-batches summed so far, and forget them (their graphs and leaves free
        their memory; a later micro-batch computes its prefix again). For when the micro-batches
        that share them are done, e.g. before the Judge's once the Actor's are."""
        block = self._prefix_block
        if not block:
            return
        outs, grads = [], []
        for _, _, _, own, leaves in block:
            if leaves is None:
                continue
            for pair, leaf_pair in zip(own, leaves):
                for t, leaf in zip(pair, leaf_pair):
                    if leaf.grad is not None:
                        outs.append(t)
                        grads.append(leaf.grad.to(t.dtype))
        block.clear()
        if outs:
            torch.autograd.backward(outs, grads)

    def _block_prefix(self, block: list, seq: list[int], p: int, role_index: int):
        """The longest prefix stored in the block that ``seq`` begins with (at most ``p`` tokens),
        as ``(cache, length)``; None if there is none."""
        best = None
        for tokens, ri, in_ref, own, leaves in block:
            n = len(tokens)
            if (ri == role_index and in_ref == self._in_reference and n <= p and tuple(seq[:n]) == tokens
                    and (best is None or n > best[1])):
                best = (own, n, leaves)
        if best is None:
            return None
        own, n, leaves = best
        return self._block_cache(own, leaves), n

    def _block_cache(self, own, leaves):
        """A cache over a stored prefix for one micro-batch: its keys and values as they are
        (no gradients), or the fp32 leaves cast back to their format (a graph node per micro-batch
        whose backward adds into the leaves' gradient)."""
        from omtr.model.checkpointing import ReplayCache

        if leaves is None:
            return ReplayCache(len(own), past=own)
        past = [(lk.to(k.dtype), lv.to(v.dtype)) for (k, v), (lk, lv) in zip(own, leaves)]
        return ReplayCache(len(own), past=past)

    def _keep_block_prefix(self, block: list, tokens: tuple, role_index: int, out0, stored, ckpt: bool):
        """Store a prefix just computed in the block; returns the cache this micro-batch uses."""
        if ckpt:
            own = stored.layers_past()
        else:  # keys and values of a plain forward pass (with or without gradients)
            own = [(layer.keys, layer.values) for layer in _cache_of(out0).layers]
        leaves = None
        if torch.is_grad_enabled():
            leaves = [(k.detach().float().requires_grad_(True), v.detach().float().requires_grad_(True))
                      for k, v in own]
        block.append((tokens, role_index, self._in_reference, own, leaves))
        return self._block_cache(own, leaves)

    @contextlib.contextmanager
    def _checkpointed(self):
        """With ``activation_checkpointing`` and gradients on: the decoder layers keep only their
        inputs and recompute their activations in the backward pass (omtr.model.checkpointing)."""
        if not (getattr(self.cfg, "activation_checkpointing", False) and torch.is_grad_enabled()) or self._checkpointing:
            yield
            return
        from omtr.model.checkpointing import checkpointed_layers, decoder_layers, spread

        self._checkpointing = True
        try:
            layers = decoder_layers(self._active_lm())
            with checkpointed_layers(spread(layers, getattr(self.cfg, "checkpoint_layers", 1.0))):
                yield
        finally:
            self._checkpointing = False

    # ------------------------------------------------------------------ reference policy

    def keep_reference(self) -> None:
        """With a trainable backbone: hold a frozen copy of the initial backbone for :meth:`reference`."""
        if not self.cfg.train_backbone or self._reference_lm is not None:
            return
        bb = load_backbone(self.cfg, device=str(self.device))
        bb.model.requires_grad_(False)
        bb.model.eval()
        self._reference_lm = bb.model

    @contextlib.contextmanager
    def reference(self):
        """Inside this block every forward pass (generate, token_logprobs) is the reference policy."""
        if self.cfg.train_backbone and self._reference_lm is None:
            raise RuntimeError(
                "the backbone is trainable, so adapters-off is not the initial policy; call "
                "keep_reference() once before training to hold a frozen copy of the initial backbone"
            )
        self._in_reference = True
        try:
            if self._reference_lm is None:
                with self.lm.disable_adapter():
                    yield self
            else:
                yield self
        finally:
            self._in_reference = False

    # ------------------------------------------------------------------ the Judge

    def judge_scores(self, prompts: Sequence[Messages]) -> torch.Tensor:
        """s_J for each (task, spec) prompt, differentiable; shape [B], values in (0, 1)."""
        ri = self.use_role("judge")
        seqs = self.encode_prompts(prompts)
        hidden = self._final_hidden(seqs, ri)
        return torch.sigmoid(self.judge_head(hidden[:, -1].float())).squeeze(-1)

    def _final_hidden(self, seqs: list[list[int]], ri: int, max_prefix: int | None = None) -> torch.Tensor:
        """The decoder's final hidden states of the rows ``[B, S, H]`` (right-aligned), the LM head
        not run at all. Through _prefill: the rows' common prefix (the system message,
        and for the specs of one task the task and its domain) is computed once; its output is
        the rows' own part. Checkpointed where training (:meth:`_checkpointed`)."""
        with self._checkpointed():
            out, attn, lengths = self._prefill(seqs, ri, logits_to_keep=1, reuse=False, max_prefix=max_prefix,
                                               pack=True, headless=True)
        hidden = out.last_hidden_state
        if attn is None:  # packed rows [1, N, H]: back to the right-aligned [B, S, H] of a padded batch
            B, S, H = len(lengths), max(lengths), hidden.shape[-1]
            dest = torch.cat([torch.arange(b * S + S - n, b * S + S, device=hidden.device)
                              for b, n in enumerate(lengths)])
            hidden = hidden.new_zeros((B * S, H)).index_copy(0, dest, hidden[0]).view(B, S, H)
            sink = getattr(self, "hidden_sink", None)
            if sink is not None:  # a caller's hook on the decoder saw the packed row: it gets the rows
                sink["hidden"] = hidden
        return hidden

    @torch.no_grad()
    def judge(self, prompts: Sequence[Messages], *, batch_size: int = 8) -> list[float]:
        """s_J for each prompt, in batches of at most ``batch_size`` alike prompts (the specs of one
        task together: their common prefix is computed once); returned in the prompts' order."""
        out: list[float] = [0.0] * len(prompts)
        for chunk in alike_chunks([prompt_text(p) for p in prompts], batch_size):
            for i, s in zip(chunk, self.judge_scores([prompts[i] for i in chunk]).tolist()):
                out[i] = s
        return out

    # ------------------------------------------------------------------ log-probs for PPO

    def token_logprobs(self, role: str, prompts: Sequence[Messages], completions: Sequence[Sequence[int]], *,
                       temperature: float = 1.0, grammar: bool | None = None, constraint: str | None = None,
                       domains: Sequence[str | None] | None = None,
                       objects: Sequence[Sequence[str] | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of given completion tokens under ``role``, with gradients.

        Returns ``(logprobs, mask)``, both [B, L] with L the longest completion; row b holds its
        tokens from position 0, ``mask`` marks them. Pass the temperature the tokens were sampled
        at (1.0 for greedy): the values then equal :attr:`Generation.logprobs`. With a decoding
        constraint on (default: the config's; ``grammar``/``constraint`` as in :meth:`generate`),
        its masks are rebuilt over the tokens, scope rules, given ``domains`` and statement
        ``objects`` included, so these are log-probabilities of the constrained distribution that
        was sampled."""
        ri = self.use_role(role)
        mode = self._constraint(grammar, constraint)
        use_grammar = mode != "off"
        prompt_ids = self.encode_prompts(prompts)
        comps = [list(map(int, c)) for c in completions]
        if len(comps) != len(prompt_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(comps)} completions")
        L = max((len(c) for c in comps), default=0)
        B = len(comps)
        if L == 0:
            z = torch.zeros((B, 0), device=self.device)
            return z, z.bool()
        given = self._given(domains, B) if use_grammar else None
        objs = self._objects(objects, B) if use_grammar else None
        seqs = [p + c for p, c in zip(prompt_ids, comps)]
        max_prefix = min(len(p) for p in prompt_ids) - 1
        col = torch.arange(L, device=self.device)
        lens = torch.tensor([len(c) for c in comps], device=self.device)
        mask = col.unsqueeze(0) < lens.unsqueeze(1)
        chunk = int(getattr(self.cfg, "logprob_chunk", 0) or 0)
        lm = self._active_lm()
        base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        from omtr.model.logprobs import chunked_token_logprobs, lean_head

        head = lean_head(base) if chunk > 0 else None
        if head is None:  # logprob_chunk=0, or a head the chunked path does not cover
            return self._full_logprobs(ri, seqs, comps, mode, given, objs, temperature, max_prefix, mask), mask
        # The final hidden states of the rows (the decoder's output; the head's logits of one
        # position only), then log-probabilities of the completion positions alone, a chunk of
        # positions at a time (omtr.model.logprobs): no [B, L, V] tensor for the whole batch.
        hidden = self._final_hidden(seqs, ri, max_prefix=max_prefix)  # [B, S, H], right-aligned: position S - 1 - len(c) + j predicts token j of c
        S, H = hidden.shape[1], hidden.shape[2]
        idx = torch.cat([torch.arange(b * S + S - 1 - len(c), b * S + S - 1, device=self.device)
                         for b, c in enumerate(comps) if c])
        targets = torch.tensor([t for c in comps for t in c], dtype=torch.long, device=self.device)
        bitmask = None
        if use_grammar:
            keys = [(mode, domains[b] if domains else None,
                     tuple(objects[b]) if objects and objects[b] is not None else None, tuple(c))
                    for b, c in enumerate(comps)]
            bitmask = self._replay_bitmask(comps, mode, given, L, objects=objs, packed=True, keys=keys)
        lp = chunked_token_logprobs(hidden.reshape(B * S, H).index_select(0, idx), head, targets,
                                    temperature=temperature, chunk=chunk, bitmask=bitmask,
                                    apply_mask=self.grammar.apply if use_grammar else None)
        # row b's token j at column j (mask's True entries in row-major order are lp's order)
        logp = torch.zeros((B, L), dtype=lp.dtype, device=self.device).masked_scatter(mask, lp)
        return logp, mask

    def _full_logprobs(self, ri: int, seqs: list[list[int]], comps: list[list[int]], mode: str, given, objs,
                       temperature: float, max_prefix: int, mask: torch.Tensor) -> torch.Tensor:
        """:meth:`token_logprobs` from the vocabulary-wide logits of the whole batch (``logprob_chunk=0``)."""
        B, L = mask.shape
        with self._checkpointed():
            out, _, _ = self._prefill(seqs, ri, logits_to_keep=L + 1, reuse=False, max_prefix=max_prefix)
        # [B, L, V], right-aligned: position L - len(c) + j predicts token j of completion c. The
        # log-probabilities are taken there (logit - logsumexp, the grammar's masks applied in place
        # to the one scaled copy) and only the [B, L] results are left-aligned: no padded copies
        # of the vocabulary-wide tensor, no saved log-softmax.
        logits = out.logits[:, :-1].float()
        if temperature != 1.0:
            logits = logits / temperature
        elif mode != "off":
            logits = logits.clone()  # the masks are applied in place
        starts = [L - len(c) for c in comps]
        targets = torch.zeros((B, L), dtype=torch.long, device=self.device)
        for b, c in enumerate(comps):
            targets[b, starts[b]:] = torch.tensor(c, dtype=torch.long)
        if mode != "off":
            bitmask = self._replay_bitmask(comps, mode, given, L, starts, objects=objs)
            self.grammar.apply(logits.view(B * L, -1), bitmask)
        right = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [B, L]
        col = torch.arange(L, device=self.device)
        lens = mask.sum(1)
        idx = (col.unsqueeze(0) + (L - lens).unsqueeze(1)).clamp(max=L - 1)
        logp = right.gather(1, idx)  # row b's token j at column j
        return logp.masked_fill(~mask, 0.0)

    def _replay_bitmask(self, comps: list[list[int]], mode: str, given: list | None, L: int,
                        starts: list[int] | None = None, objects: list | None = None, *,
                        packed: bool = False, keys: list | None = None) -> torch.Tensor:
        """The grammar's bitmask rows for completions replayed token by token: row ``b * L +
        starts[b] + j`` (``starts`` default 0, left-aligned) is the mask token j of completion b
        was chosen under; every other row allows everything. ``packed``: only the completions'
        rows, one after another (row ``len(c_0) + ... + len(c_{b-1}) + j``).

        ``keys`` (packed only; each completion's constraint, given domain, statement names and
        tokens): a completion replayed before under the same key, config and grammar takes its
        rows from :attr:`_mask_rows` (the old-log-prob pass and the PPO pass replay the same steps;
        the masks do not depend on the parameters). The store keeps the latest
        :data:`MASK_ROWS_BYTES` of rows; :meth:`forget_masks` empties it."""
        g = self.grammar
        if packed and keys is not None:
            return self._stored_mask_rows(comps, mode, given, objects, keys)
        bitmask = g.allocate_bitmask(sum(len(c) for c in comps) if packed else len(comps) * L)
        if not packed:
            bitmask.fill_(-1)  # padding positions: everything allowed (they are masked out anyway)
        pieces = self.pieces
        offset = 0
        for b, c in enumerate(comps):
            st = g.state(scoped=mode == "scoped", given=given[b] if given else None,
                         objects=objects[b] if objects else None)
            if packed:
                base, offset = offset, offset + len(c)
            else:
                base = b * L + (starts[b] if starts else 0)
            for j, tok in enumerate(c):
                st.fill(bitmask, base + j)
                if not st.accept(tok, pieces[tok] if tok < len(pieces) else ""):
                    raise ValueError(f"completion {b} leaves the grammar at token {j} ({tok}); "
                                     "pass grammar=False for text generated without it")
        return bitmask

    def _stored_mask_rows(self, comps, mode, given, objects, keys) -> torch.Tensor:
        store = self._mask_rows
        rows: list = [None] * len(comps)
        todo = []
        for b, key in enumerate(keys):
            hit = store.get(key)
            if hit is not None and hit[0] is self.cfg and hit[1] is self.grammar:
                store.move_to_end(key)
                rows[b] = hit[2]
            else:
                todo.append(b)
        if todo:
            fresh = self._replay_bitmask([comps[b] for b in todo], mode, [given[b] for b in todo] if given else None,
                                         0, objects=[objects[b] for b in todo] if objects else None, packed=True)
            offset = 0
            for b in todo:
                rows[b] = fresh[offset:offset + len(comps[b])].clone()
                offset += len(comps[b])
                store[keys[b]] = (self.cfg, self.grammar, rows[b])
                self._mask_rows_bytes += rows[b].numel() * rows[b].element_size()
            while self._mask_rows_bytes > MASK_ROWS_BYTES and store:
                _, (_, _, old) = store.popitem(last=False)
                self._mask_rows_bytes -= old.numel() * old.element_size()
        return torch.cat(rows) if len(rows) > 1 else rows[0]

    def forget_masks(self) -> None:
        """Empty the store of replayed grammar masks (:meth:`_replay_bitmask`'s ``keys``)."""
        self._mask_rows.clear()
        self._mask_rows_bytes = 0
        self.hidden_sink: dict | None = None  # where a packed pass puts its rows for a caller's hook (_final_hidden)

    def _grammar_replay(self, logits: torch.Tensor, comps: list[list[int]], mode: str = "plain",
                        given: list | None = None) -> torch.Tensor:
        """Left-aligned ``logits`` [B, L, V] with the replayed masks applied (a masked copy)."""
        B, L, V = logits.shape
        flat = logits.reshape(B * L, V).clone()
        self.grammar.apply(flat, self._replay_bitmask(comps, mode, given, L))
        return flat.reshape(B, L, V)

    # ------------------------------------------------------------------ generation

    def _constraint(self, grammar: bool | None, constraint: str | None) -> str:
        from omtr.config import DECODING_CONSTRAINTS

        if constraint is not None:
            if constraint not in DECODING_CONSTRAINTS:
                raise ValueError(f"constraint {constraint!r}: choose one of {', '.join(DECODING_CONSTRAINTS)}")
            return constraint
        if grammar is None:
            return self.cfg.constraint
        if not grammar:
            return "off"
        return self.cfg.decoding if self.cfg.decoding != "off" else "plain"

    def _given(self, domains, n: int):
        """Declarations of each prompt's given domain (None where none is given)."""
        if domains is None:
            return None
        if len(domains) != n:
            raise ValueError(f"{n} prompts but {len(domains)} given domains")
        from omtr.model.scope import given_declarations

        inv = getattr(self.cfg, "init_invariants", True)
        return [given_declarations(d, invariants=inv) if d else None for d in domains]

    takes_objects = True  # the episode loop passes objects= (each task statement's names) to generate

    def _objects(self, objects, n: int):
        """Each prompt's statement names for the scope rules (None: none), or None when the
        config turns the rule off (``statement_objects``)."""
        if objects is None:
            return None
        if len(objects) != n:
            raise ValueError(f"{n} prompts but {len(objects)} object-name lists")
        from omtr.statement import decoder_objects

        return [decoder_objects(o, self.cfg.statement_objects, self.cfg.statement_facts,
                                getattr(self.cfg, "statement_predicates", True)) for o in objects]

    def answer_limits(self, sampling: Sampling, seqs: Sequence[Sequence[int]], mode: str, given, objs) -> list[int]:
        """Each prompt's token limit: ``sampling.max_new_tokens``, raised where the answer is PDDL
        under the decoder and its task's statement needs more (:func:`omtr.model.grammar.answer_tokens`,
        sized from the names and clauses as the grammar's bounds are; ``sampling.fit_statement``
        False keeps it fixed). Raises :class:`omtr.policy.ContextOverflow` where a prompt
        with that many tokens after it would not fit the model's context."""
        from omtr.model.grammar import answer_tokens
        from omtr.policy import ContextOverflow

        base = sampling.max_new_tokens
        ctx = getattr(getattr(self.lm, "config", None), "max_position_embeddings", None)
        out = []
        for i, s in enumerate(seqs):
            need = 0
            if getattr(sampling, "fit_statement", True) and mode != "off" and objs and objs[i] is not None:
                need = answer_tokens(objs[i], given[i] if given else None)
            limit = max(base, need)
            if ctx and need > base and self.cfg.role_vectors + len(s) + limit > ctx:
                raise ContextOverflow(
                    f"the task's statement needs an answer of about {need} tokens after a prompt of {len(s)}, more "
                    f"than the model's context of {ctx} positions: shorten the task (fewer objects or facts) or "
                    f"use a model with a longer context", row=i)
            out.append(limit)
        return out

    @property
    def grammar(self):
        if self._grammar is None:
            from omtr.model.grammar import PddlGrammar

            from omtr.model.limits import GrammarLimits

            self._grammar = PddlGrammar(self.tokenizer, self._vocab_size(), GrammarLimits(**self.cfg.grammar_limits))
        return self._grammar

    def set_grammar_limits(self, limits) -> None:
        """Use the PDDL grammar with other repetition bounds (:class:`omtr.model.limits.GrammarLimits`)."""
        from omtr.model.grammar import PddlGrammar

        self._grammar = PddlGrammar(self.tokenizer, self._vocab_size(), limits)

    def _vocab_size(self) -> int:
        return int(self.base_model.get_output_embeddings().weight.shape[0])

    @property
    def pieces(self) -> list[str]:
        """Decoded text of every token id (for incremental text, stop checks and the grammar)."""
        if self._pieces is None:
            n = self._vocab_size()
            self._pieces = [self.tokenizer.decode([i]) if i < len(self.tokenizer) else "" for i in range(n)]
        return self._pieces

    @torch.no_grad()
    def generate(self, role: str, prompts: Sequence[Messages], sampling: Sampling, *,
                 stop_when: Callable[[str], bool] | None = None, grammar: bool | None = None,
                 constraint: str | None = None, domains: Sequence[str | None] | None = None,
                 objects: Sequence[Sequence[str] | None] | None = None) -> list[Generation]:
        """One generation per prompt, batched (left padding, KV cache).

        A sequence stops at end-of-sequence, when ``stop_when(text)`` is true, or at
        ``sampling.max_new_tokens`` (finish_reason ``length``); finished sequences leave the batch.
        ``logprobs`` are of the decoding distribution: the grammar-masked logits (grammar on), at
        ``sampling.temperature`` when sampling and at temperature 1 when greedy, before nucleus
        truncation (so :meth:`token_logprobs` recomputes them exactly).

        The decoding constraint is the config's (``decoding``: scoped, plain or off) unless
        ``constraint`` names one; ``grammar=False`` turns it off, ``grammar=True`` turns the
        config's on (plain when the config says off). ``domains[i]``, when given, is prompt i's
        given domain (PDDL text): that answer is a problem alone, decoded under the problem grammar
        and, when scoped, the given domain's predicates, types and constants. A given domain that
        does not parse raises :class:`omtr.model.scope.GivenDomainError`. ``objects[i]``: the names
        prompt i's task statement uses (:func:`omtr.statement.statement_objects`); under scoped
        decoding the problem declares them first, each once (``statement_objects`` in the config
        turns this off)."""
        if role not in GENERATING_ROLES:
            raise ValueError(f"generate takes role actor or editor, not {role!r}; the Judge scores with judge()")
        if not prompts:
            return []
        ri = self.use_role(role)
        mode = self._constraint(grammar, constraint)
        given = self._given(domains, len(prompts))
        objs = self._objects(objects, len(prompts))
        g = self.grammar if mode != "off" else None
        pieces = self.pieces
        eos = self.tokenizer.eos_token_id
        rng = torch.Generator(device="cpu")
        rng.manual_seed(sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(7), "little"))
        temperature = 1.0 if sampling.greedy else sampling.temperature

        seqs = self.encode_prompts(prompts)
        B = len(seqs)
        limits = self.answer_limits(sampling, seqs, mode, given, objs)
        lm = self._active_lm()
        t0 = time.perf_counter()
        out, attn, pos = self._prefill(seqs, ri, logits_to_keep=1, reuse=True)
        cache, logits = _cache_of(out), out.logits[:, -1].float()
        next_pos = pos[:, -1:] + 1
        prefill_ms = 1000 * (time.perf_counter() - t0)

        rows = DecodedRows(B, g, mode, given, objs, pieces, eos, stop_when, limits)
        states = rows.states
        active = list(range(B))
        from omtr.progress import GenerationProgress

        bar = GenerationProgress(role, B)
        rows.start()
        for _ in range(max(limits)):
            forced: list[int | None] = [None] * len(active)
            if g:
                tg = time.perf_counter()
                bitmask = g.allocate_bitmask(len(active))
                for row, i in enumerate(active):
                    forced[row] = states[i].fill(bitmask, row)
                g.apply(logits, bitmask)
                rows.grammar_s += time.perf_counter() - tg
            logp = torch.log_softmax(logits / temperature, dim=-1)
            if sampling.greedy:
                choice = logp.argmax(-1)
            else:
                choice = _sample_top_p(logp, sampling.top_p, rng)
            for row, f in enumerate(forced):
                if f is not None:
                    choice[row] = f
            chosen_lp = logp.gather(-1, choice.unsqueeze(-1)).squeeze(-1).tolist()
            choice_list = choice.tolist()
            keep = [row for row, i in enumerate(active) if rows.take(i, choice_list[row], chosen_lp[row])]
            bar.step(len(active), len(keep))
            if not keep:
                break
            if len(keep) < len(active):
                idx = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                attn, next_pos, choice = attn[idx], next_pos[idx], choice[idx]
                active = [active[r] for r in keep]
            attn = torch.cat([attn, torch.ones((len(active), 1), dtype=attn.dtype, device=self.device)], dim=1)
            emb = lm.get_input_embeddings()(choice.unsqueeze(-1))
            out = lm(inputs_embeds=emb, attention_mask=attn, position_ids=next_pos, use_cache=True,
                     **{self._cache_kw: cache})
            cache, logits = _cache_of(out), out.logits[:, -1].float()
            next_pos = next_pos + 1
        bar.close()
        return rows.generations(self.tokenizer, seqs, {"prefill_ms": prefill_ms})

    # ------------------------------------------------------------------ accounting

    def parameter_report(self) -> dict:
        """Parameter counts, each role's share of the total, and ``memory_ratio`` = parameter bytes
        of the three-role model / parameter bytes of the backbone alone."""
        backbone = backbone_bytes = 0
        roles = {r: 0 for r in ROLE_NAMES}
        role_bytes = 0
        for name, p in self.lm.named_parameters():
            if "lora_" in name:
                role = next((r for r in ROLE_NAMES if f".{r}." in name), None)
                roles[role] += p.numel()
                role_bytes += p.numel() * p.element_size()
            else:
                backbone += p.numel()
                backbone_bytes += p.numel() * p.element_size()
        per_vec = self.role_embeddings[0].numel()
        for r in ROLE_NAMES:
            roles[r] += per_vec
        roles["judge"] += sum(p.numel() for p in self.judge_head.parameters())
        role_bytes += self.role_embeddings.numel() * self.role_embeddings.element_size()
        role_bytes += sum(p.numel() * p.element_size() for p in self.judge_head.parameters())
        total = backbone + sum(roles.values())
        return {
            "backbone": self.cfg.backbone,
            "parameters": {"total": total, "backbone": backbone, **{r: n for r, n in roles.items()}},
            "role_share": {r: n / total for r, n in roles.items()},
            "shared_share": backbone / total,
            "memory_ratio": (backbone_bytes + role_bytes) / backbone_bytes,
            "separate_models_ratio": float(len(ROLE_NAMES)),
            "trainable_backbone": self.cfg.train_backbone,
        }

    # ------------------------------------------------------------------ save / load

    def save(self, out_dir: str | os.PathLike) -> Path:
        """Write the model directory (atomically: a killed save leaves the old one or none).

        The backbone's weights are written when they can differ from their source (a trainable
        backbone) or have no other source (micro); otherwise the directory points at the source."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            save_backbone = self.cfg.train_backbone or self.source.get("kind") == "micro"
            if save_backbone:
                self._save_backbone(tmp / "backbone")
            self.tokenizer.save_pretrained(tmp / "tokenizer")
            (tmp / "adapters").mkdir()
            for role in ROLE_NAMES:
                sd = get_peft_model_state_dict(self.lm, adapter_name=role)
                save_file({k: v.detach().contiguous().cpu() for k, v in sd.items()},
                          str(tmp / "adapters" / f"{role}.safetensors"))
            save_file({
                "role_embeddings": self.role_embeddings.detach().cpu().contiguous(),
                "initial_role_embeddings": self.initial_role_embeddings.detach().cpu().contiguous(),
                "judge_head.weight": self.judge_head.weight.detach().cpu().contiguous(),
                "judge_head.bias": self.judge_head.bias.detach().cpu().contiguous(),
            }, str(tmp / "roles.safetensors"))
            meta = {"format": FORMAT_VERSION, "roles": list(ROLE_NAMES), "config": self.cfg.to_dict(),
                    "backbone": {"saved": save_backbone, "source": self.source}}
            (tmp / MODEL_FILE).write_text(json.dumps(meta, indent=2) + "\n")
            if out.exists():
                shutil.rmtree(out)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out

    def _save_backbone(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir()
        base = self.base_model
        state = {}
        for k, v in base.state_dict().items():
            if "lora_" in k:
                continue
            state[k.replace(".base_layer.", ".")] = v.detach().cpu().contiguous()
        if base.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        base.config.save_pretrained(folder)

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str | None = None) -> "RoleModel":
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from omtr.config import ModelConfig

        path = Path(path)
        meta_file = path / MODEL_FILE
        if not meta_file.is_file():
            raise FileNotFoundError(f"{path} is not an omtr model directory (no {MODEL_FILE}); "
                                    "make one with `omtr model init --backbone small --out DIR`")
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path}: model directory format {meta.get('format')}, this omtr reads {FORMAT_VERSION}")
        cfg = ModelConfig.from_dict(meta["config"])
        device = device or resolve_device(cfg.device)
        source = meta["backbone"]["source"]
        if meta["backbone"]["saved"]:
            tok = AutoTokenizer.from_pretrained(str(path / "tokenizer"))
            model = AutoModelForCausalLM.from_pretrained(str(path / "backbone"),
                                                         dtype=resolve_dtype(cfg.dtype, device)).to(device)
            bb = Backbone(model, tok, source)
        else:
            bb = load_backbone(cfg, device=device)
            bb.tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"))
        rm = cls(cfg, bb)
        for role in ROLE_NAMES:
            sd = load_file(str(path / "adapters" / f"{role}.safetensors"), device=str(rm.device))
            res = set_peft_model_state_dict(rm.lm, sd, adapter_name=role)
            if getattr(res, "unexpected_keys", None):
                raise ValueError(f"{path}: adapter {role} has unexpected weights {res.unexpected_keys[:3]}")
        roles = load_file(str(path / "roles.safetensors"), device=str(rm.device))
        with torch.no_grad():
            rm.role_embeddings.copy_(roles["role_embeddings"])
            rm.initial_role_embeddings.copy_(roles["initial_role_embeddings"])
            rm.judge_head.weight.copy_(roles["judge_head.weight"])
            rm.judge_head.bias.copy_(roles["judge_head.bias"])
        return rm


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


class DecodedRows:
    """The answers of one batched decode, row by row (:meth:`RoleModel.generate` and the fast
    engine's loop): tokens, their log-probs, text, each row's grammar state, why and when each
    stopped, and the time spent in the grammar (``grammar_s``, wherever it ran)."""

    def __init__(self, B: int, g, mode: str, given, objs, pieces: list[str], eos: int | None,
                 stop_when: Callable[[str], bool] | None, limits: list[int]):
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.lps: list[list[float]] = [[] for _ in range(B)]
        self.texts = [""] * B
        self.finish = [""] * B
        self.decode_ms = [0.0] * B
        self.mode = mode
        self.states = [g.state(scoped=mode == "scoped", given=given[i] if given else None,
                               objects=objs[i] if objs else None) for i in range(B)] if g else None
        self.pieces, self.eos, self.stop_when, self.limits = pieces, eos, stop_when, limits
        self.grammar_s = 0.0
        self.t1 = time.perf_counter()

    def start(self) -> None:
        """The decode starts (a row's ``decode_ms`` counts from here)."""
        self.t1 = time.perf_counter()

    def take(self, i: int, tok: int, lp: float) -> bool:
        """Append ``tok`` (log-prob ``lp``) to row ``i`` and advance its grammar; False where the
        row is finished by it (end of sequence, ``stop_when``, its token limit)."""
        self.tokens[i].append(tok)
        self.lps[i].append(lp)
        piece = self.pieces[tok] if tok != self.eos else ""
        self.texts[i] += piece
        if self.states:
            tg = time.perf_counter()
            self.states[i].accept(tok, piece)
            self.grammar_s += time.perf_counter() - tg
        if tok == self.eos or (self.stop_when is not None and self.stop_when(self.texts[i])):
            self.finish[i] = "stop"
        elif len(self.tokens[i]) >= self.limits[i]:
            self.finish[i] = "length"
        else:
            return True
        self.decode_ms[i] = 1000 * (time.perf_counter() - self.t1)
        return False

    def generations(self, tokenizer, seqs: list[list[int]], timings: dict) -> list[Generation]:
        """One :class:`Generation` per row, with ``timings`` and the row's own figures."""
        gens = []
        for i, ids in enumerate(self.tokens):
            st = self.states[i] if self.states else None
            gens.append(Generation(
                text=tokenizer.decode(ids, skip_special_tokens=True),
                token_ids=ids, logprobs=self.lps[i], prompt_tokens=len(seqs[i]),
                finish_reason=self.finish[i] or "length",
                timings={**timings, "decode_ms": self.decode_ms[i] or 1000 * (time.perf_counter() - self.t1),
                         "grammar_ms": 1000 * self.grammar_s, "batch": float(len(self.tokens)),
                         **({"scope_ms": 1000 * st.scope_s, "scope_fallbacks": float(st.fallbacks),
                             "scope_left": float(st.scope_left)} if st is not None and self.mode == "scoped" else {})},
            ))
        return gens


def _sample_top_p(logp: torch.Tensor, top_p: float, rng: torch.Generator) -> torch.Tensor:
    """Nucleus sampling from log-probabilities [B, V]."""
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        sorted_p = sorted_p.masked_fill(cum - sorted_p > top_p, 0.0)
        pick = torch.multinomial(sorted_p.cpu(), 1, generator=rng).to(idx.device)
        return idx.gather(-1, pick).squeeze(-1)
    return torch.multinomial(probs.cpu(), 1, generator=rng).squeeze(-1).to(logp.device)
