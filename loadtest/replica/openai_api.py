"""OpenAI request parsing and response shapes, as vLLM's OpenAI server emits them. Pure.

`parse_chat` / `parse_completion` validate a request body into a `Job` (what to tokenise and how
to answer); the `*_response` and `*_chunk` functions build the JSON objects. Errors are
`ApiError(status, message)` and render as vLLM's error object. A chat prompt is the chat
template's rendering of the messages; a completion prompt is the raw string (or token ids),
tokenised without a template.

The hot responses are also built directly as JSON text from fixed fragments (`encode_full`,
`StreamEncoder`): the same bytes as compact `json.dumps` of the dict shapes (tested), without
building the dicts or running the generic encoder for every chunk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from .text import REPLY_VOCABULARY

_str: Any = json.encoder.encode_basestring  # type: ignore[attr-defined]  # str -> JSON, non-ASCII kept
# JSON of every piece a reply can hold, for content_chunks (other pieces are encoded per call)
_PIECE_JSON: dict[str, str] = {p: _str(p) for p in REPLY_VOCABULARY}


class Kind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_

    def body(self) -> dict[str, Any]:
        return {"object": "error", "message": self.message, "type": self.type, "param": None,
                "code": self.status}


class ModelNotFound(ApiError):
    """A model name the replica does not serve: vLLM's 404, in its current error shape
    (``{"error": {message, type, param, code}}``, ``param`` = ``"model"``)."""

    def __init__(self, model: object, served: str) -> None:
        super().__init__(404, f"The model `{model}` does not exist. Valid aliases: {served}.",
                         "NotFoundError")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": "model",
                          "code": self.status}}


class Job(NamedTuple):
    kind: Kind
    max_tokens: int
    stream: bool
    include_usage: bool
    messages: tuple[Mapping[str, Any], ...] = ()
    tools: tuple[Mapping[str, Any], ...] | None = None
    template_kwargs: Mapping[str, Any] | None = None
    prompt_text: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    # as vLLM 0.32.0 tokenises a text prompt: chat without special tokens by default (the
    # template writes them), completions with them (a Llama-style tokenizer prepends BOS)
    add_special_tokens: bool = False


def _common(body: Any, default_max_tokens: int) -> tuple[int, bool, bool]:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options") or {}
    include_usage = bool(stream and isinstance(opts, dict) and opts.get("include_usage"))
    return max_tokens, stream, include_usage


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if type(value) is not bool:
        raise ApiError(400, f"{key} must be a boolean, got {value!r}")
    return value


def parse_chat(body: Any, default_max_tokens: int) -> Job:
    max_tokens, stream, include_usage = _common(body, default_max_tokens)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and "role" in m for m in messages):
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools must be a list")
    kwargs = body.get("chat_template_kwargs")
    return Job(Kind.CHAT, max_tokens, stream, include_usage, messages=tuple(messages),
               tools=tuple(tools) if tools else None,
               template_kwargs=kwargs if isinstance(kwargs, dict) else None,
               add_special_tokens=_flag(body, "add_special_tokens", False))


def parse_completion(body: Any, default_max_tokens: int) -> Job:
    max_tokens, stream, include_usage = _common(body, default_max_tokens)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return Job(Kind.COMPLETION, max_tokens, stream, include_usage, prompt_text=prompt,
                   add_special_tokens=_flag(body, "add_special_tokens", True))
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        return Job(Kind.COMPLETION, max_tokens, stream, include_usage, prompt_ids=tuple(prompt))
    raise ApiError(400, "prompt must be a string or a list of token ids (batches are not "
                        "supported by the simulator)")


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class Envelope(NamedTuple):
    """The fields every response and chunk of one request shares."""

    id: str
    created: int
    model: str
    fingerprint: str

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}


def full_response(kind: Kind, env: Envelope, text: str, finish_reason: str,
                  usage: dict[str, Any]) -> dict[str, Any]:
    if kind is Kind.CHAT:
        out = env.head("chat.completion")
        out["choices"] = [{"index": 0, "message": {"role": "assistant", "content": text,
                                                   "tool_calls": []},
                           "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}]
    else:
        out = env.head("text_completion")
        out["choices"] = [{"index": 0, "text": text, "logprobs": None,
                           "finish_reason": finish_reason, "stop_reason": None}]
    out["usage"] = usage
    return out


def chunk(kind: Kind, env: Envelope, text: str | None, finish_reason: str | None = None,
          *, role: bool = False) -> dict[str, Any]:
    """One stream chunk: `role` opens a chat stream, `finish_reason` closes the choice."""
    if kind is Kind.CHAT:
        out = env.head("chat.completion.chunk")
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
    else:
        out = env.head("text_completion")
        choice = {"index": 0, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
    out["choices"] = [choice]
    return out


def usage_chunk(kind: Kind, env: Envelope, usage: dict[str, Any]) -> dict[str, Any]:
    out = env.head("chat.completion.chunk" if kind is Kind.CHAT else "text_completion")
    out["choices"] = []
    out["usage"] = usage
    return out


def encode_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> str:
    """The JSON text of `usage_json`."""
    return (f'{{"prompt_tokens":{prompt_tokens},"total_tokens":{prompt_tokens + completion_tokens},'
            f'"completion_tokens":{completion_tokens},'
            f'"prompt_tokens_details":{{"cached_tokens":{cached_tokens}}}}}')


def _head(env: Envelope, obj: str) -> str:
    return (f'{{"id":{_str(env.id)},"object":"{obj}","created":{env.created:d},'
            f'"model":{_str(env.model)},"system_fingerprint":{_str(env.fingerprint)}')


def encode_full(kind: Kind, env: Envelope, text: str, finish_reason: str, usage: str,
                kv_transfer: Mapping[str, Any] | None = None) -> str:
    """The JSON text of `full_response` (``usage`` from `encode_usage``); ``kv_transfer``: the
    response's top-level ``kv_transfer_params`` (a disaggregated prefill, `kv_transfer`)."""
    tail = "}" if kv_transfer is None else ',"kv_transfer_params":' + json.dumps(kv_transfer) + "}"
    if kind is Kind.CHAT:
        return (_head(env, "chat.completion")
                + ',"choices":[{"index":0,"message":{"role":"assistant","content":' + _str(text)
                + ',"tool_calls":[]},"logprobs":null,"finish_reason":' + _str(finish_reason)
                + ',"stop_reason":null}],"usage":' + usage + tail)
    return (_head(env, "text_completion") + ',"choices":[{"index":0,"text":' + _str(text)
            + ',"logprobs":null,"finish_reason":' + _str(finish_reason)
            + ',"stop_reason":null}],"usage":' + usage + tail)


class StreamEncoder:
    """The JSON texts of one request's `chunk`s and `usage_chunk`: its head encoded once."""

    def __init__(self, kind: Kind, env: Envelope) -> None:
        self.kind = kind
        self._head = _head(env, "chat.completion.chunk" if kind is Kind.CHAT else "text_completion")
        if kind is Kind.CHAT:
            self._open = self._head + ',"choices":[{"index":0,"delta":{'
            self._close = '},"logprobs":null,"finish_reason":'
        else:
            self._open = self._head + ',"choices":[{"index":0,"text":'
            self._close = ',"logprobs":null,"finish_reason":'

    def chunk(self, text: str | None, finish_reason: str | None = None, *,
              role: bool = False) -> str:
        end = "null}]}" if finish_reason is None else _str(finish_reason) + "}]}"
        if self.kind is not Kind.CHAT:
            return self._open + _str(text or "") + self._close + end
        if text is None:
            delta = '"role":"assistant"' if role else ""
        else:
            delta = ('"role":"assistant","content":' if role else '"content":') + _str(text)
        return self._open + delta + self._close + end

    def content_chunks(self, pieces: Sequence[str], finish_reason: str) -> str:
        """``"\n\ndata: ".join`` of `chunk` of every piece, the last with ``finish_reason``,
        built with one join (an instant stream's chunks differ only in their text)."""
        if not pieces:
            return ""
        pre = self._open + '"content":' if self.kind is Kind.CHAT else self._open
        texts = list(map(_PIECE_JSON.get, pieces))
        if None in texts:
            texts = [t or _str(p) for t, p in zip(texts, pieces, strict=True)]
        sep = self._close + "null}]}\n\ndata: " + pre
        return (pre + sep.join(texts)  # type: ignore[arg-type]  # no None left
                + self._close + _str(finish_reason) + "}]}")

    def usage_chunk(self, usage: str) -> str:
        return self._head + ',"choices":[],"usage":' + usage + "}"


def models_response(model: str, root: str, max_model_len: int, created: int,
                    loras: Sequence[str] = ()) -> dict[str, Any]:
    """vLLM's model list: the base model, then each adapter with ``parent`` set to it (and no
    ``max_model_len`` of its own, as vLLM lists them)."""
    data = [{"id": model, "object": "model", "created": created, "owned_by": "vllm",
             "root": root, "parent": None, "max_model_len": max_model_len, "permission": []}]
    data += [{"id": name, "object": "model", "created": created, "owned_by": "vllm",
              "root": f"/adapters/{name}", "parent": model, "max_model_len": None,
              "permission": []} for name in loras]
    return {"object": "list", "data": data}
