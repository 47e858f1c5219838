"""vLLM's block arithmetic, checked against hand-computed cases."""

from __future__ import annotations

import random

import pytest

from templates_audit.blocks import NONE_HASH, PrefixCache, block_hashes, hit_rate

BS = 4


def toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(toks(3), BS)) == 0  # a partial block has no hash
    assert len(block_hashes(toks(4), BS)) == 1
    assert len(block_hashes(toks(11), BS)) == 2  # the partial third block is not cached


def test_hashes_are_chained() -> None:
    a = block_hashes([1, 2, 3, 4, 9, 9, 9, 9], BS)
    b = block_hashes([5, 6, 7, 8, 9, 9, 9, 9], BS)
    # the second block has identical tokens but follows a different prefix: different hash
    assert a[1] != b[1]
    # same prefix -> same hashes, deterministic
    assert a == block_hashes([1, 2, 3, 4, 9, 9, 9, 9], BS)


def test_parent_continues_the_chain() -> None:
    full = block_hashes(toks(12), BS)
    head = block_hashes(toks(8), BS)
    tail = block_hashes(toks(4, 8), BS, parent=head[-1])
    assert head + tail == full


@pytest.mark.parametrize("bs", [1, 3, 16])
def test_short_and_long_inputs_hash_alike(bs: int) -> None:
    """A few blocks are hashed by a plain loop, more through the iterator pipeline: both give
    the chain of ``hash((parent, hash(block tuple)))`` written out here."""
    rng = random.Random(bs)
    for n in range(0, 20 * bs, max(1, bs // 3)):
        ids = [rng.randrange(1 << 31) for _ in range(n)]
        h, expected = NONE_HASH, []
        for i in range(n // bs):
            h = hash((h, hash(tuple(ids[i * bs:(i + 1) * bs]))))
            expected.append(h)
        assert block_hashes(ids, bs) == expected
        assert block_hashes(ids, bs, parent=7)[:1] == ([hash((7, hash(tuple(ids[:bs]))))]
                                                       if n >= bs else [])


def test_salt_separates_caches() -> None:
    assert block_hashes(toks(8), BS, salt="tenant-a") != block_hashes(toks(8), BS, salt="tenant-b")
    assert block_hashes(toks(8), BS, salt="tenant-a") == block_hashes(toks(8), BS, salt="tenant-a")


@pytest.mark.parametrize(
    ("cached_tokens", "prompt_tokens", "expected_hit"),
    [
        (16, 16, 12),  # fully cached prompt: vLLM recomputes the last token, so one block less
        (16, 17, 16),  # 4 full cached blocks, 1 new token: all 4 blocks hit
        (16, 11, 8),  # prompt has 2 full blocks (+3); both cached
        (8, 16, 8),  # only the first two blocks were cached before
        (0, 16, 0),  # cold
        (16, 3, 0),  # shorter than one block: nothing to hit
    ],
)
def test_hit_counting_in_tokens(cached_tokens: int, prompt_tokens: int, expected_hit: int) -> None:
    cache = PrefixCache(None, BS)
    if cached_tokens:
        seq = toks(cached_tokens)
        cache.insert(block_hashes(seq, BS), cached_tokens + 1, record=False)
    prompt = toks(prompt_tokens)
    hashes = block_hashes(prompt, BS)
    assert cache.cached_prefix_tokens(hashes, prompt_tokens) == expected_hit
    assert cache.insert(hashes, prompt_tokens) == expected_hit
    assert cache.queries == prompt_tokens
    assert cache.hits == expected_hit


def test_divergence_stops_the_hit() -> None:
    cache = PrefixCache(None, BS)
    a = toks(16)
    cache.insert(block_hashes(a, BS), 16)
    b = a[:6] + [999] + a[7:]  # one token changed inside block 1
    assert cache.insert(block_hashes(b, BS), 16) == 4  # only block 0 is reused
    assert hit_rate(cache.hits, cache.queries) == pytest.approx(4 / 32)


def test_lru_eviction_of_unreferenced_blocks() -> None:
    cache = PrefixCache(4, BS)  # room for 4 blocks
    a, b, c = toks(8, 0), toks(8, 100), toks(8, 200)
    for seq in (a, b):  # 2 blocks each, all cached, all free afterwards
        cache.insert(block_hashes(seq, BS), 9)
    # c needs 3 blocks (8 tokens + 1 => ceil(9/4)); evicts the least recently freed ones: a's
    cache.insert(block_hashes(c, BS), 9)
    assert cache.evictions == 3
    assert cache.cached_prefix_tokens(block_hashes(a, BS), 9) == 0
    assert cache.cached_prefix_tokens(block_hashes(c, BS), 9) == 8


def test_tail_blocks_are_evicted_before_the_head() -> None:
    cache = PrefixCache(4, BS)
    a = toks(16)
    cache.insert(block_hashes(a, BS), 16)  # 4 blocks, freed tail first
    other = toks(4, 500)
    cache.insert(block_hashes(other, BS), 4)  # needs 1 block: evicts a's tail (block 3)
    hashes = block_hashes(a, BS)
    assert cache.cached_prefix_tokens(hashes, 17) == 12


def test_next_evictions_are_the_free_queue_head() -> None:
    cache = PrefixCache(4, BS)
    assert cache.next_evictions(2) == [None, None]  # never-used blocks first
    a = toks(16)
    hashes = block_hashes(a, BS)
    cache.insert(hashes, 16)  # 4 blocks, freed tail first
    assert cache.next_evictions(9) == hashes[::-1]
    assert cache.next_evictions(0) == []
    cache.insert(block_hashes(toks(4, 500), BS), 4)  # takes the head: block 3 of a
    assert cache.next_evictions(1) == [hashes[2]]


def test_running_requests_blocks_are_pinned() -> None:
    cache = PrefixCache(4, BS)
    a = toks(12)
    alloc = cache.allocate(block_hashes(a, BS), 12)
    assert alloc is not None
    cache.cache_full_blocks(alloc, block_hashes(a, BS))
    # 3 blocks pinned, 1 free: a 2-block request cannot be admitted
    assert cache.allocate(block_hashes(toks(8, 50), BS), 8) is None
    assert cache.usage == pytest.approx(0.75)
    # a request sharing a's first two blocks needs only one new block: admitted, shares pins
    shared = cache.allocate(block_hashes(a[:8] + [7, 7, 7, 7], BS), 12)
    assert shared is not None and shared.hit_tokens == 8
    cache.free(alloc)
    cache.free(shared)
    assert cache.usage == 0.0


def test_extend_for_decode_and_exhaustion() -> None:
    cache = PrefixCache(3, BS)
    alloc = cache.allocate(block_hashes(toks(4), BS), 4)
    assert alloc is not None and len(alloc.blocks) == 1
    assert cache.extend(alloc, 12)  # decode grows to 3 blocks
    assert not cache.extend(alloc, 13)  # a fourth block does not exist: preemption territory
    cache.free(alloc)
    cache.free(alloc)  # freeing twice is harmless
    assert cache.num_free == 3


def test_generated_blocks_are_cached_for_the_next_turn() -> None:
    cache = PrefixCache(None, BS)
    prompt, output = toks(6), [900, 901, 902, 903, 904, 905]
    alloc = cache.allocate(block_hashes(prompt, BS), len(prompt))
    assert alloc is not None
    cache.extend(alloc, len(prompt) + len(output))
    cache.cache_full_blocks(alloc, block_hashes(prompt + output, BS))
    cache.free(alloc)
    follow_up = prompt + output + [1, 2, 3, 4, 5]
    assert cache.cached_prefix_tokens(block_hashes(follow_up, BS), len(follow_up)) == 12


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        PrefixCache(0, BS)
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)
