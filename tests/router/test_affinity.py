"""Post-policy affinities: conversation (chat) and prompt (completions) stickiness."""

from __future__ import annotations

from router.affinity import Affinities, PromptAffinity
from router.keys import KeyConfig, KeySource, RoutingKey, derive, prompt_chunks
from router.policy import Branch, Decision, LoadBound
from router.replicas import ReplicaState

NAMES = ("r0", "r1", "r2", "r3")


def states(loads: dict[str, int] | None = None, down: tuple[str, ...] = ()) -> list[ReplicaState]:
    out = []
    for n in NAMES:
        s = ReplicaState(n, f"http://{n}:1")
        s.in_flight = (loads or {}).get(n, 0)
        s.healthy = n not in down
        out.append(s)
    return out


def key(chunks: tuple[int, ...]) -> RoutingKey:
    return RoutingKey("k", None, KeySource.PREFIX, 100, False, chunks)


def decided(name: str) -> Decision:
    return Decision(name, Branch.SPILL, (name, *(n for n in NAMES if n != name)), "r0")


def test_a_continuation_goes_where_its_longest_known_prefix_went() -> None:
    aff = PromptAffinity(LoadBound(1.25, 8))
    turn1 = (1, 2, 3, 4)
    assert aff.apply(key(turn1), decided("r2"), states()).replica == "r2"
    d = aff.apply(key((*turn1, 5, 6)), decided("r1"), states())   # 4 of 6 chunks known
    assert d.replica == "r2" and d.branch is Branch.CONVERSATION
    assert d.candidates[0] == "r2" and sorted(d.candidates) == sorted(NAMES)
    assert d.home == "r0"


def test_a_shared_preamble_alone_is_not_a_match() -> None:
    aff = PromptAffinity(LoadBound(1.25, 8), spread=False)
    aff.apply(key((1, 2, 30, 40)), decided("r2"), states())
    # a new conversation: shares 2 of its 4 chunks (not more than half) -> the policy decides
    d = aff.apply(key((1, 2, 50, 60)), decided("r3"), states())
    assert d.replica == "r3" and d.branch is Branch.SPILL


def test_new_conversations_after_a_known_preamble_spread_by_their_first_new_chunk() -> None:
    aff = PromptAffinity(LoadBound(1.25, 8))
    aff.apply(key((1, 2, 30, 40)), decided("r0"), states())
    placed = {}
    for conv in range(40):
        first_new = 1000 + conv
        d = aff.apply(key((1, 2, first_new, 2000 + conv)), decided("r0"), states())
        placed[conv] = d.replica
        # the placement depends only on the first new chunk: the same one places the same way
        again = PromptAffinity(LoadBound(1.25, 8))
        again.apply(key((1, 2, 7)), decided("r0"), states())
        assert again.apply(key((1, 2, first_new, 5)), decided("r0"), states()).replica == \
            d.replica
    assert set(placed.values()) == set(NAMES)   # spread over the fleet, not all on the home
    # each conversation's next turn then follows its own first turn
    for conv in range(40):
        nxt = key((1, 2, 1000 + conv, 2000 + conv, 3000 + conv))
        assert aff.apply(nxt, decided("r0"), states()).replica == placed[conv]


def test_spreading_respects_the_cap_and_needs_a_known_preamble() -> None:
    aff = PromptAffinity(LoadBound(1.25, 0))
    # nothing known: the policy's placement (the key's home) stands
    assert aff.apply(key((1, 2, 3, 4)), decided("r0"), states()).replica == "r0"
    busy = states({"r0": 1, "r1": 11, "r2": 11, "r3": 11})
    for conv in range(20):
        d = aff.apply(key((1, 2, 500 + conv, 600 + conv)), decided("r0"), busy)
        assert d.replica == "r0"   # the others are at their cap, ceil(1.25 * 35 / 4) = 11


def test_never_moves_to_a_replica_at_its_cap_or_unavailable() -> None:
    aff = PromptAffinity(LoadBound(1.25, 0))
    aff.apply(key((1, 2, 3, 4)), decided("r2"), states())
    busy = states({"r2": 10, "r0": 1, "r1": 1, "r3": 1})   # cap ceil(1.25 * 14 / 4) = 5
    assert aff.apply(key((1, 2, 3, 4, 5)), decided("r1"), busy).replica == "r1"
    # the last decision is remembered: the next turn follows r1 now
    assert aff.apply(key((1, 2, 3, 4, 5, 6)), decided("r0"), states()).replica == "r1"
    aff.apply(key((7, 8, 9)), decided("r3"), states())
    assert aff.apply(key((7, 8, 9, 10)), decided("r0"), states(down=("r3",))).replica == "r0"


def test_the_table_is_bounded() -> None:
    aff = PromptAffinity(LoadBound(1.25, 0), size=10)
    for i in range(50):
        aff.apply(key((i * 10 + 1, i * 10 + 2, i * 10 + 3)), decided(NAMES[i % 4]), states())
    assert len(aff._where) == 10


def test_requests_without_chunks_pass_through() -> None:
    aff = Affinities(LoadBound(1.25, 0))
    d = decided("r1")
    assert aff.apply(RoutingKey("k", None, KeySource.PREFIX, 100), d, states()) is d


def test_prompt_chunks_are_chained_and_skip_the_partial_tail() -> None:
    cfg = KeyConfig(chunk_bytes=8)
    a = prompt_chunks("/v1/completions", {"model": "m", "prompt": "AAAAAAAABBBBBBBBCCC"}, cfg)
    b = prompt_chunks("/v1/completions", {"model": "m", "prompt": "AAAAAAAABBBBBBBBDDDDDDDD"}, cfg)
    c = prompt_chunks("/v1/completions", {"model": "m", "prompt": "XXXXXXXXBBBBBBBB"}, cfg)
    assert len(a) == 2 and len(b) == 3          # "CCC" is a partial chunk
    assert a == b[:2]
    assert c[1] != a[1]                         # same chunk after a different prefix: chained
    other_model = prompt_chunks("/v1/completions", {"model": "n", "prompt": "AAAAAAAA"}, cfg)
    assert other_model[0] != a[0]


def test_prompt_chunks_only_for_text_completions() -> None:
    cfg = KeyConfig(chunk_bytes=8)
    long = "x" * 64
    assert prompt_chunks("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]},
                         cfg) == ()
    assert prompt_chunks("/v1/completions", {"prompt": list(range(64))}, cfg) == ()
    assert prompt_chunks("/v1/embeddings", {"input": long}, cfg) == ()
    assert prompt_chunks("/v1/completions", {"prompt": long}, KeyConfig(chunk_bytes=0)) == ()
    assert len(prompt_chunks("/v1/completions", {"prompt": long},
                             KeyConfig(min_prefix_chars=8, chunk_bytes=8, max_prefix_chars=20))) == 2


def test_derive_carries_the_chunks_of_a_completions_prompt() -> None:
    body = {"model": "m", "prompt": "You are a careful assistant. " * 200}
    k = derive("/v1/completions", {}, body)
    assert k.source is KeySource.PREFIX and len(k.chunks) == len(body["prompt"]) // 1024
    assert derive("/v1/completions", {}, body, KeyConfig(chunk_bytes=0)).chunks == ()
    assert derive("/v1/completions", {"x-prefix-hash": "abc"}, body).chunks == ()
