"""Prompt preparation: rendering + tokenising + hashing, memoised per body within a budget."""

from __future__ import annotations

import random
from typing import Any

from loadtest.replica.openai_api import parse_chat, parse_completion
from loadtest.replica.prompts import Prompter
from loadtest.replica.text import completion_pieces
from templates_audit.blocks import block_hashes
from templates_audit.render import ChatRenderer
from templates_audit.tokenize import default_tokenizer

TOK = default_tokenizer()


def test_chat_prompt_is_the_rendered_template_tokenised_and_hashed() -> None:
    p = Prompter(ChatRenderer(), TOK, 16)
    body = {"messages": [{"role": "system", "content": "Be brief. " * 20},
                         {"role": "user", "content": "hi"}]}
    prompt = p.prompt(parse_chat(body, 4), b"body-1")
    expected = TOK.encode(ChatRenderer().render(body["messages"]))
    assert list(prompt.ids) == expected
    assert list(prompt.hashes) == block_hashes(expected, 16)


def test_memo_returns_the_same_prompt_and_stays_within_its_token_budget() -> None:
    p = Prompter(ChatRenderer(), TOK, 16, memo_tokens=100)
    job = parse_completion({"prompt": list(range(60))}, 4)
    first = p.prompt(job, b"a")
    assert p.prompt(job, b"a") is first                  # memo hit
    p.prompt(parse_completion({"prompt": list(range(50))}, 4), b"b")   # 110 > 100: evicts "a"
    assert p.prompt(job, b"a") is not first and p.prompt(job, b"a") == first
    assert p.prompt(parse_completion({"prompt": list(range(500))}, 4), b"c").ids[-1] == 499


def test_templates_that_read_the_clock_are_never_memoised() -> None:
    p = Prompter(ChatRenderer("{{ strftime_now('%H:%M:%S.%f') }}{{ messages[0].content }}"), TOK, 16)
    job = parse_chat({"messages": [{"role": "user", "content": "x"}]}, 4)
    assert p.prompt(job, b"same") is not p.prompt(job, b"same")


def test_reply_ids_match_tokenising_the_whole_reply() -> None:
    p = Prompter(ChatRenderer(), TOK, 16)
    pieces = ["cache", " warm", " hit", " block"]
    assert p.reply_ids(pieces) == TOK.encode("".join(pieces))


def test_replies_are_the_seeded_text_and_its_ids() -> None:
    p = Prompter(ChatRenderer(), TOK, 16)
    for seed in range(20):
        for n in (1, 5, 16, 70):
            pieces, ids = p.reply(seed, n)
            assert pieces == completion_pieces(seed, n) and len(pieces) == n
            assert ids == TOK.encode("".join(pieces))


def test_a_prompt_carries_the_reply_of_its_max_tokens_memoised_with_its_body() -> None:
    p = Prompter(ChatRenderer(), TOK, 16)
    msgs = [{"role": "user", "content": "reset my password"}]
    for n in (1, 16, 70):
        body = f"body {n}".encode()
        prompt = p.prompt(parse_chat({"messages": msgs, "max_tokens": n}, 4), body)
        assert prompt.reply == p.reply(prompt.seed, n) and len(prompt.reply.pieces) == n
        again = p.prompt(parse_chat({"messages": msgs, "max_tokens": n}, 4), body)
        assert again is prompt   # the memo hit returns the reply with the prompt


def _whole(job_body: dict[str, Any]) -> tuple[list[int], list[int]]:
    ids = TOK.encode(ChatRenderer().render_jinja(job_body["messages"]))
    return ids, block_hashes(ids, 16)


