"""The simulated engine: vLLM V1-style continuous batching over a prefix-cached KV block pool.

One asyncio task per replica runs the scheduler loop. Each iteration is one engine step:

1. Running requests, oldest first: a request still prefilling gets its next chunk (bounded by the
   step's token budget, ``max_num_batched_tokens``); a decoding request gets one token, after its
   KV allocation grows by a slot. If the pool is out of blocks the *newest* running request is
   preempted (recompute mode: blocks freed, progress reset, back to the head of the queue;
   ``preemptions`` counted) until the grow succeeds.
2. If nothing was preempted, waiting requests are admitted FIFO while fewer than ``max_num_seqs``
   run and budget remains. A LoRA request whose adapter would make more than ``max_loras``
   distinct adapters in the batch is skipped (it keeps its place; later requests go on, as
   vLLM's scheduler skips it); admitting one whose adapter is not resident loads it into a slot
   (LRU eviction of an adapter no running request holds) and the step pays ``lora_load_ms``. Admission pins the cached prefix and allocates the rest of the prompt
   (``PrefixCache.allocate``); the head of the queue waits when the pool cannot hold it
   (head-of-line, as vLLM). Hits and queries are counted in tokens on a request's first admission.
3. The step sleeps for ``TimingModel.step_seconds(prefill tokens, decoding seqs)``; then every
   request whose scheduled tokens complete its prompt (or its decode slot) emits one token,
   registers its newly full blocks in the cache, and finishes at ``max_tokens``.

Invariants: a running request's blocks are pinned (refcount > 0) until it finishes, is preempted
or aborted; cached tokens are never scheduled, so prefill time is proportional to uncached tokens;
an aborted request leaves the queue or frees its blocks at once (its computed full blocks stay
cached, as in vLLM). With ``preempt=False`` a request reserves ``prompt + max_tokens`` slots at
admission and is never preempted. Cost per step: O(running + admitted) plus hashing each newly
filled block once.

A request's ``remote_tokens`` (a disaggregated decode: KV a remote prefill computed,
`kv_transfer`) count as computed at its first admission - capped one token short of the prompt,
like a hit - without being a local prefix-cache hit (they are ``external_hits``); its usage
reports ``remote_cached`` (the prefill's own hit) as cached tokens when given, as vLLM does.

``Engine.serve_instant`` is the no-timing path: allocate, count, cache, free, all at once.

KV cache events (``events``, a `BlockEvents`; None: off): every change of the block pool is
reported in the order it happens — blocks a request registers (``stored``, one call per run of
consecutive new blocks: their hashes, the hash before them, their token ids, the request's
adapter; a block whose hash another block already holds is not registered, so not reported),
hashes evicted (``removed``) and a reset (``cleared``) — and ``flush`` closes the batch at the end
of every engine step (of every instant request; of an abort or a reset outside a step). Every
``stored`` hash is absent from the pool just before and every ``removed`` one present, so
replaying the changes onto an empty set — or onto per-hash counts — yields exactly the pool's
cached hashes after each flush.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from templates_audit.blocks import Allocation, PrefixCache, block_hashes

from .timing import TimingModel


class EngineError(ValueError):
    """A request the engine can never serve (too long for the model or the KV pool)."""


class EngineRequest(NamedTuple):   # NamedTuples: built per request, 5x cheaper than frozen
    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    output_ids: Sequence[int] = ()   # ids of the text the request will return (cached on finish)
    prompt_hashes: Sequence[int] | None = None   # full-block hashes of prompt_ids, if known
    lora: str | None = None   # the LoRA adapter the request runs with (None: the base model)
    # prompt tokens whose KV a remote prefill computed (disaggregated decode, `kv_transfer`):
    # counted as computed at admission, like a hit, but not as a local prefix-cache hit
    remote_tokens: int = 0
    # the cached tokens the remote prefill reported: what usage reports instead of the local
    # hit (vLLM's output processor reports the prefill's hits on the decode instance)
    remote_cached: int | None = None


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str = "length"


@dataclass(frozen=True)
class EngineLimits:
    block_size: int = 16
    kv_blocks: int | None = 8192
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768
    preempt: bool = True
    max_loras: int = 1   # distinct adapters one step can run (vLLM --max-loras)


class BlockEvents(Protocol):
    """Where the engine reports its block pool's changes (``loadtest.replica.kv_events``)."""

    def stored(self, hashes: Sequence[int], parent: int | None, token_ids: Sequence[int],
               lora: str | None) -> None: ...

    def removed(self, hashes: list[int]) -> None: ...

    def cleared(self) -> None: ...

    def flush(self) -> None: ...


