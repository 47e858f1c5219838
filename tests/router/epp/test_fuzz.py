"""Random and garbled ProcessingRequest sequences (a bounded, seeded count): the EPP never
fails internally, every stream ends, and the in-flight accounting returns to zero."""

from __future__ import annotations

import json
import random

import grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpTrailers,
    ProcessingRequest,
)
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from google.protobuf.message import DecodeError
from google.protobuf.struct_pb2 import Struct

from loadtest.fleet import Fleet
from loadtest.gateway import (
    BUFFERED,
    FULL_DUPLEX,
    EppThread,
    ExtProcStream,
    Gateway,
    body_message,
    headers_message,
    response_headers_message,
)
from router.epp.wire import SUBSET, SUBSET_NAMESPACE
from tests.conftest import wait_for
from tests.router.epp.conftest import addresses, all_idle, chat

STREAMS = 150
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/other", ""]


def _garbled_hint(rng: random.Random, addrs: list[str]) -> ProcessingRequest:
    hint = Struct()
    hint.update({SUBSET: rng.choice([5, "not-an-endpoint", {"a": 1}, addrs[:2],
                                     ",".join(addrs), [], [1, None]])})
    msg = ProcessingRequest()
    msg.metadata_context.filter_metadata[SUBSET_NAMESPACE].CopyFrom(hint)
    return msg


def _message(rng: random.Random, addrs: list[str]) -> ProcessingRequest:
    body = chat(f"fuzz {rng.randrange(50)}")
    kind = rng.randrange(10)
    if kind == 0:
        msg = headers_message(rng.choice(PATHS), rng.choice([body, None]),
                              method=rng.choice(["POST", "GET", "PUT"]),
                              mode=rng.choice([FULL_DUPLEX, BUFFERED, None, 0, 1, 3, 99]),
                              subset=rng.choice([None, addrs[:1], [], ["x"]]))
        if rng.random() < 0.3:
            msg.MergeFrom(_garbled_hint(rng, addrs))
        if rng.random() < 0.2:
            h = msg.request_headers.headers.headers.add()
            h.key, h.raw_value = "content-length", rng.choice([b"-1", b"abc", b"99999999999"])
        return msg
    if kind in (1, 2):
        cut = rng.randrange(len(body) + 1)
        chunk = rng.choice([body, body[:cut], body[cut:], rng.randbytes(rng.randrange(64)),
                            b"", b"\xff\xfe{"])
        return body_message(chunk, rng.random() < 0.6)
    if kind == 3:
        return ProcessingRequest(request_trailers=HttpTrailers())
    if kind == 4:
        msg = response_headers_message(rng.choice([200, 404, 500, 503, 0, 999]),
                                       rng.choice([None, addrs[0], addrs[-1], "bogus", ""]),
                                       rng.choice(["application/json", "text/event-stream"]),
                                       end_of_stream=rng.random() < 0.2)
        if rng.random() < 0.2:
            h = msg.response_headers.headers.headers.add()
            h.key, h.raw_value = ":status", b"abc"
        return msg
    if kind in (5, 6):
        return body_message(rng.choice([b"data: {}\n\n", json.dumps(
            {"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 7}}}
        ).encode(), rng.randbytes(32)]), rng.random() < 0.5, response=True)
    if kind == 7:
        return ProcessingRequest(response_trailers=HttpTrailers())
    if kind == 8:
        return ProcessingRequest()  # no oneof set
    try:  # random wire bytes: whatever fields they happen to decode to
        return ProcessingRequest.FromString(rng.randbytes(rng.randrange(1, 40)))
    except DecodeError:
        return ProcessingRequest(observability_mode=True)


def _valid_start(rng: random.Random) -> list[ProcessingRequest]:
    body = chat(f"conversation {rng.randrange(20)}")
    cut = rng.randrange(1, len(body))
    return [headers_message("/v1/chat/completions", body, mode=FULL_DUPLEX),
            body_message(body[:cut], False), body_message(body[cut:], True)]


def test_random_streams_never_break_the_epp(fleet: Fleet, epp: EppThread) -> None:
    rng = random.Random(35)
    addrs = addresses(fleet)
    codes: dict[str, int] = {}
    channel = grpc.insecure_channel(f"127.0.0.1:{epp.port}")
    stub = ExternalProcessorStub(channel)
    try:
        for _ in range(STREAMS):
            stream = ExtProcStream(stub, deadline=10.0)
            msgs = (_valid_start(rng) if rng.random() < 0.4 else [])
            msgs += [_message(rng, addrs) for _ in range(rng.randrange(0, 7))]
            cancel_at = rng.randrange(len(msgs) + 1) if rng.random() < 0.25 else None
            for i, msg in enumerate(msgs):
                if i == cancel_at:
                    break
                stream.send(msg)
            if cancel_at is not None:
                stream.cancel()
                codes["cancelled"] = codes.get("cancelled", 0) + 1
                continue
            stream.close()
            try:
                while stream.recv() is not None:
                    pass
                code = grpc.StatusCode.OK
            except grpc.RpcError:
                code = stream.code()
            codes[code.name] = codes.get(code.name, 0) + 1
    finally:
        channel.close()
    # out-of-order messages are refused as such; nothing fails inside the EPP
    assert set(codes) <= {"OK", "INVALID_ARGUMENT", "cancelled"}, codes
    assert codes.get("OK", 0) > 10 and codes.get("INVALID_ARGUMENT", 0) > 10
    wait_for(lambda: epp.run(lambda: epp.server.processor.open) == 0, "every stream closed")
    wait_for(lambda: all_idle(epp), "in-flight counts back to zero")
    gw = Gateway(epp.port)
    try:
        picked, resp, _ = gw.request("/v1/chat/completions", chat("after the storm"))
        assert picked.endpoints and resp is not None and resp.status_code == 200
    finally:
        gw.close()
