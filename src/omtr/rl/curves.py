"""The training-curve figure (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("success and rewards", ("success_rate", "actor_success_rate", "reward_actor", "reward_editor", "mean_ladder_actor")),
    ("Judge", ("judge_loss", "judge_bce", "judge_ece", "judge_brier", "judge_auc")),
    ("policy", ("actor_kl", "editor_kl", "actor_clip_frac", "actor_entropy")),
    ("throughput (tokens/s)", ("rollout_tokens_per_s", "update_tokens_per_s")),
)


def training_curve(history: list[dict], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.4))
    xs = [h["update"] for h in history]
    for ax, (title, keys) in zip(axes, PANELS):
        for k in keys:
            pts = [(x, h[k]) for x, h in zip(xs, history) if k in h]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=k)
        ax.set_title(title)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)
    return path
