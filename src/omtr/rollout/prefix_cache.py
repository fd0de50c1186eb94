"""A prefix cache: keys and values of prompt-token blocks, kept by the prefix they extend.

The way of vLLM's automatic prefix caching and SGLang's RadixAttention, for one CPU engine: a
prompt's tokens are cut into blocks of ``block`` tokens from its start; a cached block holds the
keys and values of its tokens *given every token before it*, so it is found by walking a tree
from the root, one child per block of tokens (a radix tree of blocks, one tree per namespace:
each role has its own, its role vectors precede every prompt). Any later prompt that starts with
the same blocks, in the same batch or a later call, finds them and computes only what follows.

Rules:

- Only full blocks are kept (a block's keys and values must come from the same computation
  whoever asks for it: :class:`omtr.rollout.fast.FastEngine` computes every prompt prefix in
  block-aligned chunks, cache or not, so a cached block is bit for bit what it would compute).
- Bounded: ``capacity_bytes``; when a new block does not fit, the least recently used leaf blocks
  go first (a block is used when a prompt walks through it; a parent is never used less recently
  than its children, so leaves go first and a path is never cut in the middle). Blocks pinned by
  a walk in progress (:meth:`pin`) are not evicted.
- A bound too small for one block caches nothing (and says so once, in the log).
- :meth:`clear` drops everything: the keys and values depend on the weights (the engine clears
  its cache on every refresh).

The payload of a block is opaque here (whatever the engine stores; its size is given).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

log = logging.getLogger("omtr.rollout")


class Node:
    """One cached block: its tokens, the payload (keys and values), its children by their tokens."""

    __slots__ = ("tokens", "parent", "children", "payload", "nbytes", "last_used", "refs", "depth")

    def __init__(self, tokens: tuple[int, ...], parent: "Node | None", payload: Any = None, nbytes: int = 0):
        self.tokens = tokens
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.payload = payload
        self.nbytes = nbytes
        self.last_used = 0
        self.refs = 0
        self.depth = 0 if parent is None else parent.depth + 1  # blocks from the root (the root: 0)


@dataclass
class CacheStats:
    """Counters since the cache was made (tokens are prompt tokens of full blocks)."""

    lookups: int = 0
    hit_tokens: int = 0  # tokens whose keys and values were found
    missed_tokens: int = 0  # tokens of full blocks that were looked up and not found
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    refused_blocks: int = 0  # blocks not kept: the bound was too small or everything else pinned
    cleared: int = 0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "extra"} | self.extra


class PrefixCache:
    """A radix tree of token blocks with an LRU eviction order and a byte bound (see the module doc)."""

    def __init__(self, block: int, capacity_bytes: int):
        if block < 1:
            raise ValueError(f"a prefix cache block holds at least 1 token, got {block}")
        if capacity_bytes < 0:
            raise ValueError(f"the prefix cache bound must be 0 bytes or more, got {capacity_bytes}")
        self.block = block
        self.capacity = capacity_bytes
        self.roots: dict[Hashable, Node] = {}
        self.bytes = 0
        self.blocks = 0
        self._tick = 0
        self._warned = False
        self.stats = CacheStats()

    # ------------------------------------------------------------------ looking up

    def full_blocks(self, n_tokens: int) -> int:
        return n_tokens // self.block

    def match(self, namespace: Hashable, tokens: Sequence[int]) -> list[Node]:
        """The cached blocks that start ``tokens``, longest chain first to last (empty: none).
        Marks them used now."""
        self._tick += 1
        root = self.roots.get(namespace)
        path: list[Node] = []
        n = self.full_blocks(len(tokens))
        node = root
        for k in range(n):
            if node is None:
                break
            child = node.children.get(tuple(tokens[k * self.block:(k + 1) * self.block]))
            if child is None:
                break
            child.last_used = self._tick
            path.append(child)
            node = child
        self.stats.lookups += 1
        self.stats.hit_tokens += len(path) * self.block
        self.stats.missed_tokens += (n - len(path)) * self.block
        return path

    # ------------------------------------------------------------------ adding

    def insert(self, namespace: Hashable, parent: Node | None, tokens: Sequence[int], payload: Any,
               nbytes: int) -> Node | None:
        """Keep ``payload`` as the block ``tokens`` that follows ``parent`` (None: the first block of
        a prompt). Returns the block's node, or None when it cannot be kept (the bound)."""
        key = tuple(tokens)
        if len(key) != self.block:
            raise ValueError(f"a cached block holds {self.block} tokens, got {len(key)}")
        root = self.roots.setdefault(namespace, Node((), None))
        at = parent or root
        if parent is not None and not self._attached(parent):
            return None  # its parent was evicted meanwhile: the chain is cut here
        self._tick += 1
        old = at.children.get(key)
        if old is not None:
            old.last_used = self._tick
            return old
        if nbytes > self.capacity:
            self._refuse(f"the prefix cache bound ({_mib(self.capacity)}) is smaller than one block of "
                         f"{self.block} tokens ({_mib(nbytes)}): it caches nothing; raise the bound "
                         "(prefix_cache_mb) or turn the cache off")
            return None
        at.refs += 1  # the parent stays while room is made
        try:
            if not self._make_room(nbytes):
                self._refuse(f"the prefix cache bound ({_mib(self.capacity)}) is full of blocks in use: "
                             "a block was not kept")
                return None
        finally:
            at.refs -= 1
        node = Node(key, at, payload, nbytes)
        node.last_used = self._tick
        at.children[key] = node
        self.bytes += nbytes
        self.blocks += 1
        self.stats.inserted_blocks += 1
        return node

    def _attached(self, node: Node) -> bool:
        while node.parent is not None:
            if node.parent.children.get(node.tokens) is not node:
                return False
            node = node.parent
        return node in self.roots.values()

    def _refuse(self, message: str) -> None:
        self.stats.refused_blocks += 1
        if not self._warned:
            self._warned = True
            log.warning("%s", message)

    # ------------------------------------------------------------------ eviction

    def _leaves(self) -> list[Node]:
        out, stack = [], [r for r in self.roots.values()]
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            elif n.parent is not None:
                out.append(n)
        return out

    def _make_room(self, nbytes: int) -> bool:
        """Evict least recently used unpinned leaves until ``nbytes`` more fit; False if they cannot."""
        if self.bytes + nbytes <= self.capacity:
            return True
        leaves = sorted((n for n in self._leaves() if n.refs == 0), key=lambda n: (n.last_used, -n.depth))
        while self.bytes + nbytes > self.capacity:
            if not leaves:
                return False
            victim = leaves.pop(0)
            parent = victim.parent
            self._drop(victim)
            if parent is not None and parent.parent is not None and not parent.children and parent.refs == 0:
                # the parent became a leaf: it joins the order where its last use puts it
                leaves.append(parent)
                leaves.sort(key=lambda n: (n.last_used, -n.depth))
        return True

    def _drop(self, node: Node) -> None:
        del node.parent.children[node.tokens]
        self.bytes -= node.nbytes
        self.blocks -= 1
        self.stats.evicted_blocks += 1
        node.payload = None

    def pin(self, nodes: Sequence[Node]) -> None:
        """Keep ``nodes`` from eviction until :meth:`unpin` (a walk in progress)."""
        for n in nodes:
            n.refs += 1

    def unpin(self, nodes: Sequence[Node]) -> None:
        for n in nodes:
            n.refs -= 1

    def clear(self) -> None:
        """Drop every block (the weights changed). The tree's links are cut node by node: a child
        points to its parent and the parent to its children, a cycle that reference counting alone
        never frees, so dropping only the roots would leave every block's keys and values resident
        until Python's cyclic collector happened to run (measured in ``omtr train``: the first
        rollout's ~390 MiB of blocks outlived the release after it and the old-log-prob pass)."""
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.children = {}
            node.parent = None
            node.payload = None
        self.roots.clear()
        self.bytes = 0
        self.blocks = 0
        self.stats.cleared += 1

    def __len__(self) -> int:
        return self.blocks


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


__all__ = ["CacheStats", "Node", "PrefixCache"]
