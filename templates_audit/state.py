"""Per-template accumulators of the audit: the reference, the span statistics, repeated static parts.

Bounded by construction: at most :data:`MAX_SPANS` spans per template, each with at most
:data:`MAX_DISTINCT` value hashes (then ``capped``) and :data:`MAX_EXAMPLES` examples. Spans are
keyed by their position in the template's reference prompt; a span that overlaps a known one (or
an insertion at its edge) is merged into it (the union of their ranges), so a value seen as ``May 3``
and ``May 13`` is one span; spans that grew into each other are merged for the report
(:meth:`TemplateState.merged_spans`).
Cost: O(spans of the template) per observed span — a handful.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from templates_audit.blocks import block_token_hashes
from templates_audit.detectors.shapes import name_shaped
from templates_audit.findings import Span
from templates_audit.history import HistoryState
from templates_audit.model import Role
from templates_audit.replay import Head
from templates_audit.slots import POOL_MAX, slot_kind, thing_context, value_core, value_lines

__all__ = ["MAX_DISTINCT", "MAX_EXAMPLES", "MAX_SPANS", "SpanStats", "StaticPart", "TemplateState"]

MAX_SPANS = 64
MAX_DISTINCT = 4096
MAX_EXAMPLES = 5
MAX_NAME_CHARS = 128  # longer values (a block) are never judged as a name
_DIGIT = re.compile(r"\d")


@dataclass
class SpanStats:
    ref_start: int
    ref_end: int
    role: Role
    kinds: Counter[str] = field(default_factory=Counter)
    values: set[int] = field(default_factory=set)
    capped: bool = False
    examples: list[str] = field(default_factory=list)
    differed: int = 0
    multi_line: bool = False
    injected: bool = False  # found by the strftime_now probe: the template writes it
    inner: bool = False  # a value inside a reordered block (findings.Span.inner)
    # What slots.slot_kind judges the slot by: distinct values shaped like a person's name, and
    # the pool of lines of its block values (at most POOL_MAX + 1 line hashes kept).
    name_like: int = 0
    pool: set[int] = field(default_factory=set)
    pool_lines: int = 0
    # Trace order (slots.slot_kind tells a release from a variant by it): the template request
    # that last carried a value here, that value's hash, and how often the value changed.
    last_request: int = 0
    last_hash: int = 0
    switches: int = 0
    digit_values: int = 0
    first: str | None = None  # the reference's value: what value_core trims against

    def absorb(self, other: SpanStats) -> None:
        """Take in ``other``, a span found apart that turned out to be part of this one.
        ``differed`` is capped by the caller (a request seen in both counts twice here)."""
        self.ref_start = min(self.ref_start, other.ref_start)
        self.ref_end = max(self.ref_end, other.ref_end)
        self.kinds.update(other.kinds)
        self.differed += other.differed
        self.multi_line |= other.multi_line
        self.injected |= other.injected
        self.capped |= other.capped
        for h in other.values:
            self._keep(h)
        self.examples += other.examples[:MAX_EXAMPLES - len(self.examples)]
        self.name_like += other.name_like
        self.digit_values += other.digit_values
        self.switches = max(self.switches, other.switches)
        self.pool_lines += other.pool_lines
        for h in other.pool:
            if len(self.pool) > POOL_MAX:
                break
            self.pool.add(h)

    def add_value(self, value: str, request: int = 0, block: str | None = None) -> None:
        """Count one value; ``request``: the template request carrying it (0: the reference's
        own value, not an observation in trace order); ``block``: the value widened to whole
        lines, what a pool of example lines is judged by (a diff cuts a block's first and last
        line where they happen to agree with the reference's)."""
        h = xxhash.xxh3_64_intdigest(value.encode("utf-8", "surrogatepass"))
        if request:
            # A gap since the last request that carried a value here: the requests between
            # had the reference's value (a change there and back); the first one changed it.
            if not self.last_request or request > self.last_request + 1:
                self.switches += 1 if not self.last_request else 2
            elif h != self.last_hash:
                self.switches += 1
            self.last_request, self.last_hash = request, h
        if not self._keep(h):
            return
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(value)
        if self.first is None:
            self.first = value
        if len(value) <= MAX_NAME_CHARS and name_shaped(
                value_core(value, self.first) if value != self.first else value):
            self.name_like += 1
        if _DIGIT.search(value):
            self.digit_values += 1
        block = value if block is None else block
        if "\n" in block or " … " in block:
            for line in value_lines(block):
                self.pool_lines += 1
                if len(self.pool) <= POOL_MAX:
                    self.pool.add(hash(line))

    def kind(self, requests: int, context: tuple[str, str] = ("", "")) -> str:
        """The slot's report kind (:func:`.slots.slot_kind`); ``requests``: the template's;
        ``context``: the reference's text before and after the slot."""
        kind = self.kinds.most_common(1)[0][0]
        if "secret" in self.kinds:
            return "secret"
        return slot_kind(kind, distinct=len(self.values), capped=self.capped, requests=requests,
                         multi_line=self.multi_line, name_like=self.name_like,
                         pool=len(self.pool), pool_full=len(self.pool) > POOL_MAX,
                         pool_lines=self.pool_lines, switches=self.switches,
                         digit_values=self.digit_values, thing=thing_context(*context))

    def _keep(self, h: int) -> bool:
        """Count value hash ``h``; True when it is new and kept (beyond MAX_DISTINCT: capped)."""
        if h in self.values:
            return False
        if len(self.values) >= MAX_DISTINCT:
            self.capped = True
            return False
        self.values.add(h)
        return True


@dataclass(eq=False)
class StaticPart:
    """One distinct static part: its tokens, its blocks (as a replay head) and its diff."""

    text: str
    ids: list[int]
    head: Head
    spans: list[Span]
    # Achievable prompt when the part varies up to its end (nothing worth moving after the
    # last span): the reference's first `ach_shared` tokens, then `ach_ids`, this part's own.
    ach_ids: list[int] | None = None
    ach_shared: int = 0


def _whole_lines(text: str, start: int, end: int) -> str:
    """``text[start:end]`` widened to the lines it touches."""
    stop = text.find("\n", end)
    return text[text.rfind("\n", 0, start) + 1:len(text) if stop < 0 else stop]


def _meets(s0: int, e0: int, s1: int, e1: int) -> bool:
    """Whether two reference ranges are one span: they overlap, or one is an insertion (empty)
    at or inside the other."""
    return (s0 < e1 and s1 < e0) or ((s0 == e0 or s1 == e1) and s0 <= e1 and s1 <= e0)


def _in_tools(value: str, tools_json: str) -> bool:
    """Whether ``value`` comes from the tool definitions: the template renders each tool as JSON
    its own way (one per line, indented...), so every line of it, spaces aside, is in them."""
    if value in tools_json:
        return True
    compact = "".join(tools_json.split())
    lines = ["".join(line.split()) for line in value.split("\n")]
    return any(lines) and all(line in compact for line in lines)


@dataclass
class TemplateState:
    id: str
    static_text: str
    static_ids: list[int]
    offsets: Sequence[int]  # token start characters (an ``array``: 4 bytes each, one per token)
    head: Head  # block hashes of static_ids (full blocks), in the observed cache
    ach_head: Head  # the same hashes, in the achievable cache
    roles: tuple[tuple[int, int, Role], ...]
    tools_json: str
    is_chat: bool
    reference: str = ""
    requests: int = 0
    spans: list[SpanStats] = field(default_factory=list)
    overflow: int = 0  # spans dropped beyond MAX_SPANS
    history: HistoryState | None = None  # few-shot turns (history.py), once seen
    _token_hashes: list[int] | None = None

    def token_hashes(self, block_size: int) -> list[int]:
        """The token hashes of the reference's full blocks of ``static_ids``
        (:func:`.blocks.chain_token_hashes`; computed once, on first use)."""
        if self._token_hashes is None:
            self._token_hashes = list(block_token_hashes(self.static_ids, block_size))
        return self._token_hashes

    def token_at(self, char: int) -> int:
        return max(bisect.bisect_right(self.offsets, char) - 1, 0)

    def role_at(self, start: int, value: str) -> Role:
        if not self.is_chat:
            return Role.PROMPT
        for s, e, role in self.roles:
            if s <= start < e or (s < e and start == e and not value):
                return role
        if self.tools_json and value and _in_tools(value, self.tools_json):
            return Role.TOOLS
        return Role.TEMPLATE

    def observe(self, spans: Sequence[Span], text: str) -> None:
        """Accumulate one request's spans. Spans of one request that land in one span of the
        template (the paragraphs of one block) count as one request and one value (joined)."""
        values: dict[int, tuple[SpanStats, list[str], list[str]]] = {}  # id(stats) -> values
        for sp in spans:
            stats = self.stats_for(sp)
            if stats is None:
                continue
            stats.kinds[sp.kind] += 1
            stats.multi_line |= sp.multi_line
            entry = values.setdefault(id(stats), (stats, [], []))
            entry[1].append(text[sp.start:sp.end])
            if sp.multi_line:
                entry[2].append(_whole_lines(text, sp.start, sp.end))
        for stats, vals, blocks in values.values():
            stats.differed += 1
            stats.add_value(vals[0] if len(vals) == 1 else " … ".join(vals), self.requests,
                            " … ".join(blocks) if blocks else None)

    def merged_spans(self) -> list[SpanStats]:
        """The spans in reference order, those that meet after growing apart merged (a span
        first seen on two lines, later on the line between them too, is one span); a value
        inside a reordered block (``inner``) only merges with such values."""
        out: list[SpanStats] = []
        for st in sorted(self.spans, key=lambda st: (st.ref_start, st.ref_end)):
            last = next((o for o in reversed(out) if o.inner == st.inner), None)
            if last is not None and _meets(last.ref_start, last.ref_end, st.ref_start, st.ref_end):
                last.absorb(st)
                # every request but the reference can differ; one seen in both counted twice
                last.differed = min(last.differed, max(self.requests - 1, 1))
            else:
                out.append(st)
        self.spans = out
        return out

    def stats_for(self, sp: Span) -> SpanStats | None:
        for st in self.spans:
            if st.inner == sp.inner and _meets(st.ref_start, st.ref_end, sp.ref_start, sp.ref_end):
                if sp.ref_start < st.ref_start or sp.ref_end > st.ref_end:
                    st.ref_start = min(st.ref_start, sp.ref_start)
                    st.ref_end = max(st.ref_end, sp.ref_end)
                return st
        if len(self.spans) >= MAX_SPANS:
            self.overflow += 1
            return None
        value = self.static_text[sp.ref_start:sp.ref_end]
        st = SpanStats(sp.ref_start, sp.ref_end, self.role_at(sp.ref_start, value), inner=sp.inner)
        # the reference's own value is one of the distinct values
        st.add_value(value, block=_whole_lines(self.static_text, sp.ref_start, sp.ref_end)
                     if sp.multi_line else None)
        self.spans.append(st)
        return st
