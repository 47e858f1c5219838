"""Chat templates rendered like transformers: ChatML default, strftime_now, tools, content parts."""

from __future__ import annotations

import datetime as dt

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
