"""`jsonfast`: whatever it decodes equals json.loads; everything else is left to json.loads."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from templates_audit import jsonfast
from templates_audit.jsonfast import Refused, fast_loads

orjson = pytest.importorskip("orjson")

JSON_VALUES = st.recursive(
    st.none() | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


def same(a: Any, b: Any) -> bool:
    return repr(a) == repr(b) and type(a) is type(b)   # -0.0 vs 0.0, int vs float


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES, st.booleans())
def test_valid_documents_decode_exactly_as_json_loads(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        got = fast_loads(data)
    except Refused:
        return
    assert same(got, json.loads(data))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40) | st.text(alphabet='{}[]":,0123456789.eE-+ truefalsn\\u\x01\xa0',
                                        max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_arbitrary_bytes_either_match_json_loads_or_are_refused(data: bytes) -> None:
    try:
        got = fast_loads(data)
    except Refused:
        return
    assert same(got, json.loads(data))


@pytest.mark.parametrize("data", [
    b"123456789012345678901234567890", b"[-9223372036854775809]", b"1e400", b"NaN", b"-Infinity",
    b'"\\ud800"', b"\xef\xbb\xbf{}", b"{} x", b"{", b"\xff", b'"\x01"', b"[" * 2000 + b"]" * 2000,
])
def test_where_orjson_differs_or_refuses_it_is_not_asked(data: bytes) -> None:
    with pytest.raises(Refused):
        fast_loads(data)


def test_loads_falls_back_to_json_for_its_values_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert jsonfast.loads(b"123456789012345678901234567890") == 123456789012345678901234567890
    assert math.isnan(jsonfast.loads(b"NaN"))
    with pytest.raises(json.JSONDecodeError, match="Expecting property name"):
        jsonfast.loads(b"{,}")
    monkeypatch.setattr(jsonfast, "_orjson_loads", None)   # orjson not installed
    with pytest.raises(Refused):
        fast_loads(b"{}")
    assert jsonfast.loads(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}


def test_big_integral_floats_anywhere_in_the_value_are_refused() -> None:
    for data in (b'{"a": [{"b": [1, 2, 1e19]}]}', b'[[[[-9.3e18]]]]', b'{"x": 2e300}'):
        with pytest.raises(Refused):
            fast_loads(data)
    assert fast_loads(b'{"a": [{"b": [1, 2.5, 9.2e18, 18446744073709551615]}]}') == {
        "a": [{"b": [1, 2.5, 9.2e18, 18446744073709551615]}]}


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES | st.recursive(st.just(0), lambda inner: st.lists(inner, max_size=2)
                                  | st.dictionaries(st.just("k"), inner, max_size=1), max_leaves=12))
def test_depth_is_the_nesting_the_trace_reader_limits(value: Any) -> None:
    """``depth(v) > limit`` is exactly the trace reader's recursive-free ``_too_deep`` test."""
    from templates_audit.traces import _too_deep

    levels = jsonfast.depth(value)
    if levels < 0:  # holds a big integral float: fast_loads refuses it, the depth is not used
        assert jsonfast._holds_big_float(value)
        return
    for limit in range(0, 10):
        assert (levels > limit) == _too_deep(value, limit), (value, limit)


def test_depth_examples() -> None:
    assert [jsonfast.depth(v) for v in (1, "s", [], {}, [[]], {"a": [1, {"b": []}]}, [1, [2, [3]]])] == [
        1, 1, 1, 1, 2, 4, 3]
    assert jsonfast.depth({"a": [1e19]}) == -1
    assert fast_loads(b'{"a": [[]]}') == {"a": [[]]}
    assert jsonfast.fast_loads_depth(b'{"a": [[]]}') == ({"a": [[]]}, 3)
