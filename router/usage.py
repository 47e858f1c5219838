"""Token usage of a relayed OpenAI response, read from its bytes as they pass: `UsageTap`.

vLLM reports what its prefix cache saved in ``usage.prompt_tokens_details.cached_tokens``
(with ``--enable-prompt-tokens-details``): in the body of a non-streamed answer, and in the last
``data:`` event of a stream when the request set ``stream_options.include_usage`` (with
``continuous_usage_stats`` every event carries one; the last is the total). Both sit at the end
of the response, so the tap keeps only the last `TAIL_BYTES` bytes relayed and reads the numbers
once the response ended.

Algorithm: `feed(chunk)` appends to a bounded tail (one copy of at most `TAIL_BYTES` +
``len(chunk)`` bytes per chunk, no parsing); `usage()` searches the tail backwards for the last
``"prompt_tokens":`` and the last ``"cached_tokens":`` key and reads the integers after them.
JSON escapes every quote inside a string value, so ``"cached_tokens":`` in the raw bytes is
always a key, never generated text. A usage object cut by the tail's start, a ``null`` detail
or a missing field reads as ``None``: the tap never guesses and never raises.

Pure: no I/O, no clock. Cost: O(len(chunk)) copy per chunk bounded by `TAIL_BYTES`, O(TAIL_BYTES)
once per response. Used by the proxy (``prefix_router_reported_cached_tokens_total``) and meant
to be reused by anything else that wants a response's token counts (tracing spans).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["TAIL_BYTES", "Usage", "UsageTap", "parse_usage"]

TAIL_BYTES = 2048

_PROMPT = b'"prompt_tokens":'
_CACHED = b'"cached_tokens":'
# after a key: optional JSON whitespace, the digits, and a byte that is not a digit (digits
# running to the end of the tail may continue past it: no match)
_NUMBER = re.compile(rb"[ \t\r\n]*([0-9]+)(?=[^0-9])")


class Usage(NamedTuple):
    prompt_tokens: int | None
    cached_tokens: int | None


def _int_after(data: bytes, key: bytes) -> int | None:
    """The non-negative integer that follows the last ``key`` in ``data``, else None."""
    at = data.rfind(key)
    if at < 0:
        return None
    m = _NUMBER.match(data, at + len(key))
    return None if m is None else int(m.group(1))


def parse_usage(data: bytes) -> Usage:
    """Prompt and cached token counts of the last usage object in ``data`` (a response tail)."""
    return Usage(_int_after(data, _PROMPT), _int_after(data, _CACHED))


class UsageTap:
    """Keeps the tail of one response's relayed bytes; `usage()` reads its token counts."""

    __slots__ = ("_tail",)

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        if len(chunk) >= TAIL_BYTES:
            self._tail = chunk[-TAIL_BYTES:]
        else:
            tail = self._tail + chunk
            self._tail = tail[-TAIL_BYTES:] if len(tail) > TAIL_BYTES else tail

    def usage(self) -> Usage:
        return parse_usage(self._tail)
