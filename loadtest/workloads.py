"""Workload generators: deterministic request streams with a known prefix-sharing structure.

Every workload is a pure function of its parameters and a seed: the same seed gives byte-identical
requests, so several setups (router policies, nginx, sglang-router) can be fed the same traffic.

Workloads (names are CLI values):

* ``shared-prefix`` — P system prompts of 1-4k tokens with Zipf popularity, short user turns.
* ``cache-pressure`` — shared-prefix's requests under another name, for the runs that size it as
  llm-d's precise-routing benchmark does: many groups of long shared prefixes (uniform
  popularity with ``zipf_s`` 0) whose total exceeds the fleet's KV capacity, so that what each
  replica evicted decides (``loadtest.bench_kv``).

  In shared-prefix, multi-turn and hot-prefix a user turn is a short question, followed by
  ``user_tokens`` tokens of pasted text (new to the cache, so it costs prefill) when that is > 0.
* ``multi-turn`` — conversations that grow turn by turn; each turn resends the whole history, as
  chat clients do, so turn k+1 shares turn k's prompt as its prefix.
* ``hot-prefix`` — multi-turn conversations where one system prompt carries 80% of the traffic:
  pure prefix hashing would melt that prompt's replica.
* ``volatile`` — like shared-prefix, but each template injects a per-request timestamp or session
  id on its second line; routing cannot save the cache, the auditor can find why.
* ``mooncake`` — replay of a Mooncake FAST'25 trace: each 512-token block id becomes a fixed block
  of text that the default tokenizer cuts into exactly 512 tokens (block texts end with a newline,
  which is always a token boundary), so the trace's sharing structure survives into vLLM's 16-token
  blocks; arrivals follow the trace's timestamps, scaled.
* ``rag`` — retrieval-augmented chat. ``prompts`` system prompts (one per app, Zipf popularity) and
  a shared pool of ``documents`` documents (``min_doc_tokens``-``max_doc_tokens`` each). A
  request's *topic* (``documents // 4`` topics, Zipf popularity) ranks 8 documents of the pool
  (popular documents belong to many topics); each user turn carries the top 2-4 of them by a
  noisy relevance score, in score order, *inside the user message* after the system prompt
  (``[1] <document>`` ... then the question), as retrieval pipelines place them. A conversation
  has 1-``turns`` turns (uniform); a follow-up resends the history (earlier documents
  included) and retrieves for the same topic with probability 0.7. Requests carry no ``user``:
  what they share is only visible in their content. Sharing: the system prompt by all of an
  app's requests, the leading document by requests of one app whose retrieval put it first,
  the history by a conversation's turns.
* ``agent`` — tool-calling agents. ``prompts`` agent kinds, each a system prompt plus 6-12
  ``tools`` definitions (JSON-schema functions, ~1-3k tokens), Zipf popularity. A conversation is
  a user task followed by steps; each step is one request (the whole history) whose answer is an
  assistant message with ``tool_calls`` (``content: null``), followed by the ``tool`` message
  with its result (200-1,500 tokens, ``tool_call_id`` set). A conversation stops when its prompt
  reaches a target drawn uniformly from ``min_history_tokens``-``max_history_tokens`` (8-20k by
  default; its last tool result is cut to land on it), so its last request is that long.
  Requests carry no ``user``. Sharing: system prompt and tools by an agent kind, the history by a
  conversation's steps (each step's prompt is the previous one plus one call and one result).

Conversation schedules (multi-turn, hot-prefix, rag, agent): conversations start as a Poisson
process at ``rate / mean turns``; the gap between two turns of one conversation is exponential
with mean ``2 x mean turns / rate``, so about ``2 x mean turns`` conversations are open at once.
In rag and agent every conversation is complete (the request count cuts only the last one).

A request's ``at`` is its arrival offset in seconds for open-loop runs; closed-loop runs ignore it
but keep the order (a conversation's turns stay in order in both).

Cost: generation is O(total prompt text); system prompts are built once per workload.
"""

from __future__ import annotations

import datetime as _dt
import functools
import itertools
import json
import math
import random
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from templates_audit.tokenize import Tokenizer

__all__ = [
    "WORKLOADS",
    "Request",
    "WorkloadSpec",
    "MooncakeRecord",
    "generate",
    "mooncake_block_text",
    "mooncake_records",
    "synthetic_text",
]

T = TypeVar("T")

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