class Observer(Protocol):
    """Where the engine reports latencies (the metrics module); seconds of wall time."""

    def first_token(self, seconds: float) -> None: ...

    def finished(self, seconds: float, reason: str) -> None: ...


class _NullObserver:
    def first_token(self, seconds: float) -> None:
        pass

    def finished(self, seconds: float, reason: str) -> None:
        pass


@dataclass(eq=False)
class _Seq:
    req: EngineRequest
    arrival: float
    ids: list[int]                  # prompt ids, then generated ids as they are produced
    hashes: list[int]               # full-block hashes of ids, extended lazily
    prompt_len: int
    generated: int = 0
    computed: int = 0               # tokens whose KV is computed
    alloc: Allocation | None = None
    admitted: bool = False          # hits/queries counted (first admission only)
    prefilled: bool = False         # reached decode since the last (re)admission
    cached_tokens: int = 0
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.generated


@dataclass
class EngineStats:
    """Plain counters (tokens unless named otherwise) that /metrics and /admin/stats read."""

    queries: int = 0    # vllm:prefix_cache_queries: prompt tokens of admitted requests
    hits: int = 0       # vllm:prefix_cache_hits: their tokens found in the cache
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    external_queries: int = 0   # vllm:external_prefix_cache_queries: prompt tokens of requests
    external_hits: int = 0      # given remote KV, and (..._hits) the tokens that KV covered
    aborts: int = 0     # requests dropped from the queue or the batch by abort()
    finished: int = 0
    steps: int = 0


@dataclass(frozen=True)
class Plan:
    """What one engine step computes; its duration is `TimingModel.step_seconds(prefill_tokens,
    decoding)`."""

    chunks: list[tuple[_Seq, int]]   # (request, tokens computed this step)
    prefill_tokens: int
    decoding: int
    lora_loads: int = 0   # adapters this step loaded into a slot


class RequestHandle:
    """A submitted request: iterate `tokens()` for token indices as they are produced."""

    def __init__(self, engine: Engine, seq: _Seq) -> None:
        self._engine = engine
        self._seq = seq

    @property
    def request_id(self) -> str:
        return self._seq.req.request_id

    @property
    def done(self) -> bool:
        return self._seq.done

    @property
    def usage(self) -> Usage:
        s = self._seq
        return Usage(s.prompt_len, s.generated, s.cached_tokens)

    async def tokens(self) -> AsyncIterator[int]:
        sent = 0
        seq = self._seq
        while True:
            await seq.changed.wait()
            seq.changed.clear()
            while sent < seq.generated:
                yield sent
                sent += 1
            if seq.done:
                return

    async def wait(self) -> Usage:
        async for _ in self.tokens():
            pass
        return self.usage

    def abort(self) -> bool:
        return self._engine.abort(self._seq)


def _output_ids(out: Sequence[int], start: int, n: int) -> list[int]:
    """Generated tokens ``start .. start + n`` of a reply whose ids are ``out``, padded with 0:
    padding keeps block hashes defined when the text tokenised shorter than max_tokens."""
    ids = list(out[start:start + n])
    ids += [0] * (n - len(ids))
    return ids


