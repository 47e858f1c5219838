"""A request's exact block keys: what vLLM could serve from cache, or None when the router
cannot reproduce the prompt."""

from __future__ import annotations

from typing import Any

import pytest

from router.kv_events.index import lora_salt
from router.kv_events.request_keys import RequestKeys
from templates_audit.prompt_keys import PromptKeys
from templates_audit.tokenize import load_tokenizer

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "You are terse. " * 20},
            {"role": "user", "content": "What is a KV cache? " * 5}]


def test_chat_keys_are_the_prompt_keys_of_the_rendered_prompt_minus_the_last_token() -> None:
    keys = RequestKeys(None, None)
    got = keys.exact(CHAT, {"messages": MESSAGES}, None, 16)
    assert got is not None
    ref = PromptKeys(load_tokenizer(None), block_size=16).chat(MESSAGES)
    usable = (len(ref.ids) - 1) // 16
    assert got.total == len(ref.ids)
    assert got.hashes == tuple(ref.hashes[:usable])
    assert got.tokens == tuple(16 * (i + 1) for i in range(usable))
    lora = keys.exact(CHAT, {"messages": MESSAGES}, "ad", 16)
    assert lora is not None and lora.hashes[0] != got.hashes[0]
    assert lora.hashes == tuple(PromptKeys(load_tokenizer(None), block_size=16).chat(
        MESSAGES, salt=lora_salt("ad")).hashes[:usable])


def test_completion_text_and_token_ids() -> None:
    keys = RequestKeys(None, None)
    ids = list(range(100, 140))
    got = keys.exact("/v1/completions", {"prompt": ids}, None, 16)
    assert got is not None and got.total == 40 and len(got.hashes) == 2
    assert keys.exact("/v1/completions", {"prompt": [ids]}, None, 16) == got
    text = keys.exact("/v1/completions", {"prompt": "hello world " * 30}, None, 16)
    assert text is not None and text.hashes


@pytest.mark.parametrize(("path", "body"), [
    # one case per request whose prompt the router does not reproduce exactly
    (CHAT, {"messages": MESSAGES, "cache_salt": "tenant-a"}),  # salted first block
    (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}),  # placeholder tokens
    (CHAT, {"messages": MESSAGES, "continue_final_message": True}),
    (CHAT, {"messages": "not a list"}),
    ("/v1/completions", {"prompt": ["a", "b"]}),  # two prompts
    ("/v1/embeddings", {"input": "x"}),
])
def test_requests_without_exact_keys(path: str, body: dict[str, Any]) -> None:
    assert RequestKeys(None, None).exact(path, body, None, 16) is None
