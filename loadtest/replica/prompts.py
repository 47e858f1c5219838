"""From a parsed request to prompt token ids and block hashes, memoised per body and per prefix.

Chat messages are rendered with the chat template and tokenised; completion prompts are
tokenised as they are (or taken as token ids); special tokens as vLLM adds them (completions
text with the tokenizer's BOS/EOS, chat only when the request asks: ``Job.add_special_tokens``). The result — ids, chained full-block hashes and
the deterministic reply (text and ids) — depends only on the request body, so an LRU keyed by a
128-bit hash of the body skips rendering, tokenising and hashing when a body repeats (load
generators replay bodies). Templates that read the clock (``strftime_now``) are never memoised.

Leading messages repeat far more often than whole bodies (one system prompt, many user turns; a
conversation resends its history every turn). With the built-in template and the default
tokeniser the prompt is assembled message by message: the template renders each message into an
independent piece ending in a newline (`ChatRenderer.render_pieces`, checked against Jinja), and
the default tokeniser never lets a token span a newline, so the ids of the joined text are the
ids of the pieces concatenated; chained block hashes continue from the hash of the last full
block before them. A second LRU keeps (ids, full-block hashes) of message prefixes — the first
message alone, and all the messages of a request (the history of the next turn) — so a shared
system prompt is neither rendered, tokenised nor hashed again: a request costs O(its new
messages) plus copying the ids. Custom templates, tools, template variables and Hugging Face
tokenisers (whose merges may cross a newline) take the whole-prompt path, through
:class:`templates_audit.prompt_keys.PromptKeys` (the router's block keys): with a Hugging Face
tokeniser the prompt is tokenised exactly by splicing the tokens of what differs into those of
a recently seen prompt sharing its prefix (``templates_audit.incremental``), and the blocks it
shares with that prompt keep their hashes.

Cost: O(prompt) on a miss, O(body bytes) to hash on a hit; memory bounded by ``memo_tokens``
token ids (plus their block hashes) per LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain
from typing import NamedTuple

import xxhash

from templates_audit.blocks import block_hashes
from templates_audit.prompt_keys import BlockKeys, PromptKeys
from templates_audit.render import ChatRenderer
from templates_audit.tokenize import DefaultTokenizer, HFTokenizer, Tokenizer

from .openai_api import Job, Kind
from .text import REPLY_VOCABULARY, completion_pieces, prompt_seed


def renderer_for(tokenizer: Tokenizer, chat_template: str | None = None) -> ChatRenderer:
    """The chat template a replica renders with: the ``chat_template`` file, else the one in the
    tokenizer's ``tokenizer_config.json``, else the built-in ChatML."""
    if chat_template:
        return ChatRenderer.from_file(chat_template)
    if isinstance(tokenizer, HFTokenizer):
        source = tokenizer.chat_template()
        if source:
            return ChatRenderer(source)
    return ChatRenderer()


class Reply(NamedTuple):
    pieces: list[str]   # one per generated token (each stream chunk's text); not to be mutated
    ids: list[int]


class Prompt(NamedTuple):
    ids: tuple[int, ...]
    hashes: tuple[int, ...]
    seed: int
    reply: Reply   # of the request's max_tokens: memoised with the body that asked for it


class _Prefix(NamedTuple):
    """The leading ``n`` token ids of a prompt and the chained hashes of their full blocks.

    ``ids`` and ``hashes`` are those of the whole prompt the prefix was cut from (shared, not
    copied): only ``ids[:n]`` and ``hashes[:n // block_size]`` belong to the prefix."""

    ids: tuple[int, ...]
    hashes: tuple[int, ...]
    n: int


_EMPTY = _Prefix((), (), 0)


