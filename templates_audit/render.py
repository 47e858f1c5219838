"""Chat templates rendered the way transformers (and therefore vLLM) renders them.

vLLM turns a chat request into a prompt with the model's Jinja chat template, compiled like
``transformers``' ``apply_chat_template``: a sandboxed environment with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block tag, a ``tojson``
filter that keeps non-ASCII characters, and the globals ``raise_exception`` and ``strftime_now``.
``strftime_now`` matters for prefix caching: templates such as Llama 3.1's write
``Today Date: 26 Jul 2024`` into every system prompt, so the date changes the prefix once a day even
when the messages never change. ``clock`` can be injected so the auditor can render the same request
at two dates and see whether the template itself injects a volatile value.

Message content given as a list of parts is flattened to its text parts joined by newlines, as vLLM
does for templates that expect string content.

The built-in default template is also rendered natively (`ChatRenderer.render_pieces`): for
the requests it covers — no tools, no extra template variables, string contents, no tool calls —
its output is, by construction of the template, one independent piece per message (each ending in
a newline) plus the generation prompt, and the pieces joined are exactly what Jinja renders (tested
against Jinja over many random message lists). Anything else, and every custom template, goes
through Jinja. The pieces let the simulated replica reuse the token ids of a repeated leading
message (a shared system prompt) instead of rendering and tokenising it again.

Cost: compiling a template once (cached per source); rendering is linear in the output.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["DEFAULT_CHAT_TEMPLATE", "GENERATION_PROMPT", "ChatRenderer", "TemplateError",
           "flatten_content"]


class TemplateError(ValueError):
    """A chat template failed to compile or render."""


# ChatML as used by Qwen2.5: tools are listed in the system turn, tool calls/results as tags.
DEFAULT_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- if message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' + "
    "(fn.arguments if fn.arguments is string else (fn.arguments | tojson)) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


_IM_START = "<|im_start|>"
_IM_END_NL = "<|im_end|>\n"
_TOOL_OPEN = "<|im_start|>user\n<tool_response>\n"
_TOOL_CLOSE = "\n</tool_response><|im_end|>\n"
GENERATION_PROMPT = "<|im_start|>assistant\n"  # the default template's generation prompt


def _default_pieces(messages: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """DEFAULT_CHAT_TEMPLATE without tools, one piece per message; None when Jinja must decide.

    Mirrors the template branch by branch: a leading system message is written by the header
    (``'<|im_start|>system\n' + content + '<|im_end|>\n'``, the same shape as any other turn) and
    skipped by the loop; ``tool`` messages are wrapped in ``<tool_response>``; other roles are
    ``'<|im_start|>' + role + '\n' + (content or '') + '<|im_end|>\n'``. Only the cases where
    that holds trivially are taken: string roles, string contents (a missing or null content
    only where the template writes ``content or ''``), no truthy ``tool_calls``.
    """
    out: list[str] = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if type(role) is not str:
            return None
        content = m.get("content")
        if isinstance(content, list):
            content = flatten_content(content)
        if role == "tool":
            if type(content) is not str:
                return None
            out.append(_TOOL_OPEN + content + _TOOL_CLOSE)
            continue
        if type(content) is not str:
            if content is not None or (i == 0 and role == "system"):
                return None
            content = ""
        if m.get("tool_calls"):
            if not (i == 0 and role == "system"):  # the header ignores a system turn's calls
                return None
        out.append(_IM_START + role + "\n" + content + _IM_END_NL)
    return out


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): render the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@functools.lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template does not compile: {exc}") from exc


def flatten_content(content: Any) -> Any:
    """A list of content parts -> its text parts joined by newlines (vLLM's 'string' format)."""
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping):
                if part.get("type") in (None, "text", "input_text") and isinstance(part.get("text"), str):
                    texts.append(part["text"])
        return "\n".join(texts)
    return content


def _normalise(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        d = dict(m)
        if "content" in d:
            d["content"] = flatten_content(d["content"])
        out.append(d)
    return out


class ChatRenderer:
    """Render chat messages to the prompt text vLLM would tokenise."""

    def __init__(
        self,
        template: str | None = None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        clock: Callable[[], _dt.datetime] | None = None,
    ) -> None:
        self.source = template if template is not None else DEFAULT_CHAT_TEMPLATE
        self.template = _compile(self.source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.clock = clock or _dt.datetime.now
        self.name = "chatml" if template is None else "custom"
        self.native = self.source == DEFAULT_CHAT_TEMPLATE

    @classmethod
    def from_file(cls, path: str, **kwargs: Any) -> ChatRenderer:
        try:
            with open(path, encoding="utf-8") as fh:
                source = fh.read()
        except OSError as exc:
            raise TemplateError(f"cannot read chat template {path!r}: {exc}") from exc
        if path.endswith(".json"):  # a tokenizer_config.json
            try:
                data = json.loads(source)
            except ValueError as exc:
                raise TemplateError(f"{path}: not valid JSON: {exc}") from exc
            tmpl = data.get("chat_template")
            if not isinstance(tmpl, str):
                raise TemplateError(f"{path}: no string 'chat_template' key")
            kwargs.setdefault("bos_token", _token_str(data.get("bos_token")))
            kwargs.setdefault("eos_token", _token_str(data.get("eos_token")))
            source = tmpl
        r = cls(source, **kwargs)
        r.name = path
        return r

    def with_clock(self, clock: Callable[[], _dt.datetime]) -> ChatRenderer:
        return ChatRenderer(self.source, bos_token=self.bos_token, eos_token=self.eos_token, clock=clock)

    def render_pieces(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> list[str] | None:
        """The rendering as one piece per message, then the generation prompt (if asked for).

        Only for the built-in default template, no tools and no extra variables, on messages it
        renders independently (see `_default_pieces`); None otherwise (use `render`). Every
        piece ends with a newline. ``"".join(pieces) == render(...)``.
        """
        if not self.native or tools or extra:
            return None
        pieces = _default_pieces(messages)
        if pieces is not None and add_generation_prompt:
            pieces.append(GENERATION_PROMPT)
        return pieces

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        pieces = self.render_pieces(messages, tools, add_generation_prompt, **extra)
        if pieces is not None:
            return "".join(pieces)
        return self.render_jinja(messages, tools, add_generation_prompt, **extra)

    def render_jinja(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """`render` through the compiled Jinja template, always (the reference output)."""
        clock = self.clock

        def strftime_now(fmt: str) -> str:
            return clock().strftime(fmt)

        try:
            return self.template.render(
                messages=_normalise(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                strftime_now=strftime_now,
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise TemplateError(f"chat template failed on this request: {exc}") from exc


def _token_str(tok: Any) -> str:
    if isinstance(tok, str):
        return tok
    if isinstance(tok, Mapping) and isinstance(tok.get("content"), str):
        return str(tok["content"])
    return ""
