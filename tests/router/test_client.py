"""Client-side key: identical to the router's own derivation, and routes the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.client import hash_key, prefix_headers
from router.discovery import Endpoint
from router.keys import KeyConfig, KeySource, derive
from router.policy import Branch, make_policy
from router.replicas import ReplicaSet

SYSTEM = "You are a code reviewer for the payments team. Flag risky changes and explain why. " * 3
BODY: dict[str, Any] = {
    "model": "qwen",
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "diff A"}],
}


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param(BODY, id="mapping"),
        pytest.param(json.dumps(BODY), id="json-str"),
        pytest.param(json.dumps(BODY).encode(), id="json-bytes"),
    ],
)
def test_hash_key_equals_router_derivation(encoded: Any) -> None:
    key = hash_key(encoded)
    assert key is not None
    assert key == derive("/v1/chat/completions", {}, BODY).prefix


def test_hash_key_for_completions_path() -> None:
    body = {"model": "m", "prompt": SYSTEM}
    assert hash_key(body, "/v1/completions") == derive("/v1/completions", {}, body).prefix
    assert hash_key(body, "/v1/completions") != hash_key(BODY)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, id="no-prefix"
        ),
        pytest.param(b"{not json", id="invalid-json"),
        pytest.param("[1, 2]", id="json-not-an-object"),
        pytest.param(b"\xff\xfe", id="undecodable-bytes"),
    ],
)
def test_no_key_when_there_is_no_cacheable_prefix(body: Any) -> None:
    assert hash_key(body) is None
    assert prefix_headers(body) == {}


def test_config_threshold_is_honoured() -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": "x" * 40}]}
    assert hash_key(body) is None
    assert hash_key(body, config=KeyConfig(min_prefix_chars=10)) is not None


def test_header_from_client_routes_like_the_body() -> None:
    rs = ReplicaSet(Endpoint(f"r{i}", f"http://127.0.0.1:{8200 + i}") for i in range(5))
    policy = make_policy("prefix", 1.25, 0)
    headers = prefix_headers(BODY)
    # The client sends only a short body (e.g. it hides the system prompt) plus the header.
    via_header = derive("/v1/chat/completions", headers, {"model": "qwen", "messages": []})
    via_body = derive("/v1/chat/completions", {}, BODY)
    assert via_header.source is KeySource.HEADER and via_header.prefix == via_body.prefix
    a = policy.choose(via_header, rs.states(), rs.ring, 0)
    b = policy.choose(via_body, rs.states(), rs.ring, 0)
    assert a is not None and b is not None
    assert a.replica == b.replica
    assert (a.branch, b.branch) == (Branch.OVERRIDE, Branch.HOME)