def test_prompts_assembled_message_by_message_equal_the_whole_prompt() -> None:
    rng = random.Random(5)
    systems = ["You are a help desk. " * n + "\nCite sections.\n" for n in (1, 7, 30)]
    words = ["reset", "password", "\n", "<|im_end|>", "é", "42", "  ", "the", "block"]
    for memo_tokens in (1 << 21, 300, 0):   # room for everything, constant eviction, none
        p = Prompter(ChatRenderer(), TOK, 16, memo_tokens=memo_tokens)
        conversations: list[list[dict[str, Any]]] = []
        for i in range(400):
            if conversations and rng.random() < 0.5:   # the next turn of an earlier conversation
                msgs = rng.choice(conversations)
                msgs += [{"role": "assistant", "content": " ".join(rng.choices(words, k=9))},
                         {"role": "user", "content": " ".join(rng.choices(words, k=5))}]
            else:
                msgs = [{"role": "system", "content": rng.choice(systems)}] if rng.random() < 0.8 else []
                msgs.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(0, 30)))})
                conversations.append(msgs)
            body = {"messages": [dict(m) for m in msgs]}
            ids, hashes = _whole(body)
            prompt = p.prompt(parse_chat(body, 4), f"{memo_tokens}-{i}".encode())
            assert list(prompt.ids) == ids and list(prompt.hashes) == hashes
            assert p.ids(parse_chat(body, 4)) == ids


def test_custom_templates_tools_and_hf_shapes_take_the_whole_prompt_path() -> None:
    tmpl = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    body = {"messages": [{"role": "system", "content": "Be brief. " * 20},
                         {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    for renderer, data in ((ChatRenderer(tmpl), body), (ChatRenderer(), body)):
        p = Prompter(renderer, TOK, 16)
        prompt = p.prompt(parse_chat(data, 4), b"x")
        expected = TOK.encode(renderer.render_jinja(data["messages"], data["tools"]))
        assert list(prompt.ids) == expected
        assert list(prompt.hashes) == block_hashes(expected, 16)


def test_with_a_tokenizer_file_turns_are_spliced_exactly_and_reuse_block_hashes(
        tmp_path: Any) -> None:
    import pytest

    pytest.importorskip("tokenizers")
    from templates_audit.tokenize import HFTokenizer
    from tests.templates_audit.tokenizer_families import byte_level

    path = tmp_path / "tokenizer.json"
    path.write_text(byte_level(), encoding="utf-8")
    tok = HFTokenizer(str(path))
    full = HFTokenizer(str(path), incremental=False)
    p = Prompter(ChatRenderer(), tok, 16)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Rules: be brief. " * 60}]
    for turn in range(4):
        msgs.append({"role": "user", "content": f"question {turn}: what about {turn * 17}?"})
        prompt = p.prompt(parse_chat({"messages": msgs, "tools": [{"type": "function",
                          "function": {"name": "f", "parameters": {}}}]}, 4), f"b{turn}".encode())
        expected = full.encode(ChatRenderer().render(msgs, [{"type": "function", "function": {
            "name": "f", "parameters": {}}}]))
        assert list(prompt.ids) == expected
        assert list(prompt.hashes) == block_hashes(expected, 16)
        msgs.append({"role": "assistant", "content": f"answer {turn}"})
    assert tok.incremental is not None and tok.incremental.stats["spliced"] == 3


def test_special_tokens_as_vllm_adds_them_completions_yes_chat_on_request(tmp_path: Any) -> None:
    import pytest

    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer

    from templates_audit.tokenize import HFTokenizer
    from tests.templates_audit.tokenizer_families import llama3

    path = tmp_path / "tokenizer.json"
    path.write_text(llama3(), encoding="utf-8")  # post-processor "<s> $A"
    lib = Tokenizer.from_file(str(path))
    p = Prompter(ChatRenderer(), HFTokenizer(str(path)), 16)
    text = "Rules: be brief. " * 30
    cases = [  # (job, body digest, encoded with special tokens?)
        (parse_completion({"prompt": text}, 4), b"c", True),  # vLLM's completions default
        (parse_completion({"prompt": text, "add_special_tokens": False}, 4), b"c-off", False),
        (parse_chat({"messages": [{"role": "user", "content": text}]}, 4), b"chat", False),
        (parse_chat({"messages": [{"role": "user", "content": text}],
                     "add_special_tokens": True}, 4), b"chat-on", True),
    ]
    for job, digest, specials in cases:
        source = text if job.prompt_text is not None else ChatRenderer().render(job.messages)
        want = list(lib.encode(source, add_special_tokens=specials).ids)
        got = p.prompt(job, digest)
        assert list(got.ids) == want, digest
        assert list(got.hashes) == block_hashes(want, 16), digest
    assert lib.encode(text, add_special_tokens=True).ids[0] == lib.token_to_id("<s>")
