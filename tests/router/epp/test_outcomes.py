"""What the EPP learns from the response phase: the served pod, the status and the reported
cached tokens - written to the index and the metrics as `serve` writes them."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from loadtest.fleet import Fleet
from loadtest.gateway import EppThread, Gateway, ask, body_message, response_headers_message
from router.replicas import address_of
from tests.conftest import wait_for
from tests.router.epp.conftest import all_idle, chat, open_stream

PATH = "/v1/chat/completions"


def _name_of(epp: EppThread, endpoint: str) -> str:
    return epp.run(lambda: next(s.name for s in epp.server.core.replicas.states()
                                if address_of(s.url) == endpoint))


def _used(epp: EppThread) -> dict[str, int]:
    def read() -> dict[str, int]:
        core = epp.server.core
        index = core.router.index
        assert index is not None
        return {s.name: index.used(s.name) for s in core.replicas.states()}
    return epp.run(read)  # type: ignore[no-any-return]


def _sample(epp: EppThread, metric: str, replica: str) -> float:
    text = epp.run(lambda: epp.server.core.metrics.render()[0].decode())
    total = 0.0
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'replica="{replica}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_response_phase_writes_the_index_for_the_served_pod(epp: EppThread) -> None:
    gw = Gateway(epp.port)
    try:
        body = chat("first")
        _picked, resp, served = gw.request(PATH, body)
        assert served is not None and resp is not None
        name = _name_of(epp, served)
        used = _used(epp)
        assert used[name] > 0 and sum(used.values()) == used[name]
        # a repeat is predicted as cached there; vLLM (simulated) reports the hit
        gw.request(PATH, body)
        assert _sample(epp, "prefix_router_predicted_cached_tokens_total", name) > 0
        assert _sample(epp, "prefix_router_reported_cached_tokens_total", name) > 0
        assert _sample(epp, "prefix_router_requests_total", name) == 2
    finally:
        gw.close()
    wait_for(lambda: all_idle(epp), "attempts released")


def test_without_the_response_phase_nothing_is_written(epp: EppThread) -> None:
    gw = Gateway(epp.port, response_phase=False)
    try:
        _picked, resp, _served = gw.request(PATH, chat("unseen"))
        assert resp is not None and resp.status_code == 200
    finally:
        gw.close()
    wait_for(lambda: all_idle(epp), "the attempt released when the stream ended")
    assert sum(_used(epp).values()) == 0  # outcome-only: no response seen, nothing learned


def test_an_error_status_writes_nothing_and_counts_a_failure(
        start_epp: Callable[..., EppThread]) -> None:
    epp = start_epp(health={"eject_after": 1})
    channel, stream = open_stream(epp)
    try:
        picked = ask(stream, PATH, chat("this one fails"))
        stream.send(response_headers_message(500, picked.endpoints[0], "application/json"))
        assert stream.recv().WhichOneof("response") == "response_headers"  # type: ignore[union-attr]
        stream.send(body_message(b'{"error": {"message": "boom"}}', True, response=True))
        assert stream.recv() is not None
    finally:
        stream.close()
        channel.close()
    wait_for(lambda: all_idle(epp), "attempt released")
    assert sum(_used(epp).values()) == 0
    name = _name_of(epp, picked.endpoints[0])
    # passive health, as serve's: with eject_after 1 the 5xx ejected the pod
    assert _sample(epp, "prefix_router_ejections_total", name) == 1


def test_a_gateway_retry_is_credited_to_the_pod_that_served(fleet: Fleet,
                                                            epp: EppThread) -> None:
    channel, stream = open_stream(epp)
    try:
        body = chat("retried elsewhere")
        picked = ask(stream, PATH, body)
        fallback = picked.endpoints[1]  # the pick failed; the gateway went down the list
        resp = httpx.post(f"http://{fallback}{PATH}", content=body,
                          headers={"content-type": "application/json"})
        stream.send(response_headers_message(200, fallback, "application/json"))
        stream.recv()
        stream.send(body_message(resp.content, True, response=True))
        echoed = stream.recv()
        assert echoed is not None
        assert echoed.response_body.response.body_mutation.streamed_response.body == resp.content
    finally:
        stream.close()
        channel.close()
    wait_for(lambda: all_idle(epp), "both attempts released")
    used = _used(epp)
    assert used[_name_of(epp, fallback)] > 0
    assert used[_name_of(epp, picked.endpoints[0])] == 0


def test_a_streamed_response_is_echoed_chunk_by_chunk(epp: EppThread) -> None:
    gw = Gateway(epp.port)
    try:
        _picked, resp, served = gw.request(PATH, chat("stream it", stream=True,
                                                     stream_options={"include_usage": True}))
        assert resp is not None and resp.headers["content-type"].startswith("text/event-stream")
    finally:
        gw.close()
    wait_for(lambda: all_idle(epp), "attempt released")
    assert served is not None
    name = _name_of(epp, served)
    assert _used(epp)[name] > 0
    assert _sample(epp, "prefix_router_reported_prompt_tokens_total", name) > 0
