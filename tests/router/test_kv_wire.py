"""router.kv_events.wire: vLLM 0.32.0's KV-event format, both directions, and malformed input.

The golden payloads were produced by vLLM 0.32.0's own msgspec structs (``KVEventBatch`` and its
events, encoded with ``msgspec.msgpack.Encoder``); tests/vllm/test_kv_wire.py re-creates them live
in the vLLM env and checks the same table, so a new vLLM that changes the shape fails there.
"""

from __future__ import annotations

import pytest

pytest.importorskip("msgpack")

import msgpack

from router.kv_events.wire import (
    REPLAY_END,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    WireError,
    decode_batch,
    decode_seq,
    encode_batch,
    encode_seq,
)

# name -> (the batch, the bytes vLLM 0.32.0 encodes for it)
GOLDEN: dict[str, tuple[EventBatch, str]] = {
    # all three event types; a uint64 hash; a bytes hash; rank unset (nil); group_idx 0 is kept
    "stored_removed_cleared": (EventBatch(ts=1.5, events=[
        BlockStored(block_hashes=[1, 2**64 - 1], parent_block_hash=None, token_ids=[1, 2, 3],
                    block_size=16, medium="GPU", group_idx=0),
        BlockRemoved(block_hashes=[b"ab"], medium="GPU"),
        AllBlocksCleared()]),
        "93cb3ff80000000000009389a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392"
        "01cfffffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647393010203"
        "aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0"
        "a967726f75705f6964780083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573"
        "91c4026162a66d656469756da347505581a474797065b0416c6c426c6f636b73436c6561726564c0"),
    # an empty step of data-parallel rank 0: the rank is encoded
    "empty_rank0": (EventBatch(ts=1764635000.25, events=[], data_parallel_rank=0),
                    "93cb41da4b8c5e1000009000"),
    # a LoRA request continuing a chain: parent hash, lora_id/lora_name, extra_keys, session_id
    "lora_chain": (EventBatch(ts=2.0, events=[
        BlockStored(block_hashes=[7, 8], parent_block_hash=6, token_ids=[10, 11, 12, 13],
                    block_size=2, lora_id=3, medium="GPU", lora_name="sql-lora",
                    extra_keys=[["sql-lora"], ["sql-lora"]], group_idx=0, session_id="s1")],
        data_parallel_rank=1),
        "93cb4000000000000000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
        "920708b1706172656e745f626c6f636b5f6861736806a9746f6b656e5f696473940a0b0c0daa626c6f63"
        "6b5f73697a6502a76c6f72615f696403a66d656469756da3475055a96c6f72615f6e616d65a873716c2d"
        "6c6f7261aa65787472615f6b6579739291a873716c2d6c6f726191a873716c2d6c6f7261a967726f7570"
        "5f69647800aa73657373696f6e5f6964a2733101"),
    # a removal from a CPU tier in group 1
    "removed_group": (EventBatch(ts=3.0, events=[
        BlockRemoved(block_hashes=[5], medium="CPU", group_idx=1)], data_parallel_rank=0),
        "93cb40080000000000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865"
        "739105a66d656469756da3435055a967726f75705f6964780100"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_encode_yields_vllms_bytes(name: str) -> None:
    batch, hex_bytes = GOLDEN[name]
    assert encode_batch(batch).hex() == hex_bytes


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_decode_reads_vllms_bytes(name: str) -> None:
    batch, hex_bytes = GOLDEN[name]
    decoded = decode_batch(bytes.fromhex(hex_bytes))
    assert decoded == batch
    assert decoded.skipped == 0
    assert encode_batch(decoded).hex() == hex_bytes  # nothing lost on the way through


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# Older vLLM: events as positional arrays [type, fields...], trailing fields absent.
POSITIONAL = [
    # the llm-d-era BlockStored: no lora_name, no medium
    (["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2, None],
     BlockStored(block_hashes=[11, 12], parent_block_hash=10, token_ids=[1, 2, 3, 4], block_size=2)),
    # with medium and lora_name
    (["BlockStored", [b"\x01"], None, [5, 6], 2, 1, "GPU", "ad"],
     BlockStored(block_hashes=[b"\x01"], parent_block_hash=None, token_ids=[5, 6], block_size=2,
                 lora_id=1, medium="GPU", lora_name="ad")),
    # a newer release's extra trailing values are ignored beyond the known fields
    (["BlockRemoved", [3], "GPU", 0, None, None, "future"],
     BlockRemoved(block_hashes=[3], medium="GPU", group_idx=0)),
    (["BlockRemoved", [3]], BlockRemoved(block_hashes=[3])),
    (["AllBlocksCleared"], AllBlocksCleared()),
]


@pytest.mark.parametrize(("raw", "event"), POSITIONAL)
def test_decode_accepts_positional_events(raw: list[object], event: object) -> None:
    assert decode_batch(_pack([4.0, [raw], 0])) == EventBatch(4.0, [event], 0)  # type: ignore[list-item]


def test_unknown_fields_and_types_are_ignored_and_counted() -> None:
    payload = _pack([1, [
        {"type": "BlockRemoved", "block_hashes": [9], "medium": "GPU", "new_field": [1, 2]},
        {"type": "BlockMoved", "block_hashes": [9]},  # a type this codec does not know
        ["SomethingElse", 1, 2],
        {"type": "AllBlocksCleared", "why": "reset"},
    ]])  # an older batch without the rank, ts as an int
    batch = decode_batch(payload)
    assert batch == EventBatch(1.0, [BlockRemoved([9], "GPU"), AllBlocksCleared()], None)
    assert batch.skipped == 2


MALFORMED = [
    (b"", "not a msgpack payload"),  # empty
    (b"\xc1", "not a msgpack payload"),  # a reserved byte
    (_pack([1.0, []]) + b"\x00", "not a msgpack payload"),  # trailing bytes
    (_pack({"ts": 1.0}), "expected an array"),  # a map, not the positional batch
    (_pack([1.0]), "expected an array"),  # too short
    (_pack([1.0, [], 0, 9]), "expected an array"),  # too long
    (_pack(["now", []]), "ts is str"),
    (_pack([1.0, {}]), "events is dict"),
    (_pack([1.0, [], "0"]), "data_parallel_rank: expected an int"),
    (_pack([1.0, [7]]), "event 0: expected a map or a non-empty array"),
    (_pack([1.0, [[]]]), "event 0: expected a map or a non-empty array"),
    (_pack([1.0, [{"block_hashes": [1]}]]), "event type is not a string"),  # no "type"
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "block_size": 16}]]),
     "missing token_ids"),
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1.5], "token_ids": [], "block_size": 16}]]),
     "block_hashes: expected int or bytes"),
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": ["a"], "block_size": 16}]]),
     "token_ids: expected a list of ints"),
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 0}]]),
     "block_size: expected > 0"),
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": True}]]),
     "block_size: expected an int"),  # a bool is not an int here
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": "x",
                   "token_ids": [], "block_size": 4}]]), "parent_block_hash: expected an int or bytes"),
    (_pack([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 4,
                   "lora_name": 3}]]), "lora_name: expected a string"),
    (_pack([1.0, [{"type": "BlockRemoved", "block_hashes": 5}]]), "expected a list of block hashes"),
    (_pack([1.0, [["BlockRemoved"]]]), "missing block_hashes"),
    (msgpack.packb([1.0, [msgpack.ExtType(5, b"x")]]), "event 0: expected a map"),
]


