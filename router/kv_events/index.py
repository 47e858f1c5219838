"""The precise prefix index: what each replica's vLLM reports it holds, block by block.

`PreciseIndex` is fed by the replicas' own KV-cache events (`router.kv_events.subscriber`) and
answers, for a request's exact block keys (`router.kv_events.request_keys`), how many prompt
tokens each replica holds. `KvIndex` puts it behind the `router.prefix_index.PrefixIndex`
protocol together with the approximate index, which keeps learning from this router's own
decisions and answers for every replica whose event stream is not live.

Keys. vLLM's engine hashes depend on ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED``, so
the index never uses them as keys: every ``BlockStored`` carries the tokens of its blocks, and
the index chains the project's own hash over them (`templates_audit.blocks.block_hashes`, the
chain `templates_audit.prompt_keys.PromptKeys` computes for a request) from the router key of
``parent_block_hash``; the first block of a prompt is seeded with the LoRA adapter's name, as
vLLM folds the adapter into its block hashes. Each replica keeps ``engine hash -> router key``
so that ``BlockRemoved`` (engine hashes only) finds the key to drop. vLLM's pool can hold two
blocks with one hash (two requests prefilling one prompt in one step), each announced and each
removed on its own: announcements are counted per hash, which stays cached until its last copy
is removed. A stored block whose parent
this router never saw (events before its subscription, beyond the replay buffer) is kept as
``engine hash -> None``: counted, removable, never matched. Only blocks in the GPU medium (or
with no medium) are indexed: a CPU-offloaded copy is not a prefix-cache hit.

Speculative entries (``speculate``): when a request was served, its blocks count as cached on
that replica for ``ttl`` seconds; they cover the gap between the routing decision and the
events of its prefill. The replica's events overrule them: when a block leaves the replica's
cache (``BlockRemoved``, a clear, a drop) its speculative entry there goes too, so a block
evicted within the TTL is not predicted for the rest of it.

Liveness: a replica's entries are used only while its stream is live (``set_live``). The
subscriber takes a replica off while it resyncs, after a failed replay, or when it is ejected;
`KvIndex.match` then answers for it from the approximate index.

Invariants: for a live replica whose subscriber applied every batch in order, ``engine_hashes``
equals the set of blocks the engine's prefix cache holds (the correctness test checks it after
thousands of requests with evictions); ``holders[k]`` contains replica ``r`` iff some engine
hash of ``r`` maps to ``k``.

Cost: ``apply`` O(blocks + tokens) per event (one chained hash per stored block); ``match``
O(request blocks) dict lookups and set operations, stopping at the first block nobody holds;
``speculate`` O(blocks); expiry is amortised O(1) per speculative entry. Memory: one dict slot
per cached block per replica plus one in the shared map - bounded by the replicas' own caches.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import NamedTuple

from router.chunks import Chunks
from router.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, Event
from router.prefix_index import ApproxIndex, match_holders
from templates_audit.blocks import block_hashes

__all__ = ["KvIndex", "PreciseIndex", "lora_salt"]

_GPU = (None, "GPU")


def lora_salt(lora_name: str | None, lora_id: int | None = None) -> str | None:
    """The seed of a prompt's first block for a LoRA adapter (None: the base model). A request
    for adapter ``name`` uses ``lora_salt(name)``; an event naming only the adapter's integer id
    (older vLLM) gets a seed no request computes, so its blocks never match."""
    if lora_name:
        return "lora\x1f" + lora_name
    if lora_id is not None:
        return f"lora-id\x1f{lora_id}"
    return None


class _Replica:
    __slots__ = ("block_size", "copies", "engine", "keys", "live")

    def __init__(self) -> None:
        self.engine: dict[Hashable, int | None] = {}  # engine hash -> router key
        self.copies: dict[Hashable, int] = {}  # engine hash -> copies, where more than one
        self.keys: dict[int, int] = {}  # router key -> engine hashes mapping to it
        self.live = False
        self.block_size = 0  # learned from BlockStored (0: none seen yet)


class _Spec(NamedTuple):
    expires: float
    replica: str
    keys: tuple[int, ...]


class PreciseIndex:
    """Per-replica block sets from KV events, plus short-lived speculative entries."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._replicas: dict[str, _Replica] = {}
        self._holders: dict[int, set[str]] = {}
        self._spec: dict[int, dict[str, float]] = {}  # key -> replica -> expiry
        self._spec_queue: deque[_Spec] = deque()

    # -- state per replica ---------------------------------------------------------------------

    def _get(self, replica: str) -> _Replica:
        r = self._replicas.get(replica)
        if r is None:
            r = self._replicas[replica] = _Replica()
        return r

    def set_live(self, replica: str, live: bool) -> None:
        self._get(replica).live = live

    def live(self, replica: str) -> bool:
        r = self._replicas.get(replica)
        return r is not None and r.live

    def precise_for(self, replica: str, block_size: int) -> bool:
        """Live, and its blocks are ``block_size`` tokens (or none seen yet)."""
        r = self._replicas.get(replica)
        return r is not None and r.live and r.block_size in (0, block_size)

    def block_size(self) -> int:
        """The block size of the live replicas that reported one (0: none yet). Replicas with
        another block size than the first live one are answered by the approximate index."""
        for r in self._replicas.values():
            if r.live and r.block_size:
                return r.block_size
        return 0

    def blocks(self, replica: str) -> int:
        r = self._replicas.get(replica)
        return 0 if r is None else len(r.engine)

    def tokens(self, replica: str) -> int | None:
        """Tokens in the blocks ``replica``'s engine holds; None unless its stream is live and
        it reported a block size."""
        r = self._replicas.get(replica)
        if r is None or not r.live or not r.block_size:
            return None
        return len(r.engine) * r.block_size

    def engine_hashes(self, replica: str) -> set[Hashable]:
        r = self._replicas.get(replica)
        return set() if r is None else set(r.engine)

    def router_keys(self, replica: str) -> set[int]:
        r = self._replicas.get(replica)
        return set() if r is None else set(r.keys)

    def drop(self, replica: str) -> int:
        """Forget every entry of ``replica`` (it stays known, liveness unchanged); returns how
        many blocks were dropped."""
        r = self._replicas.get(replica)
        if r is None:
            return 0
        n = len(r.engine)
        holders = self._holders
        for key in r.keys:
            held = holders.get(key)
            if held is not None:
                held.discard(replica)
                if not held:
                    del holders[key]
        r.engine.clear()
        r.copies.clear()
        r.keys.clear()
        for key in [k for k, d in self._spec.items() if replica in d]:
            d = self._spec[key]
            del d[replica]
            if not d:
                del self._spec[key]
        return n

    def forget(self, replica: str) -> None:
        """``replica`` left the membership."""
        self.drop(replica)
        self._replicas.pop(replica, None)

    # -- events --------------------------------------------------------------------------------

    def apply(self, replica: str, event: Event) -> None:
        """One decoded event of ``replica``'s stream, in stream order."""
        r = self._get(replica)
        if isinstance(event, BlockStored):
            if event.medium in _GPU:
                self._stored(replica, r, event)
        elif isinstance(event, BlockRemoved):
            if event.medium in _GPU:
                copies = r.copies
                for h in event.block_hashes:
                    if h in copies:  # one of several copies left: the hash is still cached
                        n = copies[h] - 1
                        if n > 1:
                            copies[h] = n
                        else:
                            del copies[h]
                    elif h in r.engine:
                        self._unlink(replica, r, r.engine.pop(h))
        elif isinstance(event, AllBlocksCleared):
            self.drop(replica)

    def _stored(self, replica: str, r: _Replica, e: BlockStored) -> None:
        bs = e.block_size
        n = len(e.block_hashes)
        if n == 0:
            return
        if not r.block_size:
            r.block_size = bs
        keys: list[int | None]
        parent_key: int | None = None
        known = True
        if e.parent_block_hash is not None:
            parent_key = r.engine.get(e.parent_block_hash)
            known = parent_key is not None
        if known and bs == r.block_size and len(e.token_ids) == n * bs:
            keys = list(block_hashes(e.token_ids, bs, salt=lora_salt(e.lora_name, e.lora_id),
                                     parent=parent_key))
        else:
            keys = [None] * n
        self._link(replica, r, e.block_hashes, keys)

    def store(self, replica: str, engine_hashes: Iterable[Hashable],
              keys: Iterable[int | None], block_size: int = 0) -> None:
        """Blocks of ``block_size`` tokens that entered ``replica``'s cache whose router keys
        the caller already knows (``None``: unmatchable), as ``BlockStored`` would add them: for
        a source that computes the router's chain itself (`loadtest.simulate`'s engines do)."""
        r = self._get(replica)
        if block_size and not r.block_size:
            r.block_size = block_size
        self._link(replica, r, list(engine_hashes), list(keys))

    def _link(self, replica: str, r: _Replica, hashes: Sequence[Hashable],
              keys: Sequence[int | None]) -> None:
        engine = r.engine
        for h, key in zip(hashes, keys, strict=True):
            if h in engine:
                old = engine[h]
                if old == key:  # another copy of a cached block (vLLM can keep two)
                    r.copies[h] = r.copies.get(h, 1) + 1
                    continue
                r.copies.pop(h, None)
                self._unlink(replica, r, old)
            engine[h] = key
            if key is not None:
                count = r.keys.get(key, 0)
                r.keys[key] = count + 1
                if not count:
                    held = self._holders.get(key)
                    if held is None:
                        self._holders[key] = {replica}
                    else:
                        held.add(replica)

    def _unlink(self, replica: str, r: _Replica, key: int | None) -> None:
        if key is None:
            return
        count = r.keys.get(key, 0) - 1
        if count > 0:
            r.keys[key] = count
            return
        r.keys.pop(key, None)
        held = self._holders.get(key)
        if held is not None:
            held.discard(replica)
            if not held:
                del self._holders[key]
        spec = self._spec.get(key)
        if spec is not None and spec.pop(replica, None) is not None and not spec:
            del self._spec[key]

    # -- requests ------------------------------------------------------------------------------

    def speculate(self, replica: str, exact: Chunks) -> None:
        """``replica`` just served a request with these block keys: count them as cached there
        until ``ttl`` from now (the events confirming them are on their way)."""
        if self.ttl <= 0 or not exact.hashes or not self.live(replica):
            return
        now = self._clock()
        self._expire(now)
        expires = now + self.ttl
        spec = self._spec
        for key in exact.hashes:
            d = spec.get(key)
            if d is None:
                spec[key] = {replica: expires}
            else:
                d[replica] = expires
        self._spec_queue.append(_Spec(expires, replica, exact.hashes))

    def _expire(self, now: float) -> None:
        queue, spec = self._spec_queue, self._spec
        while queue and queue[0].expires <= now:
            item = queue.popleft()
            for key in item.keys:
                d = spec.get(key)
                if d is not None and d.get(item.replica) == item.expires:
                    del d[item.replica]
                    if not d:
                        del spec[key]

    def match(self, exact: Chunks) -> dict[str, int]:
        """Live replica -> tokens of the longest prefix of ``exact`` it holds or speculatively
        holds (replicas holding nothing are absent)."""
        if not exact.hashes:
            return {}
        if self._spec_queue:
            self._expire(self._clock())
        if self._spec:
            found = match_holders(_Union(self._holders, self._spec), exact)
        else:
            found = match_holders(self._holders, exact)
        replicas = self._replicas
        return {n: t for n, t in found.items() if n in replicas and replicas[n].live}


