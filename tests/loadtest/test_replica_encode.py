"""The replica's pre-encoded response JSON is byte for byte the compact json.dumps of its dicts;
request bodies decode the same with orjson (the `fast` extra) as with the stdlib."""

from __future__ import annotations

import json
import random

import pytest

from loadtest.replica import asgi
from loadtest.replica import openai_api as api
from loadtest.replica.asgi import dumps
from loadtest.replica.openai_api import Envelope, Kind, StreamEncoder
from templates_audit import jsonfast

NAMES = ["sim-0", 'we"ird\\name', "é-ü-日本", "tab\there", "nl\nx", "\x01ctl", "</script>"]
TEXTS = ["", " the", "cache", 'quo"te', "back\\slash", "é", "\u2028", "line\nbreak", "\x7f"]


def test_full_responses_and_chunks_encode_like_json_dumps() -> None:
    rng = random.Random(3)
    for _ in range(500):
        env = Envelope(f"chatcmpl-{rng.choice(NAMES)}-{rng.randint(0, 10**6)}",
                       rng.randint(0, 2**40), rng.choice(NAMES), rng.choice(NAMES))
        kind = rng.choice([Kind.CHAT, Kind.COMPLETION])
        text = "".join(rng.choices(TEXTS, k=rng.randint(0, 5)))
        finish = rng.choice(["length", "stop", 'od"d'])
        p, c, cached = rng.randint(0, 9999), rng.randint(0, 99), rng.randint(0, 9999)
        usage = api.usage_json(p, c, cached)
        assert api.encode_usage(p, c, cached).encode() == dumps(usage)
        assert (api.encode_full(kind, env, text, finish, api.encode_usage(p, c, cached)).encode()
                == dumps(api.full_response(kind, env, text, finish, usage)))
        enc = StreamEncoder(kind, env)
        for t in (text, None, ""):
            for fr in (None, finish):
                for role in (False, True):
                    assert (enc.chunk(t, fr, role=role).encode()
                            == dumps(api.chunk(kind, env, t, fr, role=role)))
        assert (enc.usage_chunk(api.encode_usage(p, c, cached)).encode()
                == dumps(api.usage_chunk(kind, env, usage)))


BODIES = [b'{"model":"m","messages":[{"role":"user","content":"h\\u00e9llo \\ud83d\\ude00 \\n"}]}',
          b'{"prompt":[1,2,3],"max_tokens":4,"temperature":0.5,"stream":true,"x":null}',
          b'  {"a": {"b": [1.5e3, -2, "\\"q\\""]}}  ', "{\"é\": \"ü\"}".encode()]
INVALID = [b"{", b'{"a":}', b"[1,]", b"\xff\xfe", b'{"a":1} extra']


@pytest.mark.parametrize("use_stdlib", [False, True])
def test_request_bodies_parse_the_same_with_orjson_and_the_stdlib(
        use_stdlib: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if use_stdlib:
        monkeypatch.setattr(jsonfast, "_orjson_loads", None)
    assert [asgi.parse_json(b) for b in BODIES] == [json.loads(b) for b in BODIES]
    assert asgi.parse_json(b"") == {}
    for bad in INVALID:
        with pytest.raises(ValueError):
            asgi.parse_json(bad)


@pytest.mark.parametrize("kind", [Kind.CHAT, Kind.COMPLETION])
def test_content_chunks_join_equals_the_chunks_one_by_one(kind: Kind) -> None:
    rng = random.Random(3)
    for _ in range(200):
        env = Envelope(f"id-{rng.randrange(99)}", rng.randrange(10**9), rng.choice(NAMES),
                       rng.choice(NAMES))
        enc = StreamEncoder(kind, env)
        pieces = [rng.choice(TEXTS) for _ in range(rng.randrange(1, 70))]
        finish = rng.choice(["length", "stop"])
        expected = "\n\ndata: ".join(
            [enc.chunk(p) for p in pieces[:-1]] + [enc.chunk(pieces[-1], finish)])
        assert enc.content_chunks(pieces, finish) == expected
    assert StreamEncoder(kind, env).content_chunks([], "length") == ""
