"""The audit: a stream of records -> :class:`~templates_audit.model.Report`, in one pass.

Per request (:meth:`Auditor.add`):

1. render and locate the static part (:mod:`.prompts`), tokenise the whole prompt once;
2. find its template (:mod:`.grouping`); a new template keeps this request as its *reference*
   (static text, token offsets, block hashes of the static part) and, when the chat template
   calls ``strftime_now``, renders the reference at two fixed dates and diffs the results — what
   changes is injected by the template (role ``template``), found deterministically whatever
   the trace's dates;
3. diff the static part against the reference (:func:`.findings.diff_spans`) and accumulate each
   span by its position in the reference: kinds seen, distinct values (hashes, capped), a few
   examples;
   with two or more history turns, check them against the template's first history for
   few-shot examples shuffled per request (:mod:`.history`);
4. feed two one-replica prefix caches (:class:`~templates_audit.blocks.PrefixCache`, trace
   order; unbounded by default, the CLI bounds them to :data:`DEFAULT_CACHE_BLOCKS`): *observed* with the request's own tokens, *achievable* with the reference's static
   tokens followed by the request's own remainder — the request as it would be if its volatile
   values sat after the static part.

:meth:`Auditor.report` turns the accumulators into value objects. A span becomes a finding only
if static text follows it in the static part (a varying tail is expected variation) and, unless
it is a recognised value (date, id, secret...), it costs at least one block.

Memory: per template a reference prompt, at most :data:`MAX_SPANS` span accumulators with at
most :data:`MAX_DISTINCT` value hashes and :data:`MAX_EXAMPLES` examples each; the caches are
bounded by ``cache_blocks``; beyond ``max_templates`` templates the oldest single-request ones are
dropped. Nothing grows with the number of requests otherwise.
Cost per request: one render, one tokenisation (line-cached), one diff of the static part against
the reference (O(lines) when only values changed), block hashing of the non-shared tail only.
"""

from __future__ import annotations

import bisect
import datetime as dt
import functools
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from templates_audit.blocks import (
    NONE_HASH,
    PrefixCache,
    block_hashes,
    chain_token_hashes,
    hit_rate,
)
from templates_audit.findings import Span, changed_range, diff_spans
from templates_audit.grouping import TemplateIndex
from templates_audit.history import MIN_TURNS, HistoryState, history_key
from templates_audit.model import BadLine, Finding, Report, Role, Summary, Template
from templates_audit.prompts import Prompt, PromptBuilder, prepare, static_index
from templates_audit.render import ChatRenderer, TemplateError
from templates_audit.replay import Head, Replay
from templates_audit.state import SpanStats, StaticPart, TemplateState
from templates_audit.suggest import redact, suggestion, variant_suggestion
from templates_audit.tokenize import DefaultTokenizer, EncodeError, Tokenizer, default_tokenizer
from templates_audit.traces import Record

__all__ = ["DEFAULT_CACHE_BLOCKS", "MAX_TEMPLATES", "Auditor", "analyze"]

DEFAULT_CACHE_BLOCKS = 1 << 16  # 1M tokens at block size 16: more than one GPU's KV pool holds
MAX_TEMPLATES = 10_000  # beyond, the oldest single-request templates are dropped (memory bound)
STATIC_CACHE = 256  # recent distinct static parts whose tokens and hashes are kept
MAX_BAD_SAMPLES = 10
CONTEXT_CHARS = 40
# Two probe instants that differ in every field strftime can print (year ... second, weekday).
PROBE_CLOCKS = (dt.datetime(2024, 1, 2, 3, 4, 5), dt.datetime(2025, 11, 28, 17, 45, 50))
_MEANINGFUL_KINDS = frozenset({"timestamp", "date", "time", "uuid", "hex_id", "numeric_id",
                               "name", "email", "version", "secret", "reordered_block",
                               "sampled_block", "variant"})
# Fixed in place (one set and order, normalised spaces): the span's own blocks are gained too.
_SPAN_RECOVERED = frozenset({"reordered_block", "sampled_block", "whitespace"})


