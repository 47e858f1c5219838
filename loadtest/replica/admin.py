"""The replica's admin endpoint: fault injection and stats for reliability tests.

``GET /admin/stats``     counters, in-flight request ids, queue state, the current fault spec
``POST /admin/fault``    replace the fault spec with a JSON `FaultSpec` (``{}`` clears it)
``DELETE /admin/fault``  clear all faults (reopens a refused listener)
``GET /admin/kv_blocks`` the hashes of every block in the prefix cache, as KV events carry them
                         (the truth a subscriber's index is checked against)

Served only to loopback peers (others get 403) and only on a loopback listener: the
``--admin-port`` listener (always bound to 127.0.0.1), or the main one when it is itself bound to
loopback; elsewhere ``/admin/*`` is 404.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from .asgi import (
    LOOPBACK,
    MAX_BODY,
    Receive,
    Scope,
    Send,
    local_port,
    parse_json,
    peer_host,
    read_body,
)
from .config import ReplicaConfig
from .faults import FaultSpec
from .openai_api import ApiError

__all__ = ["AdminTarget", "admin_allowed_here", "handle"]

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class AdminTarget(Protocol):
    """All the admin endpoints may touch of a replica (``server.Replica`` is one): its config,
    a stats snapshot, the fault switch and the process exit. Nothing of the engine."""

    @property
    def config(self) -> ReplicaConfig: ...

    @property
    def can_refuse(self) -> bool:
        """Whether the listener can be closed (the refuse fault)."""
        ...

    def admin_stats(self) -> dict[str, Any]: ...

    def kv_blocks(self) -> dict[str, Any]: ...

    def set_faults(self, spec: FaultSpec) -> None: ...

    def exit_process(self, code: int) -> None: ...

    async def send_error(self, send: Send, err: ApiError) -> None: ...

    async def send_json(self, send: Send, obj: Any, status: int = 200) -> None: ...


def admin_allowed_here(replica: AdminTarget, scope: Scope) -> bool:
    cfg = replica.config
    port = local_port(scope)
    return (cfg.admin_port is not None and port == cfg.admin_port) or cfg.host in _LOOPBACK_HOSTS


async def handle(replica: AdminTarget, scope: Scope, receive: Receive, send: Send) -> None:
    if not admin_allowed_here(replica, scope):
        await replica.send_error(send, ApiError(404, f"{scope['path']} not found", "NotFoundError"))
        return
    if peer_host(scope) not in LOOPBACK:
        await replica.send_error(send, ApiError(403, "admin endpoints are loopback-only",
                                                "PermissionDenied"))
        return
    method, path = scope["method"], scope["path"]
    if (method, path) == ("GET", "/admin/stats"):
        await replica.send_json(send, replica.admin_stats())
    elif (method, path) == ("GET", "/admin/kv_blocks"):
        await replica.send_json(send, replica.kv_blocks())
    elif path == "/admin/fault" and method in ("POST", "DELETE"):
        try:
            body = await read_body(receive, MAX_BODY) if method == "POST" else b""
            spec = FaultSpec.from_json(parse_json(body)) if body.strip() else FaultSpec()
        except (ValueError, TypeError) as exc:
            await replica.send_error(send, ApiError(400, str(exc)))
            return
        if spec.refuse and not replica.can_refuse:
            await replica.send_error(send, ApiError(501, "this server cannot stop listening"))
            return
        replica.set_faults(spec)
        await replica.send_json(send, {"faults": spec.to_json()})
        if spec.exit:
            # After the answer is flushed: the caller learns the fault was accepted.
            asyncio.get_running_loop().call_later(0.05, replica.exit_process, spec.exit_code)
    elif path in ("/admin/stats", "/admin/fault", "/admin/kv_blocks"):
        await replica.send_error(send, ApiError(405, f"{method} not allowed on {path}"))
    else:
        await replica.send_error(send, ApiError(404, f"{path} not found", "NotFoundError"))
