"""Few-shot examples sent as chat turns, in a different order per request.

A conversation's history (the messages between the static part and the last message) is
expected to vary and is never diffed. One pattern is not a conversation, though: the same
example turns (``user: 2+2?`` / ``assistant: 4`` / ...) sent with every request but shuffled, so
the prefix cache stops at the first example. Real histories never repeat as a permutation of
another request's, so the test is exact: a request whose history is the same multiset of
(role, content) messages as its template's reference history, in another order, reorders it.

Few-shot turns can also be *drawn* from a pool: k of n example pairs per request, in random
order. Their histories are no permutation of one another, but they reuse the same pairs (a
pair is messages 2i and 2i+1: a question and its answer) at different positions, which a
conversation never does: a follow-up resends its history with every pair where it was, and two
conversations share no pairs. So a template whose histories put a pair seen before at another
position (:data:`MIN_DISPLACED` times), with at most :data:`POOL_MAX` distinct pairs, samples
its examples from a pool: ``sampled_block``, fixed by one set in one order (the reference's).

Per template, :class:`HistoryState` keeps the first history of :data:`MIN_TURNS` or more
messages it saw (the *history reference*: where it starts and ends in that request's prompt,
its tokens) and counts the requests that carry the same turns, the orders seen and a few
examples. :meth:`HistoryState.observe` returns, for a reordered request, where its history ends
in its prompt, so the achievable replay can put the reference order there instead — the
request as it would be if the examples were sorted.

Cost: nothing for single-turn requests; one hash per history message otherwise (and one per
pair, against a pool of at most :data:`POOL_MAX` pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MIN_TURNS", "HistoryState", "history_key"]

MIN_TURNS = 2
MAX_ORDERS = 4096
MAX_EXAMPLES = 5
POOL_MAX = 64  # distinct example pairs of a pool (a larger set is conversations, not a pool)
MIN_DISPLACED = 3  # pairs seen at another position than before that make a pool


def _pairs(key: tuple[int, ...]) -> list[int]:
    """The history's turns two by two (an example's question and answer), hashed."""
    return [hash(key[i:i + 2]) for i in range(0, len(key) - 1, 2)]


def _content(message: dict[str, Any]) -> str:
    return str(message.get("content") or "")  # a string once read (traces flattens parts)


def history_key(messages: Sequence[dict[str, Any]], k: int) -> tuple[int, ...] | None:
    """Hashes of the history messages ``messages[k:-1]`` (role and content; compared within
    one run only), None when there are fewer than :data:`MIN_TURNS`."""
    if len(messages) - 1 - k < MIN_TURNS:
        return None
    return tuple(hash((m.get("role"), _content(m))) for m in messages[k:-1])


def _span(text: str, start: int, messages: Sequence[dict[str, Any]], k: int
          ) -> tuple[int, int] | None:
    """(first history content, line start of the last message's content) in ``text``, found in
    order from ``start``; None when a content is not in the rendered text verbatim."""
    cursor = start
    first = -1
    for m in messages[k:-1]:
        content = _content(m)
        pos = text.find(content, cursor) if content else cursor
        if pos < 0:
            return None
        first = pos if first < 0 else first
        cursor = pos + len(content)
    last = _content(messages[-1])
    pos = text.find(last, cursor) if last else -1
    if pos < 0:
        return None
    return first, text.rfind("\n", 0, pos) + 1


@dataclass
class HistoryState:
    """One template's history reference and what its requests did with those turns."""

    key: tuple[int, ...]
    text: str  # the reference request's history, rendered: its first content to the last turn
    role: str  # role of its first message
    lead: str  # the rendered text between the reference's static part and ``text``
    ids: list[int] = field(default_factory=list)  # tokens of ``lead + text``
    lead_tokens: int = 0  # tokens of ``lead``
    requests: int = 1  # requests carrying these turns, in any order
    reordered: int = 0
    orders: set[int] = field(default_factory=set)
    capped: bool = False
    examples: list[str] = field(default_factory=list)
    # The pool of example pairs (first position seen) and how often a pair came back elsewhere.
    pairs: dict[int, int] = field(default_factory=dict)
    pool_full: bool = False
    displaced: int = 0
    sampled: int = 0  # requests drawing other examples from the pool (a sampled_block)

    @property
    def pooled(self) -> bool:
        """Whether the histories are drawn from a pool of examples (see the module docstring)."""
        return not self.pool_full and self.displaced >= MIN_DISPLACED

    def _draw(self, key: tuple[int, ...]) -> bool:
        """Account the pairs of a history; whether it reuses a pair of the pool."""
        reused = False
        for i, pair in enumerate(_pairs(key)):
            first = self.pairs.get(pair)
            if first is not None:
                reused = True
                self.displaced += first != i
            elif len(self.pairs) < POOL_MAX:
                self.pairs[pair] = i
            else:
                self.pool_full = True
        return reused

    @classmethod
    def start(cls, key: tuple[int, ...], text: str, static_end: int,
              messages: Sequence[dict[str, Any]], k: int,
              encode: Callable[[str], list[int]]) -> HistoryState | None:
        """The history reference of a request (``encode``: the audit's tokenizer), or None when
        its history cannot be located in its prompt."""
        span = _span(text, static_end, messages, k)
        if span is None or span[1] <= span[0]:
            return None
        lead = text[static_end:span[0]]
        st = cls(key, text[span[0]:span[1]], str(messages[k].get("role")), lead,
                 encode(lead + text[span[0]:span[1]]), len(encode(lead)))
        st.orders.add(hash(key))
        st.examples.append(st.text)
        st._draw(key)
        return st

    def observe(self, key: tuple[int, ...], text: str, static_end: int,
                messages: Sequence[dict[str, Any]], k: int) -> int | None:
        """Account one request's history; for a reordered one, where (characters) its history
        ends in ``text`` if it could be located, else None."""
        if key == self.key:
            self.requests += 1
            return None
        reused = self._draw(key)
        if len(key) != len(self.key) or sorted(key) != sorted(self.key):
            if not (reused and self.pooled):
                return None  # another conversation: expected variation
            self.sampled += 1
        else:
            self.reordered += 1
        self.requests += 1
        order = hash(key)
        if order not in self.orders:
            if len(self.orders) >= MAX_ORDERS:
                self.capped = True
            else:
                self.orders.add(order)
        span = _span(text, static_end, messages, k)
        if span is None:
            return None
        value = text[span[0]:span[1]]
        if len(self.examples) < MAX_EXAMPLES and value not in self.examples:
            self.examples.append(value)
        return span[1]
