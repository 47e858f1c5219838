"""Request -> routing key: the part of a request vLLM's prefix cache can reuse, hashed.

Algorithm (pure, no I/O):

1. ``X-Prefix-Hash`` header present -> its value is the key (source ``HEADER``); clients compute
   it with :func:`router.client.hash_key`, which runs exactly the derivation below.
2. Otherwise build the *canonical prefix* of the body: a header naming the API kind and the
   model, then the cacheable content:
   - chat: the tool definitions (JSON with sorted keys, compact separators) followed by the
     **leading** ``system``/``developer`` messages (string content, or the text parts of a
     content list up to the first non-text part, after which nothing is cacheable by text);
   - completions / embeddings: the leading window of ``prompt`` / ``input`` (a string; a list of
     token ids rendered as comma-separated ids; a list of strings or of id lists -> the first).
     There is no message boundary in a raw prompt, so only the first ``prompt_window_chars``
     (``// 4`` ids for token lists) are keyed: requests sharing that window share the key.
   The content is truncated to ``max_prefix_chars`` and then **cut at the first volatile token**
   (``templates_audit.detectors.first_volatile``: timestamps, dates, UUIDs, long ids, JWTs...),
   so everything after a volatile value - including later messages - is excluded. Token-id
   prompts are not scanned (ids are numbers, not text).
3. The key is ``xxh3_128`` (hex) of the canonical prefix, if its content part is at least
   ``min_prefix_chars`` long (source ``PREFIX``). Shorter -> conversation identity (source
   ``CONVERSATION``): ``X-Session-ID`` header, else body ``user``, else for chat the hash of the
   model and the first user message (turn N+1 resends turn N's history, so both map to the same
   conversation). Nothing usable -> source ``NONE``.

The conversation identity is filled in for every source, so the policy can keep one
conversation's spills on one replica.

Malformed bodies never raise: a missing or ill-typed field simply contributes nothing (a chat
body without ``messages`` yields ``NONE`` unless a session header or ``user`` is present). The
router forwards such requests and lets the replica answer with its own 400.

Cost: O(len(prefix)) string building plus one xxh3_128 pass (GB/s); the detector scan (regexes,
the expensive part) is memoised in a bounded LRU keyed by the 128-bit digest of the text, so a
repeated system prompt is scanned once.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import xxhash

from templates_audit.detectors import Match, first_volatile

if TYPE_CHECKING:
    from router.settings import RoutingSettings

__all__ = [
    "KeyConfig",
    "KeySource",
    "PrefixExplanation",
    "RoutingKey",
    "VolatileCut",
    "api_kind",
    "canonical_prefix",
    "derive",
    "explain",
    "key_config",
]

# Control characters separate fields so that no message text can forge a field boundary and
# no detector pattern spans two fields.
_FIELD = "\x1f"
_RECORD = "\x1e"
_HEADER_END = "\x1d"

_CHAT_ROLES = frozenset({"system", "developer"})
_STATE_ROLES = ("assistant", "tool")
_CUT_CACHE_SIZE = 4096
_KIND_CACHE_SIZE = 256  # request paths -> API kind (a few distinct paths in practice)
_UNKNOWN = object()
_kinds: dict[str, str | None] = {}


class KeySource(StrEnum):
    HEADER = "header"
    PREFIX = "prefix"
    CONVERSATION = "conversation"
    NONE = "none"


class RoutingKey(NamedTuple):  # per request: a third of a frozen dataclass's cost
    prefix: str | None
    conversation: str | None
    source: KeySource
    prefix_chars: int = 0
    # The conversation already has state worth following: an explicit identity (session
    # header, body ``user``) or a chat body that carries history (an assistant/tool turn).
    # Only such conversations get rendezvous (sticky) spill; a first turn without identity
    # spills in ring order, which keeps a hot prefix's overflow on the fewest replicas.
    sticky: bool = False
    # A chat body (``messages`` a list) without assistant or tool turns: a conversation's
    # first turn. Found by the same walk over the messages as ``sticky``'s history.
    first_turn: bool = False

    @property
    def ring_key(self) -> str | None:
        """The string placed on the hash ring: the prefix, else the conversation."""
        return self.prefix if self.prefix is not None else self.conversation


@dataclass(frozen=True)
class KeyConfig:
    min_prefix_chars: int = 64
    max_prefix_chars: int = 65536
    key_header: str = "x-prefix-hash"
    session_header: str = "x-session-id"
    prompt_window_chars: int = 1024

    def __post_init__(self) -> None:
        if self.min_prefix_chars < 0:
            raise ValueError(f"min_prefix_chars: expected >= 0, got {self.min_prefix_chars}")
        if self.max_prefix_chars < max(1, self.min_prefix_chars):
            raise ValueError(
                f"max_prefix_chars: expected >= min_prefix_chars, got {self.max_prefix_chars}"
            )
        if self.prompt_window_chars < 1:
            raise ValueError(f"prompt_window_chars: expected >= 1, got {self.prompt_window_chars}")
        # Header names are compared case-insensitively; store them lowercase once.
        object.__setattr__(self, "key_header", self.key_header.lower())
        object.__setattr__(self, "session_header", self.session_header.lower())


def key_config(r: RoutingSettings) -> KeyConfig:
    """The key settings of a validated ``routing:`` section (the app and ``hash-key`` share it)."""
    return KeyConfig(min_prefix_chars=r.min_prefix_chars, max_prefix_chars=r.max_prefix_chars,
                     key_header=r.key_header, session_header=r.session_header)


@dataclass(frozen=True)
class VolatileCut:
    """Where the cacheable content stops, as reported by the detectors."""

    offset: int
    kind: str
    value: str


@dataclass(frozen=True)
class PrefixExplanation:
    """The canonical prefix and how it was obtained (for ``hash-key --explain`` and tests)."""

    text: str  # the exact string that is hashed: header + content[:cut]
    header_chars: int  # length of the kind/model header at the start of ``text``
    content_chars: int  # cacheable content kept (compared with ``min_prefix_chars``)
    full_content_chars: int  # content length before truncation and cut
    cut: VolatileCut | None  # first volatile token, offset relative to the content
    truncated: bool  # content was longer than ``max_prefix_chars``


def derive(
    path: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    config: KeyConfig = KeyConfig(),
) -> RoutingKey:
    """The routing key of one request (see the module docstring for the rules).

    One walk over a chat body's messages (`_walk`) finds what the conversation identity, the
    history flags and the cacheable content need: the opener, whether a turn carries state,
    and how many leading system/developer messages there are."""
    wanted = _headers(headers, (config.key_header, config.session_header))
    session = wanted.get(config.session_header)
    kind = api_kind(path)
    mapping = _is_mapping(body)
    history: bool | None = None
    lead = 0
    conversation = session or None
    has_user = False
    if mapping:
        assert body is not None
        user = body.get("user")
        has_user = isinstance(user, str) and bool(user)
        messages = body.get("messages")
        opener = None
        if isinstance(messages, list):
            history, opener, lead = _walk(messages)
        if conversation is None:
            if has_user:
                conversation = user
            elif kind == "chat" and opener is not None:
                conversation = _opener_identity(body, opener, config)
    first = history is False
    sticky = conversation is not None and (bool(session) or bool(history) or has_user)
    override = wanted.get(config.key_header)
    if override:
        return RoutingKey(override, conversation, KeySource.HEADER, 0, sticky, first)
    if kind is not None and mapping:
        assert body is not None
        header, content, _, _, _ = _prefix_parts(kind, body, config, lead)
        if len(content) >= max(1, config.min_prefix_chars):
            text = header + content
            digest = xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))
            return RoutingKey(digest, conversation, KeySource.PREFIX, len(text), sticky, first)
    if conversation is not None:
        return RoutingKey(None, conversation, KeySource.CONVERSATION, 0, sticky, first)
    return RoutingKey(None, None, KeySource.NONE, 0, False, first)


def _walk(messages: list[Any]) -> tuple[bool, Mapping[str, Any] | None, int]:
    """(history, opener, lead) of a ``messages`` list in one pass: whether a message has an
    assistant or tool role (``sticky``, ``first_turn``), the first message with the user role
    (the derived conversation identity), and how many messages at the start have a
    system/developer role (the cacheable content, `_chat_content`). A non-mapping message
    ends the leading run and is otherwise skipped; the walk stops once history and opener are
    both found."""
    history = False
    opener = None
    lead = 0
    leading = True
    for m in messages:
        if type(m) is not dict and not isinstance(m, Mapping):
            leading = False
            continue
        role = m.get("role")
        if leading:
            if isinstance(role, str) and role in _CHAT_ROLES:  # a list is not hashable
                lead += 1
                continue
            leading = False
        if role == "user":
            if opener is None:
                opener = m
        elif role in _STATE_ROLES:
            history = True
        if history and opener is not None:
            break
    return history, opener, lead


def _leading(messages: list[Any]) -> int:
    """How many messages at the start have a system/developer role (`_walk`'s ``lead``)."""
    return _walk(messages)[2]


def _is_mapping(value: object) -> bool:
    """``isinstance(value, Mapping)``, with the decoded-JSON case (a dict) first: the ABC check
    costs several times a type test, and bodies are checked field by field."""
    return type(value) is dict or isinstance(value, Mapping)


def canonical_prefix(path: str, body: Mapping[str, Any], config: KeyConfig = KeyConfig()) -> str:
    """The exact text whose xxh3_128 is the prefix key ("" when the path has no prompt)."""
    ex = explain(path, body, config)
    return "" if ex is None else ex.text


def explain(
    path: str, body: Mapping[str, Any], config: KeyConfig = KeyConfig()
) -> PrefixExplanation | None:
    """Canonical prefix with its cut; ``None`` for paths that carry no prompt."""
    kind = api_kind(path)
    if kind is None or not isinstance(body, Mapping):
        return None
    header, content, full, truncated, cut = _prefix_parts(kind, body, config)
    return PrefixExplanation(
        text=header + content,
        header_chars=len(header),
        content_chars=len(content),
        full_content_chars=full,
        cut=cut,
        truncated=truncated,
    )


def _prefix_parts(
    kind: str, body: Mapping[str, Any], config: KeyConfig, lead: int | None = None
) -> tuple[str, str, int, bool, VolatileCut | None]:
    """(header, content kept, content length before truncation and cut, truncated, cut): the
    canonical prefix of a body of API ``kind`` is ``header + content`` (``lead``: the leading
    system messages, when the caller's `_walk` counted them)."""
    if kind == "chat":
        content, scan = _chat_content(body, lead), True
    else:
        content, scan = _prompt_content(
            body.get("prompt" if kind == "completions" else "input"), config
        )
    model = body.get("model")
    header = f"{kind}{_FIELD}{model if isinstance(model, str) else ''}{_HEADER_END}"
    full = len(content)
    truncated = full > config.max_prefix_chars
    if truncated:
        content = content[: config.max_prefix_chars]
    cut = _volatile_cut(content) if scan and content else None
    if cut is not None:
        content = content[: cut.offset]
    return header, content, full, truncated, cut


def api_kind(path: str) -> str | None:
    """``chat``, ``completions`` or ``embeddings`` by the path's last segments (query and a
    trailing slash ignored), else None; memoised per path (`router.chunks` shares it)."""
    kind = _kinds.get(path, _UNKNOWN)
    if kind is _UNKNOWN:
        kind = _kind_of(path)
        if len(_kinds) >= _KIND_CACHE_SIZE:
            _kinds.clear()
        _kinds[path] = kind
    return kind  # type: ignore[return-value]


def _kind_of(path: str) -> str | None:
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    if path.endswith("/embeddings"):
        return "embeddings"
    return None


def _headers(headers: Mapping[str, str], names: Sequence[str]) -> dict[str, str]:
    """Case-insensitive lookup of a few header names (``names`` are lowercase)."""
    found: dict[str, str] = {}
    for name in names:
        value = headers.get(name)
        if isinstance(value, str) and value.strip():
            found[name] = value.strip()
    if len(found) < len(names):
        for k, v in headers.items():
            lk = k.lower()
            if lk in names and lk not in found and isinstance(v, str) and v.strip():
                found[lk] = v.strip()
    return found


def _opener_identity(body: Mapping[str, Any], opener: Mapping[str, Any],
                     config: KeyConfig) -> str | None:
    """The conversation identity derived from a chat's first user message (`_walk`'s
    ``opener``): the hash of the model and the opener's identity text; None for an empty one."""
    text = _identity_text(opener.get("content"))[: config.max_prefix_chars]
    if not text:
        return None  # an empty opener would merge unrelated conversations into one
    model = body.get("model")
    seed = f"{model if isinstance(model, str) else ''}{_HEADER_END}{text}"
    return "c-" + xxhash.xxh3_128_hexdigest(seed.encode("utf-8", "surrogatepass"))


def _chat_content(body: Mapping[str, Any], lead: int | None = None) -> str:
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        try:
            dumped = json.dumps(tools, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            dumped = ""
        parts.append(f"tools{_FIELD}{dumped}{_RECORD}")
    messages = body.get("messages")
    if isinstance(messages, list):
        if lead is None:
            lead = _leading(messages)
        for i in range(lead):
            message = messages[i]
            text, complete = _text_parts(message.get("content"))
            parts.append(f"{message['role']}{_FIELD}{text}")
            if not complete:
                break
            parts.append(_RECORD)
    return "".join(parts)


def _text_parts(content: Any) -> tuple[str, bool]:
    """Text of a message's content; ``complete`` is False when a non-text part stopped it."""
    if isinstance(content, str):
        return content, True
    if not isinstance(content, list):
        return "", content is None
    texts: list[str] = []
    for part in content:
        if _is_mapping(part) and part.get("type") == "text":
            text = part.get("text")
            texts.append(text if isinstance(text, str) else "")
        else:
            return "\n".join(texts), False
    return "\n".join(texts), True


def _identity_text(content: Any) -> str:
    """A message's content as identity text: the string, else its canonical JSON (so an
    image-only opener still identifies its conversation)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    try:
        return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return ""


def _prompt_content(prompt: Any, config: KeyConfig) -> tuple[str, bool]:
    """(leading window, scan with detectors?) of a completions prompt / embeddings input."""
    id_window = max(1, config.prompt_window_chars // 4)
    if isinstance(prompt, list) and prompt and not _is_ids(prompt[:id_window]):
        prompt = prompt[0]  # a batch: key on its first prompt
    if isinstance(prompt, str):
        return prompt[: config.prompt_window_chars], True
    if isinstance(prompt, list) and _is_ids(prompt[:id_window]):
        return ",".join(str(i) for i in prompt[:id_window]), False
    return "", False


def _is_ids(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


# --- detector cut, memoised --------------------------------------------------------------------

_cut_cache: OrderedDict[bytes, VolatileCut | None] = OrderedDict()
_cut_lock = threading.Lock()
# Held in a module attribute so tests can count the (memoised) detector calls.
_first_volatile: Callable[[str], Match | None] = first_volatile


def _volatile_cut(content: str) -> VolatileCut | None:
    digest = xxhash.xxh3_128_digest(content.encode("utf-8", "surrogatepass"))
    with _cut_lock:
        if digest in _cut_cache:
            _cut_cache.move_to_end(digest)
            return _cut_cache[digest]
    match = _first_volatile(content)
    cut = None if match is None else VolatileCut(match.start, str(match.kind), match.value)
    with _cut_lock:
        _cut_cache[digest] = cut
        if len(_cut_cache) > _CUT_CACHE_SIZE:
            _cut_cache.popitem(last=False)
    return cut
