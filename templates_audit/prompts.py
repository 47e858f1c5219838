"""A record -> the prompt text vLLM would see, and where its static part ends.

The **static part** is what every request of a template should share: the rendered prompt up to
the start of the first conversational message (the first message that is not ``system`` or
``developer``; when all are, the last one). It holds the system/developer messages, the tools
and whatever the chat template injects around them. Everything after it — the user's turn,
history, the last message — is expected to vary and is never a finding. A completions prompt is
static as a whole; its varying tail is excluded later (nothing static follows it).

Locating the boundary: the first conversational message's content is searched in the rendered
text after the static messages' contents; when the template transforms content so that it
cannot be found, the request is rendered once more with a sentinel in its place. ``roles`` are
the character ranges of the static messages' contents, for attributing a span to a role.

Cost: one template render per request (two in the rare sentinel case); O(len) searches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from templates_audit.model import Role
from templates_audit.render import ChatRenderer
from templates_audit.traces import Record

__all__ = ["STATIC_ROLES", "Prompt", "prepare"]

STATIC_ROLES = frozenset({"system", "developer"})
_SENTINEL = "\ue000\ue001prefix-audit\ue001\ue000"


@dataclass(frozen=True)
class Prompt:
    text: str
    static_end: int
    roles: tuple[tuple[int, int, Role], ...] = ()
    tools_json: str = ""
    is_chat: bool = True

    @property
    def static_text(self) -> str:
        return self.text[: self.static_end]


def prepare(record: Record, renderer: ChatRenderer) -> Prompt:
    """Render ``record`` and locate its static part (raises ``render.TemplateError``)."""
    if record.messages is None:
        prompt = record.prompt or ""
        return Prompt(prompt, len(prompt), ((0, len(prompt), Role.PROMPT),), is_chat=False)
    messages = record.messages
    text = renderer.render(messages, tools=record.tools)
    k = next((i for i, m in enumerate(messages) if m.get("role") not in STATIC_ROLES),
             len(messages) - 1)
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
            role = Role.DEVELOPER if m.get("role") == "developer" else Role.SYSTEM
            roles.append((pos, pos + len(content), role))
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
    tools_json = json.dumps(record.tools, ensure_ascii=False) if record.tools else ""
    return Prompt(text, end, tuple(roles), tools_json)
