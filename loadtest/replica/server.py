"""The simulated vLLM replica as an ASGI app (`Replica`).

Per inference request: count it, draw a fault verdict, parse, render the chat template (chat
only), tokenise, then either serve it at once (``--instant``) or submit it to the engine and relay
its tokens. The response is vLLM's shape (OpenAI chunks over SSE ending with ``data: [DONE]``,
``usage.prompt_tokens_details.cached_tokens``) and carries the replica name in the
``x-replica-name`` header, the ``id`` and ``system_fingerprint``. A client that disconnects
aborts its request in the engine (queue slot or KV blocks released at once).

Routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``, ``/metrics``,
``/tokenize``, ``/version``, ``/reset_prefix_cache`` (vLLM's dev-mode route), sglang-router's
``/server_info`` and ``/model_info`` (also under ``/get_*``), and the loopback-only ``/admin/*``
(see `admin`).

With ``--kv-transfer-config`` (`kv_transfer`) the replica plays both sides of vLLM's disaggregated
prefill: a request with ``kv_transfer_params.do_remote_decode`` returns the params a decode
instance needs and is held in the `kv_transfer.Ledger` (read back over ``POST
/kv_transfer/read``); one with ``do_remote_prefill`` reads them from the prefill instance first,
waits the transfer, and skips the prefill of those tokens (a failed read is an error response).

With ``--kv-events-config`` enabling it, the engine's block pool publishes vLLM's KV cache events
(`kv_events`, `kv_publisher`; docs/kv-events.md); the publisher starts with the replica and stops
at lifespan shutdown (or `close()`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from prefix_asgi import serve_lifespan
from templates_audit.blocks import block_hashes
from templates_audit.render import TemplateError
from templates_audit.tokenize import load_tokenizer

from . import admin, openai_api
from .asgi import (
    MAX_BODY,
    AbruptClose,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    parse_json,
    race_disconnect,
    read_body,
    send_bytes,
    send_json,
    wait_disconnect,
)
from .config import ReplicaConfig
from .engine import BlockEvents, Engine, EngineLimits, EngineRequest, RequestHandle, Usage
from .faults import Action, Faults, FaultSpec
from .kv_config import parse_kv_events_config
from .kv_transfer import READ_PATH, Ledger, TransferError, parse_kv_transfer_config, remote_of
from .metrics import CONTENT_TYPE, CacheConfig, LoraConfig, ReplicaMetrics, Snapshot
from .openai_api import ApiError, Envelope, Job, Kind
from .prompts import Prompter, renderer_for
from .timing import TimingModel

SSE_DONE = b"data: [DONE]\n\n"


class Listener(Protocol):
    """Control of the public listening socket (the refuse-connections fault)."""

    def refuse(self) -> None: ...

    def resume(self) -> None: ...


class InFlight(NamedTuple):
    request_id: str
    path: str
    started: float


def fault_spec_of(cfg: ReplicaConfig) -> FaultSpec:
    return FaultSpec(error_rate=cfg.fault_error_rate, error_status=cfg.fault_error_status,
                     hang_rate=cfg.fault_hang_rate, slow=cfg.fault_slow,
                     stop_after=cfg.fault_stop_after, exit_after=cfg.fault_exit_after)


class Replica:
    """State of one replica (engine, metrics, faults, counters) and its ASGI entry point."""

    def __init__(self, config: ReplicaConfig, *, listener: Listener | None = None,
                 exit_process: Callable[[int], None] = os._exit) -> None:
        self.config = config
        self.listener = listener
        self.exit_process = exit_process
        self.tokenizer = load_tokenizer(config.tokenizer)
        self.renderer = renderer_for(self.tokenizer, config.chat_template)
        self.prompter = Prompter(self.renderer, self.tokenizer, config.block_size)
        self.metrics = ReplicaMetrics(
            config.model, self.snapshot,
            CacheConfig(block_size=config.block_size, num_gpu_blocks=config.kv_blocks),
            LoraConfig(config.max_lora) if config.lora else None)
        self.kv_publisher: Any = None   # kv_publisher.ZmqPublisher when KV events are on
        self.engine = Engine(
            EngineLimits(block_size=config.block_size, kv_blocks=config.kv_blocks,
                         max_num_seqs=config.max_num_seqs,
                         max_num_batched_tokens=config.max_num_batched_tokens,
                         max_model_len=config.max_model_len, preempt=config.preempt,
                         max_loras=config.max_lora),
            TimingModel(step_ms=config.step_ms, prefill_us_per_token=config.prefill_us_per_token,
                        decode_us_per_seq=config.decode_us_per_seq, speed=config.speed,
                        lora_load_ms=config.lora_load_ms),
            observer=self.metrics, events=self._kv_events(config))
        self.faults = Faults(fault_spec_of(config), seed=config.seed)
        self.engine.slow = self.faults.spec.slow
        self.requests = 0
        self.hang_aborts = 0
        self.last_abort_at: float | None = None  # wall clock of the latest abort (tests time it)
        self.in_flight: dict[str, InFlight] = {}
        self.created = int(time.time())
        self._seq = itertools.count()
        self._reopen: asyncio.TimerHandle | None = None
        self.model_path = config.model_path or (
            os.path.dirname(os.path.abspath(config.tokenizer)) if config.tokenizer
            and not os.path.isdir(config.tokenizer) else config.tokenizer) or config.model
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Any]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completion,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/tokenize"): self._tokenize,
            ("GET", "/version"): self._version,
            ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_server_info"): self._server_info,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/get_model_info"): self._model_info,
        }
        self._headers = [(b"x-replica-name", config.name.encode())]
        self._sse_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                             (b"cache-control", b"no-cache"), *self._headers]
        self._bearer = f"Bearer {config.api_key}".encode() if config.api_key else None
        self.ledger: Ledger | None = None
        self._kv_session: Any = None  # aiohttp.ClientSession for reads from remote prefills
        if config.kv_transfer_config is not None:
            host = config.host if config.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
            self.ledger = Ledger(parse_kv_transfer_config(config.kv_transfer_config), host,
                                 config.port)
            self._routes[("POST", READ_PATH)] = self._kv_read

    def _kv_events(self, config: ReplicaConfig) -> BlockEvents | None:
        """The engine's event journal and its publisher, when KV events are on (binds the
        sockets now: a taken port fails the replica at start, as it fails vLLM)."""
        if config.kv_events_config is None:
            return None
        kv = parse_kv_events_config(config.kv_events_config)
        if not kv.publishes:
            return None
        from .kv_events import EventJournal, lora_ids  # pyzmq and msgpack only when on
        from .kv_publisher import ZmqPublisher

        self.kv_publisher = ZmqPublisher(kv)
        return EventJournal(self.kv_publisher, config.block_size, lora_ids(config.lora))

    async def _shutdown(self) -> None:
        await self.engine.stop()
        if self._kv_session is not None:
            await self._kv_session.close()
            self._kv_session = None
        self.close()

    def close(self) -> None:
        """Stop the KV-event publisher (its thread and sockets); idempotent."""
        if self.kv_publisher is not None:
            self.kv_publisher.close()

    # -- state -----------------------------------------------------------------------------------
    @property
    def aborts(self) -> int:
        return self.engine.stats.aborts + self.hang_aborts

    def snapshot(self) -> Snapshot:
        e = self.engine
        if self.config.instant:
            running, waiting = len(self.in_flight), 0
        else:
            running, waiting = len(e.running), len(e.waiting)
        st = e.stats
        running_loras, waiting_loras = e.lora_adapters()
        return Snapshot(running=running, waiting=waiting, kv_usage=e.kv_usage, queries=st.queries,
                        hits=st.hits, prompt_tokens=st.prompt_tokens,
                        generation_tokens=st.generation_tokens, preemptions=st.preemptions,
                        finished=st.finished, aborts=self.aborts, requests=self.requests,
                        external_queries=st.external_queries, external_hits=st.external_hits,
                        running_loras=tuple(running_loras), waiting_loras=tuple(waiting_loras))

    @property
    def can_refuse(self) -> bool:
        return self.listener is not None

    def admin_stats(self) -> dict[str, Any]:
        """``GET /admin/stats``: counters, in-flight request ids, queue state, the fault spec."""
        e = self.engine
        queue = e.request_ids()
        return {
            "name": self.config.name,
            "pid": os.getpid(),
            "requests": self.requests,
            "aborts": self.aborts,
            "last_abort_at": self.last_abort_at,
            "in_flight": len(self.in_flight),
            "in_flight_ids": sorted(self.in_flight),
            "running": queue["running"],
            "waiting": queue["waiting"],
            "finished": e.stats.finished,
            "preemptions": e.stats.preemptions,
            "prefix_cache_queries": e.stats.queries,
            "prefix_cache_hits": e.stats.hits,
            "kv_cache_usage": e.kv_usage,
            "steps": e.stats.steps,
            "faults": self.faults.spec.to_json(),
            "kv_events": self.kv_publisher.stats() if self.kv_publisher is not None else None,
        }

    def kv_blocks(self) -> dict[str, Any]:
        """``GET /admin/kv_blocks``: every cached block's hash in KV events' form (uint64)."""
        mask = (1 << 64) - 1
        return {"block_size": self.config.block_size,
                "hashes": sorted(h & mask for h in self.engine.cache.cached_hashes())}

    def set_faults(self, spec: FaultSpec) -> None:
        self.faults.set(spec)
        self.engine.slow = spec.slow
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if self.listener is None:
            return
        if spec.refuse:
            self.listener.refuse()
            if spec.refuse_seconds is not None:
                self._reopen = asyncio.get_running_loop().call_later(
                    spec.refuse_seconds, self.set_faults, FaultSpec())
        else:
            self.listener.resume()

    # -- ASGI ------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await serve_lifespan(receive, send, self._startup, self._shutdown)
            return
        if kind != "http":
            return
        path = scope["path"]
        if path.startswith("/admin/"):
            await admin.handle(self, scope, receive, send)
            return
        route = self._routes.get((scope["method"], path))
        if route is None:
            status = 405 if any(p == path for _, p in self._routes) else 404
            await self.send_error(send, ApiError(status, f"{scope['method']} {path} not found",
                                                 "NotFoundError"))
            return
        if self._bearer is not None and path.startswith("/v1") and (
                dict(scope["headers"]).get(b"authorization") != self._bearer):
            await send_json(send, 401, {"error": "Unauthorized"}, self._headers)  # vLLM's shape
            return
        if not self.config.instant:
            self.engine.start()  # idempotent; covers servers run without lifespan
        try:
            await route(scope, receive, send)
        except (ClientGone, ConnectionError):
            pass  # the client left; its request was aborted on the way out
        except BodyTooLarge:
            await self.send_error(send, ApiError(413, "request body too large"))

    async def _startup(self) -> None:
        if not self.config.instant:
            self.engine.start()

    async def send_error(self, send: Send, err: ApiError) -> None:
        await send_json(send, err.status, err.body(), self._headers)

    async def send_json(self, send: Send, obj: Any, status: int = 200) -> None:
        await send_json(send, status, obj, self._headers)

    # -- inference -------------------------------------------------------------------------------
    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._infer(Kind.CHAT, scope, receive, send)

    async def _completion(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._infer(Kind.COMPLETION, scope, receive, send)

    async def _infer(self, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
        self.requests += 1
        n = next(self._seq)
        prefix = "chatcmpl" if kind is Kind.CHAT else "cmpl"
        rid = f"{prefix}-{self.config.name}-{n}"
        self.in_flight[rid] = InFlight(rid, scope["path"], time.time())
        server = scope.get("server")
        if self.ledger is not None and server and server[1]:  # the side channel: this listener
            self.ledger.port = int(server[1])
            if server[0] not in ("0.0.0.0", "::"):
                self.ledger.host = str(server[0])
        try:
            await self._serve(kind, rid, receive, send)
        finally:
            del self.in_flight[rid]

    async def _serve(self, kind: Kind, rid: str, receive: Receive, send: Send) -> None:
        verdict = self.faults.draw()
        if verdict.action is Action.EXIT:
            self.exit_process(self.faults.spec.exit_code)
            return
        body = await read_body(receive, MAX_BODY)
        if verdict.action is Action.ERROR:
            await self.send_error(send, ApiError(verdict.status, "injected fault",
                                                 "InternalServerError"))
            return
        if verdict.action is Action.HANG:
            await wait_disconnect(receive)
            self.hang_aborts += 1
            self.last_abort_at = time.time()
            return
        try:
            data = parse_json(body)
            lora = self._served(data)
            job = (openai_api.parse_chat if kind is Kind.CHAT else openai_api.parse_completion)(
                data, self.config.default_max_tokens)
            prompt = self.prompter.prompt(job, body)
            pieces, output_ids = prompt.reply
            hashes: Sequence[int] = prompt.hashes
            if lora is not None:
                # vLLM folds the adapter into every block's hash: its blocks match no other
                # adapter's nor the base model's (here: the chain's first seed)
                hashes = block_hashes(prompt.ids, self.config.block_size, salt="lora:" + lora)
            params = self._kv_params(data)
            remote, remote_cached = 0, None
            if params is not None and params.get("do_remote_prefill"):
                remote = await race_disconnect(self._pull(params, hashes, len(prompt.ids)),
                                               receive)
                cached = params.get("remote_prefill_cached_tokens")
                remote_cached = cached if type(cached) is int else None
            hold = params is not None and bool(params.get("do_remote_decode")) \
                and not job.stream
            req = EngineRequest(rid, prompt.ids, job.max_tokens, output_ids=output_ids,
                                prompt_hashes=hashes, lora=lora, remote_tokens=remote,
                                remote_cached=remote_cached)
            env = Envelope(rid, int(time.time()), lora or self.config.model, self.config.name)
            if self.config.instant:
                usage = self.engine.serve_instant(req)
                handle = None
            else:
                handle = self.engine.submit(req)
        except ApiError as exc:
            await self.send_error(send, exc)
            return
        except TransferError as exc:
            await self.send_error(send, ApiError(
                exc.status, f"KV transfer failed: {exc}",
                "BadRequestError" if exc.status == 400 else "InternalServerError"))
            return
        except ValueError as exc:  # JSON, chat template, engine limits (EngineError)
            await self.send_error(send, ApiError(400, str(exc)))
            return
        if handle is None:
            if self.faults.spec.slow > 1:
                await asyncio.sleep((self.faults.spec.slow - 1) * 0.001)
            kv = self._hold(rid, hashes, usage) if hold else None
            await self._respond_now(job, env, pieces, usage, send, kv)
            return
        try:
            if job.stream:
                await race_disconnect(self._stream(job, env, pieces, handle, send), receive)
            else:
                usage = await race_disconnect(handle.wait(), receive)
                kv = self._hold(rid, hashes, usage) if hold else None
                await self._respond_now(job, env, pieces, usage, send, kv)
        finally:
            if handle.abort():  # False when it had finished
                self.last_abort_at = time.time()

    def _served(self, data: Any) -> str | None:
        """The adapter a request names (None: the base model); a name this replica does not
        serve is vLLM's 404. A missing model means the base model, as in vLLM."""
        model = data.get("model") if isinstance(data, dict) else None
        if not model or model == self.config.model:
            return None
        if isinstance(model, str) and model in self.config.lora:
            return model
        raise openai_api.ModelNotFound(model, self.config.model)

    def _kv_params(self, data: Any) -> dict[str, Any] | None:
        """The request's ``kv_transfer_params`` when this replica has a KV connector (vLLM
        without one ignores them); a value that is not an object is a 400."""
        params = data.get("kv_transfer_params") if isinstance(data, dict) else None
        if params is None or self.ledger is None:
            return None
        if not isinstance(params, dict):
            raise ApiError(400, "kv_transfer_params must be an object")
        return params

    async def _pull(self, params: dict[str, Any], hashes: Sequence[int], prompt_len: int) -> int:
        """Read a remote prefill's KV for this prompt (`kv_transfer` protocol); the prompt
        tokens it computed. TransferError when the read fails or the blocks are another
        prompt's. Waits the transfer cost of the blocks this replica's cache lacks."""
        import aiohttp  # only decode instances read

        host, port, read = remote_of(params)
        if self._kv_session is None:
            self._kv_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        url = f"http://{host}:{port}{READ_PATH}"
        try:
            async with self._kv_session.post(url, json=read) as resp:
                answer = await resp.json(content_type=None)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise TransferError(f"remote engine {read['engine_id']!r} at {host}:{port} "
                                f"unreachable ({type(exc).__name__})") from None
        if status != 200:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise TransferError(f"remote engine {read['engine_id']!r} at {host}:{port}: "
                                f"{message or status}")
        got = answer.get("hashes") if isinstance(answer, dict) else None
        tokens = answer.get("num_tokens") if isinstance(answer, dict) else None
        if not isinstance(got, list) or type(tokens) is not int or \
                list(hashes[:len(got)]) != got or tokens > prompt_len:
            raise TransferError("the transferred blocks are not this prompt's", 409)
        # vLLM pulls only what its own prefix cache lacks (NixlConnector's
        # get_num_new_matched_tokens: prompt tokens minus the locally computed ones)
        local = self.engine.cache.cached_prefix_tokens(hashes, prompt_len) // self.config.block_size
        blocks = max(0, len(read["block_ids"]) - local)
        cfg = self.config
        if blocks and cfg.kv_transfer_us_per_block and not cfg.instant:
            await asyncio.sleep(blocks * cfg.kv_transfer_us_per_block / 1e6 * self.faults.spec.slow
                                / cfg.speed)
        return tokens

    def _hold(self, rid: str, hashes: Sequence[int], usage: Usage) -> dict[str, Any]:
        assert self.ledger is not None
        return self.ledger.hold(rid, hashes, usage.prompt_tokens, self.config.block_size,
                                usage.cached_tokens)

    async def _kv_read(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /kv_transfer/read``: a decode instance reads (and releases) held KV."""
        assert self.ledger is not None
        try:
            answer = self.ledger.read(parse_json(await read_body(receive, MAX_BODY)))
        except TransferError as exc:
            await self.send_error(send, ApiError(exc.status, str(exc), "NotFoundError"))
            return
        except ValueError as exc:
            await self.send_error(send, ApiError(400, str(exc)))
            return
        await self.send_json(send, answer)

    async def _respond_now(self, job: Job, env: Envelope, pieces: list[str], usage: Usage,
                           send: Send, kv_transfer: dict[str, Any] | None = None) -> None:
        if job.stream:
            await self._stream(job, env, pieces, None, send, usage)
            return
        u = openai_api.encode_usage(usage.prompt_tokens, usage.completion_tokens,
                                    usage.cached_tokens)
        payload = openai_api.encode_full(job.kind, env, "".join(pieces), usage.finish_reason,
                                         u, kv_transfer).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode()), *self._headers]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if self.faults.spec.stop_after is None:
            await send({"type": "http.response.body", "body": payload})
            return
        await send({"type": "http.response.body", "body": payload[: len(payload) // 2],
                    "more_body": True})
        raise AbruptClose

    async def _stream(self, job: Job, env: Envelope, pieces: list[str], handle: RequestHandle | None,
                      send: Send, usage: Usage | None = None) -> None:
        stop_after = self.faults.spec.stop_after
        await send({"type": "http.response.start", "status": 200, "headers": self._sse_headers})
        enc = openai_api.StreamEncoder(job.kind, env)
        last = job.max_tokens - 1
        chat = job.kind is Kind.CHAT
        if handle is None and stop_after is None:
            # Instant replies are complete up front: the whole stream in one write.
            assert usage is not None
            events = [enc.chunk("", role=True)] if chat else []
            events.append(enc.content_chunks(pieces, "length"))
            if job.include_usage:
                events.append(enc.usage_chunk(openai_api.encode_usage(
                    usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)))
            events.append("[DONE]")
            body = "".join([part for e in events for part in ("data: ", e, "\n\n")])
            await send({"type": "http.response.body", "body": body.encode()})
            return
        sent = 0
        buffer: list[bytes] | None = [] if handle is None else None   # instant: one write

        async def flush() -> None:
            if buffer:
                await send({"type": "http.response.body", "body": b"".join(buffer),
                            "more_body": True})
                buffer.clear()

        async def emit(event: str | None) -> None:
            nonlocal sent
            if stop_after is not None and sent >= stop_after:
                await flush()
                raise AbruptClose
            data = SSE_DONE if event is None else ("data: " + event + "\n\n").encode()
            if buffer is not None:
                buffer.append(data)
            else:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            sent += 1

        indices = handle.tokens() if handle is not None else _count(job.max_tokens)
        async for i in indices:
            if i == 0 and chat:
                await emit(enc.chunk("", role=True))
            await emit(enc.chunk(pieces[i], "length" if i == last else None))
        if handle is not None:
            usage = handle.usage
        assert usage is not None
        if job.include_usage:
            await emit(enc.usage_chunk(openai_api.encode_usage(
                usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)))
        await emit(None)
        await send({"type": "http.response.body", "body": b"".join(buffer or ()),
                    "more_body": False})

    # -- informational ---------------------------------------------------------------------------
    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.send_json(send, openai_api.models_response(
            self.config.model, self.model_path, self.config.max_model_len, self.created,
            self.config.lora))

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = self.faults.spec.health_status or 200
        await send_bytes(send, status, b"", [(b"content-type", b"text/plain"), *self._headers])

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_bytes(send, 200, self.metrics.render(),
                         [(b"content-type", CONTENT_TYPE.encode()), *self._headers])

    async def _reset_prefix_cache(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's ``POST /reset_prefix_cache``: ``{"success": false}`` while requests hold
        blocks; a success publishes ``AllBlocksCleared``."""
        await self.send_json(send, {"success": self.engine.reset_prefix_cache()})

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.send_json(send, {"version": "sim"})

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            data = parse_json(await read_body(receive, MAX_BODY))
            if isinstance(data, dict) and "messages" in data:
                job = openai_api.parse_chat(data, 1)
            else:
                job = openai_api.parse_completion(data, 1)
            ids = self.prompter.ids(job)
        except ApiError as exc:
            await self.send_error(send, exc)
            return
        except (ValueError, TemplateError) as exc:
            await self.send_error(send, ApiError(400, str(exc)))
            return
        await self.send_json(send, {"count": len(ids), "max_model_len": self.config.max_model_len,
                                    "tokens": ids})

    def _info(self) -> dict[str, Any]:
        c = self.config
        return {"model_path": self.model_path, "tokenizer_path": self.model_path,
                "served_model_name": c.model, "is_generation": True, "page_size": c.block_size,
                "max_total_num_tokens": c.kv_blocks * c.block_size, "context_length": c.max_model_len,
                "max_running_requests": c.max_num_seqs, "tp_size": 1, "dp_size": 1,
                "replica_name": c.name, "version": "sim"}

    async def _server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.send_json(send, self._info())

    async def _model_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        info = self._info()
        await self.send_json(send, {k: info[k] for k in (
            "model_path", "tokenizer_path", "served_model_name", "is_generation")})


async def _count(n: int) -> Any:
    for i in range(n):
        yield i


def create_app(config: ReplicaConfig, **kwargs: Any) -> Replica:
    return Replica(config, **kwargs)
