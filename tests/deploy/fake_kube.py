"""A fake Kubernetes API server for EndpointSlices, speaking the real wire protocol on 127.0.0.1.

What it implements (as the real kube-apiserver does):
* `GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=k=v[,k=v]` ->
  `EndpointSliceList` with `metadata.resourceVersion`.
* the same path with `watch=true`: a chunked stream of JSON lines `{"type", "object"}` —
  ADDED/MODIFIED/DELETED from the event history after `resourceVersion` (no version: synthetic
  ADDED for every current object), BOOKMARK (only with `allowWatchBookmarks=true`), and for a
  compacted version an ERROR event with a `Status` of code 410 (or, with `gone_as_http=True`, an
  HTTP 410 response). `timeoutSeconds` ends the stream cleanly.
* bearer-token auth (401 Status without it) when a token is set.

Test controls (call from the test thread; thread-safe): `put_slice`, `delete_slice`,
`set_conditions`, `bookmark`, `compact`, `expire_watches` (ERROR 410 to open watches),
`end_watches` (clean end), `drop_watches` (connection reset mid-stream), `fail_next` (HTTP errors),
`stop`/`start`/`restart` (same port; state and versions survive), `requests` (what was asked).
One request per connection (`Connection: close`), which keeps the server small.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from loadtest._net import quiet_port

SERVICE_LABEL = "kubernetes.io/service-name"


def pod_endpoint(pod: str, ip: str, *, ready: bool | None = True, terminating: bool | None = None,
                 serving: bool | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {}
    for key, value in (("ready", ready), ("serving", serving), ("terminating", terminating)):
        if value is not None:
            cond[key] = value
    return {"addresses": [ip], "conditions": cond,
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}}


def make_slice(name: str, service: str, endpoints: list[dict[str, Any]], *, port: int = 8000,
               port_name: str = "http", address_type: str = "IPv4") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {SERVICE_LABEL: service}},
            "addressType": address_type, "endpoints": endpoints,
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]}


@dataclass(eq=False)
class _Watch:
    namespace: str
    selector: dict[str, str]
    bookmarks: bool
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)


class FakeKubeAPI:
    def __init__(self, port: int | None = None, *, token: str | None = None,
                 gone_as_http: bool = False) -> None:
        self.port = port or quiet_port()
        self.token = token
        self.gone_as_http = gone_as_http
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._history: list[tuple[int, str, dict[str, Any]]] = []
        self._rv = 1000
        self._oldest = 0  # watches from a version below this get 410 Gone
        self._failures: list[int] = []
        self._watches: set[_Watch] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeKubeAPI:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake API server did not start")
        return self

    def _serve(self, ready: threading.Event) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                      reuse_address=True)
            ready.set()
            await self._stopped.wait()
            self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            await self._server.wait_closed()

        asyncio.run(main())

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(10)
        self._loop = self._thread = None
        self._watches.clear()

    def restart(self, down_for: float = 0.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> str:
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": user}],
            "contexts": [{"name": "fake",
                          "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)  # JSON is YAML
        return os.fspath(path)

    # ---- test controls ---------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def put_slice(self, obj: dict[str, Any], namespace: str = "default") -> int:
        obj = json.loads(json.dumps(obj))
        key = (namespace, obj["metadata"]["name"])
        with self._lock:
            kind = "MODIFIED" if key in self._objects else "ADDED"
            if kind == "MODIFIED":
                obj["metadata"]["uid"] = self._objects[key]["metadata"]["uid"]
            return self._commit(kind, namespace, obj)

    def delete_slice(self, name: str, namespace: str = "default") -> int:
        with self._lock:
            obj = self._objects[(namespace, name)]
            return self._commit("DELETED", namespace, json.loads(json.dumps(obj)))

    def get_slice(self, name: str, namespace: str = "default") -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._objects[(namespace, name)]))  # type: ignore[no-any-return]

    def set_conditions(self, slice_name: str, pod: str, namespace: str = "default",
                       **conditions: bool | None) -> int:
        obj = self.get_slice(slice_name, namespace)
        for ep in obj["endpoints"]:
            if ep["targetRef"]["name"] == pod:
                for key, value in conditions.items():
                    if value is None:
                        ep["conditions"].pop(key, None)
                    else:
                        ep["conditions"][key] = value
        return self.put_slice(obj, namespace)

    def bookmark(self) -> None:
        """A BOOKMARK at the current version on every watch that asked for bookmarks."""
        self._broadcast("BOOKMARK", None)

    def compact(self) -> None:
        """Forget history: a watch from any version before now gets 410 Gone."""
        with self._lock:
            self._history.clear()
            self._oldest = self._rv + 1

    def expire_watches(self) -> None:
        """Open watches receive ERROR 410 (the API server's watch cache fell behind)."""
        self.compact()
        self._broadcast("GONE", None)

    def end_watches(self) -> None:
        self._broadcast("END", None)

    def drop_watches(self) -> None:
        self._broadcast("DROP", None)

    def fail_next(self, count: int, status: int = 500) -> None:
        with self._lock:
            self._failures.extend([status] * count)

    def watch_count(self) -> int:
        return len(self._watches)

    def count(self, kind: str) -> int:
        """How many 'list' or 'watch' requests were made."""
        return sum(1 for r in list(self.requests) if r["kind"] == kind)

    # ---- internals -------------------------------------------------------------------------
    def _commit(self, kind: str, namespace: str, obj: dict[str, Any]) -> int:
        self._rv += 1
        meta = obj["metadata"]
        meta.update(namespace=namespace, resourceVersion=str(self._rv))
        meta.setdefault("uid", f"uid-{meta['name']}-{self._rv}")
        obj.update(kind="EndpointSlice", apiVersion="discovery.k8s.io/v1")
        if kind == "DELETED":
            del self._objects[(namespace, meta["name"])]
        else:
            self._objects[(namespace, meta["name"])] = obj
        self._history.append((self._rv, kind, obj))
        for w in list(self._watches):
            if w.namespace == namespace and _matches(obj, w.selector) and self._loop:
                self._loop.call_soon_threadsafe(w.queue.put_nowait, (kind, obj))
        return self._rv

    def _broadcast(self, kind: str, obj: Any) -> None:
        for w in list(self._watches):
            if self._loop:
                self._loop.call_soon_threadsafe(w.queue.put_nowait, (kind, obj))

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip()
                       for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
            await self._route(method, target, headers, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _route(self, method: str, target: str, headers: dict[str, str],
                     writer: asyncio.StreamWriter) -> None:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        segs = parts.path.strip("/").split("/")
        watch = query.get("watch") in ("true", "1")
        self.requests.append({"kind": "watch" if watch else "list", "path": parts.path,
                              "query": query, "method": method})
        if self.token and headers.get("authorization") != f"Bearer {self.token}":
            return await self._status(writer, 401, "Unauthorized", "Unauthorized")
        with self._lock:
            failure = self._failures.pop(0) if self._failures else None
        if failure:
            return await self._status(writer, failure, "InternalError", "injected failure")
        if (method != "GET" or len(segs) != 6 or segs[:3] != ["apis", "discovery.k8s.io", "v1"]
                or segs[3] != "namespaces" or segs[5] != "endpointslices"):
            return await self._status(writer, 404, "NotFound", f"the server could not find "
                                      f"the requested resource ({parts.path})")
        namespace = segs[4]
        selector = _parse_selector(query.get("labelSelector", ""))
        if not watch:
            with self._lock:
                items = [o for (ns, _), o in sorted(self._objects.items())
                         if ns == namespace and _matches(o, selector)]
                body = {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                        "metadata": {"resourceVersion": str(self._rv)},
                        "items": [_strip_type(o) for o in items]}
            return await self._send_json(writer, 200, body)
        await self._watch(writer, namespace, selector, query)

    async def _watch(self, writer: asyncio.StreamWriter, namespace: str, selector: dict[str, str],
                     query: dict[str, str]) -> None:
        w = _Watch(namespace, selector, query.get("allowWatchBookmarks") == "true")
        rv_param = query.get("resourceVersion", "")
        backlog: list[tuple[str, Any]]
        with self._lock:
            if rv_param in ("", "0"):
                backlog = [("ADDED", o) for (ns, _), o in sorted(self._objects.items())
                           if ns == namespace and _matches(o, selector)]
            elif int(rv_param) < self._oldest - 1:
                backlog = [("GONE", None)]
            else:
                backlog = [(k, o) for rv, k, o in self._history if rv > int(rv_param)
                           and o["metadata"]["namespace"] == namespace and _matches(o, selector)]
            if backlog and backlog[0][0] == "GONE" and self.gone_as_http:
                gone = True
            else:
                gone = False
                self._watches.add(w)
        if gone:
            return await self._status(writer, 410, "Expired",
                                      f"too old resource version: {rv_param} ({self._oldest})")
        for item in backlog:
            w.queue.put_nowait(item)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        deadline = float(query.get("timeoutSeconds") or 1800)
        try:
            async with asyncio.timeout(deadline):
                while True:
                    kind, obj = await w.queue.get()
                    if kind == "DROP":
                        writer.transport.abort()
                        return
                    if kind == "END":
                        break
                    if kind == "GONE":
                        msg = f"too old resource version: {rv_param} ({self._oldest})"
                        event: dict[str, Any] = {"type": "ERROR", "object": _status_obj(
                            410, "Expired", msg)}
                    elif kind == "BOOKMARK":
                        if not w.bookmarks:
                            continue
                        event = {"type": "BOOKMARK", "object": {
                            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                            "metadata": {"resourceVersion": str(self._rv)}}}
                    else:
                        event = {"type": kind, "object": obj}
                    data = json.dumps(event).encode() + b"\n"
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                    if kind == "GONE":
                        break
        except TimeoutError:
            pass
        finally:
            self._watches.discard(w)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (status, len(data), data))
        await writer.drain()

    async def _status(self, writer: asyncio.StreamWriter, code: int, reason: str,
                      message: str) -> None:
        await self._send_json(writer, code, _status_obj(code, reason, message))


def _status_obj(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _strip_type(obj: dict[str, Any]) -> dict[str, Any]:
    # list items carry no kind/apiVersion on the wire
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _parse_selector(text: str) -> dict[str, str]:
    out = {}
    for term in filter(None, text.split(",")):
        key, _, value = term.partition("=")
        out[key.strip()] = value.lstrip("=").strip()
    return out


def _matches(obj: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI(**kwargs).start()
    try:
        yield api
    finally:
        api.stop()
