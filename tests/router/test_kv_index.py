"""The precise index: events in, exact matches out; the approximate index for the rest."""

from __future__ import annotations

import pytest

from router.chunks import Chunks
from router.kv_events.index import KvIndex, PreciseIndex, lora_salt
from router.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored
from router.prefix_index import ApproxIndex
from templates_audit.blocks import block_hashes

BS = 4


def exact(ids: list[int], salt: str | None = None) -> Chunks:
    """A request's keys as `RequestKeys.exact` builds them (the last token never hits)."""
    keys = block_hashes(ids, BS, salt=salt)
    usable = (len(ids) - 1) // BS
    return Chunks(tuple(keys[:usable]), tuple(BS * (i + 1) for i in range(usable)), len(ids))


def stored(engine: list[int], parent: int | None, ids: list[int], **kw: object) -> BlockStored:
    return BlockStored(block_hashes=engine, parent_block_hash=parent, token_ids=ids,
                       block_size=BS, **kw)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


PROMPT = list(range(1, 18))  # 17 tokens: 4 full blocks, all usable (16 <= 17 - 1)


def live(index: PreciseIndex, *names: str) -> PreciseIndex:
    for n in names:
        index.set_live(n, True)
    return index


def test_keys_follow_the_token_chain_whatever_the_engine_hashes() -> None:
    index = live(PreciseIndex(0), "a", "b")
    # two replicas with unrelated engine hash functions store the same blocks, in pieces
    index.apply("a", stored([11, 12], None, PROMPT[:8]))
    index.apply("a", stored([13], 12, PROMPT[8:12]))
    index.apply("b", stored([b"x1", b"x2", b"x3", b"x4"], None, PROMPT[:16]))
    assert index.match(exact(PROMPT)) == {"a": 12, "b": 16}
    assert index.router_keys("a") < index.router_keys("b")
    assert index.engine_hashes("a") == {11, 12, 13}


def test_removal_by_engine_hash_and_clear() -> None:
    index = live(PreciseIndex(0), "a")
    index.apply("a", stored([1, 2, 3, 4], None, PROMPT[:16]))
    index.apply("a", BlockRemoved(block_hashes=[3, 99]))  # 99 was never stored: ignored
    assert index.match(exact(PROMPT)) == {"a": 8}  # block 3 gone: the prefix ends at block 2
    assert index.blocks("a") == 3
    index.apply("a", AllBlocksCleared())
    assert index.blocks("a") == 0 and index.match(exact(PROMPT)) == {}


@pytest.mark.parametrize(("event", "blocks", "matched"), [
    # an unknown parent: stored (removable, counted) but never matched
    (stored([7], 999, PROMPT[4:8]), 1, {}),
    # a CPU-offloaded copy is no prefix-cache hit
    (stored([7], None, PROMPT[:4], medium="CPU"), 0, {}),
    # token ids that do not cover the blocks: kept unmatched
    (stored([7, 8], None, PROMPT[:5]), 2, {}),
    # a LoRA adapter's blocks never match the base model's request
    (stored([7], None, PROMPT[:4], lora_name="ad"), 1, {}),
])
def test_blocks_that_must_not_match(event: BlockStored, blocks: int,
                                    matched: dict[str, int]) -> None:
    index = live(PreciseIndex(0), "a")
    index.apply("a", event)
    assert index.blocks("a") == blocks
    assert index.match(exact(PROMPT)) == matched


def test_lora_blocks_match_the_adapters_request() -> None:
    index = live(PreciseIndex(0), "a")
    index.apply("a", stored([7, 8], None, PROMPT[:8], lora_name="ad", lora_id=3))
    assert index.match(exact(PROMPT, lora_salt("ad"))) == {"a": 8}
    assert index.match(exact(PROMPT)) == {}


def test_a_restored_hash_with_new_content_moves_its_key() -> None:
    index = live(PreciseIndex(0), "a")
    index.apply("a", stored([1], None, PROMPT[:4]))
    index.apply("a", stored([1], None, [9, 9, 9, 9]))  # the engine reused the hash
    assert index.match(exact(PROMPT)) == {}
    assert index.blocks("a") == 1 and len(index.router_keys("a")) == 1


def test_only_live_replicas_answer_and_drop_forgets() -> None:
    index = live(PreciseIndex(0), "a")
    index.apply("a", stored([1, 2], None, PROMPT[:8]))
    index.apply("b", stored([1, 2], None, PROMPT[:8]))  # b's stream is not live
    assert index.match(exact(PROMPT)) == {"a": 8}
    assert index.drop("a") == 2
    assert index.match(exact(PROMPT)) == {} and index.blocks("a") == 0


def test_speculative_entries_expire_and_extend_real_ones() -> None:
    clock = Clock()
    index = live(PreciseIndex(2.0, clock), "a")
    index.apply("a", stored([1, 2], None, PROMPT[:8]))
    index.speculate("a", exact(PROMPT))
    index.speculate("b", exact(PROMPT))  # not live: nothing
    assert index.match(exact(PROMPT)) == {"a": 16}
    clock.now += 2.5
    assert index.match(exact(PROMPT)) == {"a": 8}
    assert not index._spec and not index._spec_queue


def test_kv_index_answers_from_the_approximate_index_where_not_precise() -> None:
    precise = live(PreciseIndex(0), "a")
    approx = ApproxIndex(1 << 20)
    both = KvIndex(approx, precise)
    chunks = Chunks((5, 6), (100, 200), 200)
    with_exact = chunks._replace(exact=exact(PROMPT))
    both.record("a", with_exact)
    both.record("b", with_exact)
    precise.apply("a", stored([1], None, PROMPT[:4]))
    # a is precise (its events say 4 tokens), b is not live: the approximate estimate
    assert both.match(with_exact) == {"a": 4, "b": 200}
    # without exact keys (a request the router cannot tokenise exactly): approximate for all
    assert both.match(chunks) == {"a": 200, "b": 200}
    both.forget("a")
    assert both.match(with_exact) == {"b": 200}


def test_a_hash_with_two_copies_stays_until_both_are_removed() -> None:
    index = live(PreciseIndex(0), "a")
    index.apply("a", stored([1], None, PROMPT[:4]))
    index.apply("a", stored([1], None, PROMPT[:4]))  # a second copy (vLLM can keep two)
    index.apply("a", BlockRemoved(block_hashes=[1]))
    assert index.match(exact(PROMPT)) == {"a": 4}
    index.apply("a", BlockRemoved(block_hashes=[1]))
    assert index.match(exact(PROMPT)) == {} and index.blocks("a") == 0