_WORDS = (
    "the of and to in is you that it for are as with be on not this but by from they we say her "
    "she or an will my one all would there their what so up out if about who get which go me when "
    "make can like time no just him know take people into year your good some could them see other "
    "than then now look only come its over think also back after use two how our work first well "
    "way even new want because any these give day most us assistant answer question customer "
    "policy product order account billing refund shipping support document context tool function "
    "result summary detail example format instruction response careful helpful accurate concise "
    "source citation search code file project request service model cache token prompt system"
).split()

_QUESTIONS = (
    "How do I reset my password", "What is the refund policy for damaged items",
    "Summarise the attached report in three bullet points", "Why was my card charged twice",
    "Write a haiku about distributed systems", "Translate this sentence into French",
    "Which plan includes priority support", "Explain the difference between TCP and UDP",
    "Can you draft a polite follow-up email", "What are the opening hours on Sunday",
)


def synthetic_text(rng: random.Random, n_words: int, line_words: int = 14) -> str:
    """Deterministic English-like filler: sentences of common words, a newline every few lines."""
    out: list[str] = []
    line: list[str] = []
    for i in range(n_words):
        w = rng.choice(_WORDS)
        if not line:
            w = w.capitalize()
        line.append(w)
        if len(line) >= line_words or i == n_words - 1:
            out.append(" ".join(line) + ".")
            line = []
    return "\n".join(out)


@dataclass(frozen=True)
class Request:
    idx: int
    at: float  # arrival offset (s) for open-loop runs
    path: str
    body: dict[str, Any]
    group: str  # the prefix group (system prompt / template) this request belongs to
    conversation: str | None = None
    turn: int = 0

    def json_bytes(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    requests: int = 200
    rate: float = 10.0  # mean arrivals/s for the Poisson schedule
    seed: int = 0
    prompts: int = 8  # P distinct system prompts
    min_prompt_tokens: int = 1000
    max_prompt_tokens: int = 4000
    zipf_s: float = 1.1
    max_tokens: int = 16
    turns: int = 4  # multi-turn / hot-prefix: turns per conversation
    hot_fraction: float = 0.8
    model: str = "sim-model"
    stream: bool = True
    trace_path: str | None = None  # mooncake
    time_scale: float = 1.0  # mooncake: trace seconds per replay second
    max_output_tokens: int = 64  # mooncake: cap on the trace's output lengths
    documents: int = 200  # rag: size of the shared document pool
    min_doc_tokens: int = 200  # rag: document sizes
    max_doc_tokens: int = 800
    min_history_tokens: int = 8000  # agent: a conversation's last prompt, drawn in this range
    max_history_tokens: int = 20000
    user_tokens: int = 0  # shared-prefix, multi-turn, hot-prefix: pasted text after each question
    extra: dict[str, Any] = field(default_factory=dict)


def _zipf_weights(n: int, s: float) -> list[float]:
    w = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def _system_prompts(spec: WorkloadSpec, rng: random.Random) -> list[str]:
    prompts = []
    for p in range(spec.prompts):
        tokens = rng.randint(spec.min_prompt_tokens, spec.max_prompt_tokens)
        # the default tokenizer makes ~1.35 tokens per word of this vocabulary (with punctuation)
        body = synthetic_text(rng, max(8, int(tokens / 1.35)))
        prompts.append(f"You are assistant #{p} of the ACME help desk.\n{body}")
    return prompts


def _poisson_times(rng: random.Random, n: int, rate: float) -> list[float]:
    t = 0.0
    out = []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate) if rate > 0 else 0.0
    return out


def _body(spec: WorkloadSpec, messages: list[dict[str, Any]], user: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": spec.model,
        "messages": messages,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": spec.stream,
    }
    if spec.stream:
        body["stream_options"] = {"include_usage": True}
    if user:
        body["user"] = user
    return body


def _question(rng: random.Random) -> str:
    return f"{rng.choice(_QUESTIONS)}? (ref {rng.randint(1000, 9999)})"


def _user_turn(spec: WorkloadSpec, rng: random.Random) -> str:
    """A question, followed by ``spec.user_tokens`` tokens of pasted text when that is > 0."""
    q = _question(rng)
    if spec.user_tokens <= 0:
        return q
    return f"{q}\n{synthetic_text(rng, _words(spec.user_tokens))}"


