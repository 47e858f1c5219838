"""The protocol messages read and built (`router.epp.wire`), table-driven."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpHeaders, ProcessingRequest
from google.protobuf.struct_pb2 import Struct

from router.epp.wire import (
    DESTINATION,
    SERVED,
    SUBSET,
    SUBSET_NAMESPACE,
    header_pairs,
    immediate,
    pick_in_body,
    pick_in_headers,
    served_endpoint,
    subset_hint,
)
from router.errors import NoReplicaAvailable


def _with(namespace: str, key: str, value: Any) -> ProcessingRequest:
    s = Struct()
    s.update({key: value})
    msg = ProcessingRequest()
    msg.metadata_context.filter_metadata[namespace].CopyFrom(s)
    return msg


def test_header_values_come_from_raw_value_else_value() -> None:
    headers = HttpHeaders(headers=HeaderMap(headers=[
        HeaderValue(key=":path", raw_value=b"/v1/completions"),  # what Envoy sends
        HeaderValue(key="X-Session-ID", value="abc"),  # older data planes: value
    ]))
    assert header_pairs(headers) == [(b":path", b"/v1/completions"), (b"x-session-id", b"abc")]


@pytest.mark.parametrize(("value", "expected"), [
    (["10.0.0.1:8000", "10.0.0.2:8000"], {"10.0.0.1:8000", "10.0.0.2:8000"}),  # the protocol's list
    ("10.0.0.1:8000, 10.0.0.2:8000", {"10.0.0.1:8000", "10.0.0.2:8000"}),  # one comma list
    ([], set()),  # set but empty: the EPP answers 503
    (5, set()),  # unreadable: no eligible endpoint either
    (["10.0.0.1:8000", 7], {"10.0.0.1:8000"}),  # non-strings skipped
])
def test_the_subset_hint(value: Any, expected: set[str]) -> None:
    assert subset_hint(_with(SUBSET_NAMESPACE, SUBSET, value)) == expected


def test_no_hint_is_none() -> None:
    assert subset_hint(ProcessingRequest()) is None
    assert subset_hint(_with(SUBSET_NAMESPACE, "other", ["a:1"])) is None
    assert subset_hint(_with("envoy.lb", SUBSET, ["a:1"])) is None  # wrong namespace


@pytest.mark.parametrize(("namespace", "value", "expected"), [
    ("envoy.lb", "10.0.0.2:8000", "10.0.0.2:8000"),
    ("envoy.lb", "10.0.0.2:8000,10.0.0.3:8000", "10.0.0.2:8000"),
    ("envoy.lb", 3, None),
    ("other", "10.0.0.2:8000", None),
])
def test_the_served_endpoint(namespace: str, value: Any, expected: str | None) -> None:
    assert served_endpoint(_with(namespace, SERVED, value), "envoy.lb") == expected


def test_the_pick_is_the_same_in_header_and_metadata() -> None:
    for answer, common in ((r := pick_in_headers("a:1,b:2", "envoy.lb"),
                            r.request_headers.response),
                           (r2 := pick_in_body("a:1,b:2", "envoy.lb"), r2.request_body.response)):
        [h] = common.header_mutation.set_headers
        assert (h.header.key, h.header.raw_value) == (DESTINATION, b"a:1,b:2")
        meta = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        assert meta[DESTINATION].string_value == "a:1,b:2"
        assert not common.HasField("body_mutation")  # the body is left alone


def test_an_immediate_response_carries_the_openai_error() -> None:
    answer = immediate(NoReplicaAvailable("no healthy replica", retry_after=2)).immediate_response
    assert answer.status.code == 503 and answer.details == "no_replica_available"
    assert {(h.header.key, h.header.raw_value) for h in answer.headers.set_headers} == {
        ("content-type", b"application/json"), ("retry-after", b"2")}
    assert b'"code": "no_replica_available"' in answer.body