class Auditor:
    """Streaming accumulator; :func:`analyze` is the one-call form."""

    def __init__(
        self,
        tokenizer: Tokenizer | None = None,
        renderer: ChatRenderer | None = None,
        *,
        block_size: int = 16,
        cache_blocks: int | None = None,
        redact_values: bool = False,
        exact_replay: bool = False,
        max_templates: int | None = MAX_TEMPLATES,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.tokenizer = tokenizer or default_tokenizer()
        self._now: dt.datetime | None = None
        base = renderer or ChatRenderer()
        self.renderer = base.with_clock(self._clock)
        self._builder = PromptBuilder(self.renderer)
        self._dynamic_template = "strftime_now" in base.source
        self._probes = [base.with_clock(functools.partial(_fixed, c)) for c in PROBE_CLOCKS]
        self.block_size = block_size
        self.redact_values = redact_values
        self.index = TemplateIndex()
        self.templates: dict[str, TemplateState] = {}
        # Memory bound: templates of one request so far (id -> model, exact key), oldest first;
        # beyond max_templates the oldest are dropped (they hold nothing to report but, rarely,
        # a chat-template-injected date, which their template's other requests also show).
        self.max_templates = max_templates
        self._singletons: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.templates_dropped = 0
        self.observed = Replay(PrefixCache(cache_blocks, block_size), exact=exact_replay)
        self.achievable = Replay(PrefixCache(cache_blocks, block_size), exact=exact_replay)
        self._line_tokenizer = isinstance(self.tokenizer, DefaultTokenizer)
        self._encode_with_offsets = _shared_encoding(self.tokenizer)
        self._static_lru: OrderedDict[int, StaticPart] = OrderedDict()
        self.requests = 0
        self.prompt_tokens = 0
        self.bad_lines = 0
        self.bad_samples: list[BadLine] = []
        self.first_ts: float | None = None
        self.last_ts: float | None = None

    def _clock(self) -> dt.datetime:
        return self._now or dt.datetime.now()

    # -- input --------------------------------------------------------------------------------
    def add_bad(self, bad: BadLine) -> None:
        self.bad_lines += 1
        if len(self.bad_samples) < MAX_BAD_SAMPLES:
            self.bad_samples.append(bad)

    def add(self, record: Record) -> None:
        if record.timestamp is not None:
            self._now = dt.datetime.fromtimestamp(record.timestamp)
            self.first_ts = record.timestamp if self.first_ts is None else self.first_ts
            self.last_ts = record.timestamp
        try:
            prompt = self._builder.build(record)
        except TemplateError as exc:
            self.add_bad(BadLine(record.file, record.line, str(exc)))
            return
        finally:
            self._now = None
        static_text = prompt.static_text
        tid, key = self.index.lookup_exact(record.model or "", static_text)
        tpl = self.templates.get(tid) if tid is not None else None
        end = prompt.static_end
        entry = self._static_lru.get(key)
        if entry is not None and entry.text == static_text:
            self._static_lru.move_to_end(key)
        else:
            entry = None
        offsets: Sequence[int] | None = None
        whole = False  # the prompt was tokenised as a whole (not line by line)
        found: tuple[TemplateState | None, str, tuple[int, int] | None] | None = None
        lines: tuple[int, int] | None = None
        same_from: int | None = None
        same_to = 0
        if self._line_tokenizer and (end == 0 or prompt.text[end - 1] == "\n"):
            # No default-tokenizer token crosses a newline: static part and tail tokenise apart.
            if entry is not None:
                static_ids = entry.ids
            else:
                if tpl is None:
                    found = self._find(record, static_text, key)
                    tpl, lines = found[0], found[2]
                if tpl is not None and (not tpl.static_text or tpl.static_text[-1] == "\n"):
                    if lines is None:
                        lines = changed_range(tpl.static_text, static_text)
                    static_ids, same_to, same_from = _splice_ids(self.tokenizer, tpl, static_text,
                                                                 lines)
                else:
                    static_ids = self.tokenizer.encode(static_text)
            tail_ids = self.tokenizer.encode(prompt.text[end:])
        else:
            try:
                ids, offs = self._encode_with_offsets(prompt.text)
            except EncodeError as exc:  # nothing recorded yet: the request is a bad line
                self.add_bad(BadLine(record.file, record.line, str(exc)))
                return
            whole = True
            cut = bisect.bisect_left(offs, end)
            static_ids, tail_ids = ids[:cut], ids[cut:]
            if tpl is None:
                offsets = offs[:cut]
            if entry is not None and entry.ids != static_ids:
                entry = None  # the tail's first token merged across the boundary differently
        if tpl is None:
            tpl = self._template(record, prompt, static_ids, offsets, key, found)
        new = entry is None
        if entry is None:
            if whole and len(static_ids) == len(tpl.static_ids):
                # tokenised whole: where the reference's last tokens resume, as _splice_ids says
                same_from = _same_tail(static_ids, tpl.static_ids)
            entry = self._static_entry(tpl, static_text, static_ids, key, lines, same_from,
                                       same_to)
        tpl.requests += 1
        if tpl.requests == 2:
            self._singletons.pop(tpl.id, None)
        self.requests += 1
        self.prompt_tokens += len(static_ids) + len(tail_ids)
        if entry.spans:
            tpl.observe(entry.spans, static_text)
            if new:
                entry.ach_ids, entry.ach_shared = self._varying_tail(tpl, static_text, entry.spans)
        ach_tail_ids = tail_ids
        if record.messages is not None and len(record.messages) > MIN_TURNS:
            ach_tail_ids = self._history(tpl, record.messages, prompt, tail_ids)
        self._feed_caches(tpl, entry, tail_ids, ach_tail_ids)

    def _history(self, tpl: TemplateState, messages: list[dict[str, Any]], prompt: Prompt,
                 tail_ids: list[int]) -> list[int]:
        """Account the request's history turns (:mod:`.history`); the tokens after its static
        part for the achievable replay: with shuffled examples, the reference order instead."""
        k = static_index(messages)
        key = history_key(messages, k)
        if key is None:
            return tail_ids
        hs = tpl.history
        if hs is None:
            tpl.history = HistoryState.start(key, prompt.text, prompt.static_end, messages, k,
                                             self.tokenizer.encode)
            return tail_ids
        end = hs.observe(key, prompt.text, prompt.static_end, messages, k)
        if end is None:
            return tail_ids
        return hs.ids + self.tokenizer.encode(prompt.text[end:])

    def _static_entry(self, tpl: TemplateState, text: str, ids: list[int], key: int,
                      lines: tuple[int, int] | None = None,
                      same_from: int | None = None, same_to: int = 0) -> StaticPart:
        """Tokens, block hashes and diff of one distinct static part, kept for its repeats.
        ``same_to``/``same_from``: ``ids[:same_to]`` are the reference's first tokens and
        ``ids[same_from:]`` its last ones (the splice)."""
        bs = self.block_size
        head = tpl.head.hashes
        if text == tpl.static_text:
            entry = StaticPart(text, tpl.static_ids, tpl.head, [])
        else:
            prefix = head[:_shared_blocks(ids, tpl.static_ids, len(head), bs, same_to)]
            start = len(prefix) * bs
            if same_from is not None and len(ids) == len(tpl.static_ids):
                # From block `reuse` on, this static part's blocks are the reference's tokens at
                # the same positions (the edit kept the token count): chain the reference's
                # block token hashes instead of cutting and hashing new blocks.
                reuse = max(-(-same_from // bs), len(prefix))
                hashes = prefix + _chain(prefix, ids[start:reuse * bs], bs)
                hashes += chain_token_hashes(tpl.token_hashes(bs)[reuse:],
                                             hashes[-1] if hashes else NONE_HASH)
            else:
                hashes = prefix + _chain(prefix, ids[start:], bs)
            entry = StaticPart(text, ids, Head(hashes), diff_spans(tpl.static_text, text, lines))
        self._static_lru[key] = entry
        if len(self._static_lru) > STATIC_CACHE:
            self._static_lru.popitem(last=False)
        return entry

    def _varying_tail(self, tpl: TemplateState, text: str, spans: list[Span]
                      ) -> tuple[list[int] | None, int]:
        """(own tokens, reference tokens before them) for the achievable prompt of a static part
        whose last span (as merged in the template) has less than a block of static tokens after
        it in the reference (call after ``observe``):
        moving that span gains nothing, so the achievable prompt keeps this part's own text
        from the span's line on (retrieved documents at the end of a system prompt stay
        uncacheable). ``(None, 0)``: the reference's static tokens stand for this part's."""
        ref = tpl.static_text
        block = next((st for st in tpl.spans if st.ref_start <= spans[-1].ref_start < st.ref_end
                      or st.ref_start == spans[-1].ref_start), None)
        if block is None or (len(tpl.static_ids) - tpl.token_at(block.ref_end) >= self.block_size
                             and block.ref_end < len(ref)):
            return None, 0
        if block.kind(tpl.requests) in _SPAN_RECOVERED:
            return None, 0  # examples in one set and order: the reference's block stands for it
        # The request's first span inside that (merged) span of the template starts the tail.
        first = next(sp for sp in spans if sp.ref_end >= block.ref_start)
        start = ref.rfind("\n", 0, min(first.ref_start, len(ref))) + 1
        shared = tpl.token_at(start) if start < len(ref) else len(tpl.static_ids)
        own = text[text.rfind("\n", 0, first.start) + 1:]
        return self.tokenizer.encode(own), shared

    def add_all(self, items: Iterable[Record | BadLine]) -> None:
        for item in items:
            if isinstance(item, BadLine):
                self.add_bad(item)
            else:
                self.add(item)

    # -- templates ----------------------------------------------------------------------------
    def _find(self, record: Record, text: str, key: int
              ) -> tuple[TemplateState | None, str, tuple[int, int] | None]:
        """The known template of a static text not seen before (None), its masked key ("" when
        a template was found) and, when known, the reference's ``changed_range`` lines."""
        model = record.model or ""
        near = self.index.find_near(model, text, key)
        if near is not None:
            return self.templates[near[0]], "", near[1]
        tid, masked = self.index.find(model, text, key)
        return (self.templates[tid] if tid is not None else None), masked, None

    def _template(self, record: Record, prompt: Prompt, static_ids: list[int],
                  offsets: Sequence[int] | None, key: int,
                  found: tuple[TemplateState | None, str, tuple[int, int] | None] | None = None
                  ) -> TemplateState:
        model = record.model or ""
        text = prompt.static_text
        tpl, masked, _ = found if found is not None else self._find(record, text, key)
        if tpl is not None:
            return tpl
        tid = f"tpl-{masked[:10]}"
        while tid in self.templates:  # same masked text under a different model
            tid += "'"
        self.index.add(tid, model, text, key)
        if offsets is None:
            offsets = self.tokenizer.encode_with_offsets(text)[1]
        hashes = block_hashes(static_ids, self.block_size)
        tpl = TemplateState(
            id=tid, static_text=text, static_ids=static_ids, offsets=array("i", offsets),
            head=Head(hashes), ach_head=Head(hashes),
            roles=prompt.roles, tools_json=prompt.tools_json, is_chat=prompt.is_chat,
            reference=f"{record.file}:{record.line}",
        )
        if prompt.is_chat and self._dynamic_template:
            self._probe(tpl, record)
        self.templates[tid] = tpl
        self._singletons[tid] = (model, key)
        if self.max_templates is not None and len(self.templates) > self.max_templates:
            self._drop_singleton(keep=tid)
        return tpl

    def _drop_singleton(self, keep: str) -> None:
        """Forget the oldest template that still has a single request (never ``keep``)."""
        oldest = next(iter(self._singletons))
        if oldest == keep:
            return
        model, key = self._singletons.pop(oldest)
        tpl = self.templates.pop(oldest)
        self.index.remove(oldest, model, tpl.static_text, key)
        self._static_lru.pop(key, None)
        self.templates_dropped += 1

    def _probe(self, tpl: TemplateState, record: Record) -> None:
        try:
            a, b = (prepare(record, r).static_text for r in self._probes)
        except TemplateError:
            return
        for sp in diff_spans(a, b):
            # Re-anchor on the reference: the probe renders differ from it only in this span.
            ref_start = _anchor(a, sp.ref_start, tpl.static_text)
            if ref_start is None:
                continue
            ref_end = ref_start + _value_len(tpl.static_text, ref_start, a[sp.ref_end:])
            stats = tpl.stats_for(Span(ref_start, ref_end, sp.start, sp.end, sp.kind,
                                        sp.multi_line))
            if stats is not None:
                # Only the kind and the role: the probe dates are not values of the trace.
                stats.kinds[sp.kind] += 1
                stats.injected = True
                stats.role = Role.TEMPLATE

    # -- caches -------------------------------------------------------------------------------
    def _feed_caches(self, tpl: TemplateState, entry: StaticPart, tail_ids: list[int],
                     ach_tail_ids: list[int]) -> None:
        """``ach_tail_ids``: the tokens after the static part in the achievable prompt —
        ``tail_ids`` unless shuffled few-shot turns are put in the reference order."""
        bs = self.block_size
        ref_ids, head = tpl.static_ids, tpl.head.hashes
        k = len(head)
        # Achievable: the reference's static tokens, then this request's own tail.
        ach_tail = _chain(head, ref_ids[k * bs:] + ach_tail_ids, bs)
        if entry.ach_ids is None:
            self.achievable.serve(tpl.ach_head, k, ach_tail, len(ref_ids) + len(ach_tail_ids))
        else:  # varies up to its end: the reference's head, then its own static tokens
            n = entry.ach_shared
            ka = min(k, n // bs)
            ids = ref_ids[ka * bs:n] + entry.ach_ids + ach_tail_ids
            self.achievable.serve(tpl.ach_head, ka, _chain(head[:ka], ids, bs), ka * bs + len(ids))
        # Observed: this static part's own blocks (shared by its repeats), then the tail.
        num_tokens = len(entry.ids) + len(tail_ids)
        if entry.head is tpl.head:
            if ach_tail_ids is not tail_ids:
                ach_tail = _chain(head, ref_ids[k * bs:] + tail_ids, bs)
            self.observed.serve(tpl.head, k, ach_tail, num_tokens)
            return
        hashes = entry.head.hashes
        n = len(hashes)
        tail = _chain(hashes, entry.ids[n * bs:] + tail_ids, bs)
        self.observed.serve(entry.head, n, tail, num_tokens)

    # -- output -------------------------------------------------------------------------------
    def report(self) -> Report:
        findings: list[Finding] = []
        templates: list[Template] = []
        for tpl in self.templates.values():
            tf = [f for st in tpl.merged_spans() if (f := self._finding(tpl, st)) is not None]
            hs = tpl.history
            if hs is not None and (hs.reordered or (hs.sampled and hs.pooled)):
                tf.append(self._history_finding(tpl, hs))
            tf.sort(key=lambda f: f.first_token)
            findings.extend(tf)
            static_tokens = len(tpl.static_ids)
            # Where the prefix shared by all its requests ends: the first varying span, a
            # finding or not (a varying end costs nothing but is still not shared).
            shared = min((tpl.token_at(st.ref_start) for st in tpl.spans if st.differed),
                         default=static_tokens)
            templates.append(Template(tpl.id, tpl.requests, shared, static_tokens,
                                      _example_prefix(tpl), tpl.reference))
        templates.sort(key=lambda t: (-t.requests, t.id))
        order = {t.id: i for i, t in enumerate(templates)}
        findings.sort(key=lambda f: (order[f.template], f.first_token))
        summary = Summary(
            requests=self.requests,
            bad_lines=self.bad_lines,
            templates=len(templates) + self.templates_dropped,
            block_size=self.block_size,
            observed_hit_rate=hit_rate(self.observed.hits, self.observed.queries),
            achievable_hit_rate=hit_rate(self.achievable.hits, self.achievable.queries),
            prompt_tokens=self.prompt_tokens,
            tokenizer=self.tokenizer.name,
            first_timestamp=self.first_ts,
            last_timestamp=self.last_ts,
            templates_dropped=self.templates_dropped,
        )
        return Report(summary, tuple(templates), tuple(findings), tuple(self.bad_samples))

    def _finding(self, tpl: TemplateState, st: SpanStats) -> Finding | None:
        text = tpl.static_text
        after = text[st.ref_end:]
        kind = st.kind(tpl.requests, (text[max(0, st.ref_start - 48):st.ref_start], after[:48]))
        if not after.strip() and not st.injected and kind not in _SPAN_RECOVERED:
            return None  # a varying tail: nothing static follows, nothing is lost
        bs = self.block_size
        first = tpl.token_at(st.ref_start)
        # A fixed order or normalised whitespace makes the span itself static as well (as in the
        # achievable replay); a value moved out of the way keeps varying.
        span_tokens = (tpl.token_at(st.ref_end) - first
                       if st.ref_end > st.ref_start and kind not in _SPAN_RECOVERED else 0)
        static_tokens = len(tpl.static_ids)
        lost: float = _full_blocks(first, static_tokens - span_tokens, bs)
        if not (lost >= bs or kind in _MEANINGFUL_KINDS or st.injected):
            return None
        suggested = suggestion(kind, st.role, text[:st.ref_start], lost)
        if kind == "variant":
            # Each value is its own cached prefix: one cold prefill per value, not per request.
            suggested = variant_suggestion(len(st.values), st.role, text[:st.ref_start], lost)
            lost = lost * len(st.values) / max(tpl.requests, 1)
        before = text[max(0, st.ref_start - CONTEXT_CHARS):st.ref_start]
        examples = self._examples(st.examples, kind)
        return Finding(
            template=tpl.id,
            kind=kind,
            role=st.role,
            first_token=first,
            block=first // bs,
            requests_affected=tpl.requests if not st.multi_line else max(st.differed, 1),
            distinct_values=len(st.values),
            examples=examples,
            tokens_lost_per_request=float(round(lost, 1)),
            suggestion=suggested,
            before=before,
            after=after[:CONTEXT_CHARS],
            distinct_values_capped=st.capped,
            char_start=st.ref_start,
            char_end=st.ref_end,
        )

    def _examples(self, values: list[str], kind: str) -> tuple[str, ...]:
        return tuple(redact(v, kind) for v in values) if self.redact_values else tuple(values)

    def _history_finding(self, tpl: TemplateState, hs: HistoryState) -> Finding:
        bs = self.block_size
        first = len(tpl.static_ids) + hs.lead_tokens
        end = len(tpl.static_ids) + len(hs.ids)
        lost = _full_blocks(first, end, bs)
        role = Role.ASSISTANT if hs.role == "assistant" else Role.USER
        before = (tpl.static_text + hs.lead)[-CONTEXT_CHARS:]
        kind = "sampled_block" if hs.sampled and hs.pooled else "reordered_block"
        examples = self._examples(hs.examples, kind)
        start = len(tpl.static_text) + len(hs.lead)
        return Finding(
            template=tpl.id, kind=kind, role=role, first_token=first, block=first // bs,
            requests_affected=hs.requests, distinct_values=len(hs.orders), examples=examples,
            tokens_lost_per_request=float(lost),
            suggestion=suggestion(kind, role, "", lost),
            before=before, after="", distinct_values_capped=hs.capped,
            char_start=start, char_end=start + len(hs.text),
        )


def _shared_encoding(tokenizer: Tokenizer) -> Callable[[str], tuple[list[int], Sequence[int]]]:
    """``encode_with_offsets`` without copies when the tokenizer keeps encodings (an incremental
    :class:`~templates_audit.tokenize.HFTokenizer`): its ids and offsets are only searched and
    sliced here."""
    encoded = getattr(tokenizer, "encoded", None)
    if encoded is None or getattr(tokenizer, "incremental", None) is None:
        return tokenizer.encode_with_offsets

    def ids_and_starts(text: str) -> tuple[list[int], Sequence[int]]:
        enc = encoded(text)
        return enc.ids, enc.starts

    return ids_and_starts


def _same_tail(ids: list[int], ref: list[int]) -> int:
    """The first index from which two token lists of one length agree to their end: galloping
    back from the end (an edit is usually near the top), then bisection."""
    good = len(ids)
    step = 16
    while good:
        lo = max(0, good - step)
        if ids[lo:good] != ref[lo:good]:
            break
        good = lo
        step *= 2
    else:
        return 0
    while good - lo > 1:  # ids[lo:] differs from ref[lo:], ids[good:] equals ref[good:]
        mid = (lo + good) // 2
        if ids[mid:good] == ref[mid:good]:
            good = mid
        else:
            lo = mid
    return good


def _full_blocks(first: int, end: int, bs: int) -> int:
    """Tokens of the full blocks from the one holding token ``first`` up to token ``end``."""
    return max(0, end // bs - first // bs) * bs


def _chain(before: list[int], ids: list[int], bs: int) -> list[int]:
    """Hashes of the full blocks of ``ids``, continuing the chain ``before`` (empty: a new chain)."""
    return block_hashes(ids, bs, parent=before[-1] if before else None)


def _splice_ids(tokenizer: Tokenizer, tpl: TemplateState, text: str,
                lines: tuple[int, int]) -> tuple[list[int], int, int]:
    """``tokenizer.encode(text)`` for the default tokenizer, reusing the reference's tokens.

    ``text`` and the reference (whose static part ends with a newline, or is empty) agree but
    on the reference's lines ``lines = (lo, hi)`` (:func:`.findings.changed_range`). No
    default-tokenizer token crosses a newline, so the tokens of the whole lines before ``lo`` and
    of everything from the newline at ``hi`` are the reference's; only the lines in between are
    tokenised. Also returns how many first tokens of the result are the reference's first tokens
    and where the reference's reused last tokens start in it. A test checks this against
    ``encode`` on random edits.
    """
    ref = tpl.static_text
    lo, hi = lines
    offs, ref_ids = tpl.offsets, tpl.static_ids
    same_to = bisect.bisect_left(offs, lo)
    head = ref_ids[:same_to]
    head += tokenizer.encode(text[lo:len(text) - (len(ref) - hi)])
    same_from = len(head)
    head += ref_ids[bisect.bisect_left(offs, hi):]
    return head, same_to, same_from


_STEP_BLOCKS = 4  # blocks compared one by one after a known-equal prefix before bisecting


def _shared_blocks(ids: list[int], ref: list[int], limit: int, bs: int, equal: int = 0) -> int:
    """Leading full blocks of ``ids`` equal to ``ref``'s, at most ``limit``; the first ``equal``
    tokens are known to be equal. A few blocks after those are compared one by one (an edit
    ends the shared prefix there); otherwise C-speed slice compares: all of them, else
    galloping from the start — a difference is usually near the top — then bisection."""
    hi = min(limit, len(ids) // bs)
    k = min(equal // bs, hi)
    for _ in range(_STEP_BLOCKS):
        if k >= hi or ids[k * bs:(k + 1) * bs] != ref[k * bs:(k + 1) * bs]:
            return k
        k += 1
    lo = k
    if ids[: hi * bs] == ref[: hi * bs]:
        return hi
    step = 1
    while step < hi and ids[: step * bs] == ref[: step * bs]:
        lo = max(lo, step)
        step *= 2
    hi = min(step, hi) - 1  # the first min(step, hi) blocks differ somewhere
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ids[: mid * bs] == ref[: mid * bs]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fixed(instant: dt.datetime) -> dt.datetime:
    return instant


def _anchor(probe: str, pos: int, ref: str) -> int | None:
    """Where ``probe[pos:]``'s span starts in ``ref``: same static text up to it."""
    return pos if ref[:pos] == probe[:pos] else None


def _value_len(ref: str, start: int, probe_after: str) -> int:
    """Length of the reference's value at ``start``: up to where the probe's static tail resumes."""
    tail = probe_after[:32]
    if not tail:
        return len(ref) - start
    end = ref.find(tail, start)
    return (end - start) if end >= 0 else 0


def _example_prefix(tpl: TemplateState, limit: int = 160) -> str:
    start = tpl.roles[0][0] if tpl.roles else 0
    return tpl.static_text[start:start + limit]


def analyze(
    items: Iterable[Record | BadLine],
    tokenizer: Tokenizer | None = None,
    renderer: ChatRenderer | None = None,
    *,
    block_size: int = 16,
    cache_blocks: int | None = None,
    redact_values: bool = False,
) -> Report:
    """Audit ``items`` (records and bad lines, in trace order) into a report."""
    auditor = Auditor(tokenizer, renderer, block_size=block_size, cache_blocks=cache_blocks,
                      redact_values=redact_values)
    auditor.add_all(items)
    return auditor.report()
