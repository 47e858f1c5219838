"""Kubernetes discovery: list + watch the EndpointSlices of one Service (the reflector pattern).

Algorithm. LIST `discovery.k8s.io/v1` EndpointSlices with label selector
`kubernetes.io/service-name=<service>` in the namespace; remember the list's resourceVersion;
WATCH from it with `allowWatchBookmarks=true` and a randomised `timeoutSeconds`. ADDED/MODIFIED
replace a slice, DELETED removes it, BOOKMARK only advances the resourceVersion. After every
change the slices are merged (`endpointslices.merge_slices`) and the membership is published if
it differs, so a change reaches routing one event after the API server emits it.

Failure modes, all survived without raising out of `run`:
* 410 Gone (resourceVersion compacted away) — as an ERROR event carrying a Status with code 410,
  or as an HTTP 410 response to the watch request: relist from scratch and *replace* the state, so
  slices deleted while we were away disappear (a plain re-watch without a version would miss them).
* the watch ends (server timeout, load balancer, API server restart) -> re-watch from the last
  resourceVersion; a watch that ends at once without events counts as a failure (no tight loop).
* connection refused / reset / HTTP 5xx / 403 -> keep the last membership, retry with capped
  exponential backoff with jitter (0.25 s doubling to 30 s), reset after a watch delivers.
* a half-open connection (peer vanished, no FIN) -> the whole watch request runs under a deadline
  of timeoutSeconds + 30 s, after which it is abandoned and re-established.
Connection state changes (connected, failing, relisting) are logged once, not per retry.

Why not `AsyncClient.watch`: lightkube (1.0) decodes every watch object as the resource type, so a
BOOKMARK (an object with only metadata) fails to decode, it has no way to request bookmarks, and
on 410 it re-watches without a version instead of relisting. So the LIST uses lightkube's public
API and the WATCH uses lightkube's request builder and authenticated HTTP client
(`client._client`), parsing the JSON-lines stream here. Credentials, TLS, kubeconfig parsing and
service-account token rotation all stay lightkube's.

Cost: memory O(endpoints); per event one merge over all slices of the Service.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from router.discovery.base import Backoff, Endpoint, Membership, Publish
from router.discovery.endpointslices import SERVICE_NAME_LABEL, merge_slices
from router.roles import ROLE_LABEL, ROLES, role_of

__all__ = ["KubernetesDiscovery", "ResourceVersionGone", "SliceState", "WatchError"]

log = logging.getLogger("router.discovery")


class ResourceVersionGone(Exception):
    """The API server no longer has our resourceVersion (HTTP 410 Gone): relist."""


class WatchError(Exception):
    """The API server answered the watch with an error status."""


def _status_code(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)  # lightkube.ApiError
    if status is not None and getattr(status, "code", None) is not None:
        return int(status.code)
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return int(code) if code is not None else None


class SliceState:
    """The slices of one Service at one resourceVersion, and the membership they imply."""

    def __init__(self, port_name: str, scheme: str) -> None:
        self.port_name = port_name
        self.scheme = scheme
        self.slices: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None
        self.warned_ports: set[str] = set()
        self.warned_roles: set[str] = set()

    def replace(self, items: list[Mapping[str, Any]], resource_version: str) -> None:
        self.slices = {item["metadata"]["name"]: item for item in items}
        self.resource_version = resource_version
        for item in items:
            self._check(item)

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; True if the slices changed (BOOKMARK only moves the version)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise ResourceVersionGone(obj.get("message", "resourceVersion too old"))
            raise WatchError(f"watch ERROR event: {obj.get('code')} {obj.get('message')}")
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.resource_version = str(meta["resourceVersion"])
        if kind in ("ADDED", "MODIFIED"):
            self.slices[meta["name"]] = obj
            self._check(obj)
            return True
        if kind == "DELETED":
            return self.slices.pop(meta["name"], None) is not None
        return False

    def endpoints(self) -> list[Endpoint]:
        return merge_slices(self.slices, self.port_name, self.scheme)

    def _check(self, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        role = (obj["metadata"].get("labels") or {}).get(ROLE_LABEL)
        if role is not None and role_of(role) is None and name not in self.warned_roles:
            self.warned_roles.add(name)
            log.warning("kubernetes discovery: EndpointSlice %s has label %s=%r, expected one "
                        "of %s; its endpoints serve both phases", name, ROLE_LABEL, role,
                        " | ".join(ROLES))
        ports = [p.get("name") or "" for p in obj.get("ports") or ()]
        if len(ports) > 1 and self.port_name not in ports and name not in self.warned_ports:
            self.warned_ports.add(name)
            log.warning("kubernetes discovery: EndpointSlice %s has no port named %r (ports %s); "
                        "its endpoints are ignored", name, self.port_name, ports)


class KubernetesDiscovery:
    def __init__(self, namespace: str, service: str, port_name: str = "http",
                 scheme: str = "http", kubeconfig: str | None = None, client: Any = None, *,
                 watch_timeout: float = 300.0, backoff: Backoff | None = None,
                 rng: Callable[[], float] = random.random,
                 label_selector: str | None = None) -> None:
        if client is None and importlib.util.find_spec("lightkube") is None:
            raise ImportError("discovery.type kubernetes needs lightkube: "
                              "pip install 'prefix-router[kubernetes]'")
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.scheme = scheme
        self.kubeconfig = kubeconfig
        self.label_selector = label_selector
        self.watch_timeout = watch_timeout
        self._client = client
        self.backoff = backoff or Backoff(base=0.25, cap=30.0)
        self._rng = rng
        self._failing = False
        self.relists = 0
        self.watches = 0
        self._opened_at: float | None = None  # when the current watch got its 200
        self._delivered = False  # whether the current watch delivered an event

    @property
    def selector(self) -> str:
        """``label_selector`` if set (several Services), else the one Service's slices."""
        return self.label_selector or f"{SERVICE_NAME_LABEL}={self.service}"

    @property
    def selector_labels(self) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self.selector.split(","))

    def make_client(self) -> Any:
        """A lightkube AsyncClient: the kubeconfig file if set, else in-cluster credentials."""
        from lightkube import AsyncClient, KubeConfig

        if self.kubeconfig:
            config = KubeConfig.from_file(self.kubeconfig)
        else:
            config = KubeConfig.from_service_account()
        return AsyncClient(config=config, namespace=self.namespace, trust_env=False)

    async def run(self, publish: Publish) -> None:
        membership = Membership(publish, "kubernetes")
        state = SliceState(self.port_name, self.scheme)
        client = self._client
        owned = client is None
        try:
            while True:
                delay = 0.0
                try:
                    if client is None:
                        client = self.make_client()
                    if state.resource_version is None:
                        await self._list(client, state)
                        membership.update(state.endpoints())
                    await self._watch(client, state, membership)
                    if self._watch_was_useful():
                        self.backoff.reset()
                    else:
                        delay = self.backoff.next()
                except ResourceVersionGone as exc:
                    log.info("kubernetes discovery: resourceVersion %s gone (%s); relisting",
                             state.resource_version, exc)
                    state.resource_version = None
                    if self._watch_was_useful():
                        self.backoff.reset()
                    if self.backoff.failures:  # repeated 410s: back off; the first relists at once
                        delay = self.backoff.next()
                    else:
                        self.backoff.failures = 1
                except Exception as exc:  # never let discovery take the router down
                    if self._watch_was_useful():  # a drop after a good watch: start over
                        self.backoff.reset()
                    delay = self.backoff.next()
                    self._mark_failing(exc, delay)
                    if not membership.published:
                        membership.update([])
                if delay:
                    await asyncio.sleep(delay)
        finally:
            if owned and client is not None:
                await client.close()

    def _watch_was_useful(self) -> bool:
        """The last watch delivered events or stayed open > 1 s (so retrying it is not a loop)."""
        opened, self._opened_at = self._opened_at, None
        delivered, self._delivered = self._delivered, False
        return delivered or (opened is not None and time.monotonic() - opened > 1.0)

    def _mark_failing(self, exc: BaseException, delay: float) -> None:
        code = _status_code(exc)
        what = f"HTTP {code}: {exc}" if code else f"{type(exc).__name__}: {exc}"
        if not self._failing:
            log.warning("kubernetes discovery: API server failing (%s); keeping the last "
                        "membership, retrying with backoff (next in %.2fs)", what, delay)
        else:
            log.debug("kubernetes discovery: still failing (%s); next retry in %.2fs", what, delay)
        self._failing = True

    def _mark_ok(self, what: str) -> None:
        if self._failing:
            log.info("kubernetes discovery: API server reachable again (%s)", what)
        self._failing = False

    async def _list(self, client: Any, state: SliceState) -> None:
        from lightkube.resources.discovery_v1 import EndpointSlice

        listing = client.list(EndpointSlice, namespace=self.namespace,
                              labels=self.selector_labels)
        items = [item.to_dict() async for item in listing]
        state.replace(items, str(listing.resourceVersion))
        self.relists += 1
        self._mark_ok(f"listed {len(items)} slices at resourceVersion {state.resource_version}")
        log.info("kubernetes discovery: %s/%s has %d EndpointSlices (resourceVersion %s)",
                 self.namespace, self.selector, len(items), state.resource_version)

    async def _watch(self, client: Any, state: SliceState, membership: Membership) -> None:
        """One watch request, until the server ends it."""
        from lightkube.resources.discovery_v1 import EndpointSlice

        server_timeout = int(self.watch_timeout * (1 + self._rng()))
        generic = client._client
        br = generic.prepare_request(
            "list", res=EndpointSlice, namespace=self.namespace, watch=True,
            params={"labelSelector": self.selector, "resourceVersion": state.resource_version,
                    "allowWatchBookmarks": "true", "timeoutSeconds": server_timeout})
        br.timeout = generic._watch_timeout  # no read timeout: the deadline below bounds it
        self._delivered = False
        async with asyncio.timeout(server_timeout + 30):
            response = await generic.send(generic.build_adapter_request(br), stream=True)
            try:
                if response.status_code == 410:
                    raise ResourceVersionGone("HTTP 410 on watch")
                if response.status_code >= 400:
                    body = (await response.aread())[:300].decode("utf-8", "replace")
                    raise WatchError(f"HTTP {response.status_code} on watch: {body}")
                self.watches += 1
                self._opened_at = time.monotonic()
                self._mark_ok(f"watching from resourceVersion {state.resource_version}")
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    if state.apply(json.loads(line)):
                        membership.update(state.endpoints())
                    self._delivered = True
            finally:
                await response.aclose()
