"""Episode logs (one parquet row per role step) and their Great Expectations suite.

Importing this package is cheap: pandas, pyarrow and Great Expectations load on first use.
"""

from omtr.validation.episodes import (
    EPISODE_COLUMNS,
    EpisodeLogError,
    EpisodeValidation,
    Failure,
    read_episode_log,
    rows_from_traces,
    validate_episode_log,
    write_episode_log,
)

__all__ = [
    "EPISODE_COLUMNS",
    "EpisodeLogError",
    "EpisodeValidation",
    "Failure",
    "read_episode_log",
    "rows_from_traces",
    "validate_episode_log",
    "write_episode_log",
]
