"""Exact block keys of a request: render, tokenise with reuse, chain the block hashes.

What a router needs to match a request against a replica's KV cache block by block (vLLM's KV
cache events report the hashes of the blocks it stores): the prompt vLLM will build from the
request, its exact token ids, and the chained hashes of its full blocks. :class:`PromptKeys`
does the three steps, each reusing earlier work:

1. **render** with the chat template vLLM uses (:class:`.render.ChatRenderer`: the built-in
   ChatML is assembled natively, any other template through Jinja);
2. **tokenise** with the model's ``tokenizer.json`` through :meth:`.tokenize.HFTokenizer.encoded`
   — exact, and only the part that differs from a cached prompt sharing a prefix is encoded
   (:mod:`.incremental`): a conversation's next turn encodes its new messages, a new
   conversation under a known system prompt its own turns;
3. **hash** the full blocks (:func:`.blocks.block_hashes`, through :meth:`.incremental.Encoded.
   block_hashes`): the blocks a prompt shares with the cached encoding it was spliced from keep
   that encoding's hashes, so only the new blocks are hashed.

A completions prompt is tokenised by vLLM *with* special tokens (``add_special_tokens=True``, a
Llama-style tokenizer prepends BOS), a rendered chat prompt without (the template writes them):
``text(..., add_special_tokens=True)`` puts the tokenizer's :meth:`.tokenize.HFTokenizer.
special_tokens` around the plain encoding, and hashes that prompt's blocks whole (the ids are
shifted against the cached encoding's blocks, so its hashes do not carry over).

The hash chain is the project's (``hash((parent, hash(block)))``, the equality relation vLLM's
has); vLLM's own function (sha256 of the CBOR-encoded parent, tokens and extra keys) is a
different function of the same blocks — pass ``hasher`` to use another chain.

Imports: this module pulls in only :mod:`.blocks` and :mod:`.tokenize`; Jinja is imported when
a renderer is first needed, the ``tokenizers`` library when a tokenizer file is loaded
(:meth:`PromptKeys.from_files`). Not thread-safe (the encoder's cache): one per event loop.

Cost per request: the render (linear in the prompt; native ChatML is a join), the encode of
the new text (see :mod:`.incremental`) and the hashes of the new blocks; a prompt repeated
exactly is one digest and a dict lookup after the render.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from templates_audit.blocks import block_hashes
from templates_audit.tokenize import EncodeError, Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from templates_audit.render import ChatRenderer

__all__ = ["BlockKeys", "PromptKeys"]

Hasher = Callable[..., list[int]]


class BlockKeys(NamedTuple):
    """A prompt's token ids (read-only: may be shared with the tokenizer's cache) and the
    chained hashes of its full blocks."""

    ids: Sequence[int]
    hashes: list[int]


class PromptKeys:
    """Requests -> :class:`BlockKeys` (see the module docstring). ``renderer``: the model's chat
    template (default: the built-in ChatML); ``hasher(ids, block_size, salt=..., parent=...)``:
    the block hash chain (default :func:`.blocks.block_hashes`)."""

    def __init__(self, tokenizer: Tokenizer, renderer: ChatRenderer | None = None, *,
                 block_size: int = 16, hasher: Hasher | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.tokenizer = tokenizer
        self._renderer = renderer
        self.block_size = block_size
        self._hasher = hasher
        self._encoded = getattr(tokenizer, "encoded", None) if hasher is None else None

    @classmethod
    def from_files(cls, tokenizer: str | None, chat_template: str | None = None,
                   **kwargs: Any) -> PromptKeys:
        """Keys from a ``tokenizer.json`` (or its directory; None: the default tokenizer) and a
        chat template file (default: the one in the tokenizer's ``tokenizer_config.json``,
        else ChatML); raises ``TokenizerError`` / ``TemplateError``."""
        from templates_audit.render import ChatRenderer

        tok = load_tokenizer(tokenizer)
        if chat_template is not None:
            renderer = ChatRenderer.from_file(chat_template)
        else:
            bundled = getattr(tok, "chat_template", lambda: None)()
            renderer = ChatRenderer(bundled) if bundled else ChatRenderer()
        return cls(tok, renderer, **kwargs)

    @property
    def renderer(self) -> ChatRenderer:
        if self._renderer is None:
            from templates_audit.render import ChatRenderer

            self._renderer = ChatRenderer()
        return self._renderer

    def chat(self, messages: Sequence[Mapping[str, Any]],
             tools: Sequence[Mapping[str, Any]] | None = None,
             template_vars: Mapping[str, Any] | None = None, *, salt: str | None = None,
             add_generation_prompt: bool = True, add_special_tokens: bool = False) -> BlockKeys:
        """The keys of a chat request (raises ``render.TemplateError`` when the template
        refuses it, ``tokenize.EncodeError`` for text the tokenizer cannot encode).
        ``template_vars``: extra template variables (a request's ``chat_template_kwargs``);
        ``add_special_tokens``: the request's (vLLM's chat default: False)."""
        text = self.renderer.render(messages, tools, add_generation_prompt,
                                    **(template_vars or {}))
        return self.text(text, salt=salt, add_special_tokens=add_special_tokens)

    def text(self, prompt: str, *, salt: str | None = None,
             add_special_tokens: bool = False) -> BlockKeys:
        """The keys of a prompt as text: a rendered chat, or a completions prompt (vLLM
        encodes those with ``add_special_tokens=True``, its default for completions). Raises
        ``tokenize.EncodeError`` when the tokenizer's special tokens cannot be reproduced."""
        if add_special_tokens:
            specials = getattr(self.tokenizer, "special_tokens", None)
            found = specials() if specials is not None else ((), ())
            if found is None:
                raise EncodeError("the tokenizer's post-processor does more than add special "
                                  "tokens around the text")
            before, after = found
            if before or after:
                plain = self._encoded(prompt).ids if self._encoded is not None else \
                    self.tokenizer.encode(prompt)
                return self.ids([*before, *plain, *after], salt=salt)
        bs = self.block_size
        if self._encoded is not None:
            enc = self._encoded(prompt)
            return BlockKeys(enc.ids, enc.block_hashes(bs, salt))
        return self.ids(self.tokenizer.encode(prompt), salt=salt)

    def ids(self, ids: Sequence[int], *, salt: str | None = None) -> BlockKeys:
        """The keys of a prompt given as token ids."""
        hasher = self._hasher or block_hashes
        return BlockKeys(ids, hasher(ids, self.block_size, salt=salt))
