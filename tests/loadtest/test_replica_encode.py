"""The replica's pre-encoded response JSON is byte for byte the compact json.dumps of its dicts."""

from __future__ import annotations

import random

from loadtest.replica import openai_api as api
from loadtest.replica.asgi import dumps
from loadtest.replica.openai_api import Envelope, Kind, StreamEncoder

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
