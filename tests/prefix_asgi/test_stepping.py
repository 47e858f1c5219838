"""`prefix_asgi.advance` steps a coroutine exactly as an asyncio Task does: every case runs
once under a real Task and once under a hand-stepped driver, and must end the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import pytest

from prefix_asgi import advance


def hand_stepped(coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """Drive ``coro`` with `advance` and done-callbacks only (no Task); its outcome as a future."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[Any] = loop.create_future()

    def step(_: object = None) -> None:
        try:
            waiting = advance(coro)
        except StopIteration as stop:
            outcome.set_result(stop.value)
            return
        except BaseException as exc:
            outcome.set_exception(exc)
            return
        if waiting is None:
            loop.call_soon(step)
        else:
            waiting.add_done_callback(step)

    step()
    return outcome


class _Yield:
    """An awaitable that yields ``value`` once: what a buggy awaitable hands the event loop."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, None]:
        yield self.value


def _non_blocking_future() -> _Yield:
    fut = asyncio.get_running_loop().create_future()
    fut._asyncio_future_blocking = False  # a future yielded by `yield`, not `await`
    return _Yield(fut)


async def _result_later() -> str:
    fut = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(fut.set_result, "value")
    return str(await fut)


async def _error_later() -> str:
    fut = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(fut.set_exception, KeyError("boom"))
    try:
        await fut
    except KeyError as exc:
        return f"caught {exc}"
    return "not raised"


async def _bare_yields() -> int:
    for _ in range(3):
        await asyncio.sleep(0)
    return 3


async def _sleeps() -> str:
    await asyncio.sleep(0.001)
    return "slept"


async def _bad_yield() -> str:
    try:
        await _Yield(42)
    except RuntimeError as exc:
        return f"told: {exc}"
    return "not told"


async def _yield_instead_of_await() -> str:
    try:
        await _non_blocking_future()
    except RuntimeError as exc:
        return "told" if "yield" in str(exc) else f"other: {exc}"
    return "not told"


async def _raises() -> None:
    await asyncio.sleep(0)
    raise ValueError("from the coroutine")


async def _queue_round_trip() -> int:
    q: asyncio.Queue[int] = asyncio.Queue()
    asyncio.get_running_loop().call_later(0.001, q.put_nowait, 7)
    return await q.get()


CASES: list[tuple[str, Callable[[], Coroutine[Any, Any, Any]], Any]] = [
    ("a future's result reaches the coroutine", _result_later, "value"),
    ("a future's exception is raised inside the coroutine", _error_later, "caught 'boom'"),
    ("sleep(0) is a bare yield: stepped again next pass", _bare_yields, 3),
    ("a timer future", _sleeps, "slept"),
    ("a bad yield is answered with RuntimeError thrown in", _bad_yield,
     "told: bad yield: 42"),
    ("a future yielded without await is refused", _yield_instead_of_await, "told"),
    ("an asyncio.Queue wait (what uvicorn's receive() does)", _queue_round_trip, 7),
]  # fmt: skip


@pytest.mark.parametrize(("what", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hand_stepped_ends_as_a_task_does(what: str, make: Callable[[], Coroutine[Any, Any, Any]],
                                          expected: Any) -> None:
    async def both() -> tuple[Any, Any]:
        by_task = await asyncio.create_task(make())
        by_hand = await hand_stepped(make())
        return by_task, by_hand

    by_task, by_hand = asyncio.run(both())
    if what.startswith("a bad yield"):
        # a Task names itself in the message; the value it was handed is the same
        assert by_task.startswith("told: Task got bad yield: 42")
    else:
        assert by_task == expected
    assert by_hand == expected


def test_an_exception_the_coroutine_lets_out_propagates() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="from the coroutine"):
            await hand_stepped(_raises())

    asyncio.run(main())


def test_throwing_cancellation_in_runs_the_coroutines_cleanup() -> None:
    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            cleaned.append("finally")

    async def main() -> None:
        coro = waits_forever()
        waiting = advance(coro)
        assert isinstance(waiting, asyncio.Future) and not waiting.done()
        # the flag is cleared, as a Task clears it: awaiting the future again is allowed
        assert waiting._asyncio_future_blocking is False
        with pytest.raises(asyncio.CancelledError):
            advance(coro, asyncio.CancelledError())
        assert cleaned == ["finally"]

    asyncio.run(main())


def test_a_finished_coroutine_reports_its_value_through_stopiteration() -> None:
    async def immediate() -> str:
        return "done"

    with pytest.raises(StopIteration) as stop:
        advance(immediate())
    assert stop.value.value == "done"
