"""The endpoint picker end to end: a gateway speaking Envoy's ext_proc protos to a real EPP on
127.0.0.1, in front of a simulated vLLM fleet (real replica processes)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

from loadtest.fleet import Fleet
from loadtest.gateway import (
    BUFFERED,
    FULL_DUPLEX,
    EppThread,
    Gateway,
    ask,
    body_message,
    endpoints_of,
    headers_message,
)
from tests.conftest import wait_for
from tests.router.epp.conftest import addresses, all_idle, chat, idle, open_stream

PATH = "/v1/chat/completions"
MODES = [pytest.param(FULL_DUPLEX, id="full_duplex_streamed"),
         pytest.param(BUFFERED, id="buffered")]


@pytest.mark.parametrize("mode", MODES)
def test_every_request_names_a_fleet_endpoint_in_the_header_and_the_metadata(
        fleet: Fleet, epp: EppThread, mode: int) -> None:
    gw = Gateway(epp.port, mode=mode)
    fleet_addrs = set(addresses(fleet))
    try:
        for i in range(8):
            body = chat(f"question {i}: where is my invoice?", system=f"Tenant {i}. " + "x" * 200)
            picked, resp, served = gw.request(PATH, body)
            assert picked.status is None, picked.error
            assert picked.endpoints and picked.endpoints == picked.metadata
            assert set(picked.endpoints) <= fleet_addrs
            assert len(set(picked.endpoints)) == len(picked.endpoints)  # pick, then retry order
            assert picked.body == body  # the body goes back unchanged
            assert resp is not None and resp.status_code == 200
            assert served == picked.endpoints[0]
    finally:
        gw.close()
    wait_for(lambda: all_idle(epp), "every attempt released")


def test_the_headers_answer_waits_for_the_whole_streamed_body(epp: EppThread) -> None:
    # FULL_DUPLEX_STREAMED: nothing is answered before end_of_stream; then the headers
    # response, then the body echoed chunk by chunk, the last with end_of_stream
    channel, stream = open_stream(epp)
    try:
        body = chat("hello")
        picked = ask(stream, PATH, body, chunks=5)
        kinds = [a.WhichOneof("response") for a in picked.answers]
        assert kinds == ["request_headers"] + ["request_body"] * 5
        echoed = [a.request_body.response.body_mutation.streamed_response
                  for a in picked.answers[1:]]
        assert [e.end_of_stream for e in echoed] == [False] * 4 + [True]
        assert b"".join(e.body for e in echoed) == body == picked.body
        assert picked.answers[0].request_headers.response.clear_route_cache
    finally:
        stream.close()
        channel.close()


def test_a_request_without_protocol_config_uses_the_configured_body_mode(
        start_epp: Callable[..., EppThread]) -> None:
    epp = start_epp(epp={"body_mode": "buffered"})
    channel, stream = open_stream(epp)
    try:
        picked = ask(stream, PATH, chat("hi"), mode=BUFFERED, send_mode=False)
        assert [a.WhichOneof("response") for a in picked.answers] == ["request_headers",
                                                                      "request_body"]
        assert picked.endpoints and picked.endpoints == picked.metadata
    finally:
        stream.close()
        channel.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_body_of_several_mebibytes_is_routed(start_epp: Callable[..., EppThread],
                                              mode: int) -> None:
    # over grpc's default 4 MiB message limit in BUFFERED (one message), under max_body_bytes
    epp = start_epp()
    channel, stream = open_stream(epp)
    try:
        body = chat("read this: " + "lorem ipsum " * 500_000)
        assert len(body) > 5 * 1024 * 1024
        picked = ask(stream, PATH, body, mode=mode, chunks=100)
        assert picked.status is None and picked.endpoints and picked.body == body
    finally:
        stream.close()
        channel.close()


def test_a_gateway_that_sends_no_body_gets_a_headers_only_decision(epp: EppThread) -> None:
    # request_body_mode NONE: the upstream is chosen on the headers (as serve routes a request
    # it does not parse); the conversation identity still keys it
    channel, stream = open_stream(epp)
    try:
        stream.send(headers_message(PATH, chat("hi"), mode=ProcessingMode.NONE,
                                    extra=[("x-session-id", "abc-123")]))
        answer = stream.recv()
        assert answer is not None and answer.WhichOneof("response") == "request_headers"
        header, meta = endpoints_of(answer)
        assert header and header == meta
    finally:
        stream.close()
        channel.close()
    wait_for(lambda: all_idle(epp), "the attempt released")


def test_the_same_conversation_keeps_its_pod(epp: EppThread) -> None:
    gw = Gateway(epp.port)
    try:
        history: list[dict[str, str]] = []
        served_on = set()
        for turn in range(5):
            user = f"turn {turn}: tell me more about clause {turn}"
            _picked, resp, served = gw.request(PATH, chat(user, history=history))
            assert resp is not None and resp.status_code == 200
            served_on.add(served)
            history += [{"role": "user", "content": user},
                        {"role": "assistant", "content": resp.json()["choices"][0]["message"]
                         ["content"]}]
        assert len(served_on) == 1
        # the later turns were cache hits on that pod (the simulated vLLM says so)
        assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        gw.close()


def test_distinct_prompts_spread_over_the_fleet(fleet: Fleet, epp: EppThread) -> None:
    gw = Gateway(epp.port)
    try:
        served = [gw.request(PATH, chat("summarise", system=f"Policy book {i}: " + "rule " * 60))[2]
                  for i in range(16)]
    finally:
        gw.close()
    assert len(set(served)) >= 3  # of 4: new prefixes go to replicas that hold nothing


def test_the_gateway_subset_is_honoured(fleet: Fleet, epp: EppThread) -> None:
    addrs = addresses(fleet)
    subset = addrs[1:3]
    gw = Gateway(epp.port)
    try:
        for i in range(6):
            picked, resp, _ = gw.request(PATH, chat(f"q{i}", system=f"S{i} " + "y" * 200),
                                         subset=subset)
            assert picked.endpoints and set(picked.endpoints) <= set(subset)
            assert resp is not None and resp.status_code == 200
        for bad in ([], ["10.255.255.1:9"]):  # empty, or nothing of the pool: 503
            picked, resp, _ = gw.request(PATH, chat("q"), subset=bad)
            assert picked.status == 503 and resp is None
            assert picked.error["error"]["code"] == "no_replica_available"  # type: ignore[index]
    finally:
        gw.close()


def _still_serves(epp: EppThread) -> None:
    gw = Gateway(epp.port)
    try:
        picked, resp, _ = gw.request(PATH, chat("still there?"))
        assert picked.endpoints and resp is not None and resp.status_code == 200
    finally:
        gw.close()
    wait_for(lambda: all_idle(epp), "every attempt released")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b'{"model": "sim-model"}', 400, "missing_field"),
    (b'{"messages": "hi"}', 400, "invalid_type"),
    (json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}
                ).encode(), 404, "model_not_found"),
])
def test_bad_requests_get_an_openai_error_and_the_epp_keeps_serving(
        epp: EppThread, mode: int, body: bytes, status: int, code: str) -> None:
    gw = Gateway(epp.port, mode=mode)
    try:
        picked, resp, _ = gw.request(PATH, body)
    finally:
        gw.close()
    assert picked.status == status and resp is None
    assert picked.error is not None and picked.error["error"]["code"] == code
    imm = picked.answers[-1].immediate_response
    assert any(h.header.key == "content-type" and h.header.raw_value == b"application/json"
               for h in imm.headers.set_headers)
    _still_serves(epp)


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_limit_is_413(start_epp: Callable[..., EppThread],
                                      declared: bool) -> None:
    epp = start_epp(proxy={"max_body_bytes": 2048})
    body = chat("big " * 1000)
    channel, stream = open_stream(epp)
    try:
        msg = headers_message(PATH, body)
        if not declared:  # chunked: no Content-Length, the collected chunks cross the limit
            hdrs = msg.request_headers.headers.headers
            keep = [h for h in hdrs if h.key != "content-length"]
            del hdrs[:]
            hdrs.extend(keep)
        stream.send(msg)
        if not declared:
            for i in range(0, len(body), 1000):
                stream.send(body_message(body[i:i + 1000], i + 1000 >= len(body)))
        answer = stream.recv()
        assert answer is not None and answer.immediate_response.status.code == 413
        err = json.loads(answer.immediate_response.body)["error"]
        assert err["code"] == "request_too_large"
        assert stream.recv() is None  # the EPP ended the stream
    finally:
        stream.close()
        channel.close()
    _still_serves(epp)


def test_a_stream_cut_mid_body_releases_everything(epp: EppThread) -> None:
    channel, stream = open_stream(epp)
    body = chat("cut me off")
    stream.send(headers_message(PATH, body))
    stream.send(body_message(body[:40], False))
    stream.cancel()  # the gateway's client went away mid-body
    channel.close()
    wait_for(lambda: epp.run(lambda: epp.server.processor.open) == 0, "the stream closed")
    assert all_idle(epp)
    _still_serves(epp)


def test_a_stream_cut_after_the_pick_releases_the_attempt(epp: EppThread) -> None:
    channel, stream = open_stream(epp)
    try:
        picked = ask(stream, PATH, chat("picked, then gone"))
        assert picked.endpoints
        assert sum(v[0] for k, v in idle(epp).items() if k != "_prefixes") == 1  # in flight
        stream.cancel()
    finally:
        channel.close()
    wait_for(lambda: all_idle(epp), "the attempt released on cancel")
    _still_serves(epp)
