"""ASGI plumbing shared by the router and the simulated replica: one home for what both need.

The lowest layer of the project's import contracts (pyproject.toml, ``[tool.importlinter]``):
it imports nothing of ``router``, ``loadtest`` or ``templates_audit``, so the replica can use it
without importing the router. Modules, one concern each:

- `types`: the ASGI 3 callables (``Scope``, ``Message``, ``Receive``, ``Send``, ``ASGIApp``);
- `body`: reading a request body under a size limit (``read_body``, ``ClientGone``,
  ``BodyTooLarge``);
- `responses`: a complete response in two messages (``send_bytes``, ``send_json``);
- `lifespan`: the app side of the lifespan protocol (``serve_lifespan``);
- `stepping`: stepping a coroutine the way an asyncio Task does (``advance``), for the two
  places that run one without a Task.
"""

from prefix_asgi.body import BodyTooLarge, ClientGone, read_body
from prefix_asgi.lifespan import serve_lifespan
from prefix_asgi.responses import JSON_HEADERS, dumps, send_bytes, send_json
from prefix_asgi.stepping import advance
from prefix_asgi.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "JSON_HEADERS", "ASGIApp", "BodyTooLarge", "ClientGone", "Message", "Receive", "Scope",
    "Send", "advance", "dumps", "read_body", "send_bytes", "send_json", "serve_lifespan",
]
