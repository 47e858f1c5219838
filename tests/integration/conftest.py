"""A fake vLLM replica (a small starlette app) and helpers to run a router in front of fakes.

The fake speaks the OpenAI surface the router relies on: chat/completions/embeddings, streamed
(SSE, one chunk per "token") or not, `/v1/models`, `/health`, `/metrics` with vLLM's gauges.
Test hooks travel in request headers so one fake serves every test:

    x-fake-delay: seconds before answering (or between stream chunks with x-fake-chunk-delay)
    x-fake-status: answer with this status (and an OpenAI error body)
    x-fake-chunks: number of stream chunks (default 4)
    x-fake-die-after: close the connection after this many stream chunks

Every request is recorded in `FakeReplica.requests`; a client that went away before the answer
ended is counted in `FakeReplica.cancelled` (that is how tests see the router aborting upstream).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from router.app import RouterApp, create_app
from router.settings import Settings
from tests.conftest import ThreadedServer


@dataclass
class Seen:
    path: str
    method: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeReplica:
    name: str
    model: str = "fake-model"
    healthy: bool = True
    requests: list[Seen] = field(default_factory=list)
    cancelled: int = 0
    running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/health", self._health),
            Route("/metrics", self._metrics),
            Route("/v1/models", self._models),
            Route("/v1/{rest:path}", self._api, methods=["GET", "POST", "PUT", "DELETE"]),
        ])

    async def _health(self, request: Request) -> Response:
        return PlainTextResponse("ok" if self.healthy else "down",
                                 status_code=200 if self.healthy else 503)

    async def _metrics(self, request: Request) -> Response:
        text = (f'vllm:num_requests_running{{model_name="{self.model}"}} {self.running}\n'
                f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0\n'
                f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} 0.25\n')
        return PlainTextResponse(text)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": "fake"},
            # an adapter of the base model, listed as vLLM lists one (parent = its base)
            {"id": f"{self.name}-only", "object": "model", "owned_by": "fake",
             "parent": self.model}]})

    async def _api(self, request: Request) -> Response:
        body = await request.body()
        with self.lock:
            self.requests.append(Seen(request.url.path, request.method,
                                      dict(request.headers), body))
        h = request.headers
        if "x-fake-status" in h:
            status = int(h["x-fake-status"])
            return JSONResponse({"error": {"message": f"{self.name} says {status}",
                                           "type": "fake", "code": status}}, status_code=status)
        if request.url.path == "/v1/echo":
            return JSONResponse({"replica": self.name, "headers": dict(request.headers)},
                                headers={"x-upstream": "kept", "keep-alive": "timeout=5",
                                         "connection": "x-drop-me", "x-drop-me": "1",
                                         "proxy-authenticate": "Basic"})
        payload: dict[str, Any] = json.loads(body) if body else {}
        delay = float(h.get("x-fake-delay", "0"))
        if payload.get("stream"):
            return StreamingResponse(self._stream(request, payload, delay),
                                     media_type="text/event-stream")
        self.running += 1
        try:
            if not await self._sleep_unless_gone(request, delay):
                return Response(status_code=499)
        finally:
            self.running -= 1
        return JSONResponse(self._completion(payload))

    async def _sleep_unless_gone(self, request: Request, delay: float) -> bool:
        steps = int(delay / 0.01)
        for _ in range(steps):
            await asyncio.sleep(0.01)
            if await request.is_disconnected():
                with self.lock:
                    self.cancelled += 1
                return False
        return True

    def _completion(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": self.model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": self.name}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    async def _stream(self, request: Request, payload: dict[str, Any],
                      delay: float) -> AsyncIterator[bytes]:
        h = request.headers
        chunks = int(h.get("x-fake-chunks", "4"))
        die_after = int(h.get("x-fake-die-after", "-1"))
        chunk_delay = float(h.get("x-fake-chunk-delay", "0"))
        finished = False
        self.running += 1
        try:
            await asyncio.sleep(delay)
            for i in range(chunks):
                if i == die_after:
                    raise RuntimeError("fake replica dies mid-stream")
                delta = {"content": self.name if i == 0 else f" t{i}"}
                chunk = {"id": "chat-1", "object": "chat.completion.chunk", "created": 0,
                         "model": self.model,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                if chunk_delay:
                    await asyncio.sleep(chunk_delay)
            yield b"data: [DONE]\n\n"
            finished = True
        finally:
            self.running -= 1
            if not finished:
                with self.lock:
                    self.cancelled += 1


@dataclass
class Fleet:
    replicas: list[FakeReplica]
    servers: list[ThreadedServer]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def by_name(self, name: str) -> FakeReplica:
        return next(r for r in self.replicas if r.name == name)

    def counts(self) -> dict[str, int]:
        return {r.name: len(r.requests) for r in self.replicas}


def router_settings(urls: list[str], **sections: dict[str, Any]) -> Settings:
    data: dict[str, Any] = {"replicas": [{"name": f"r{i}", "url": u} for i, u in enumerate(urls)],
                            "health": {"interval": 0.2, "timeout": 0.5, "readmit_backoff": 0.2},
                            "scrape": {"interval": 0.2},
                            "logging": {"access_log": False}}
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v}
    return Settings.from_dict(data)


@pytest.fixture
def fake_fleet() -> Iterator[Any]:
    started: list[ThreadedServer] = []

    def start(n: int = 3, names: list[str] | None = None) -> Fleet:
        replicas = [FakeReplica(name) for name in names or [f"r{i}" for i in range(n)]]
        servers = [ThreadedServer(r.app()).start() for r in replicas]
        started.extend(servers)
        return Fleet(replicas, servers)

    yield start
    for srv in reversed(started):
        srv.stop()


@pytest.fixture
def router_server() -> Iterator[Any]:
    started: list[ThreadedServer] = []

    def start(settings: Settings, **config: Any) -> tuple[ThreadedServer, RouterApp]:
        app = create_app(settings)
        srv = ThreadedServer(app, **config).start()
        started.append(srv)
        return srv, app

    yield start
    for srv in reversed(started):
        srv.stop()
