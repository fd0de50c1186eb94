"""Result cache keyed by a normalised hash of the spec.

The key ignores whitespace, comments and case (PDDL is case-insensitive), and includes the
settings that change the answer (search, limits, validation). In memory (LRU) and optionally in
a SQLite file shared by processes. Verdicts caused by resource limits are never cached: they
depend on the machine's load, not on the spec.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import OrderedDict

from omtr.config import SolverConfig
from omtr.solver.verdict import Verdict

_TOKENS = re.compile(r";[^\n]*|\(|\)|[^\s();]+")


def normalise(text: str) -> str:
    return " ".join(t for t in _TOKENS.findall(text.lower()) if t[0] != ";")


def spec_key(domain: str, problem: str, cfg: SolverConfig) -> str:
    h = hashlib.sha256()
    for part in (normalise(domain), normalise(problem), cfg.search, repr(cfg.time_limit_s),
                 str(cfg.memory_limit_mb), str(cfg.validate)):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def exact_key(domain, problem, cfg: SolverConfig) -> str:
    """Key of the byte-identical spec (any input type); lets a repeat skip lint entirely."""
    h = hashlib.sha256(b"exact\x00")
    for part in (domain, problem):
        if isinstance(part, str):
            part = part.encode("utf-8", "surrogatepass")
        elif not isinstance(part, (bytes, bytearray)):
            part = repr(part).encode()
        h.update(hashlib.sha256(part).digest())
    for part in (cfg.search, repr(cfg.time_limit_s), str(cfg.memory_limit_mb), str(cfg.validate),
                 str(cfg.max_file_bytes), str(cfg.max_nesting)):
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()


def cacheable(v: Verdict) -> bool:
    return not v.limited


class ResultCache:
    def __init__(self, max_entries: int = 100_000, cache_dir: str | None = None):
        self.max_entries = max_entries
        self._mem: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.Lock()
        self._db_path = None
        self.hits = self.misses = 0
        if cache_dir:
            os.makedirs(cache_dir, exist_ok=True)
            self._db_path = os.path.join(cache_dir, "verdicts.sqlite")
            with self._connect() as db:
                db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, verdict TEXT NOT NULL)")

    def _connect(self):
        import sqlite3  # only for the on-disk cache

        db = sqlite3.connect(self._db_path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def get(self, key: str) -> Verdict | None:
        with self._lock:
            d = self._mem.get(key)
            if d is not None:
                self._mem.move_to_end(key)
        if d is None and self._db_path:
            with self._connect() as db:
                row = db.execute("SELECT verdict FROM verdicts WHERE key = ?", (key,)).fetchone()
            if row:
                d = json.loads(row[0])
                self._remember(key, d)
        if d is None:
            self.misses += 1
            return None
        self.hits += 1
        v = Verdict.from_json(d)
        v.cached = True
        return v

    def put(self, key: str, v: Verdict) -> None:
        if not cacheable(v):
            return
        d = v.to_json()
        d["cached"] = False
        self._remember(key, d)
        if self._db_path:
            with self._connect() as db:
                db.execute("INSERT OR REPLACE INTO verdicts (key, verdict) VALUES (?, ?)", (key, json.dumps(d)))

    def _remember(self, key: str, d: dict) -> None:
        if self.max_entries == 0:
            return
        with self._lock:
            self._mem[key] = d
            self._mem.move_to_end(key)
            while len(self._mem) > self.max_entries:
                self._mem.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._mem.clear()
        if self._db_path:
            with self._connect() as db:
                db.execute("DELETE FROM verdicts")

    def __len__(self) -> int:
        return len(self._mem)
