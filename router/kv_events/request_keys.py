"""A request's exact block keys, as the replica's vLLM will hash its prompt. Pure but stateful
(the tokenizer's reuse cache); one instance per event loop.

`RequestKeys.exact(path, body, adapter, block_size)` renders a chat request with the model's
chat template and tokenises it exactly as vLLM does (special tokens as vLLM 0.32.0 adds them:
a chat prompt with none unless the request sets ``add_special_tokens``, a completions prompt
with the tokenizer's BOS/EOS unless it sets ``add_special_tokens: false``; token-id prompts as
given), through
`templates_audit.prompt_keys.PromptKeys` (the same renderer, tokenizer and block math the
simulated replica uses; ``routing.tokenizer`` / ``routing.chat_template`` name the model's
files), and returns the keys of the blocks vLLM could serve from its cache: the first
``(prompt tokens - 1) // block_size`` full blocks - vLLM computes at least the prompt's last
token, so a hit never covers it. The first block is seeded with the LoRA adapter's name
(`router.kv_events.index.lora_salt`), so keys match those the index chains over the replicas'
``BlockStored`` token ids.

Requests whose prompt the router cannot reproduce exactly get ``None`` (the caller then uses
the approximate index for them): a ``cache_salt`` (vLLM folds it into the first block's hash,
which the events do not carry), content parts other than text (images and audio add
placeholder tokens and their own hashes), ``continue_final_message``, several prompts in one
completions request, ``truncate_prompt_tokens``, a non-boolean ``add_special_tokens``, and any
render or encode error (a tokenizer whose post-processor does more than add tokens around the
text among them).

Cost: the render (linear in the prompt), the encode of the text that differs from a recently
seen prompt (`templates_audit.incremental`, for a Hugging Face tokenizer; the default tokenizer
encodes the whole prompt) and a chained hash per new block; PromptKeys per block size is made
once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.chunks import Chunks
from router.kv_events.index import lora_salt
from templates_audit.prompt_keys import PromptKeys

__all__ = ["RequestKeys"]

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"


class RequestKeys:
    def __init__(self, tokenizer: str | None, chat_template: str | None) -> None:
        self._tokenizer_path = tokenizer
        self._template_path = chat_template
        self._keys: dict[int, PromptKeys] = {}
        self._base: PromptKeys | None = None

    def load(self) -> None:
        """Load the tokenizer and template now (start-up), so that a bad file fails there;
        raises ``TokenizerError`` / ``TemplateError``."""
        if self._base is None:
            self._base = PromptKeys.from_files(self._tokenizer_path, self._template_path)

    def source(self) -> tuple[str, str]:
        """(what tokenises, warning): `templates_audit.tokenize.HFTokenizer`'s ``source`` and
        ``fidelity`` ("default tokenizer", "" for the built-in one)."""
        self.load()
        assert self._base is not None
        tok = self._base.tokenizer
        return (getattr(tok, "source", "default tokenizer"), getattr(tok, "fidelity", ""))

    def _for(self, block_size: int) -> PromptKeys:
        keys = self._keys.get(block_size)
        if keys is None:
            self.load()
            base = self._base
            assert base is not None
            keys = self._keys[block_size] = PromptKeys(base.tokenizer, base.renderer,
                                                       block_size=block_size)
        return keys

    def exact(self, path: str, body: Mapping[str, Any] | None, adapter: str | None,
              block_size: int) -> Chunks | None:
        """The request's cacheable block keys as `Chunks` (tokens: the end of each block; total:
        the prompt's tokens), or None when its prompt cannot be reproduced exactly."""
        if body is None or block_size <= 0 or body.get("cache_salt") is not None \
                or body.get("truncate_prompt_tokens") is not None:
            return None
        keys = self._for(block_size)
        salt = lora_salt(adapter)
        try:
            if path == _CHAT:
                found = self._chat(keys, body, salt)
            elif path == _COMPLETIONS:
                found = self._completion(keys, body, salt)
            else:
                return None
        except Exception:  # a template or tokenizer refusing the request: no exact keys
            return None
        if found is None:
            return None
        ids, hashes = found
        n = len(ids)
        usable = max(0, (n - 1) // block_size)
        return Chunks(tuple(hashes[:usable]),
                      tuple(range(block_size, (usable + 1) * block_size, block_size)), n)

    @staticmethod
    def _chat(keys: PromptKeys, body: Mapping[str, Any],
              salt: str | None) -> tuple[Any, list[int]] | None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or body.get("continue_final_message"):
            return None
        for m in messages:
            if not isinstance(m, Mapping):
                return None
            content = m.get("content")
            if isinstance(content, list) and not all(
                    isinstance(p, Mapping) and p.get("type") == "text" for p in content):
                return None
        tools = body.get("tools")
        template_vars = body.get("chat_template_kwargs")
        add = body.get("add_generation_prompt", True)
        specials = body.get("add_special_tokens", False)
        if type(specials) is not bool:
            return None
        found = keys.chat(messages, tools if isinstance(tools, list) and tools else None,
                          template_vars if isinstance(template_vars, Mapping) else None,
                          salt=salt, add_generation_prompt=add is not False,
                          add_special_tokens=specials)
        return found.ids, found.hashes

    @staticmethod
    def _completion(keys: PromptKeys, body: Mapping[str, Any],
                    salt: str | None) -> tuple[Any, list[int]] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            specials = body.get("add_special_tokens", True)
            if type(specials) is not bool:
                return None
            found = keys.text(prompt, salt=salt, add_special_tokens=specials)
        elif isinstance(prompt, list) and prompt and all(
                type(t) is int for t in prompt):
            found = keys.ids(prompt, salt=salt)
        else:
            return None
        return found.ids, found.hashes
