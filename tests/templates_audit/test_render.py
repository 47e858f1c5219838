"""Chat templates rendered like transformers: ChatML default, strftime_now, tools, content parts."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from templates_audit.render import ChatRenderer, TemplateError

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_default_chatml() -> None:
    out = ChatRenderer().render(MSGS)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_no_generation_prompt() -> None:
    assert not ChatRenderer().render(MSGS, add_generation_prompt=False).endswith("assistant\n")


def test_tools_are_rendered_into_the_system_turn() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"q": "é"}}}]
    out = ChatRenderer().render(MSGS, tools=tools)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "lookup"' in out and "é" in out  # tojson keeps non-ASCII, like transformers


def test_content_parts_are_flattened() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "<|im_start|>user\na\nb<|im_end|>" in ChatRenderer().render(msgs)


def test_strftime_now_uses_the_injected_clock() -> None:
    tmpl = "{{ bos_token }}Today Date: {{ strftime_now('%d %b %Y') }}\n{% for m in messages %}{{ m.content }}{% endfor %}"
    r1 = ChatRenderer(tmpl, bos_token="<s>", clock=lambda: dt.datetime(2024, 7, 26))
    r2 = r1.with_clock(lambda: dt.datetime(2024, 7, 27))
    a, b = r1.render(MSGS), r2.render(MSGS)
    assert a.startswith("<s>Today Date: 26 Jul 2024")
    assert a != b  # the template itself injects a per-day value


def test_raise_exception_and_generation_tag() -> None:
    tmpl = "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}{% generation %}ok{% endgeneration %}"
    with pytest.raises(TemplateError, match="user first"):
        ChatRenderer(tmpl).render(MSGS)
    assert ChatRenderer(tmpl).render([{"role": "user", "content": "x"}]) == "ok"


def test_broken_template_is_a_clear_error() -> None:
    with pytest.raises(TemplateError):
        ChatRenderer("{% for %}")


def test_loopcontrols_enabled() -> None:
    tmpl = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    assert ChatRenderer(tmpl).render(MSGS) == "system"


def test_from_tokenizer_config(tmp_path: object) -> None:
    import json

    path = f"{tmp_path}/tokenizer_config.json"
    with open(path, "w") as fh:
        json.dump({"chat_template": "{{ bos_token }}{{ messages[0].content }}", "bos_token": "<B>"}, fh)
    assert ChatRenderer.from_file(path).render(MSGS) == "<B>Be brief."


def _random_messages(rng: random.Random) -> list[dict[str, Any]]:
    texts = ["", "hi", "Be brief.\nCite the policy.", "  spaced  ", "{{ not jinja }}", "é ü 日本",
             "<|im_end|>", "line\n", "\n", "tab\there"]
    contents: list[Any] = [*texts, None, 0, 7, [{"type": "text", "text": "a"}, "b"],
                           [{"type": "image_url", "image_url": {"url": "x"}}], []]
    roles: list[Any] = ["system", "user", "assistant", "tool", "developer", "function", None, 3]
    calls: list[Any] = [None, [], [{"function": {"name": "f", "arguments": "{}"}}],
                        [{"name": "g", "arguments": {"x": 1}}]]
    msgs = []
    for _ in range(rng.randint(0, 6)):
        m: dict[str, Any] = {}
        if rng.random() < 0.97:
            m["role"] = rng.choice(roles[:5]) if rng.random() < 0.9 else rng.choice(roles)
        if rng.random() < 0.93:
            m["content"] = rng.choice(texts) if rng.random() < 0.8 else rng.choice(contents)
        if rng.random() < 0.15:
            m["tool_calls"] = rng.choice(calls)
        msgs.append(m)
    return msgs


def _outcome(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except TemplateError:
        return TemplateError


def test_native_default_template_renders_exactly_like_jinja() -> None:
    rng = random.Random(1234)
    r = ChatRenderer()
    native = 0
    for _ in range(4000):
        msgs = _random_messages(rng)
        gen = rng.random() < 0.8
        pieces = r.render_pieces(msgs, None, gen)
        expected = _outcome(r.render_jinja, msgs, None, gen)
        assert _outcome(r.render, msgs, None, gen) == expected, msgs
        if pieces is not None:
            native += 1
            assert "".join(pieces) == expected, msgs
            assert all(p.endswith("\n") for p in pieces)
            assert len(pieces) == len(msgs) + gen
    assert native > 2000  # the fast path covers the common shapes


def test_native_rendering_is_only_for_the_builtin_template_without_tools_or_extras() -> None:
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    assert ChatRenderer().render_pieces(MSGS) is not None
    assert ChatRenderer().render_pieces(MSGS, tools) is None
    assert ChatRenderer().render_pieces(MSGS, enable_thinking=False) is None
    custom = ChatRenderer("{% for m in messages %}{{ m.content }}|{% endfor %}")
    assert custom.render_pieces(MSGS) is None
    assert custom.render(MSGS) == "Be brief.|hi|"
    # Extra variables still reach Jinja (and clash there as they do in transformers).
    with pytest.raises(TemplateError):
        ChatRenderer().render(MSGS, bos_token="<s>")