@pytest.mark.parametrize(("payload", "message"), MALFORMED)
def test_malformed_payloads_raise_wire_error(payload: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode_batch(payload)


def test_encode_rejects_what_vllm_cannot_carry() -> None:
    with pytest.raises(WireError, match="cannot encode"):
        encode_batch(EventBatch(0.0, [BlockRemoved([2**64])]))  # beyond uint64
    with pytest.raises(WireError, match="not a KV event"):
        encode_batch(EventBatch(0.0, ["BlockRemoved"]))  # type: ignore[list-item]


@pytest.mark.parametrize(("n", "frame"), [
    (0, "0000000000000000"),  # vLLM's first batch
    (1, "0000000000000001"),
    (2**40 + 5, "0000010000000005"),
    (2**63 - 1, "7fffffffffffffff"),  # the largest sequence number
    (REPLAY_END, "ffffffffffffffff"),  # the replay end marker, as vLLM sends it
])
def test_seq_frames(n: int, frame: str) -> None:
    assert encode_seq(n).hex() == frame
    assert decode_seq(bytes.fromhex(frame)) == n
    assert encode_seq(n) == n.to_bytes(8, "big", signed=True)


def test_seq_frames_reject_bad_lengths_and_range() -> None:
    for bad in (b"", b"\x00" * 7, b"\x00" * 9):
        with pytest.raises(WireError, match="expected 8"):
            decode_seq(bad)
    with pytest.raises(WireError, match="does not fit"):
        encode_seq(2**63)
