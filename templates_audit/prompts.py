"""A record -> the prompt text vLLM would see, and where its static part ends.

The **static part** is what every request of a template should share: the rendered prompt up to
the start of the first conversational message (the first message that is not ``system`` or
``developer``; when all are, the last one). It holds the system/developer messages, the tools
and whatever the chat template injects around them. Everything after it — the user's turn,
history, the last message — is expected to vary and is never diffed (few-shot example turns
shuffled per request are found apart, by :mod:`.history`). A completions prompt is
static as a whole; its varying tail is excluded later (nothing static follows it).

Locating the boundary: the first conversational message's content is searched in the rendered
text after the static messages' contents; when the template transforms content so that it
cannot be found, the request is rendered once more with a sentinel in its place. ``roles`` are
the character ranges of the static messages' contents, for attributing a span to a role.

Cost: one template render per request (two in the rare sentinel case); O(len) searches.
:class:`PromptBuilder` removes the render for templates known to insert message content
verbatim (the built-in ChatML): it renders each message *structure* (roles, tool calls, tools)
once with sentinel contents and splices the real contents into that skeleton — byte-identical to
a render, checked against a real render the first time each skeleton is used.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from templates_audit.model import Role
from templates_audit.render import DEFAULT_CHAT_TEMPLATE, ChatRenderer
from templates_audit.traces import Record

__all__ = ["STATIC_ROLES", "Prompt", "PromptBuilder", "prepare", "static_index"]

STATIC_ROLES = frozenset({"system", "developer"})
_SENTINEL = "\ue000\ue001prefix-audit\ue001\ue000"


@dataclass(frozen=True, init=False)
class Prompt:
    text: str
    static_end: int
    roles: tuple[tuple[int, int, Role], ...] = ()
    tools_json: str = ""
    is_chat: bool = True

    def __init__(self, text: str, static_end: int, roles: tuple[tuple[int, int, Role], ...] = (),
                 tools_json: str = "", is_chat: bool = True) -> None:
        # Built per request: all fields at once instead of one object.__setattr__ each.
        self.__dict__.update(text=text, static_end=static_end, roles=roles,
                             tools_json=tools_json, is_chat=is_chat)

    @property
    def static_text(self) -> str:
        return self.text[: self.static_end]


def static_index(messages: list[dict[str, Any]]) -> int:
    """Index of the first conversational message (the last message when all are static)."""
    for i, m in enumerate(messages):
        if m.get("role") not in STATIC_ROLES:
            return i
    return len(messages) - 1


def _role(message: dict[str, Any]) -> Role:
    return Role.DEVELOPER if message.get("role") == "developer" else Role.SYSTEM


def _tools_json(record: Record) -> str:
    return json.dumps(record.tools, ensure_ascii=False) if record.tools else ""


def prepare(record: Record, renderer: ChatRenderer) -> Prompt:
    """Render ``record`` and locate its static part (raises ``render.TemplateError``)."""
    if record.messages is None:
        prompt = record.prompt or ""
        return Prompt(prompt, len(prompt), ((0, len(prompt), Role.PROMPT),), is_chat=False)
    messages = record.messages
    text = renderer.render(messages, tools=record.tools)
    k = static_index(messages)
    roles: list[tuple[int, int, Role]] = []
    cursor = 0
    for m in messages[:k]:
        content = str(m.get("content") or "")
        if not content:
            continue
        pos = text.find(content, cursor)
        if pos < 0:
            content = content.strip()
            pos = text.find(content, cursor) if content else -1
        if pos >= 0:
            roles.append((pos, pos + len(content), _role(m)))
            cursor = pos + len(content)
    target = str(messages[k].get("content") or "")
    end = text.find(target, cursor) if target.strip() else -1
    if end < 0 or not target.strip():
        probe = [dict(m) for m in messages]
        probe[k]["content"] = _SENTINEL
        rendered = renderer.render(probe, tools=record.tools)
        end = rendered.find(_SENTINEL)
        if end < 0 or rendered[:end] != text[:end]:
            end = cursor
    return Prompt(text, end, tuple(roles), _tools_json(record))


# Templates that splice message content in verbatim, so a skeleton render is exact.
_VERBATIM_TEMPLATES = frozenset({DEFAULT_CHAT_TEMPLATE})
_MAX_SKELETONS = 1024


def _slot(i: int) -> str:
    return f"\ue000{i}\ue001"


def _structure_key(msgs: list[dict[str, Any]], tools: Any) -> str:
    """Everything about a request but its message contents (roles, tool calls, tools)."""
    if not tools and all(len(m) == 2 for m in msgs):  # only role + content: the common case
        return "\x00".join(str(m.get("role")) for m in msgs)
    return json.dumps([[{k: v for k, v in m.items() if k != "content"} for m in msgs], tools],
                      sort_keys=True, default=str)


class PromptBuilder:
    """``prepare`` with per-structure skeletons for verbatim templates (see the module docstring)."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.enabled = renderer.source in _VERBATIM_TEMPLATES
        # structure key -> (literal parts, slot order) or None when the skeleton is unusable
        self._skeletons: OrderedDict[str, tuple[list[str], list[int]] | None] = OrderedDict()

    def build(self, record: Record) -> Prompt:
        msgs = record.messages
        if not self.enabled or msgs is None:
            return prepare(record, self.renderer)
        key = _structure_key(msgs, record.tools)
        if key in self._skeletons:
            skel = self._skeletons[key]
            if skel is None:
                return prepare(record, self.renderer)
            return self._splice(skel, record)
        skel = self._skeleton(msgs, record)
        if skel is not None:
            # Trust the skeleton only if it reproduces a real render of this request.
            fast, slow = self._splice(skel, record), prepare(record, self.renderer)
            if fast != slow:
                skel = None
            self._remember(key, skel)
            return slow
        self._remember(key, None)
        return prepare(record, self.renderer)

    def _remember(self, key: str, skel: tuple[list[str], list[int]] | None) -> None:
        self._skeletons[key] = skel
        if len(self._skeletons) > _MAX_SKELETONS:
            self._skeletons.popitem(last=False)

    def _skeleton(self, msgs: list[dict[str, Any]], record: Record
                  ) -> tuple[list[str], list[int]] | None:
        probe = [{**m, "content": _slot(i)} for i, m in enumerate(msgs)]
        text = self.renderer.render(probe, tools=record.tools)
        parts: list[str] = []
        order: list[int] = []
        pos = 0
        while True:
            start = text.find("\ue000", pos)
            if start < 0:
                break
            end = text.find("\ue001", start)
            if end < 0:
                return None
            parts.append(text[pos:start])
            order.append(int(text[start + 1:end]))
            pos = end + 1
        parts.append(text[pos:])
        if sorted(order) != list(range(len(msgs))):
            return None  # a content dropped or repeated: not a plain splice
        return parts, order

    def _splice(self, skel: tuple[list[str], list[int]], record: Record) -> Prompt:
        parts, order = skel
        msgs = record.messages or []
        k = static_index(msgs)
        out: list[str] = []
        roles: list[tuple[int, int, Role]] = []
        pos = 0
        static_end = -1
        for lit, i in zip(parts, order, strict=False):
            out.append(lit)
            pos += len(lit)
            content = str(msgs[i].get("content") or "")
            if i < k and content:
                roles.append((pos, pos + len(content), _role(msgs[i])))
            if i == k:
                static_end = pos
            out.append(content)
            pos += len(content)
        out.append(parts[-1])
        return Prompt("".join(out), static_end, tuple(roles), _tools_json(record))
