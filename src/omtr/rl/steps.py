"""The batch's records: rollouts turned into rewarded steps, and dynamic sampling's group selection.

**Where the rewards are computed** (:func:`rewarded_items`): an outcome score (``binary`` or
``shaped``, :mod:`omtr.rl.rewards`) of each verdict; ``R_A = b0 + 0.3 s_J`` for the Actor's step
(``s_J`` only while the Judge gate is open); ``R_E = b_T - 0.1 T`` on the Editor's last step (0 on
its earlier ones). A verdict decided by a limit scores 0 (``limited_reward=zero``, the paper's b = 0)
or gets no reward (``skip``: logged, not trained on). The Actor's verdicts that no limit decided
become the Judge's labelled items.

A :class:`StepItem` carries one generated step through the rest of the update (old and reference
log-probabilities, value, advantage); :func:`select_groups` is dynamic sampling's choice of the
groups (a task's samples) whose returns differ, the only ones trained on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from omtr.inference import prompts as P
from omtr.inference.episode import Episode
from omtr.model.batching import alike_chunks, prompt_text
from omtr.rl.config import TrainConfig
from omtr.rl.negatives import mutants
from omtr.rl.recipe import groups_with_signal
from omtr.rl.rewards import actor_reward, editor_reward, outcome
from omtr.statement import statement_objects

GEN_ROLES = ("actor", "editor")


# ---------------------------------------------------------------------------------------- records

@dataclass
class StepItem:
    """One generated step, with everything the update needs."""

    ep: int  # episode number within the cycle
    group: tuple  # (update, task position): the samples of one task
    role: str
    step: int
    prompt: list
    tokens: list[int]
    old_logprobs: list[float]
    outcome: str
    limited: bool
    judge_score: float | None
    reward: float | None = None
    score: float | None = None  # the Actor's outcome score b0 alone (no Judge term); None for the Editor
    advantage: float | None = None
    ret: float | None = None
    value: float | None = None
    ref_logprobs: list[float] | None = None
    domain: str | None = None  # the task's given domain (domain-given mode): the masks replay with it
    objects: list | None = None  # the task statement's names (the scope rules'): the masks replay with them
    skip: bool = False  # dynamic sampling: its group carries no signal (rewarded and logged, not trained on)
    old_pending: bool = False  # its policy log-probs ("old") come from the update's first forward pass
    feature: torch.Tensor | None = field(default=None, repr=False)


@dataclass
class JudgeItem:
    prompt: list
    label: bool
    index: int = 0  # position among the batch's Judge items (all ranks), for the minibatch split


# ---------------------------------------------------------------------------------------- rewards

def step_scores(score: Callable, episodes: list[Episode], steps: list[tuple[int, object]]) -> list[float | None]:
    """The outcome score of each ``(episode position, step)`` pair, given every column a score may
    ask for by name (see :mod:`omtr.rl.rewards`)."""
    return score([s.text for _, s in steps], verdicts=[s.verdict for _, s in steps],
                 token_ids=[s.token_ids for _, s in steps], roles=[s.role for _, s in steps],
                 task_ids=[episodes[n].task.id for n, _ in steps], nls=[episodes[n].task.nl for n, _ in steps],
                 problems=[s.problem for _, s in steps], domains=[s.domain for _, s in steps])


def rewarded_items(episodes: list[Episode], first: int, cfg: TrainConfig, score: Callable, update: int, *,
                   judge_term: bool | None = None, judge_checks: bool = False) -> tuple[list[StepItem], list[JudgeItem]]:
    """The episodes' steps with their rewards (``R_A`` with ``s_J`` when ``judge_term``, default
    ``use_judge``), numbered from ``first``, grouped by (``update``, task position); and the Judge's
    labelled Actor specs. ``score`` is the outcome score. A verdict decided by a limit scores 0
    (``limited_reward=zero``, the paper) or nothing (``skip``). ``judge_checks``: the Judge's prompts
    show the annotation-free checks (the Judge model's ``judge_checks``, as every door asks)."""
    if judge_term is None:
        judge_term = cfg.use_judge
    steps = [(n, s) for n, ep in enumerate(episodes) for s in ep.steps]
    scores = step_scores(score, episodes, steps)
    if cfg.limited_reward == "zero":
        scores = [0.0 if sc is None and s.verdict.limited else sc for (_, s), sc in zip(steps, scores)]
    score_of = {(n, s.index): sc for (n, s), sc in zip(steps, scores)}
    items: list[StepItem] = []
    judge_items: list[JudgeItem] = []
    for n, ep in enumerate(episodes):
        group = (update, (first + n) // cfg.samples_per_task)
        prev = None
        T = len(ep.steps) - 1
        r_e = editor_reward(score_of[(n, T)], T, cfg.editor_step_penalty) if T > 0 else None
        given = ep.mode == "domain-given"
        for s in ep.steps:
            if s.role == "actor":
                prompt = P.actor_messages(ep.task)
                reward = actor_reward(score_of[(n, 0)], s.judge_score if judge_term else None,
                                      cfg.judge_reward_weight)
                if cfg.use_judge and not s.verdict.limited:
                    # The Judge's target: the outcome score counts the spec in full (under `supported`,
                    # solved with the signals' support), or the planner's bare verdict (the paper).
                    label = (s.verdict.success if cfg.judge_target == "verdict"
                             else bool(s.verdict.success and (score_of[(n, 0)] or 0.0) >= 1.0))
                    judge_items.append(JudgeItem(
                        P.judge_messages(ep.task, P.spec_text(s.domain, s.problem, s.text, given=given),
                                         checks=judge_checks, domain=s.domain, problem=s.problem), label))
                    if label and cfg.judge_negatives and s.domain and s.problem:
                        # the same spec with one edit that makes it say what the English does not
                        rng = random.Random(f"{cfg.seed}:{update}:{first + n}")
                        for _, wrong in mutants(s.domain, s.problem, rng, k=cfg.judge_negatives):
                            text = s.text.replace(s.problem, wrong) if s.problem in s.text else wrong
                            judge_items.append(JudgeItem(
                                P.judge_messages(ep.task, P.spec_text(s.domain, wrong, text, given=given),
                                                 checks=judge_checks, domain=s.domain, problem=wrong), False))
            else:
                spec = P.spec_text(prev.domain, prev.problem, prev.text, given=given)
                cat = prev.verdict.category.value if prev.verdict.category else None
                prompt = P.editor_messages(ep.task, spec, cat, prev.verdict.message)
                reward = None if r_e is None else (r_e if s.index == T else 0.0)
            items.append(StepItem(ep=first + n, group=group, role=s.role, step=s.index, prompt=prompt,
                                  tokens=list(s.token_ids), old_logprobs=list(s.logprobs),
                                  domain=ep.task.domain, objects=statement_objects(ep.task.nl),
                                  outcome=outcome(s.verdict), limited=s.verdict.limited,
                                  judge_score=s.judge_score, reward=reward,
                                  score=score_of[(n, 0)] if s.role == "actor" else None))
            prev = s
    return items, judge_items


# ---------------------------------------------------------------------------------------- dynamic sampling

def select_groups(items: list[StepItem], want: int) -> set:
    """Up to ``want`` groups (in rollout order) whose samples' outcome scores differ for some role.

    The Actor's signal is its outcome score ``b0`` alone, not ``R_A``: within a group whose specs
    all scored the same, the Judge's term is all the return varies by, and group normalisation
    would blow its small differences up to unit-size advantages, training the Actor to please
    the Judge instead of the planner (a run with the nontrivial reward drifted that way into
    specs with empty plans, which the Judge scores high and the reward scores 0)."""
    returns: dict[tuple, float] = {}
    for it in items:
        value = it.reward if it.score is None else it.score  # the Editor's: its return
        if it.reward is not None and it.tokens and value is not None:
            returns[(it.role, it.group, it.ep)] = returns.get((it.role, it.group, it.ep), 0.0) + value
    signal = groups_with_signal(((role, g), ret) for (role, g, _), ret in returns.items())
    groups = list(dict.fromkeys(it.group for it in items))
    return set([g for g in groups if any((role, g) in signal for role in GEN_ROLES)][:max(0, want)])


# ---------------------------------------------------------------------------------------- batch helpers

def _domains(chunk: list[StepItem]) -> dict:
    """``domains=`` (when a step of the chunk had a given domain) and ``objects=`` (the statements'
    names) for token log-probs: the masks (problem-only grammar, scoped to the domain and the
    names) replay as they were sampled."""
    kw = {}
    if any(it.domain is not None for it in chunk):
        kw["domains"] = [it.domain for it in chunk]
    if any(it.objects for it in chunk):
        kw["objects"] = [it.objects for it in chunk]
    return kw


def _pad(rows: list[list[float]], length: int, like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((len(rows), length), dtype=like.dtype, device=like.device)
    for b, r in enumerate(rows):
        if r:
            out[b, :len(r)] = torch.tensor(r[:length], dtype=like.dtype)
    return out


def _chunks(xs: list, n: int):
    """Micro-batches of at most ``n`` items, alike prompts together (:func:`omtr.model.batching.alike_chunks`:
    the samples of one task share their prompt, or most of it, which the forward pass computes once),
    and within them rows of about one length (a step's completion tokens, a Judge item's prompt), so
    that little of a micro-batch is padding."""
    texts = [prompt_text(x.prompt) for x in xs]
    lengths = [len(x.tokens) if hasattr(x, "tokens") else len(t) for x, t in zip(xs, texts)]
    return [[xs[i] for i in c] for c in alike_chunks(texts, n, lengths=lengths)]

