"""Environment wrappers shared by the episode-loop tests."""

from __future__ import annotations


class CountingEnv:
    """The real pool, with a record of every batch of specs it was sent."""

    def __init__(self, pool):
        self.pool, self.batches = pool, []

    def solve_many(self, specs):
        self.batches.append(len(specs))
        return self.pool.solve_many(specs)
