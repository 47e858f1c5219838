"""A request's exact block keys: what vLLM could serve from cache, or None when the router
cannot reproduce the prompt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.kv_events.index import lora_salt
from router.kv_events.request_keys import RequestKeys
from templates_audit.blocks import block_hashes
from templates_audit.prompt_keys import PromptKeys
from templates_audit.tokenize import load_tokenizer
from tests.templates_audit import tokenizer_families

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
    ("/v1/completions", {"prompt": "a b", "truncate_prompt_tokens": 1}),  # vLLM cuts the prompt
    ("/v1/embeddings", {"input": "x"}),
])
def test_requests_without_exact_keys(path: str, body: dict[str, Any]) -> None:
    assert RequestKeys(None, None).exact(path, body, None, 16) is None


# -- special tokens as vLLM 0.32.0 adds them (completions: add_special_tokens=True) --------------

TEXT = "Rule 7: the policy customer order refund shipping billing assistant. " * 12


def _model(tmp_path: Any, tokenizer_json: str, config: dict[str, Any] | None = None) -> str:
    (tmp_path / "tokenizer.json").write_text(tokenizer_json)
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(tmp_path / "tokenizer.json")


def _blocks(ids: list[int], n: int) -> tuple[int, ...]:
    return tuple(block_hashes(ids, 16)[:(n - 1) // 16])


def test_completion_on_a_bos_post_processor_prepends_bos_as_vllm(tmp_path: Any) -> None:
    from tokenizers import Tokenizer

    path = _model(tmp_path, tokenizer_families.llama3())  # post-processor: "<s> $A"
    lib = Tokenizer.from_file(path)
    with_bos = list(lib.encode(TEXT, add_special_tokens=True).ids)
    plain = list(lib.encode(TEXT, add_special_tokens=False).ids)
    assert with_bos == [lib.token_to_id("<s>"), *plain]
    keys = RequestKeys(path, None)
    got = keys.exact("/v1/completions", {"prompt": TEXT}, None, 16)
    assert got is not None and got.total == len(with_bos)
    assert got.hashes == _blocks(with_bos, len(with_bos))
    # the request can turn them off, as vLLM's CompletionRequest.add_special_tokens does
    off = keys.exact("/v1/completions", {"prompt": TEXT, "add_special_tokens": False}, None, 16)
    assert off is not None and off.hashes == _blocks(plain, len(plain))
    # token-id prompts are taken as given
    ids = keys.exact("/v1/completions", {"prompt": plain}, None, 16)
    assert ids is not None and ids.hashes == off.hashes
    # a chat prompt gets none unless the request asks (ChatCompletionRequest's default: False)
    chat = {"messages": [{"role": "user", "content": TEXT}]}
    rendered = keys.exact(CHAT, chat, None, 16)
    asked = keys.exact(CHAT, {**chat, "add_special_tokens": True}, None, 16)
    assert rendered is not None and asked is not None
    assert asked.total == rendered.total + 1 and asked.hashes[0] != rendered.hashes[0]
    assert keys.exact("/v1/completions", {"prompt": TEXT, "add_special_tokens": "yes"},
                      None, 16) is None


@pytest.mark.parametrize("config", [
    # transformers 5.19 (vLLM 0.32.0's loader) drops these flags when a tokenizer.json exists
    # and keeps its post-processor (checked against AutoTokenizer in the vLLM env): BOS stays
    {"add_bos_token": False, "bos_token": "<s>"},
    {"add_eos_token": False, "bos_token": "<s>"},
    {"bos_token": "<s>"},
])
def test_tokenizer_config_flags_do_not_override_the_post_processor(
        tmp_path: Any, config: dict[str, Any]) -> None:
    from tokenizers import Tokenizer

    path = _model(tmp_path, tokenizer_families.llama3(), config)
    lib = Tokenizer.from_file(path)
    want = list(lib.encode(TEXT, add_special_tokens=True).ids)
    assert want[0] == lib.token_to_id("<s>")
    got = RequestKeys(path, None).exact("/v1/completions", {"prompt": TEXT}, None, 16)
    assert got is not None and got.total == len(want)
    assert got.hashes == _blocks(want, len(want))


def test_no_post_processor_adds_nothing_even_with_add_bos_token(tmp_path: Any) -> None:
    from tokenizers import Tokenizer

    source = tokenizer_families.byte_level()  # no post-processor, markers <|im_start|> ...
    assert json.loads(source)["post_processor"] is None
    plain_path = _model(tmp_path, source)
    lib = Tokenizer.from_file(plain_path)
    plain = list(lib.encode(TEXT, add_special_tokens=False).ids)
    got = RequestKeys(plain_path, None).exact("/v1/completions", {"prompt": TEXT}, None, 16)
    assert got is not None and got.total == len(plain)
    bos_dir = tmp_path / "bos"
    bos_dir.mkdir()
    bos_path = _model(bos_dir, source, {"add_bos_token": True, "bos_token": "<|im_start|>"})
    got = RequestKeys(bos_path, None).exact("/v1/completions", {"prompt": TEXT}, None, 16)
    assert got is not None and got.hashes == _blocks(plain, len(plain))


def test_post_processor_around_the_text_bert(tmp_path: Any) -> None:
    from tokenizers import Tokenizer

    path = _model(tmp_path, tokenizer_families.wordpiece())  # [CLS] $A [SEP]
    want = list(Tokenizer.from_file(path).encode(TEXT, add_special_tokens=True).ids)
    got = RequestKeys(path, None).exact("/v1/completions", {"prompt": TEXT}, None, 16)
    assert got is not None and got.total == len(want)
    assert got.hashes == _blocks(want, len(want))
