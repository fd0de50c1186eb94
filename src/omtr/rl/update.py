"""The optimisation of one update, on the batch's rewarded steps (:mod:`omtr.rl.steps`).

In the order the driver (:mod:`omtr.rl.trainer`) calls them:

1. **Old log-probabilities** (:meth:`UpdateMixin._recompute_old`): when a non-exact rollout engine
   sampled the tokens, the policy's own log-probabilities on them (same masks) enter the PPO ratio
   as "old" (verl's recompute); their gap to the engine's is logged as ``engine_kl``.
2. **Reference pass** (:meth:`UpdateMixin._reference_pass`): the reference policy's
   log-probabilities of every sampled token (the KL term), and the prompt's last hidden state
   (:func:`_capture_hidden`), which the value head reads.
3. **Advantages** (:meth:`UpdateMixin._advantages`) by the estimator the config names (``gae`` or
   ``group``, :mod:`omtr.rl.advantages`), whitened per role over the whole batch when asked.
4. **Update** (:meth:`UpdateMixin._update`): ``L = L_PPO^A + 0.5 L_PPO^E + 0.3 L_J`` (+ the value
   head's error), minibatches and epochs, one optimizer step per minibatch through the backend
   (:mod:`omtr.rl.engine`). :meth:`UpdateMixin.judge_step` is one step of ``L_J`` alone on fixed
   labelled data.

With several ranks, whitening, loss normalisers and metrics are computed over the whole batch, and
the step applies the batch's gradient.

The methods live on :class:`UpdateMixin`, a base of :class:`omtr.rl.trainer.Trainer`; they read its
``cfg``, ``coll``, ``models``, ``distinct``, ``engines``, ``estimator``, ``value_head`` and
``backend``.
"""

from __future__ import annotations

import contextlib
import logging
import math

import torch

from omtr.rl import losses as L
from omtr.rl.advantages import Trajectory
from omtr.rl.distributed import merge_weighted_means
from omtr.rl.distributed import whiten as whiten_over_ranks
from omtr.rl.steps import GEN_ROLES, JudgeItem, StepItem, _chunks, _domains, _pad

log = logging.getLogger("omtr.rl.trainer")
PROGRESS_EVERY_S = 2.0  # seconds between the update's progress lines (omtr.progress)


