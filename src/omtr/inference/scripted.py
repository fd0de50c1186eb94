"""A scripted policy: fixed answers per task, replayed in order. For tests and for users.

Each task has a script: the Actor's answer, then the Editor's answers in order (the last one is
repeated if the Editor is asked more often). The task is recognised by its NL text in the prompt,
so the same prompts the role model would see drive the script. ``stop_when`` is honoured line by
line, as a decoder would stop once the spec is complete.

From the command line: ``omtr infer --model scripted:ANSWERS.jsonl``, one line per task::

    {"id": "bw-1", "texts": ["<Actor's answer>", "<first repair>", ...], "score": 0.8}

A script may also hold ``"samples"``: the Actor's answers when it is asked to *sample* (``Sampling``
with ``greedy=False``, as ``--select invariants`` asks after the greedy answer), served in order and
the last one repeated; without them a sampled Actor answers as a greedy one does (``texts[0]``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from omtr.jsonl import JsonlError, read_jsonl
from omtr.policy import Generation, Messages, Sampling


class PolicyLoadError(ValueError):
    """A ``--model`` value that cannot be turned into a policy; the message says why."""


class ScriptedPolicy:
    """Deterministic :class:`~omtr.policy.Policy` returning given texts per call."""

    def __init__(self, scripts: Mapping[str, Sequence[str]], *, scores: Mapping[str, float] | None = None,
                 default_score: float = 0.5, samples: Mapping[str, Sequence[str]] | None = None):
        """``scripts``, ``scores`` and ``samples`` (the sampled Actor's answers) are keyed by the task's NL text."""
        self.scripts = {nl: list(texts) for nl, texts in scripts.items()}
        self.samples = {nl: list(texts) for nl, texts in (samples or {}).items() if texts}
        self._drawn: dict[str, int] = defaultdict(int)
        self.scores = dict(scores or {})
        self.default_score = default_score
        self.calls: list[tuple[str, list[Messages]]] = []  # every generate/judge call, for tests
        self.domains: list[list[str | None] | None] = []  # the given domains of each generate call
        self._edits: dict[str, int] = defaultdict(int)
        self._by_length = sorted(self.scripts, key=len, reverse=True)

    @classmethod
    def for_tasks(cls, tasks: Iterable, scripts_by_id: Mapping[str, Sequence[str]], *,
                  scores_by_id: Mapping[str, float] | None = None, default_score: float = 0.5,
                  samples_by_id: Mapping[str, Sequence[str]] | None = None) -> "ScriptedPolicy":
        nl_of = {t.id: t.nl for t in tasks}
        unknown = sorted((set(scripts_by_id) | set(samples_by_id or {})) - set(nl_of))
        if unknown:
            raise PolicyLoadError(f"scripts for unknown task ids {unknown[:5]}")
        return cls({nl_of[i]: texts for i, texts in scripts_by_id.items()},
                   scores={nl_of[i]: s for i, s in (scores_by_id or {}).items() if i in nl_of},
                   default_score=default_score,
                   samples={nl_of[i]: texts for i, texts in (samples_by_id or {}).items()})

    @classmethod
    def from_jsonl(cls, path: str | Path, tasks: Iterable) -> "ScriptedPolicy":
        """Read ``{"id", "texts": [...], "score"?}`` lines; ids must be tasks' ids."""
        p = Path(path)
        if not p.is_file():
            raise PolicyLoadError(f"scripted answers file {p} does not exist")
        scripts, scores, samples = {}, {}, {}
        try:
            for n, rec in read_jsonl(p, what="scripted answers file"):
                texts = rec.get("texts")
                if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts) \
                        or not isinstance(rec.get("id"), str):
                    raise PolicyLoadError(f'{p}:{n}: expected {{"id": "...", "texts": ["<answer>", ...]}}')
                scripts[rec["id"]] = texts
                drawn = rec.get("samples")
                if drawn is not None:
                    if not isinstance(drawn, list) or not all(isinstance(t, str) for t in drawn):
                        raise PolicyLoadError(f'{p}:{n}: "samples" must be a list of answers (strings)')
                    samples[rec["id"]] = drawn
                if isinstance(rec.get("score"), (int, float)):
                    scores[rec["id"]] = float(rec["score"])
        except JsonlError as exc:
            raise PolicyLoadError(str(exc)) from None
        return cls.for_tasks(tasks, scripts, scores_by_id=scores, samples_by_id=samples)

    # ------------------------------------------------------------------ Policy
    def _task_of(self, prompt: Messages) -> str | None:
        last = next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")
        if last in self.scripts:
            return last
        return next((nl for nl in self._by_length if nl in last), None)

    def generate(self, role: str, prompts: Sequence[Messages], sampling: Sampling, *,
                 stop_when: Callable[[str], bool] | None = None,
                 domains: Sequence[str | None] | None = None) -> list[Generation]:
        self.calls.append((role, list(prompts)))
        self.domains.append(list(domains) if domains is not None else None)
        out = []
        for prompt in prompts:
            key = self._task_of(prompt)
            texts = self.scripts.get(key, [""]) if key is not None else [""]
            if role == "actor":
                self._edits[key] = 0
                text = texts[0]
                drawn = self.samples.get(key) if key is not None and not sampling.greedy else None
                if drawn:  # a sampled Actor: the script's samples in order, the last one repeated
                    text = drawn[min(self._drawn[key], len(drawn) - 1)]
                    self._drawn[key] += 1
            else:
                self._edits[key] += 1
                text = texts[min(self._edits[key], len(texts) - 1)]
            text, reason = _cut(text, stop_when)
            pieces = text.split()
            out.append(Generation(
                text=text, token_ids=list(range(len(pieces))), logprobs=[0.0] * len(pieces),
                prompt_tokens=sum(len(m["content"].split()) for m in prompt), finish_reason=reason,
            ))
        return out

    def judge(self, prompts: Sequence[Messages]) -> list[float]:
        self.calls.append(("judge", list(prompts)))
        return [self.scores.get(self._task_of(p), self.default_score) for p in prompts]


def _cut(text: str, stop_when: Callable[[str], bool] | None) -> tuple[str, str]:
    """The text up to the line where ``stop_when`` first holds (as an early-stopping decoder)."""
    if stop_when is None:
        return text, "stop"
    lines = text.splitlines(keepends=True)
    acc = ""
    for line in lines:
        acc += line
        if stop_when(acc):
            return acc, "stop"
    return text, "stop"