def shared_prefix(spec: WorkloadSpec) -> Iterator[Request]:
    rng = random.Random(spec.seed)
    prompts = _system_prompts(spec, rng)
    weights = _zipf_weights(len(prompts), spec.zipf_s)
    times = _poisson_times(rng, spec.requests, spec.rate)
    for i in range(spec.requests):
        p = rng.choices(range(len(prompts)), weights)[0]
        msgs = [{"role": "system", "content": prompts[p]},
                {"role": "user", "content": _user_turn(spec, rng)}]
        yield Request(i, times[i], CHAT, _body(spec, msgs), group=f"p{p}")


def volatile(spec: WorkloadSpec) -> Iterator[Request]:
    rng = random.Random(spec.seed)
    prompts = _system_prompts(spec, rng)
    weights = _zipf_weights(len(prompts), spec.zipf_s)
    times = _poisson_times(rng, spec.requests, spec.rate)
    base = 1_767_225_600  # 2026-01-01T00:00:00Z
    for i in range(spec.requests):
        p = rng.choices(range(len(prompts)), weights)[0]
        head, _, rest = prompts[p].partition("\n")
        if p % 2 == 0:
            ts = base + int(times[i] * 1000) + rng.randint(0, 59)
            stamp = _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            line = f"Current time: {stamp}"
        else:
            line = f"Session: {uuid.UUID(int=rng.getrandbits(128), version=4)}"
        msgs = [
            {"role": "system", "content": f"{head}\n{line}\n{rest}"},
            {"role": "user", "content": _question(rng)},
        ]
        yield Request(i, times[i], CHAT, _body(spec, msgs), group=f"p{p}")