class UpdateMixin:
    """The trainer's optimisation: old and reference log-probabilities, advantages, the PPO/Judge step."""

    def _precision(self):
        """The number format of the passes below (``update_dtype``, resolved by the trainer): a bf16
        autocast, or nothing for fp32 (omtr.model.precision)."""
        from omtr.model.precision import update_autocast

        return update_autocast(getattr(self, "update_dtype", "fp32"), str(self.models["actor"].device))

    def _prefix_block(self):
        """Inside: each model computes a prompt prefix once for all the micro-batches that begin
        with it (``prompt_prefix_once``, :meth:`omtr.model.roles.RoleModel.prefix_block`); with
        gradients every backward pass of the block runs inside it and the optimizer step after
        it. The torch backend only: DeepSpeed reduces gradients inside its own backward calls."""
        stack = contextlib.ExitStack()
        if self.cfg.prompt_prefix_once and getattr(self.backend, "name", "torch") == "torch":
            for m in self.distinct:
                if hasattr(m, "prefix_block"):
                    stack.enter_context(m.prefix_block())
        return stack

    def _progress(self, total: int, desc: str):
        from omtr.progress import Progress

        return Progress(total, desc, quiet=getattr(self, "quiet", False), every_s=PROGRESS_EVERY_S, logger=log)

    # ------------------------------------------------------------------ PPO's old log-probs
    @torch.no_grad()
    def _recompute_old(self, items: list[StepItem], judge_items: list[JudgeItem] = ()) -> None:
        """A non-exact engine sampled the tokens: the log-probabilities that enter the PPO ratio as
        "old" are the policy's own on those tokens, under the same masks (verl's recompute).

        With ``reuse_first_logprobs`` the steps trained in the update's first optimizer step are
        left out (``old_pending``): their loss is taken before any parameter moves, so their forward
        pass in :meth:`_ppo_loss` gives the same values, and saves a pass over them (half of this
        pass's time with the `small` profile's two minibatches). The gap ``log p_engine - log
        p_policy`` of every step is summed for :meth:`_engine_kl`."""
        self._engine_gap = [0.0, 0]
        # with dropout in the adapters the update's (training-mode) pass would not give the same values
        exact = not any(getattr(m.cfg, "lora_dropout", 0.0) for m in self.distinct)
        first = self._first_step(items, judge_items) if self.cfg.reuse_first_logprobs and exact else set()
        todo_all = [it for it in items if it.tokens and not it.skip and it.role in GEN_ROLES]
        for it in todo_all:
            it.old_pending = id(it) in first
        bar = self._progress(sum(not it.old_pending for it in todo_all), "old log-probs")
        with self._micro_heap() as trim, self._prefix_block():
            self._old_passes(todo_all, bar, trim)
        bar.close()

    def _old_passes(self, todo_all: list[StepItem], bar, trim) -> None:
        for role in GEN_ROLES:
            todo = [it for it in todo_all if it.role == role and not it.old_pending]
            model = self.models[role]
            model.eval()
            for chunk in _chunks(todo, self.cfg.micro_batch_size):
                with self._precision():
                    lp, mask = model.token_logprobs(role, [it.prompt for it in chunk], [it.tokens for it in chunk],
                                                    temperature=self.cfg.temperature, **_domains(chunk))
                bar.update(len(chunk), tokens=sum(len(p) for p in model.encode_prompts([it.prompt for it in chunk]))
                           + int(mask.sum()))
                for b, it in enumerate(chunk):
                    self._take_old(it, lp[b, :len(it.tokens)].tolist())
                del lp, mask
                trim()

    def _take_old(self, it: StepItem, new: list[float]) -> None:
        """The policy's log-probs of a step's tokens become its "old" ones; the engine's gap is counted."""
        gap = getattr(self, "_engine_gap", None)
        if gap is not None:  # tokens the policy's replayed masks refuse (-inf) have no gap to count
            pairs = [(e, p) for e, p in zip(it.old_logprobs, new) if math.isfinite(p) and math.isfinite(e)]
            gap[0] += sum(e - p for e, p in pairs)
            gap[1] += len(pairs)
        it.old_logprobs = new
        it.old_pending = False

    def _engine_kl(self) -> float | None:
        """The mean over the update's tokens of ``log p_engine - log p_policy`` (after :meth:`_update`):
        an estimate of KL(engine || policy) on the rollout's tokens; None when there were none."""
        diff, n = getattr(self, "_engine_gap", None) or (0.0, 0)
        if self.coll.active:
            diff, n = self.coll.sum([diff, n])
        return diff / n if n else None

    def _first_step(self, items: list[StepItem], judge_items: list[JudgeItem]) -> set[int]:
        """``id``s of the steps :meth:`_update` trains in its first optimizer step (epoch 0, part 0):
        those that will get an advantage (:meth:`_advantages`: rewarded, with tokens, not skipped)."""
        train = [it for it in items if it.reward is not None and it.tokens and not it.skip and it.role in GEN_ROLES]
        _, part_of = self._parts(train, judge_items)
        return {id(it) for it in train if part_of(it) == 0}

    def _parts(self, train: list[StepItem], judge_items: list[JudgeItem]):
        """How many minibatches (optimizer steps per epoch) and which one each trained step is in."""
        cfg, coll = self.cfg, self.coll
        local_eps = {it.ep for it in train} | {j.index for j in judge_items}
        n_eps = len(set().union(*coll.gather(local_eps))) if coll.active else len(local_eps)
        parts = max(1, min(cfg.minibatches, n_eps or 1))
        # Minibatches hold whole groups (the samples of one task) when there are several samples: a
        # micro-batch of one group shares its whole prompt, which the forward pass computes once.
        order = {g: k for k, g in enumerate(sorted({it.group for it in train}, key=repr))}
        if cfg.samples_per_task > 1 and len(order) >= parts:
            def part_of(it):
                return order[it.group] % parts
        else:
            def part_of(it):
                return it.ep % parts
        return parts, part_of

    # ------------------------------------------------------------------ reference pass / values
    @torch.no_grad()
    def _reference_pass(self, items: list[StepItem]) -> None:
        need_values = self.cfg.advantage == "gae"
        if self.cfg.kl_coef <= 0 and not need_values:
            return
        for role in GEN_ROLES:
            todo = [it for it in items if it.role == role and it.reward is not None and it.tokens and not it.skip]
            model = self.models[role]
            for chunk in _chunks(todo, self.cfg.micro_batch_size):
                with _capture_hidden(model) as cap, model.reference(), self._precision():
                    ref, mask = model.token_logprobs(role, [it.prompt for it in chunk], [it.tokens for it in chunk],
                                                     temperature=self.cfg.temperature, **_domains(chunk))
                hidden = cap["hidden"]
                for b, it in enumerate(chunk):
                    n = len(it.tokens)
                    it.ref_logprobs = ref[b, :n].tolist()
                    it.feature = hidden[b, -(n + 1)].float().detach().clone()
                    if need_values:
                        it.value = float(self.value_head(it.feature.to(self.value_head.weight.dtype))[GEN_ROLES.index(role)])

    def _advantages(self, items: list[StepItem]) -> None:
        cfg = self.cfg
        trajs, members = [], []
        by_ep: dict[tuple, list[StepItem]] = {}
        for it in items:
            if it.reward is not None and it.tokens and not it.skip:
                by_ep.setdefault((it.ep, it.role), []).append(it)
        for (_, role), its in by_ep.items():
            its.sort(key=lambda i: i.step)
            values = [i.value if i.value is not None else 0.0 for i in its] if cfg.advantage == "gae" else None
            trajs.append(Trajectory(its[0].group, role, [i.reward for i in its], values))
            members.append(its)
        if trajs:  # the groups of `group` are whole on every rank (shares are whole tasks)
            advs, rets = self.estimator(trajs, cfg.editor_gamma, cfg.gae_lambda, cfg.group_scale)
            for its, a, r in zip(members, advs, rets):
                for i, ai, ri in zip(its, a, r):
                    i.advantage, i.ret = ai, ri
        if cfg.whiten_advantages:
            for role in GEN_ROLES:  # over the whole batch: every rank takes part, with or without items
                its = [i for i in items if i.role == role and i.advantage is not None]
                values = [i.advantage for i in its]
                white = whiten_over_ranks(values, self.coll) if self.coll.active else L.whiten(values)
                for i, w in zip(its, white):
                    i.advantage = w

    # ------------------------------------------------------------------ the update
    def _update(self, items: list[StepItem], judge_items: list[JudgeItem]) -> dict:
        """The batch's optimizer steps. Every loss term is a mean over the batch's items of one kind
        (on all ranks): a micro-batch's loss is weighted by its share of that batch-wide count, and
        the backend sums the ranks' gradients, so the step's gradient is the whole batch's."""
        cfg = self.cfg
        coll = self.coll
        for m in self.distinct:
            m.train()
        train = [it for it in items if it.advantage is not None and it.tokens]
        stats: dict[str, list[float]] = {}

        def add(key, value, n=1):
            stats.setdefault(key, []).extend([float(value)] * n)

        parts, part_of = self._parts(train, judge_items)
        stepped = False  # whether an optimizer step has moved the parameters in this update
        tokens_done = 0
        judge_scores: list[float] = []
        bar = self._progress(cfg.ppo_epochs * (sum(it.role in GEN_ROLES for it in train)
                                               + (len(judge_items) if cfg.use_judge else 0)),
                             "update (PPO and Judge losses)")
        for _epoch in range(cfg.ppo_epochs):
            for part in range(parts):
                part_items = [it for it in train if part_of(it) == part]
                part_judge = [j for j in judge_items if j.index % parts == part] if cfg.use_judge else []
                vals = ([it for it in part_items if it.feature is not None and it.ret is not None]
                        if cfg.advantage == "gae" else [])
                local = [sum(it.role == "actor" for it in part_items), sum(it.role == "editor" for it in part_items),
                         len(part_judge), len(vals)]
                n_actor, n_editor, n_judge, n_vals = coll.sum(local) if coll.active else local
                counts = {"actor": n_actor, "editor": n_editor}
                jobs = []
                for role, weight in (("actor", cfg.actor_weight), ("editor", cfg.editor_weight)):
                    its = [it for it in part_items if it.role == role]
                    jobs += [("ppo", role, weight * len(c) / counts[role], c) for c in _chunks(its, cfg.micro_batch_size)]
                jobs += [("judge", "judge", cfg.judge_weight * len(c) / n_judge, c)
                         for c in _chunks(part_judge, cfg.judge_micro_batch_size or cfg.micro_batch_size)]
                if vals:
                    jobs.append(("value", "value", cfg.value_weight * len(vals) / n_vals, vals))
                if not (n_actor or n_editor or n_judge or n_vals):
                    continue  # no rank has anything to learn from in this part
                self.backend.zero_grad()
                with self._prefix_block():  # a prefix's summed gradient reaches the parameters on leaving it
                    tokens_done = self._run_jobs(jobs, stepped, tokens_done, add, judge_scores, bar)
                add("grad_norm", self.backend.step())  # the same on every rank (the reduced gradient)
                stepped = True
                value_norm = getattr(self.backend, "last_value_grad_norm", None)
                if value_norm is not None:  # torch clips the value head apart (DeepSpeed: one global norm)
                    add("value_grad_norm", value_norm)
                self._forget_prefixes()
        bar.close()
        for m in self.distinct:  # the grammar masks the old-log-prob and PPO passes shared
            getattr(m, "forget_masks", lambda: None)()
        if coll.active:
            out = merge_weighted_means(stats, coll)
            out["update_tokens"] = coll.sum([tokens_done])[0]
        else:
            out = {k: sum(v) / len(v) for k, v in stats.items() if v}
            out["update_tokens"] = tokens_done
        skipped = getattr(self.backend, "skipped_steps", None)
        if skipped is not None:  # optimizer steps skipped so far for a non-finite gradient (torch backend)
            out["skipped_steps"] = float(skipped)
        return out

    @contextlib.contextmanager
    def _micro_heap(self):
        """Under ``lean_memory``, the micro-batches of a pass that trains take their blocks under
        ``lean_heap_mb`` MiB from glibc's heap, which is trimmed after each micro-batch and at the
        end, so that its free pages do not stay resident. With the threshold at 1 MiB every one of a
        micro-batch's many mid-sized blocks got fresh pages of its own, which cost more than its
        products (on 2 cores the update's passes took 1.3-1.4x as long). Yields the trim to call
        after a micro-batch (a no-op without ``lean_memory`` or with ``lean_heap_mb`` of 1 or less:
        the 1 MiB threshold of the passes that train stays)."""
        from omtr.rl.memory import MMAP_THRESHOLD, fix_mmap_threshold, trim_heap

        nbytes = int(self.cfg.lean_heap_mb * (1 << 20))
        if not self.cfg.lean_memory or nbytes <= MMAP_THRESHOLD:
            yield lambda: None
            return
        fix_mmap_threshold(nbytes)
        try:
            yield trim_heap
        finally:
            fix_mmap_threshold(MMAP_THRESHOLD)
            trim_heap()

    def _run_jobs(self, jobs: list, stepped: bool, tokens_done: int, add, judge_scores: list, bar) -> int:
        """One optimizer step's micro-batches, forward and backward; returns the tokens done so far."""
        with self._micro_heap() as trim:
            return self._jobs(jobs, stepped, tokens_done, add, judge_scores, bar, trim)

    def _jobs(self, jobs, stepped, tokens_done, add, judge_scores, bar, trim) -> int:
        cfg = self.cfg
        for j, (kind, role, weight, chunk) in enumerate(jobs):
            last = j == len(jobs) - 1
            before = tokens_done
            if j and jobs[j - 1][:2] != (kind, role):  # the previous role's micro-batches are done: its
                for m in self.distinct:                  # prefixes' gradient now, their memory freed
                    getattr(m, "flush_prefix_block", lambda: None)()
            if kind == "ppo":
                if stepped and any(it.old_pending for it in chunk):
                    raise RuntimeError("a step's old log-probs were left to the first optimizer step, but it "
                                       "is trained after it; --set reuse_first_logprobs=false")
                with self._precision():
                    loss, st = self._ppo_loss(role, chunk)
                tokens_done += st.pop("tokens")
                for k, v in st.items():
                    add(k, v, len(chunk))
            elif kind == "judge":
                with self._precision():
                    s = self.models["judge"].judge_scores([ji.prompt for ji in chunk])
                tokens_done += sum(len(x) for x in self.models["judge"].encode_prompts([ji.prompt for ji in chunk]))
                labels = torch.tensor([float(ji.label) for ji in chunk], device=s.device)
                loss, bce, band = L.judge_loss(s, labels, cfg.band_weight)
                judge_scores += s.detach().float().tolist()
                add("judge_loss", loss.item(), len(chunk))
                add("judge_bce", bce.item(), len(chunk))
                add("judge_band", band.item(), len(chunk))
            else:
                feats = torch.stack([it.feature for it in chunk]).to(self.value_head.weight.dtype)
                idx = torch.tensor([GEN_ROLES.index(it.role) for it in chunk], device=feats.device)
                v = self.value_head(feats).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
                target = torch.tensor([it.ret for it in chunk], dtype=v.dtype, device=v.device)
                loss = ((v - target) ** 2).mean()
                add("value_loss", loss.item(), len(chunk))
            # outside the autocast (torch's advice); checkpointed layers recompute in their forward's format
            self.backend.backward(loss * weight, last=last)
            if kind != "value":
                trim()
                bar.update(len(chunk), tokens=tokens_done - before)
        return tokens_done

    def _forget_prefixes(self) -> None:
        """Stored prompt prefixes are stale after a step (DeepSpeed may update parameters in
        ways their version counters do not see)."""
        for m in {id(m): m for m in self.models.values()}.values():
            getattr(m, "forget_prefixes", lambda: None)()
        for e in getattr(self, "engines", {}).values():
            e.mark_stale()  # the engine takes the new weights before the next rollout

    def _ppo_loss(self, role: str, chunk: list[StepItem]) -> tuple[torch.Tensor, dict]:
        cfg = self.cfg
        model = self.models[role]
        logp, mask = model.token_logprobs(role, [it.prompt for it in chunk], [it.tokens for it in chunk],
                                          temperature=cfg.temperature, **_domains(chunk))
        for b, it in enumerate(chunk):
            if it.old_pending:  # the parameters have not moved since the rollout: this pass is "old"
                self._take_old(it, logp[b, :len(it.tokens)].detach().tolist())
        old = _pad([it.old_logprobs for it in chunk], logp.shape[1], logp)
        # A token the policy's replayed masks refuse (-inf: the engine's scope rules and the replay's
        # parted ways) has no ratio; it is left out of the loss rather than turning it into NaN.
        scorable = torch.isfinite(logp.detach()) & torch.isfinite(old)
        unscorable = mask & ~scorable
        if bool(unscorable.any()):
            mask = mask & scorable
            logp = torch.where(scorable, logp, torch.zeros_like(logp))
            old = torch.where(scorable, old, torch.zeros_like(old))
        adv = torch.tensor([it.advantage for it in chunk], dtype=logp.dtype, device=logp.device)
        pg, clip_frac = L.ppo_clip_loss(logp, old, adv, mask, cfg.ppo_clip)
        loss = pg
        st = {f"{role}_pg_loss": pg.item(), f"{role}_clip_frac": clip_frac.item(),
              f"{role}_entropy": -L.seq_mean(logp.detach(), mask).item(),
              f"{role}_unscorable_share": float(unscorable.sum()) / max(1, int((mask | unscorable).sum()))}
        if all(it.ref_logprobs is not None for it in chunk):
            ref = _pad([it.ref_logprobs for it in chunk], logp.shape[1], logp)
            kl = L.seq_mean(L.kl_k3(logp, ref), mask)
            st[f"{role}_kl"] = kl.item()
            if cfg.kl_coef > 0:
                loss = loss + cfg.kl_coef * kl
        prompt_tokens = sum(len(p) for p in model.encode_prompts([it.prompt for it in chunk]))
        st["tokens"] = prompt_tokens + int(mask.sum())
        return loss, st

    # ------------------------------------------------------------------ the Judge on labelled data
    def judge_step(self, prompts: list, labels: list[bool]) -> float:
        """One optimizer step of L_J alone on fixed labelled data; returns the loss before the step."""
        self.backend.zero_grad()
        m = self.models["judge"]
        m.train()
        with self._precision():
            s = m.judge_scores(prompts)
        loss, _, _ = L.judge_loss(s, torch.tensor([float(b) for b in labels]), self.cfg.band_weight)
        self.backend.backward(loss, last=True)
        self.last_grad_norm = self.backend.step()
        self._forget_prefixes()
        return float(loss.detach())


# ---------------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def _capture_hidden(model):
    """Capture the decoder's last hidden states of the next forward pass (policy or reference), as
    a padded batch's [B, S, H] (right-aligned): a pass over packed rows puts them in the model's
    ``hidden_sink`` after its decoder's hook has seen the packed row."""
    cap: dict = {}
    hooks = []
    model.hidden_sink = cap
    for lm in (model.base_model, getattr(model, "_reference_lm", None)):
        if lm is None:
            continue
        decoder = getattr(lm, lm.base_model_prefix)

        def hook(mod, args, out):
            cap["hidden"] = out[0] if isinstance(out, tuple) else out.last_hidden_state

        hooks.append(decoder.register_forward_hook(hook))
    try:
        yield cap
    finally:
        model.hidden_sink = None
        for h in hooks:
            h.remove()