class _Union(Mapping[int, Collection[str]]):
    """holders ∪ speculative holders, as the mapping `match_holders` reads (``get`` only)."""

    __slots__ = ("_holders", "_spec")

    def __init__(self, holders: dict[int, set[str]], spec: dict[int, dict[str, float]]) -> None:
        self._holders, self._spec = holders, spec

    def get(self, key: int, default: object = None) -> set[str] | None:  # type: ignore[override]
        held = self._holders.get(key)
        sp = self._spec.get(key)
        if sp is None:
            return held
        return set(sp) if held is None else held | sp.keys()

    def __getitem__(self, key: int) -> set[str]:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._holders.keys() | self._spec.keys())

    def __len__(self) -> int:
        return len(self._holders.keys() | self._spec.keys())


class KvIndex:
    """`PrefixIndex`: precise for replicas with a live event stream, approximate for the rest.

    ``match(chunks)`` uses ``chunks.exact`` (the request's block keys, when the router computed
    them) for live replicas and ``chunks`` itself, through the approximate index, for every
    other replica. ``record`` feeds the approximate index (so it is warm whenever a stream goes
    down) and adds speculative entries to the precise one.
    """

    def __init__(self, approx: ApproxIndex, precise: PreciseIndex) -> None:
        self.approx = approx
        self.precise = precise

    def match(self, chunks: Chunks) -> dict[str, int]:
        found = self.approx.match(chunks)
        exact = chunks.exact
        if exact is None:
            return found
        precise = self.precise
        bs = exact.tokens[0] if exact.tokens else 0
        out = {n: t for n, t in found.items() if not precise.precise_for(n, bs)}
        for n, t in precise.match(exact).items():
            if precise.precise_for(n, bs):
                out[n] = t
        return out

    def record(self, replica: str, chunks: Chunks) -> None:
        self.approx.record(replica, chunks)
        if chunks.exact is not None:
            self.precise.speculate(replica, chunks.exact)

    def set_capacity(self, replica: str, tokens: int) -> None:
        self.approx.set_capacity(replica, tokens)

    def forget(self, replica: str) -> None:
        self.approx.forget(replica)
        self.precise.forget(replica)

    def inserted(self, replica: str) -> float:
        return self.approx.inserted(replica)

    def used(self, replica: str) -> int:
        """What the replica's engine holds, while its stream is live; else the approximate
        index's estimate."""
        tokens = self.precise.tokens(replica)
        return self.approx.used(replica) if tokens is None else tokens
