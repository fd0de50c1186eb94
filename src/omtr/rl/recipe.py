"""The small-model recipe's pure parts: which groups carry signal, when the Judge's term is trusted,
and which tasks the curriculum admits. No model, no planner: plain data in, plain data out, so each
rule is tested on hand-made numbers (``tests/test_rl_recipe.py``).

* **Dynamic sampling** (DAPO): a group whose samples all got the same return gives every sample a
  zero group advantage, so it adds nothing to the gradient but cost. :func:`groups_with_signal`
  names the groups worth training on; the trainer rolls out replacement tasks for the others.
* **The Judge gate**: ``R_A = b0 + w * s_J`` only helps once ``s_J`` separates accepted from
  rejected specs. :class:`JudgeGate` keeps the Judge's scores and the planner's labels of the last
  few updates and opens when their AUC is above a threshold (0: always open, the paper).
* **The curriculum** by object count: :class:`Curriculum` admits tasks up to a cap on
  ``meta["n_objects"]`` and raises the cap one level when the rollouts of the tasks at the cap
  succeed often enough.

Every piece has a ``state_dict`` so a resumed run continues with the same gate and cap.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

from omtr.telemetry import binary_auc


def groups_with_signal(returns: Iterable[tuple[Hashable, float]], *, tol: float = 1e-9) -> set:
    """The groups (keys) whose returns are not all equal (within ``tol``): those whose normalised
    group advantages are not all zero. A group of one sample never carries signal."""
    seen: dict[Hashable, tuple[float, float, int]] = {}
    for key, r in returns:
        lo, hi, n = seen.get(key, (r, r, 0))
        seen[key] = (min(lo, r), max(hi, r), n + 1)
    return {k for k, (lo, hi, n) in seen.items() if n > 1 and hi - lo > tol}


class JudgeGate:
    """Opens the Judge's term in the Actor's reward once the Judge separates success from failure.

    ``observe(scores, labels)`` adds one update's Actor specs (the Judge's score, the planner's
    verdict); the gate looks at the last ``window`` updates. With ``threshold <= 0`` it is always open
    (the paper's reward); otherwise it is open only when both labels occur in the window and the AUC
    is above ``threshold``."""

    def __init__(self, threshold: float, window: int = 3):
        if window < 1:
            raise ValueError("the Judge gate's window must be at least 1 update")
        self.threshold = float(threshold)
        self.window = int(window)
        self.batches: list[tuple[list[float], list[bool]]] = []

    def observe(self, scores: Sequence[float], labels: Sequence[bool]) -> None:
        if len(scores) != len(labels):
            raise ValueError(f"{len(scores)} Judge scores for {len(labels)} labels")
        self.batches.append(([float(s) for s in scores], [bool(y) for y in labels]))
        del self.batches[:-self.window]

    def auc(self) -> float | None:
        ps = [p for b in self.batches for p in b[0]]
        ys = [y for b in self.batches for y in b[1]]
        return binary_auc(ps, ys) if ps else None

    @property
    def open(self) -> bool:
        if self.threshold <= 0:
            return True
        auc = self.auc()
        return auc is not None and auc > self.threshold

    def state_dict(self) -> dict:
        return {"batches": [[list(s), list(y)] for s, y in self.batches]}

    def load_state_dict(self, state: dict) -> None:
        self.batches = [(list(s), list(y)) for s, y in state.get("batches", [])][-self.window:]


def balanced_sample(items: Sequence, k: int, rng) -> list:
    """At most ``k`` of ``items`` (each with a boolean ``label``), as many of each label as there
    are up to half of ``k``, the rest filled from the larger class; in their original order.
    The Judge's loss on every Actor spec of a batch costs a forward and backward pass over a whole
    prompt each; a balanced subset keeps its signal at a fraction of the cost."""
    if len(items) <= k:
        return list(items)
    pos = [i for i, it in enumerate(items) if it.label]
    neg = [i for i, it in enumerate(items) if not it.label]
    take_pos = min(len(pos), max(k // 2, k - len(neg)))
    take_neg = min(len(neg), k - take_pos)
    chosen = set(rng.sample(pos, take_pos)) | set(rng.sample(neg, take_neg))
    return [it for i, it in enumerate(items) if i in chosen]


def object_count(task) -> int | None:
    """The task's object count from its training meta (``n_objects``, else ``size``), or None."""
    meta = getattr(task, "meta", None) or {}
    for key in ("n_objects", "size"):
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None


class Curriculum:
    """Tasks admitted by object count, smallest first.

    The levels are the distinct object counts of the training tasks. The cap starts at the largest
    level not above ``start`` (the smallest level if every task is larger) and rises one level when
    ``observe`` sees a rollout success rate of at least ``advance_at`` on tasks at the cap. Tasks
    without an object count are admitted from the start. ``enabled=False`` admits everything."""

    def __init__(self, tasks: Sequence, *, enabled: bool, start: int = 2, advance_at: float = 0.5):
        self.enabled = bool(enabled)
        self.advance_at = float(advance_at)
        self.levels = sorted({c for c in (object_count(t) for t in tasks) if c is not None})
        below = [lv for lv in self.levels if lv <= start]
        self.cap = (below[-1] if below else (self.levels[0] if self.levels else None))

    @property
    def final(self) -> bool:
        return not self.enabled or self.cap is None or self.cap == self.levels[-1]

    def admits(self, task) -> bool:
        if not self.enabled or self.cap is None:
            return True
        c = object_count(task)
        return c is None or c <= self.cap

    def eligible(self, tasks: Sequence) -> list:
        return [t for t in tasks if self.admits(t)]

    def observe(self, results: Iterable[tuple[int | None, bool]]) -> bool:
        """``results``: (object count, success) per rollout episode (:func:`object_count` of its
        task). Raises the cap by one level when the episodes at the cap succeed at ``advance_at`` or
        more; returns whether it rose."""
        if self.final:
            return False
        at_cap = [bool(ok) for c, ok in results if c == self.cap]
        if not at_cap or sum(at_cap) / len(at_cap) < self.advance_at:
            return False
        self.cap = self.levels[self.levels.index(self.cap) + 1]
        return True

    def state_dict(self) -> dict:
        return {"cap": self.cap}

    def load_state_dict(self, state: dict) -> None:
        cap = state.get("cap", self.cap)
        self.cap = cap if (cap is None or cap in self.levels) else self.cap


class CollapseGuard:
    """What a majority-style reward can do to a policy, watched per update.

    Rewards that favour what most samples agree on sharpen what the model already believes and can
    collapse to one confident wrong answer. For every task of an update, ``observe`` clusters its
    samples' solved specs by equivalence (``clusters_fn``, :func:`omtr.faithfulness.signals.clusters`)
    and reports:

    * ``top_cluster_share``: the largest cluster's size over the task's samples (mean over tasks);
      near 1 everywhere means the samples have stopped differing;
    * ``clusters_per_task``: distinct solved problems per task (mean);
    * ``top_cluster_changed``: of the tasks seen in an earlier update, the share whose largest
      cluster now states another problem than it did then (``eq`` decides).

    The last top cluster of each task is kept in memory (not in checkpoints: a resumed run starts
    the comparison afresh)."""

    def __init__(self, clusters_fn=None, eq=None):
        if clusters_fn is None or eq is None:
            from omtr.faithfulness.signals import clusters, equivalent

            clusters_fn, eq = clusters_fn or clusters, eq or equivalent
        self.clusters_fn, self.eq = clusters_fn, eq
        self.top: dict = {}

    def observe(self, groups: dict) -> dict[str, float]:
        """``groups``: task id -> its samples' specs (``(domain, problem)``, None for an unsolved one)."""
        shares, counts, changed = [], [], []
        for task, specs in groups.items():
            if not specs:
                continue
            ids = self.clusters_fn(specs)
            sizes: dict[int, int] = {}
            for k in ids:
                if k is not None:
                    sizes[k] = sizes.get(k, 0) + 1
            counts.append(len(sizes))
            if not sizes:
                shares.append(0.0)
                continue
            best = max(sizes, key=lambda k: (sizes[k], -k))
            shares.append(sizes[best] / len(specs))
            rep = specs[ids.index(best)]
            if task in self.top:
                changed.append(0.0 if self.eq(self.top[task], rep) else 1.0)
            self.top[task] = rep
        out: dict[str, float] = {}
        if shares:
            out["top_cluster_share"] = sum(shares) / len(shares)
            out["clusters_per_task"] = sum(counts) / len(counts)
        if changed:
            out["top_cluster_changed"] = sum(changed) / len(changed)
        return out
