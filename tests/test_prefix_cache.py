"""The prefix cache as a data structure: blocks found by the prefix they extend, LRU eviction of
leaves under a byte bound, pins, a bound too small for one block, clearing."""

import logging

import pytest

from omtr.rollout.prefix_cache import PrefixCache


def fill(cache, ns, tokens, size=10):
    """Insert every full block of ``tokens`` after what is cached; returns the path."""
    path = cache.match(ns, tokens)
    parent = path[-1] if path else None
    for k in range(len(path), len(tokens) // cache.block):
        node = cache.insert(ns, parent, tokens[k * cache.block:(k + 1) * cache.block], ("kv", k), size)
        if node is None:
            break
        path.append(node)
        parent = node
    return path


def test_blocks_are_found_by_the_prefix_they_extend():
    c = PrefixCache(block=2, capacity_bytes=1000)
    assert c.match("actor", [1, 2, 3, 4, 5]) == []
    fill(c, "actor", [1, 2, 3, 4, 5])  # two full blocks; the fifth token is not kept
    assert len(c) == 2 and c.bytes == 20
    path = c.match("actor", [1, 2, 3, 4, 9, 9])
    assert [n.payload for n in path] == [("kv", 0), ("kv", 1)]
    assert [n.payload for n in c.match("actor", [1, 2, 7, 7])] == [("kv", 0)]
    assert c.match("actor", [2, 1, 3, 4]) == [], "a block is found only after the same blocks"
    assert c.match("editor", [1, 2, 3, 4]) == [], "namespaces (roles) do not share blocks"
    fill(c, "actor", [1, 2, 7, 7])
    assert len(c) == 3 and len(c.roots["actor"].children[(1, 2)].children) == 2
    assert c.stats.hit_tokens > 0 and c.stats.inserted_blocks == 3


def test_least_recently_used_leaves_go_first():
    c = PrefixCache(block=1, capacity_bytes=40)
    fill(c, "a", [1, 2])  # 1 -> 2
    fill(c, "a", [3, 4])  # 3 -> 4
    c.match("a", [1, 2])  # the path 1 -> 2 is used again
    fill(c, "a", [5])  # full: the least recently used leaf (4) goes
    assert [n.tokens for n in c.match("a", [3, 4])] == [(3,)]
    assert len(c.match("a", [1, 2])) == 2
    fill(c, "a", [6, 7])  # needs two blocks: 3 (a leaf now), then 5, least recently used
    assert c.match("a", [3]) == [] and c.match("a", [5]) == []
    assert len(c.match("a", [1, 2])) == 2 and len(c.match("a", [6, 7])) == 2
    assert c.bytes <= c.capacity and c.stats.evicted_blocks == 3


def test_a_parent_is_never_evicted_before_its_children():
    c = PrefixCache(block=1, capacity_bytes=30)
    fill(c, "a", [1, 2, 3])
    fill(c, "a", [9])  # the leaf 3 goes, not the root block 1
    assert len(c.match("a", [1, 2, 3])) == 2


def test_pinned_blocks_stay_and_a_full_cache_of_pinned_blocks_refuses(caplog):
    c = PrefixCache(block=1, capacity_bytes=20)
    path = fill(c, "a", [1, 2])
    c.pin(path)
    with caplog.at_level(logging.WARNING, logger="omtr.rollout"):
        assert c.insert("a", None, [5], "x", 10) is None
        assert c.insert("a", None, [6], "x", 10) is None
    assert len(c.match("a", [1, 2])) == 2
    assert sum("in use" in r.getMessage() for r in caplog.records) == 1, "said once"
    c.unpin(path)
    assert c.insert("a", None, [5], "x", 10) is not None


def test_a_bound_too_small_for_one_block_caches_nothing_and_says_so_once(caplog):
    c = PrefixCache(block=4, capacity_bytes=5)
    with caplog.at_level(logging.WARNING, logger="omtr.rollout"):
        for _ in range(3):
            assert fill(c, "a", [1, 2, 3, 4, 5, 6, 7, 8]) == []
    assert len(c) == 0 and c.bytes == 0 and c.stats.refused_blocks == 3
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "caches nothing" in msgs[0]


def test_a_child_of_an_evicted_block_is_not_kept():
    c = PrefixCache(block=1, capacity_bytes=20)
    parent = fill(c, "a", [1])[0]
    fill(c, "a", [2])
    fill(c, "a", [3])  # evicts 1 (least recently used)
    assert c.insert("a", parent, [4], "x", 10) is None


def test_clear_drops_everything_and_arguments_are_checked():
    c = PrefixCache(block=2, capacity_bytes=100)
    fill(c, "a", [1, 2, 3, 4])
    c.clear()
    assert len(c) == 0 and c.bytes == 0 and c.match("a", [1, 2, 3, 4]) == []
    with pytest.raises(ValueError):
        c.insert("a", None, [1], "x", 1)
    with pytest.raises(ValueError):
        PrefixCache(block=0, capacity_bytes=1)
    with pytest.raises(ValueError):
        PrefixCache(block=2, capacity_bytes=-1)


def test_clear_frees_the_blocks_without_the_cyclic_collector():
    """A child points to its parent and the parent to its children: clear() cuts those links, so the
    blocks' keys and values go at once, not whenever Python's cyclic collector next runs (issue 42:
    the first rollout's blocks outlived the release after it). Without the cut every block lives on."""
    import gc
    import weakref

    torch = pytest.importorskip("torch")
    cache = PrefixCache(2, 1 << 30)
    refs, parent = [], None
    gc.disable()
    try:
        for k in range(4):
            kv = (torch.zeros(8), torch.zeros(8))
            refs += [weakref.ref(kv[0]), weakref.ref(kv[1])]
            parent = cache.insert("actor", parent, [k, k + 1], kv, 64)
            del kv
        cache.insert("judge", None, [9, 9], (torch.zeros(8),), 32)
        parent = None
        assert all(r() is not None for r in refs) and cache.blocks == 5
        cache.clear()
        assert cache.blocks == 0 and cache.bytes == 0
        assert all(r() is None for r in refs), "a block's keys and values outlived clear()"
        assert cache.match("actor", [0, 1, 1, 2]) == []
    finally:
        gc.enable()


def test_a_smaller_bound_changes_no_sampled_token_or_log_prob():
    """issue 42: lean_memory bounds training's prefix cache lower (lean_prefix_cache_mb). A bound only
    decides which blocks are found and which are computed again, in the same chunks, so sampled
    rollouts (several calls, the cache carried across them, two prompt families, the Judge on the
    same cache) are the same bit for bit with a bound that holds everything, one that evicts, and
    none at all."""
    torch = pytest.importorskip("torch")
    from omtr.model import build_model
    from omtr.policy import Sampling
    from omtr.rollout import make_engine

    torch.set_num_threads(1)
    m = build_model("micro")
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    demo = {f: " ".join(f"{f} example step {k}: move the {f} thing {k} to place {k + 1}." for k in range(12))
            for f in ("blocks", "balls")}
    prompts = [[{"role": "system", "content": "You write PDDL for planning tasks, carefully."},
                {"role": "user", "content": f"{demo[f]} Now the task: move {f} item {i} to place {i + 2}."}]
               for i in range(3) for f in demo]

    def rollouts(**kw):
        eng = make_engine("fast", m, prefix_block=8, **kw)
        out = []
        for call in range(3):
            sampling = Sampling(greedy=False, temperature=0.7, max_new_tokens=10, seed=100 + call)
            gens = eng.generate("actor" if call != 1 else "editor", prompts[call:] + prompts[:call], sampling,
                                constraint="off")
            out.append(([x.token_ids for x in gens], [x.logprobs for x in gens]))
        out.append(eng.judge(prompts))
        return out, eng.prefix_cache.stats

    big, big_stats = rollouts(prefix_cache_mb=1024.0)
    small, small_stats = rollouts(prefix_cache_mb=0.05)  # a few blocks of the micro model's keys and values
    off, _ = rollouts(prefix_cache=False)
    assert big_stats.hit_tokens > 0 and big_stats.evicted_blocks == 0
    assert small_stats.evicted_blocks > 0, "the small bound must evict (the test needs it)"
    assert small == big, "a smaller prefix cache bound changed a sampled token, a log-prob or a Judge score"
    assert off == big
