"""Typed configuration. Every number taken from the paper is a default here, in one place.

Profiles (``tiny``, ``paper``) are instances of these dataclasses; commands take a profile and
override single fields from their flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says how to fix it."""


@dataclass(frozen=True)
class SolverConfig:
    """Limits and search of the solver-grounded environment E(y)."""

    time_limit_s: float = field(
        default=60.0,
        metadata={"help": "CPU-time limit of one planner call in seconds (paper: 60 s)."},
    )
    memory_limit_mb: int = field(
        default=4096,
        metadata={"help": "Address-space limit of each planner process in MiB."},
    )
    search: str = field(
        default="lama-first",
        metadata={
            "help": "A Fast Downward alias (e.g. lama-first, seq-opt-lmcut) or a raw search "
            "string such as 'astar(lmcut())'."
        },
    )
    wall_clock_slack_s: float = field(
        default=5.0,
        metadata={"help": "Wall-clock allowance on top of the CPU limit before the process group is killed."},
    )
    max_file_bytes: int = field(
        default=256 * 1024,
        metadata={"help": "Largest accepted domain or problem file in bytes (larger: a syntax verdict)."},
    )
    max_nesting: int = field(
        default=64,
        metadata={"help": "Deepest accepted parenthesis nesting (deeper: a syntax verdict)."},
    )
    validate: bool = field(
        default=True,
        metadata={"help": "Confirm every plan with VAL; success requires it."},
    )
    cache: bool = field(default=True, metadata={"help": "Answer repeated specs from the result cache."})
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Directory of the on-disk result cache (None: memory only)."},
    )
    cache_max_entries: int = field(
        default=100_000, metadata={"help": "Entries kept in the in-memory cache (LRU)."}
    )

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ConfigError(f"time_limit_s must be positive, got {self.time_limit_s}; e.g. 60")
        if self.memory_limit_mb < 64:
            raise ConfigError(
                f"memory_limit_mb={self.memory_limit_mb} is too small for the planner; use at least 64"
            )
        if not self.search or not self.search.strip():
            raise ConfigError("search must name a Fast Downward alias or a search string, e.g. lama-first")
        if self.wall_clock_slack_s < 0:
            raise ConfigError("wall_clock_slack_s must be >= 0")
        if self.max_file_bytes < 1024:
            raise ConfigError("max_file_bytes must be at least 1024")
        if self.max_nesting < 8:
            raise ConfigError("max_nesting must be at least 8 (PDDL needs a few levels)")
        if self.cache_max_entries < 0:
            raise ConfigError("cache_max_entries must be >= 0")

    def replace(self, **changes) -> "SolverConfig":
        """A copy with some fields changed; ``None`` values are ignored (unset CLI flags)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class EpisodeConfig:
    """Numbers of the Actor -> Judge -> Editor episode (paper, Algorithm 1 and appendix A.4)."""

    max_repairs: int = 5  # H_max: Editor turns after the Actor's first spec
    judge_reward_weight: float = 0.3  # R_A = b0 + 0.3 * s_J
    editor_step_penalty: float = 0.1  # R_E = b_T - 0.1 * T
    train_temperature: float = 0.7

    @property
    def planner_call_budget(self) -> int:
        """K = H_max + 1 planner calls per task."""
        return self.max_repairs + 1


PROFILES: dict[str, dict[str, object]] = {
    # Small, fast limits for CPU machines and CI.
    "tiny": {"solver": SolverConfig(time_limit_s=20.0, memory_limit_mb=2048)},
    # The paper's settings.
    "paper": {"solver": SolverConfig()},
}


def solver_profile(name: str = "paper") -> SolverConfig:
    try:
        return PROFILES[name]["solver"]  # type: ignore[return-value]
    except KeyError:
        raise ConfigError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}") from None
