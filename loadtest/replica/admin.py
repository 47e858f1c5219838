"""The replica's admin endpoint: fault injection and stats for reliability tests.

``GET /admin/stats``     counters, in-flight request ids, queue state, the current fault spec
``POST /admin/fault``    replace the fault spec with a JSON `FaultSpec` (``{}`` clears it)
``DELETE /admin/fault``  clear all faults (reopens a refused listener)

Served only to loopback peers (others get 403) and only on a loopback listener: the
``--admin-port`` listener (always bound to 127.0.0.1), or the main one when it is itself bound to
loopback; elsewhere ``/admin/*`` is 404.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from .asgi import LOOPBACK, Receive, Scope, Send, local_port, parse_json, peer_host, read_body
from .faults import FaultSpec
from .openai_api import ApiError

if TYPE_CHECKING:
    from .server import Replica

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def admin_allowed_here(replica: Replica, scope: Scope) -> bool:
    cfg = replica.config
    port = local_port(scope)
    return (cfg.admin_port is not None and port == cfg.admin_port) or cfg.host in _LOOPBACK_HOSTS


def stats(replica: Replica) -> dict[str, Any]:
    e = replica.engine
    queue = e.request_ids()
    return {
        "name": replica.config.name,
        "pid": os.getpid(),
        "requests": replica.requests,
        "aborts": replica.aborts,
        "last_abort_at": replica.last_abort_at,
        "in_flight": len(replica.in_flight),
        "in_flight_ids": sorted(replica.in_flight),
        "running": queue["running"],
        "waiting": queue["waiting"],
        "finished": e.stats.finished,
        "preemptions": e.stats.preemptions,
        "prefix_cache_queries": e.stats.queries,
        "prefix_cache_hits": e.stats.hits,
        "kv_cache_usage": e.kv_usage,
        "steps": e.stats.steps,
        "faults": replica.faults.spec.to_json(),
    }


async def handle(replica: Replica, scope: Scope, receive: Receive, send: Send) -> None:
    if not admin_allowed_here(replica, scope):
        await replica.send_error(send, ApiError(404, f"{scope['path']} not found", "NotFoundError"))
        return
    if peer_host(scope) not in LOOPBACK:
        await replica.send_error(send, ApiError(403, "admin endpoints are loopback-only",
                                                "PermissionDenied"))
        return
    method, path = scope["method"], scope["path"]
    if (method, path) == ("GET", "/admin/stats"):
        await replica.send_json(send, stats(replica))
    elif path == "/admin/fault" and method in ("POST", "DELETE"):
        try:
            body = await read_body(receive) if method == "POST" else b""
            spec = FaultSpec.from_json(parse_json(body)) if body.strip() else FaultSpec()
        except (ValueError, TypeError) as exc:
            await replica.send_error(send, ApiError(400, str(exc)))
            return
        if spec.refuse and replica.listener is None:
            await replica.send_error(send, ApiError(501, "this server cannot stop listening"))
            return
        replica.set_faults(spec)
        await replica.send_json(send, {"faults": spec.to_json()})
        if spec.exit:
            # After the answer is flushed: the caller learns the fault was accepted.
            asyncio.get_running_loop().call_later(0.05, replica.exit_process, spec.exit_code)
    elif path in ("/admin/stats", "/admin/fault"):
        await replica.send_error(send, ApiError(405, f"{method} not allowed on {path}"))
    else:
        await replica.send_error(send, ApiError(404, f"{path} not found", "NotFoundError"))