class Engine:
    """One replica's scheduler. `start()` runs the real-time loop; a discrete-event driver can
    instead call `schedule()`, advance its own clock by `timing.step_seconds(...)` and `apply()`
    the plan, passing `clock` so arrival times come from its virtual time."""

    def __init__(self, limits: EngineLimits, timing: TimingModel,
                 observer: Observer | None = None,
                 clock: Callable[[], float] | None = None,
                 events: BlockEvents | None = None) -> None:
        self.limits = limits
        self._clock = clock
        self.timing = timing
        self.cache = PrefixCache(limits.kv_blocks, limits.block_size)
        self.events = events
        self._fresh: list[int] = []   # hashes the pool registered during the current call
        if events is not None:
            self.cache.on_evict = events.removed
            self.cache.on_store = self._fresh.extend
        self._stepping = False   # inside an engine step: its end flushes the events
        self.observer: Observer = observer or _NullObserver()
        self.stats = EngineStats()
        self.slow = 1.0   # fault injection: multiplies every step's duration
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        # adapters loaded in slots, least recently used first (at most limits.max_loras)
        self.resident: OrderedDict[str, None] = OrderedDict()
        self.lora_loads = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # -- requests --------------------------------------------------------------------------------
    def _check(self, req: EngineRequest) -> None:
        total = len(req.prompt_ids) + req.max_tokens
        if not req.prompt_ids:
            raise EngineError("the prompt is empty")
        if total > self.limits.max_model_len:
            raise EngineError(
                f"This model's maximum context length is {self.limits.max_model_len} tokens. "
                f"However, you requested {total} tokens ({len(req.prompt_ids)} in the messages, "
                f"{req.max_tokens} in the completion).")
        kv = self.limits.kv_blocks
        if kv is not None and self.cache.blocks_for(total) > kv:
            raise EngineError(f"the request needs {total} tokens of KV cache; "
                              f"the replica holds {kv * self.limits.block_size}")

    def _new_seq(self, req: EngineRequest) -> _Seq:
        self._check(req)
        hashes = (list(req.prompt_hashes) if req.prompt_hashes is not None
                  else block_hashes(req.prompt_ids, self.limits.block_size))
        return _Seq(req=req, arrival=self._now(), ids=list(req.prompt_ids), hashes=hashes,
                    prompt_len=len(req.prompt_ids))

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def submit(self, req: EngineRequest) -> RequestHandle:
        seq = self._new_seq(req)
        self.waiting.append(seq)
        self._wake.set()
        return RequestHandle(self, seq)

    def serve_instant(self, req: EngineRequest) -> Usage:
        """No timing: admit, count, generate, cache and free in one call.

        The pool sees what a timed request does over its life, in the same order: allocate the
        prompt plus every generated token (hit capped below the prompt's length), register every
        computed full block — prompt and generated, all but the last token, whose KV is never
        computed — then free. No per-request sequence object, no copy of the prompt.

        With nothing running (so nothing pinned: always, in instant mode) that is
        `PrefixCache.insert` of the request's full-block hashes with the hit capped at the
        prompt's blocks, several times cheaper than the three calls.
        """
        self._check(req)
        bs = self.limits.block_size
        prompt = req.prompt_ids
        n = len(prompt)
        total = n + req.max_tokens
        hashes = (req.prompt_hashes if req.prompt_hashes is not None
                  else block_hashes(prompt, bs))
        cap = (n - 1) // bs
        full = (total - 1) // bs   # the last token's KV is never computed
        if len(hashes) < full:
            start = len(hashes) * bs
            gen = _output_ids(req.output_ids, 0, req.max_tokens)
            more = [*prompt[start:], *gen][: full * bs - start]
            hashes = [*hashes, *block_hashes(more, bs, parent=hashes[-1] if hashes else None)]
        elif len(hashes) > full:
            hashes = hashes[:full]
        cache = self.cache
        stored = None   # the range of hashes registered: (start, end)
        if not self.running:
            # Nothing pinned, so the pool holds the request (it passed _check): it registers
            # every block past its hit.
            hit = cache.insert(hashes, total, record=False, hit_limit=cap)
            stored = (hit // bs, len(hashes))
        else:
            capped = hashes[:cap]
            alloc = cache.allocate(capped, total, record=False)
            if alloc is None:  # only concurrent timed requests could pin blocks; count anyway
                hit = cache.cached_prefix_tokens(capped, n)
            else:
                hit = alloc.hit_tokens
                start = alloc.cached_upto
                cache.cache_full_blocks(alloc, hashes)
                cache.free(alloc)
                stored = (start, alloc.cached_upto)
        if self.events is not None:
            if stored is not None and stored[1] > stored[0]:
                a, b = stored
                ids = prompt if b * bs <= n else [
                    *prompt, *_output_ids(req.output_ids, 0, req.max_tokens)]
                self._report_stored(hashes, a, b, ids, req.lora)
            self._fresh.clear()
            self.events.flush()
        st = self.stats
        st.queries += n
        st.hits += hit
        st.prompt_tokens += n
        st.generation_tokens += req.max_tokens
        st.finished += 1
        if req.remote_tokens > hit:
            st.external_queries += n
            st.external_hits += min(req.remote_tokens, n - 1) - hit
        return Usage(n, req.max_tokens, hit if req.remote_cached is None else req.remote_cached)

    def abort(self, seq: _Seq) -> bool:
        """Drop a request (client went away). False when it had already finished."""
        if seq.done:
            return False
        seq.done = True
        if seq.alloc is not None:
            self._release(seq)
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.stats.aborts += 1
        seq.changed.set()
        if self.events is not None and not self._stepping:
            self.events.flush()
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's ``POST /reset_prefix_cache``); False while a
        request holds blocks (vLLM refuses then too)."""
        if not self.cache.reset():
            return False
        if self.events is not None:
            self.events.cleared()
            if not self._stepping:
                self.events.flush()
        return True

    @property
    def kv_usage(self) -> float:
        return self.cache.usage

    def request_ids(self) -> dict[str, list[str]]:
        return {"running": [s.req.request_id for s in self.running],
                "waiting": [s.req.request_id for s in self.waiting]}

    # -- block bookkeeping -----------------------------------------------------------------------
    def _extend_ids(self, seq: _Seq) -> None:
        out = seq.req.output_ids
        need = seq.num_tokens - len(seq.ids)
        if need > 0:
            seq.ids.extend(_output_ids(out, len(seq.ids) - seq.prompt_len, need))

    def _hashes_upto(self, seq: _Seq, num_tokens: int) -> list[int]:
        bs = self.limits.block_size
        full = num_tokens // bs
        if len(seq.hashes) < full:
            start = len(seq.hashes) * bs
            parent = seq.hashes[-1] if seq.hashes else None
            seq.hashes.extend(block_hashes(seq.ids[start:full * bs], bs, parent=parent))
        return seq.hashes

    def _register(self, seq: _Seq) -> None:
        """Make the request's computed full blocks reusable by later requests."""
        alloc = seq.alloc
        bs = self.limits.block_size
        full = seq.computed // bs
        if alloc is not None and full > alloc.cached_upto:
            start = alloc.cached_upto
            hashes = self._hashes_upto(seq, seq.computed)
            self.cache.cache_full_blocks(alloc, hashes[:full])
            if self.events is not None:
                self._report_stored(hashes, start, alloc.cached_upto, seq.ids, seq.req.lora)

    def _report_stored(self, hashes: Sequence[int], a: int, b: int, ids: Sequence[int],
                       lora: str | None) -> None:
        """Report the blocks of ``hashes[a:b]`` the pool just registered (``_fresh``), one
        ``stored`` per run of consecutive ones; ``ids`` are the request's token ids."""
        assert self.events is not None
        fresh = set(self._fresh)
        self._fresh.clear()
        if not fresh:
            return
        bs = self.limits.block_size
        i = a
        while i < b:
            if hashes[i] not in fresh:
                i += 1
                continue
            j = i + 1
            while j < b and hashes[j] in fresh:
                j += 1
            self.events.stored(hashes[i:j], hashes[i - 1] if i else None, ids[i * bs:j * bs],
                               lora)
            i = j

    def _release(self, seq: _Seq) -> None:
        assert seq.alloc is not None
        self._register(seq)
        self.cache.free(seq.alloc)
        seq.alloc = None

    def _preempt(self, seq: _Seq) -> None:
        self._release(seq)
        self.running.remove(seq)
        seq.computed = 0
        seq.prefilled = False
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    # -- scheduling ------------------------------------------------------------------------------
    def schedule(self) -> Plan:
        lim = self.limits
        budget = lim.max_num_batched_tokens
        chunks: list[tuple[_Seq, int]] = []
        prefill = decoding = 0
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            todo = seq.num_tokens - seq.computed
            assert seq.alloc is not None
            if lim.preempt and seq.alloc.num_tokens < seq.num_tokens:
                while not self.cache.extend(seq.alloc, seq.num_tokens):
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted = True
                    if victim is seq:
                        break
                if seq.alloc is None:
                    continue  # preempted itself; it was the last one running
            n = min(todo, budget)
            chunks.append((seq, n))
            budget -= n
            if seq.prefilled:
                decoding += 1
            else:
                prefill += n
            i += 1
        loras = {s.req.lora for s in self.running if s.req.lora is not None}
        loads = 0
        skipped = 0
        while (len(self.waiting) > skipped and not preempted and budget > 0
               and len(self.running) < lim.max_num_seqs):
            seq = self.waiting[skipped]
            lora = seq.req.lora
            if lora is not None and lora not in loras and len(loras) >= lim.max_loras:
                skipped += 1  # its adapter does not fit this step: it waits, later ones go on
                continue
            self._hashes_upto(seq, seq.num_tokens)
            reserve = seq.num_tokens if lim.preempt else seq.prompt_len + seq.req.max_tokens
            # vLLM recomputes at least one token: the hit is capped below num_tokens.
            capped = seq.hashes[: (seq.num_tokens - 1) // lim.block_size]
            alloc = self.cache.allocate(capped, reserve, record=False)
            if alloc is None:
                break
            del self.waiting[skipped]
            if lora is not None:
                loras.add(lora)
                loads += self._load_lora(lora, loras)
            seq.alloc = alloc
            seq.computed = hit = alloc.hit_tokens
            if not seq.admitted:
                seq.admitted = True
                if seq.req.remote_tokens > hit:  # transferred KV: first admission only (a
                    # preempted request recomputes, its remote blocks were freed)
                    seq.computed = min(seq.req.remote_tokens, seq.num_tokens - 1)
                    self.stats.external_queries += seq.prompt_len
                    self.stats.external_hits += seq.computed - hit
                remote = seq.req.remote_cached
                seq.cached_tokens = hit if remote is None else remote
                self.stats.queries += seq.prompt_len
                self.stats.hits += hit
                self.stats.prompt_tokens += seq.prompt_len
            self.running.append(seq)
            n = min(seq.num_tokens - seq.computed, budget)
            chunks.append((seq, n))
            budget -= n
            prefill += n
        return Plan(chunks, prefill, decoding, loads)

    def _load_lora(self, lora: str, in_use: set[str]) -> int:
        """Make ``lora`` resident (1 if it had to be loaded); evicts the least recently used
        adapter no running request holds."""
        resident = self.resident
        if lora in resident:
            resident.move_to_end(lora)
            return 0
        while len(resident) >= self.limits.max_loras:
            victim = next((n for n in resident if n not in in_use), None)
            if victim is None:
                break
            del resident[victim]
        resident[lora] = None
        self.lora_loads += 1
        return 1

    def lora_adapters(self) -> tuple[list[str], list[str]]:
        """Adapters of the running and of the waiting requests, in first-seen order (the
        ``running_lora_adapters`` / ``waiting_lora_adapters`` of ``vllm:lora_requests_info``)."""
        running = dict.fromkeys(s.req.lora for s in self.running if s.req.lora is not None)
        waiting = dict.fromkeys(s.req.lora for s in self.waiting if s.req.lora is not None)
        return list(running), list(waiting)

    def apply(self, plan: Plan, now: float) -> None:
        for seq, n in plan.chunks:
            if seq.done or seq.alloc is None:
                continue  # aborted or preempted while the step ran
            seq.computed += n
            self._register(seq)
            if seq.computed < seq.num_tokens:
                continue  # prefill continues next step
            seq.prefilled = True
            seq.generated += 1
            self.stats.generation_tokens += 1
            self._extend_ids(seq)
            if seq.generated == 1:
                self.observer.first_token(now - seq.arrival)
            if seq.generated >= seq.req.max_tokens:
                # The last token's KV is never computed, so its block is not cached (as vLLM).
                self._release(seq)
                self.running.remove(seq)
                seq.done = True
                self.stats.finished += 1
                self.observer.finished(now - seq.arrival, "length")
            seq.changed.set()

    _schedule = schedule   # names used by loadtest.simulate before these became public
    _apply = apply

    async def _loop(self) -> None:
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.schedule()
            if not plan.chunks:
                # Nothing fits (cannot happen for requests that passed _check); wait for change.
                self._wake.clear()
                await self._wake.wait()
                continue
            self.stats.steps += 1
            self._stepping = True
            try:
                await asyncio.sleep(self.timing.step_seconds(plan.prefill_tokens, plan.decoding,
                                                             self.slow, plan.lora_loads))
                self.apply(plan, self._now())
            finally:
                self._stepping = False
                if self.events is not None:
                    self.events.flush()   # one batch per engine step, as vLLM publishes
