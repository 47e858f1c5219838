"""Prompt preparation: rendering + tokenising + hashing, memoised per body within a budget."""

from __future__ import annotations

from loadtest.replica.openai_api import parse_chat, parse_completion
from loadtest.replica.prompts import Prompter
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
