"""The contract between the episode loop and whatever writes specs: :class:`Policy`.

The episode loop (``omtr.inference.episode``) never touches a language model directly. It asks a
policy for text in one of three roles and for Judge scores; the role model in ``omtr.model``
implements this protocol, and so do scripted policies in tests and (later) LLM backends.

Prompts are chat messages (``[{"role": "system"|"user"|"assistant", "content": str}, ...]``);
the policy applies its own chat template.

Shared vocabulary, below every room that uses it: the episode loop (``omtr.inference``) asks through
it, and the role model (``omtr.model``) and the rollout engines (``omtr.rollout``) answer in it, so
this module imports nothing of omtr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

ROLES = ("actor", "judge", "editor")

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Sampling:
    """How to decode: greedy (evaluation) or temperature + nucleus sampling (training)."""

    greedy: bool = True
    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 768
    seed: int | None = None
    # A PDDL answer under omtr's decoder may take more than max_new_tokens where its task's statement
    # needs it (omtr.model.grammar.answer_tokens: names and clauses); False keeps the limit fixed.
    fit_statement: bool = True


class ContextOverflow(ValueError):
    """A prompt with the answer its task needs does not fit the model's context. ``row``: the
    prompt's index in its batch (the episode loop names the task)."""

    def __init__(self, message: str, row: int | None = None):
        super().__init__(message)
        self.row = row


@dataclass
class Generation:
    """One sequence a policy wrote, with what PPO and the trace need."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    # Log-probabilities of the sampled tokens under the distribution that was sampled
    # (the grammar-constrained one when a grammar is on); same length as token_ids.
    logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    finish_reason: str = "stop"  # stop (spec complete / EOS) | length (token limit)
    timings: dict[str, float] = field(default_factory=dict)  # ms: prefill_ms, decode_ms, ...


@runtime_checkable
class Policy(Protocol):
    """What the episode loop needs from a model."""

    def generate(
        self,
        role: str,
        prompts: Sequence[Messages],
        sampling: Sampling,
        *,
        stop_when: Callable[[str], bool] | None = None,
        domains: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        """One generation per prompt, in order. ``role`` is ``actor`` or ``editor``.

        ``stop_when(text_so_far)`` returning True ends that sequence early (e.g. once both the
        domain and the problem block are closed). ``domains`` (the domain-given mode; the loop
        passes it only there) holds each prompt's given domain: the answer is then a problem for
        that domain alone, which a constrained decoder may scope to the domain's names. A policy
        with ``routes_by_id = True`` also gets ``task_ids=`` (each prompt's task id), beside
        ``domains`` in a domain-given batch; one with ``takes_objects = True`` gets ``objects=``
        (the names each prompt's task statement uses, :func:`omtr.statement.statement_objects`,
        None where it names none), which omtr's scoped decoder makes the problem declare."""
        ...

    def judge(self, prompts: Sequence[Messages]) -> list[float]:
        """The Judge's probability in [0, 1] that the planner accepts each (task, spec)."""
        ...
