"""The simulated engine on its own: scheduling, KV blocks, prefix hits, preemption, aborts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from loadtest.replica.engine import Engine, EngineError, EngineLimits, EngineRequest, Usage
from loadtest.replica.timing import TimingModel

T = TypeVar("T")
FAST = TimingModel(speed=200.0)


def run(body: Callable[[Engine], Awaitable[T]], **limits: object) -> T:
    async def main() -> T:
        engine = Engine(EngineLimits(**limits), FAST)  # type: ignore[arg-type]
        engine.start()
        try:
            return await asyncio.wait_for(body(engine), timeout=30)
        finally:
            await engine.stop()

    return asyncio.run(main())


def req(rid: str, ids: list[int], max_tokens: int = 4) -> EngineRequest:
    return EngineRequest(rid, ids, max_tokens)


def test_second_identical_prompt_hits_all_full_blocks_but_recomputes_one_token() -> None:
    prompt = list(range(100))  # 6 full blocks of 16 + 4 tokens

    async def body(e: Engine) -> tuple[int, int, int, int]:
        first = await e.submit(req("a", prompt)).wait()
        second = await e.submit(req("b", prompt)).wait()
        return first.cached_tokens, second.cached_tokens, e.stats.queries, e.stats.hits

    assert run(body) == (0, 96, 200, 96)


def test_prompt_of_exact_blocks_is_capped_one_block_short() -> None:
    prompt = list(range(64))  # 4 full blocks: vLLM must compute >= 1 token, so 3 blocks hit

    async def body(e: Engine) -> int:
        await e.submit(req("a", prompt)).wait()
        return (await e.submit(req("b", prompt)).wait()).cached_tokens

    assert run(body) == 48


def test_same_block_after_a_different_prefix_is_a_miss() -> None:
    shared = list(range(1000, 1032))

    async def body(e: Engine) -> int:
        await e.submit(req("a", [1] * 16 + shared)).wait()
        return (await e.submit(req("b", [2] * 16 + shared + [7])).wait()).cached_tokens

    assert run(body) == 0


def test_generated_tokens_are_cached_for_the_next_turn() -> None:
    prompt = list(range(40))
    out = list(range(500, 540))

    async def body(e: Engine) -> int:
        await e.submit(EngineRequest("a", prompt, 41, output_ids=out + [77])).wait()
        # next turn = prompt + reply + new user text: hit reaches into the generated blocks
        # (80 of the 81 tokens had their KV computed: the last token's never is)
        return (await e.submit(req("b", prompt + out + [9] * 10)).wait()).cached_tokens

    assert run(body) == 80


def test_lru_evicts_the_least_recently_used_prompt() -> None:
    a, b, c = ([k] * 64 for k in (1, 2, 3))  # 4 blocks each (+1 for decode), 10-block pool

    async def body(e: Engine) -> list[int]:
        hits = []
        for rid, p in (("a", a), ("b", b), ("a2", a), ("c", c), ("a3", a), ("b2", b)):
            hits.append((await e.submit(req(rid, p, 1)).wait()).cached_tokens)
        return hits

    # c and a3 take b's blocks (least recently used, freed tail first): a stays warm, only b's
    # head block survives.
    assert run(body, kv_blocks=10) == [0, 0, 48, 0, 48, 16]


def test_max_num_seqs_queues_fifo() -> None:
    async def body(e: Engine) -> tuple[list[str], list[str], list[int]]:
        handles = [e.submit(req(f"r{i}", [i] * 20, 8)) for i in range(3)]
        await asyncio.sleep(0)  # let one step schedule
        for _ in range(1000):
            if e.running:
                break
            await asyncio.sleep(0.001)
        state = e.request_ids()
        done = await asyncio.gather(*(h.wait() for h in handles))
        return state["running"], state["waiting"], [u.completion_tokens for u in done]

    running, waiting, tokens = run(body, max_num_seqs=1)
    assert (running, waiting) == (["r0"], ["r1", "r2"])
    assert tokens == [8, 8, 8]


def test_running_blocks_are_pinned_and_freed_on_finish() -> None:
    async def body(e: Engine) -> tuple[float, float]:
        h = e.submit(req("a", list(range(160)), 50))
        async for _ in h.tokens():
            break
        during = e.kv_usage
        await h.wait()
        return during, e.kv_usage

    during, after = run(body, kv_blocks=20)
    assert during >= 11 / 20 and after == 0.0


def test_out_of_blocks_preempts_the_newest_request_and_both_finish() -> None:
    async def body(e: Engine) -> tuple[int, list[int]]:
        hs = [e.submit(req(f"r{i}", [i] * 60, 60)) for i in range(2)]
        done = await asyncio.gather(*(h.wait() for h in hs))
        return e.stats.preemptions, [u.completion_tokens for u in done]

    # each needs 8 blocks at the end; 12 blocks hold both prompts but not both completions
    preemptions, tokens = run(body, kv_blocks=12)
    assert preemptions >= 1
    assert tokens == [60, 60]


def test_no_preempt_reserves_and_makes_the_second_request_wait() -> None:
    async def body(e: Engine) -> tuple[list[str], int]:
        hs = [e.submit(req(f"r{i}", [i] * 60, 60)) for i in range(2)]
        for _ in range(1000):
            if e.running:
                break
            await asyncio.sleep(0.001)
        waiting = e.request_ids()["waiting"]
        await asyncio.gather(*(h.wait() for h in hs))
        return waiting, e.stats.preemptions

    assert run(body, kv_blocks=12, preempt=False) == (["r1"], 0)


def test_abort_of_running_request_frees_blocks_and_keeps_computed_ones_cached() -> None:
    prompt = list(range(64))

    async def body(e: Engine) -> tuple[float, int, int]:
        h = e.submit(req("a", prompt, 1000))
        async for _ in h.tokens():
            break
        assert h.abort()
        usage_after = e.kv_usage
        again = await e.submit(req("b", prompt)).wait()
        return usage_after, e.stats.aborts, again.cached_tokens

    assert run(body, kv_blocks=100) == (0.0, 1, 48)


def test_abort_of_waiting_request_leaves_the_queue() -> None:
    async def body(e: Engine) -> tuple[list[str], int]:
        first = e.submit(req("a", [1] * 20, 50))
        second = e.submit(req("b", [2] * 20, 50))
        second.abort()
        await first.wait()
        return e.request_ids()["waiting"], e.stats.finished

    assert run(body, max_num_seqs=1) == ([], 1)


def test_requests_that_can_never_fit_are_rejected() -> None:
    async def body(e: Engine) -> None:
        e.submit(req("a", [1] * 100, 100))

    with pytest.raises(EngineError, match="KV cache"):
        run(body, kv_blocks=4)
    with pytest.raises(EngineError, match="maximum context length"):
        run(body, max_model_len=150)


def test_prefill_is_chunked_by_the_step_token_budget() -> None:
    async def body(e: Engine) -> int:
        await e.submit(req("a", list(range(1000)), 1)).wait()
        return e.stats.steps

    assert run(body, max_num_batched_tokens=256) == 4  # ceil(1000 / 256) prefill steps


def test_cached_prefill_is_much_faster_than_uncached_in_the_timing_model() -> None:
    t = TimingModel()
    uncached = t.step_seconds(prefill_tokens=2048, decoding_seqs=0)
    cached = t.step_seconds(prefill_tokens=16, decoding_seqs=0)
    assert uncached >= 10 * cached
    assert t.step_seconds(0, 64) > t.step_seconds(0, 1)  # ITL grows with the batch
    assert TimingModel(speed=10).step_seconds(100, 1) == pytest.approx(t.step_seconds(100, 1) / 10)


def test_last_generated_token_is_not_cached() -> None:
    async def body(e: Engine) -> int:
        await e.submit(EngineRequest("a", list(range(40)), 8, output_ids=list(range(500, 508)))).wait()
        # 48 tokens = 3 full blocks, but the 48th token's KV was never computed
        return (await e.submit(req("b", list(range(40)) + list(range(500, 508)) + [1])).wait()
                ).cached_tokens

    assert run(body) == 32


def test_instant_mode_counts_hits_without_a_loop() -> None:
    e = Engine(EngineLimits(), FAST)
    prompt = list(range(40))

    async def serve() -> list[int]:
        return [e.serve_instant(req("a", prompt)).cached_tokens,
                e.serve_instant(req("b", prompt)).cached_tokens]

    assert asyncio.run(serve()) == [0, 32]
    assert (e.stats.queries, e.stats.hits, e.kv_usage) == (80, 32, 0.0)


def test_engine_can_be_stepped_on_a_virtual_clock() -> None:
    now = [0.0]
    e = Engine(EngineLimits(), TimingModel(), clock=lambda: now[0])
    h = e.submit(req("a", list(range(2048)), 2))
    plans = []
    while not h.done:
        plan = e.schedule()
        plans.append((plan.prefill_tokens, plan.decoding))
        now[0] += e.timing.step_seconds(plan.prefill_tokens, plan.decoding)
        e.apply(plan, now[0])
    assert plans == [(2048, 0), (0, 1)]    # one prefill step (first token), one decode step
    assert now[0] == pytest.approx((10 + 204.8) / 1000 + (10 + 0.25) / 1000)


def test_instant_mode_leaves_the_pool_as_a_request_served_step_by_step_would() -> None:
    """serve_instant against the reference sequence of pool calls (allocate prompt + output with
    the hit capped below the prompt, register all computed full blocks, free), on a small pool
    where eviction order decides later hits."""
    import random

    from templates_audit.blocks import PrefixCache, block_hashes

    rng = random.Random(11)
    bs, blocks = 4, 40
    e = Engine(EngineLimits(block_size=bs, kv_blocks=blocks), FAST)
    ref = PrefixCache(blocks, bs)
    heads = [[rng.randrange(50) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    seen: list[tuple[list[int], int, list[int]]] = []
    for i in range(1500):
        if seen and rng.random() < 0.2:   # the same request again: its reply blocks are cached
            prompt, max_tokens, out = rng.choice(seen)
        else:
            prompt = rng.choice(heads) + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
            max_tokens = rng.randrange(1, 9)
            out = [rng.randrange(50) for _ in range(rng.randrange(0, max_tokens + 1))]
            seen.append((prompt, max_tokens, out))
        if rng.random() < 0.3:
            heads.append(prompt + out)   # a later turn continues this one
        usage = e.serve_instant(EngineRequest(f"r{i}", prompt, max_tokens, output_ids=out,
                                              prompt_hashes=block_hashes(prompt, bs)
                                              if i % 2 else None))
        ids = prompt + out + [0] * (max_tokens - len(out))
        hashes = block_hashes(ids, bs)
        alloc = ref.allocate(hashes[: (len(prompt) - 1) // bs], len(ids), record=False)
        assert alloc is not None
        ref.cache_full_blocks(alloc, hashes[: (len(ids) - 1) // bs])
        ref.free(alloc)
        assert usage == Usage(len(prompt), max_tokens, alloc.hit_tokens)
    probes = [block_hashes(h, bs) for h in heads]
    assert ([e.cache.cached_prefix_tokens(p, 10**6) for p in probes]
            == [ref.cached_prefix_tokens(p, 10**6) for p in probes])
    assert e.kv_usage == ref.usage == 0.0
    assert e.stats.finished == 1500
