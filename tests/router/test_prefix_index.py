"""router.prefix_index: capacity eviction, longest-prefix matches, in-flight overlay."""

from __future__ import annotations

from router.chunks import Chunks
from router.prefix_index import ApproxIndex, InFlight


def chain(*hashes: int, step: int = 100) -> Chunks:
    return Chunks(tuple(hashes), tuple(step * (i + 1) for i in range(len(hashes))),
                  step * len(hashes))


def test_match_is_the_longest_held_prefix_per_replica() -> None:
    idx = ApproxIndex(10_000)
    idx.record("a", chain(1, 2, 3))
    idx.record("b", chain(1, 2))
    idx.record("c", chain(9))
    assert idx.match(chain(1, 2, 3, 4)) == {"a": 300, "b": 200}
    assert idx.match(chain(1, 5)) == {"a": 100, "b": 100}
    assert idx.match(chain(7, 2, 3)) == {}  # chained: nothing without the first chunk


def test_capacity_in_tokens_evicts_the_oldest_and_tails_before_heads() -> None:
    idx = ApproxIndex(500)
    idx.record("a", chain(1, 2, 3))  # 300 tokens
    idx.record("a", chain(1, 7, 8))  # shares chunk 1: 500 tokens in all
    assert idx.used("a") == 500
    idx.record("a", chain(20))  # 100 more: the oldest entry goes - the tail of the first
    assert idx.used("a") == 500
    assert idx.match(chain(1, 2, 3)) == {"a": 200}
    assert idx.match(chain(1, 7, 8)) == {"a": 300}  # the shared head stayed


def test_scraped_capacity_shrinks_and_entry_bound_holds() -> None:
    idx = ApproxIndex(10_000, max_entries=4)
    idx.record("a", chain(1, 2, 3, 4, 5, 6))
    assert idx.stats() == {"a": 4}
    assert idx.match(chain(1, 2, 3, 4, 5, 6)) == {"a": 400}
    idx.set_capacity("a", 200)
    assert idx.match(chain(1, 2, 3)) == {"a": 200}
    idx.forget("a")
    assert idx.match(chain(1)) == {} and idx.stats() == {}


def test_in_flight_is_reference_counted() -> None:
    f = InFlight()
    f.add("a", chain(1, 2))
    f.add("a", chain(1, 3))
    assert f.match(chain(1, 2)) == {"a": 200}
    f.remove("a", chain(1, 2))
    assert f.match(chain(1, 2)) == {"a": 100}
    f.remove("a", chain(1, 3))
    assert len(f) == 0


def test_in_flight_leader_is_the_earliest_owner_of_the_longest_prefix() -> None:
    f = InFlight()
    f.add("a", chain(1, 2), owner="first")
    f.add("a", chain(1, 2, 3), owner="second")
    f.add("b", chain(1, 2, 3), owner="elsewhere")
    assert f.leader(chain(1, 2, 3, 4), "a") == ("second", 300)  # only it holds chunk 3 on a
    assert f.leader(chain(1, 2, 9), "a") == ("first", 200)
    assert f.leader(chain(5), "a") is None and f.leader(chain(1), "c") is None
    f.remove("a", chain(1, 2), owner="first")
    assert f.leader(chain(1, 2, 9), "a") == ("second", 200)