class _Lru:
    """An LRU of values with a token size, bounded by the sum of the sizes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[object, tuple[int, object]] = OrderedDict()

    def get(self, key: object) -> object | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[1]

    def put(self, key: object, value: object, size: int) -> None:
        if size > self.budget or key in self._items:
            return
        self._items[key] = (size, value)
        self.used += size
        while self.used > self.budget:
            self.used -= self._items.popitem(last=False)[1][0]

    def __len__(self) -> int:
        return len(self._items)


class Prompter:
    def __init__(self, renderer: ChatRenderer, tokenizer: Tokenizer, block_size: int,
                 memo_tokens: int = 1 << 21) -> None:
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.block_size = block_size
        self._keys = PromptKeys(tokenizer, renderer, block_size=block_size)
        self._memo = _Lru(memo_tokens if "strftime_now" not in renderer.source else 0)
        self._prefixes = _Lru(memo_tokens)
        # Pieces can be tokenised one by one only if no token spans the newline ending each.
        self._by_piece = isinstance(tokenizer, DefaultTokenizer)
        self._piece_ids: dict[str, tuple[int, ...]] = {
            p: tuple(tokenizer.encode(p)) for p in REPLY_VOCABULARY}

    # -- chat prompts, piece by piece --------------------------------------------------------
    def _pieces(self, job: Job) -> list[str] | None:
        if not self._by_piece or job.kind is not Kind.CHAT or job.tools or job.template_kwargs:
            return None
        return self.renderer.render_pieces(job.messages, None, True)

    def _assemble(self, pieces: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Ids and full-block hashes of the pieces (messages, then the generation prompt) joined."""
        msgs = len(pieces) - 1
        prefixes = self._prefixes
        base, done = _EMPTY, 0
        for j in (msgs, msgs - 2, 1):   # same messages, the previous turn, the system prompt
            if j >= 1:
                hit = prefixes.get(tuple(pieces[:j]))
                if hit is not None:
                    assert isinstance(hit, _Prefix)
                    base, done = hit, j
                    break
        bs = self.block_size
        ids = list(base.ids[:base.n])
        known = base.hashes[:base.n // bs]
        encode = self.tokenizer.encode
        cut: list[tuple[int, int]] = []   # (pieces, ids) of the prefixes to remember
        for k in range(done, len(pieces)):
            ids += encode(pieces[k])
            if k + 1 == 1 or k + 1 == msgs:
                cut.append((k + 1, len(ids)))
        more = block_hashes(ids[len(known) * bs:len(ids) // bs * bs], bs,
                            parent=known[-1] if known else None)
        hashes = known + tuple(more) if more else known
        out = tuple(ids)
        for j, n in cut:
            prefixes.put(tuple(pieces[:j]), _Prefix(out, hashes, n), len(out))
        return out, hashes

    def _whole(self, job: Job) -> BlockKeys:
        """Ids and full-block hashes of the prompt, rendered and tokenised whole."""
        keys = self._keys
        if job.kind is Kind.CHAT:
            return keys.chat(list(job.messages), list(job.tools) if job.tools else None,
                             job.template_kwargs, add_special_tokens=job.add_special_tokens)
        if job.prompt_ids is not None:
            return keys.ids(list(job.prompt_ids))
        return keys.text(job.prompt_text or "", add_special_tokens=job.add_special_tokens)

    # -- public --------------------------------------------------------------------------------
    def ids(self, job: Job) -> list[int]:
        pieces = self._pieces(job)
        if pieces is not None:
            return list(self._assemble(pieces)[0])
        return list(self._whole(job).ids)

    def prompt(self, job: Job, body: bytes) -> Prompt:
        """The prompt of a request and its reply (``job.max_tokens`` tokens), memoised by body."""
        key = xxhash.xxh3_128_digest(body)
        hit = self._memo.get(key)
        if hit is not None:
            assert isinstance(hit, Prompt)
            return hit
        pieces = self._pieces(job)
        if pieces is not None:
            ids, hashes = self._assemble(pieces)
        else:
            whole = self._whole(job)
            ids, hashes = tuple(whole.ids), tuple(whole.hashes)
        # The chained hashes already summarise the full blocks; only the tail needs hashing.
        tail = ids[len(hashes) * self.block_size:]
        seed = prompt_seed(tail, hashes[-1] if hashes else 0)
        out = Prompt(ids, hashes, seed, self.reply(seed, job.max_tokens))
        self._memo.put(key, out, len(ids) + job.max_tokens)
        return out

    def reply_ids(self, pieces: Sequence[str]) -> list[int]:
        """Token ids of the reply, piece by piece (the pieces come from a small vocabulary,
        whose ids are kept; any other piece is tokenised here)."""
        found = list(map(self._piece_ids.get, pieces))
        if None in found:
            found = [t or tuple(self.tokenizer.encode(p)) for t, p in zip(found, pieces, strict=True)]
        return list(chain.from_iterable(found))  # type: ignore[arg-type]

    def reply(self, seed: int, max_tokens: int) -> Reply:
        """The deterministic reply of a prompt with this seed: its pieces (one per token) and
        their ids. Not memoised here: `prompt` keeps it with the body's memo entry, so a repeated
        body gets it back and a new prompt pays no cache upkeep for a reply nobody repeats."""
        pieces = completion_pieces(seed, max_tokens)
        return Reply(pieces, self.reply_ids(pieces))