def _conversations(spec: WorkloadSpec, hot: bool) -> Iterator[Request]:
    rng = random.Random(spec.seed)
    prompts = _system_prompts(spec, rng)
    n_conv = max(1, math.ceil(spec.requests / spec.turns))
    if hot:
        weights = [spec.hot_fraction] + [(1 - spec.hot_fraction) / max(1, len(prompts) - 1)] * (len(prompts) - 1)
    else:
        weights = _zipf_weights(len(prompts), spec.zipf_s)
    starts = _poisson_times(rng, n_conv, spec.rate / spec.turns if spec.rate > 0 else 0)
    events: list[tuple[float, int, int]] = []  # (time, conversation, turn)
    think = 2.0 / max(spec.rate, 1e-9) * spec.turns if spec.rate > 0 else 0.0
    for c in range(n_conv):
        t = starts[c]
        for k in range(spec.turns):
            events.append((t, c, k))
            t += rng.expovariate(1.0 / think) if think > 0 else 0.0
    events.sort()
    events = events[: spec.requests]
    conv_prompt = [rng.choices(range(len(prompts)), weights)[0] for _ in range(n_conv)]
    history: dict[int, list[dict[str, Any]]] = {}
    conv_rng = [random.Random(spec.seed * 1_000_003 + c) for c in range(n_conv)]
    for i, (t, c, k) in enumerate(events):
        msgs = history.setdefault(c, [{"role": "system", "content": prompts[conv_prompt[c]]}])
        r = conv_rng[c]
        msgs.append({"role": "user", "content": _user_turn(spec, r)})
        body = _body(spec, [dict(m) for m in msgs], user=f"conv-{spec.seed}-{c}")
        yield Request(i, t, CHAT, body, group=f"p{conv_prompt[c]}", conversation=f"conv-{c}", turn=k)
        msgs.append({"role": "assistant", "content": synthetic_text(r, spec.max_tokens // 2 + 4)})


def multi_turn(spec: WorkloadSpec) -> Iterator[Request]:
    return _conversations(spec, hot=False)


def hot_prefix(spec: WorkloadSpec) -> Iterator[Request]:
    return _conversations(spec, hot=True)


def _conversation_events(rng: random.Random, lengths: Sequence[int],
                         rate: float) -> list[tuple[float, int, int]]:
    """(arrival, conversation, turn) of every turn of conversations of ``lengths`` turns, sorted.

    Starts are Poisson at ``rate / mean length``; turns of one conversation are separated by
    exponential gaps of mean ``2 x mean length / rate`` (the multi-turn workloads' think time).
    """
    if not lengths:
        return []
    mean = sum(lengths) / len(lengths)
    starts = _poisson_times(rng, len(lengths), rate / mean if rate > 0 else 0.0)
    think = 2.0 * mean / rate if rate > 0 else 0.0
    events = []
    for c, n in enumerate(lengths):
        t = starts[c]
        for k in range(n):
            events.append((t, c, k))
            t += rng.expovariate(1.0 / think) if think > 0 else 0.0
    events.sort()
    return events


def _words(tokens: int) -> int:
    """Words of `synthetic_text` for about ``tokens`` default-tokenizer tokens."""
    return max(4, int(tokens / 1.35))


def _documents(spec: WorkloadSpec, rng: random.Random) -> list[str]:
    docs = []
    for d in range(spec.documents):
        title = " ".join(rng.choice(_WORDS) for _ in range(4)).title()
        body = synthetic_text(rng, _words(rng.randint(spec.min_doc_tokens, spec.max_doc_tokens)))
        docs.append(f"Document {d}: {title}\n{body}")
    return docs


def _topics(n_docs: int, rng: random.Random) -> list[list[int]]:
    """``n_docs // 4`` topics, each ranking 8 distinct documents; popular documents (Zipf) are
    in many topics."""
    weights = _zipf_weights(n_docs, 0.8)
    topics = []
    for _ in range(max(1, n_docs // 4)):
        ranked: list[int] = []
        while len(ranked) < min(8, n_docs):
            d = rng.choices(range(n_docs), weights)[0]
            if d not in ranked:
                ranked.append(d)
        topics.append(ranked)
    return topics


def _retrieve(rng: random.Random, ranked: Sequence[int]) -> list[int]:
    """The top 2-4 of a topic's documents by a noisy relevance score, best first."""
    scores = [(1.0 / (r + 1) * math.exp(rng.gauss(0.0, 0.6)), d) for r, d in enumerate(ranked)]
    k = rng.randint(2, 4)
    return [d for _, d in sorted(scores, reverse=True)[:k]]


def _rag_turn(docs: Sequence[str], chosen: Sequence[int], question: str) -> str:
    parts = [f"[{j + 1}] {docs[d]}" for j, d in enumerate(chosen)]
    return ("Answer using only the documents below and cite them by number.\n\n"
            + "\n\n".join(parts) + f"\n\nQuestion: {question}")


def rag(spec: WorkloadSpec) -> Iterator[Request]:
    rng = random.Random(spec.seed)
    prompts = _system_prompts(spec, rng)
    docs = _documents(spec, rng)
    topics = _topics(len(docs), rng)
    app_w = _zipf_weights(len(prompts), spec.zipf_s)
    topic_w = _zipf_weights(len(topics), spec.zipf_s)
    lengths: list[int] = []
    while sum(lengths) < spec.requests:
        lengths.append(rng.randint(1, max(1, spec.turns)))
    if lengths:
        lengths[-1] -= sum(lengths) - spec.requests
    apps = [rng.choices(range(len(prompts)), app_w)[0] for _ in lengths]
    history: dict[int, list[dict[str, Any]]] = {}
    topic: dict[int, int] = {}
    for i, (t, c, k) in enumerate(_conversation_events(rng, lengths, spec.rate)):
        r = random.Random(spec.seed * 1_000_003 + c * 7 + k)
        msgs = history.setdefault(c, [{"role": "system", "content": prompts[apps[c]]}])
        if c not in topic or r.random() >= 0.7:
            topic[c] = r.choices(range(len(topics)), topic_w)[0]
        msgs.append({"role": "user",
                     "content": _rag_turn(docs, _retrieve(r, topics[topic[c]]), _question(r))})
        yield Request(i, t, CHAT, _body(spec, [dict(m) for m in msgs]), group=f"p{apps[c]}",
                      conversation=f"rag-{c}", turn=k)
        msgs.append({"role": "assistant", "content": synthetic_text(r, spec.max_tokens // 2 + 4)})


_TOOL_NAMES = (
    "search_code", "read_file", "write_file", "list_directory", "run_tests", "run_shell",
    "grep", "git_diff", "git_log", "http_get", "query_database", "describe_table",
    "create_ticket", "update_ticket", "send_message", "get_metrics", "get_logs", "calculator",
    "fetch_document", "summarise", "translate", "schedule_job", "get_user", "list_alerts",
)


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    names = rng.sample(_TOOL_NAMES, rng.randint(6, 12))
    tools = []
    for name in names:
        props = {}
        for _ in range(rng.randint(2, 5)):
            arg = rng.choice(_WORDS) + "_" + rng.choice(("id", "path", "query", "limit", "text"))
            props[arg] = {"type": rng.choice(("string", "integer", "boolean")),
                          "description": synthetic_text(rng, rng.randint(8, 30), line_words=40)}
        tools.append({"type": "function", "function": {
            "name": name,
            "description": synthetic_text(rng, rng.randint(40, 140), line_words=40),
            "parameters": {"type": "object", "properties": props,
                           "required": sorted(props)[:1]}}})
    return tools


def _agent_conversation(spec: WorkloadSpec, system: str, tools: list[dict[str, Any]],
                        rng: random.Random, conv: str) -> list[list[dict[str, Any]]]:
    """The message lists of one agent conversation's requests, in order (each one the whole
    history so far); stops once the prompt reaches the conversation's target length."""
    tok = _tokenizer()
    target = rng.randint(spec.min_history_tokens, spec.max_history_tokens)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Task: {_question(rng)}.\n"
                                    + synthetic_text(rng, rng.randint(30, 90))},
    ]
    size = (sum(len(tok.encode(json.dumps(t))) for t in tools)
            + sum(len(tok.encode(m["content"])) + 8 for m in msgs))
    out = [list(msgs)]
    step = 0
    while size < target:
        fn = rng.choice(tools)["function"]
        args = {a: (rng.randint(1, 500) if p["type"] == "integer" else
                    rng.random() < 0.5 if p["type"] == "boolean" else
                    " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6))))
                for a, p in fn["parameters"]["properties"].items()}
        call_id = f"call_{conv}_{step}"
        arguments = json.dumps(args)
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": fn["name"], "arguments": arguments}}]})
        size += len(tok.encode(arguments)) + 16
        want = min(rng.randint(200, 1500), max(20, target - size))
        result = synthetic_text(rng, _words(want))
        msgs.append({"role": "tool", "tool_call_id": call_id, "content": result})
        size += len(tok.encode(result)) + 10
        out.append(list(msgs))
        step += 1
    return out


def agent(spec: WorkloadSpec) -> Iterator[Request]:
    rng = random.Random(spec.seed)
    systems = _system_prompts(spec, rng)
    toolsets = [_tools(rng) for _ in systems]
    weights = _zipf_weights(len(systems), spec.zipf_s)
    convs: list[list[list[dict[str, Any]]]] = []
    kinds: list[int] = []
    total = 0
    while total < spec.requests:
        a = rng.choices(range(len(systems)), weights)[0]
        r = random.Random(spec.seed * 1_000_003 + len(convs))
        steps = _agent_conversation(spec, systems[a], toolsets[a], r, f"{spec.seed}_{len(convs)}")
        steps = steps[: spec.requests - total]
        convs.append(steps)
        kinds.append(a)
        total += len(steps)
    for i, (t, c, k) in enumerate(_conversation_events(rng, [len(s) for s in convs], spec.rate)):
        body = _body(spec, convs[c][k])
        body["tools"] = toolsets[kinds[c]]
        yield Request(i, t, CHAT, body, group=f"a{kinds[c]}", conversation=f"agent-{c}", turn=k)


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    from templates_audit.tokenize import default_tokenizer

    return default_tokenizer()


@functools.lru_cache(maxsize=1)
def _word_costs() -> dict[str, int]:
    from templates_audit.tokenize import default_tokenizer

    tok = default_tokenizer()
    return {w: len(tok.encode(" " + w)) for w in _WORDS}


def mooncake_block_text(block_id: int, tokens: int = 512) -> str:
    """Text of one trace block: exactly ``tokens`` default-tokenizer tokens, ending in a newline.

    The content depends only on the block id, so equal ids give equal text and, with the
    default tokenizer, equal token blocks. Word pieces never merge across the single spaces
    between words, so the token count is the sum of per-word counts (checked in the tests).
    """
    from templates_audit.tokenize import default_tokenizer

    costs = _word_costs()
    rng = random.Random(block_id * 7919 + 17)
    head = f"b{block_id}"
    n = len(default_tokenizer().encode(head)) + 1  # + the closing newline
    words = [head]
    while True:
        w = rng.choice(_WORDS)
        if n + costs[w] > tokens:
            break
        words.append(w)
        n += costs[w]
    text = " ".join(words)
    # top up with " ." (one token each) to hit the exact size
    text += " ." * (tokens - n)
    return text + "\n"


def _mooncake_prompt(hash_ids: list[int], input_length: int, cache: dict[int, str]) -> str:
    from templates_audit.tokenize import default_tokenizer

    parts = []
    for j, hid in enumerate(hash_ids):
        if hid not in cache:
            cache[hid] = mooncake_block_text(hid)
        text = cache[hid]
        if j == len(hash_ids) - 1:
            last = input_length - 512 * (len(hash_ids) - 1)
            if 0 < last < 512:
                _ids, offs = default_tokenizer().encode_with_offsets(text)
                text = text[: offs[last]] if last < len(offs) else text
        parts.append(text)
    return "".join(parts)


@dataclass(frozen=True)
class MooncakeRecord:
    """One request of a Mooncake trace: arrival in ms, prompt and output lengths in tokens, and
    the ids of the prompt's 512-token blocks (equal ids, equal content)."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(rec: dict[str, Any], name: str, lo: int) -> int:
    v = rec.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    return v


def _jsonl(name: str, lines: Iterable[str],
           parse: Callable[[dict[str, Any], int], T]) -> Iterator[T]:
    """``parse(object, index)`` of each non-blank line (index: among those lines); a line that
    is not a JSON object, or whose object ``parse`` rejects with ValueError, raises ValueError
    naming the file, the line number and what is wrong."""
    index = 0
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
            out = parse(rec, index)
        except ValueError as exc:  # json.JSONDecodeError included
            raise ValueError(f"{name}:{lineno}: {exc}") from None
        yield out
        index += 1


def _mooncake_record(rec: dict[str, Any], _index: int) -> MooncakeRecord:
    ts = rec.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not ts >= 0:
        raise ValueError(f"timestamp: expected a number >= 0 (ms), got {ts!r}")
    hids = rec.get("hash_ids")
    if not isinstance(hids, list) or not hids or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in hids):
        raise ValueError(f"hash_ids: expected a non-empty list of integers >= 0, got {hids!r}"[:200])
    return MooncakeRecord(float(ts), _int_field(rec, "input_length", 1),
                          _int_field(rec, "output_length", 0), tuple(hids))


def mooncake_records(path: str) -> Iterator[MooncakeRecord]:
    """The records of a Mooncake-format JSONL file (blank lines skipped); a bad line raises
    ValueError naming the file, the line number and what is wrong with it."""
    with open(path, encoding="utf-8") as fh:
        yield from _jsonl(path, fh, _mooncake_record)


def mooncake(spec: WorkloadSpec) -> Iterator[Request]:
    if not spec.trace_path:
        raise ValueError("the mooncake workload needs trace_path (e.g. ../shared/data/traces/conversation_trace.jsonl)")
    cache: dict[int, str] = {}
    for i, rec in enumerate(mooncake_records(spec.trace_path)):
        if i >= spec.requests:
            break
        body: dict[str, Any] = {
            "model": spec.model,
            "prompt": _mooncake_prompt(list(rec.hash_ids), rec.input_length, cache),
            "max_tokens": max(1, min(rec.output_length, spec.max_output_tokens)),
            "temperature": 0,
            "stream": spec.stream,
        }
        at = rec.timestamp / 1000.0 / max(spec.time_scale, 1e-9)
        yield Request(i, at, COMPLETIONS, body, group=f"h{rec.hash_ids[0]}")


WORKLOADS = {
    "shared-prefix": shared_prefix,
    "multi-turn": multi_turn,
    "hot-prefix": hot_prefix,
    "volatile": volatile,
    "mooncake": mooncake,
    "rag": rag,
    "agent": agent,
    "cache-pressure": shared_prefix,
}


def generate(spec: WorkloadSpec) -> list[Request]:
    """All requests of ``spec`` in arrival order. A file path as name reads a JSONL of bodies."""
    fn = WORKLOADS.get(spec.name)
    if fn is not None:
        return list(fn(spec))
    return list(_from_file(spec))


def _from_file(spec: WorkloadSpec) -> Iterator[Request]:
    """A JSONL file of request bodies (optionally {"path", "body", "at"} records)."""
    try:
        fh = open(spec.name, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"unknown workload {spec.name!r}: not one of {sorted(WORKLOADS)} and not a readable file ({exc})") from exc
    rng = random.Random(spec.seed)
    times = _poisson_times(rng, spec.requests, spec.rate)

    def request(rec: dict[str, Any], i: int) -> Request:
        body = rec.get("body", rec)
        if not isinstance(body, dict):
            raise ValueError(f"body: expected a JSON object, got {type(body).__name__}")
        path = rec.get("path") or (COMPLETIONS if "prompt" in body else CHAT)
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"path: expected a URL path, got {path!r}")
        at = rec.get("at", times[i])
        if isinstance(at, bool) or not isinstance(at, int | float) or not at >= 0:
            raise ValueError(f"at: expected a number of seconds >= 0, got {at!r}")
        return Request(i, float(at), path, body, group="file")

    with fh:
        yield from itertools.islice(_jsonl(spec.name, fh, request), spec.requests)
