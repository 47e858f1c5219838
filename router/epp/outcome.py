"""What one picked request did on its replica, learned without being in the data path.

`Outcome` is, for the endpoint picker, what `router.proxy.Forwarder._one` is for ``serve``: it
drives the request's `router.routing.Routed` hooks and the same counters, from what the gateway
reports instead of from a proxied exchange:

- ``start(replica)`` when the EPP names the endpoints (the gateway dispatches now):
  ``ReplicaState.in_flight`` and ``prefix_router_in_flight`` up, ``Routed.started`` (queued
  prefill, the in-flight prefix set, the recent-load counts);
- ``served(replica, status)`` when the response headers come back through the response phase
  (the replica is the one the gateway reports in ``x-gateway-destination-endpoint-served``,
  else the pick): ``Routed.served`` - for a status below 400 the request's chunks are written
  to the prefix index for that replica, once; a gateway retry onto another endpoint first ends
  the attempt on the pick and starts one on the endpoint that answered;
- ``end()`` once the response ended or the stream is gone, however that happened:
  ``Routed.ended``, in-flight down, ``requests_total`` / the duration and TTFB histograms,
  passive health (a 5xx is a failure, another answer a success; no answer says nothing) and the
  predicted-vs-reported cached tokens (`router.app.RouterApp.settle`, what ``serve`` runs).

Invariant: every ``start`` is matched by exactly one release (`end`, or the switch to another
replica), so the in-flight counts return to zero when the stream ends, errs or is cancelled.
Cost: O(1) per call besides the `Routed` hooks.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from router.accesslog import CLIENT_CLOSED, AccessRecord
from router.replicas import ReplicaState
from router.routing import Routed

if TYPE_CHECKING:
    from router.app import RouterApp

__all__ = ["Outcome"]


class Outcome:
    __slots__ = ("_core", "_replica", "_t0", "_ttfb", "record", "routed", "status")

    def __init__(self, core: RouterApp, routed: Routed, record: AccessRecord) -> None:
        self._core = core
        self.routed = routed
        self.record = record
        self.status = CLIENT_CLOSED  # until a response head says otherwise
        self._replica: ReplicaState | None = None
        self._t0 = 0.0
        self._ttfb: float | None = None

    @property
    def replica(self) -> ReplicaState | None:
        """The replica with the open attempt (None before `start` and after `end`)."""
        return self._replica

    def start(self, replica: ReplicaState) -> None:
        assert self._replica is None, "one open attempt at a time"
        self._replica = replica
        self._t0 = time.perf_counter()
        replica.in_flight += 1
        self._core.metrics.dispatched(replica.name)
        self.routed.started(replica)
        self.record.replica = replica.name
        self.record.attempts += 1

    def served(self, replica: ReplicaState, status: int) -> None:
        """The response head came back from ``replica`` (the gateway may have retried)."""
        if self._replica is None:
            return
        if replica is not self._replica:  # the pick failed; the gateway went down the list
            self.status = 502
            self._release(health=False)
            self.start(replica)
        self.status = status
        self._ttfb = time.perf_counter() - self._t0
        self.record.ttfb_ms = self._ttfb * 1000
        self.routed.served(replica, status)

    def end(self) -> None:
        """The exchange is over; idempotent."""
        if self._replica is None:
            return
        self._release(health=True)
        self.record.status = self.status
        self._core.settle(self.routed)

    def _release(self, health: bool) -> None:
        replica = self._replica
        assert replica is not None
        self._replica = None
        replica.in_flight -= 1
        self.routed.ended(replica)
        core = self._core
        core.metrics.finished(replica.name, self.record.branch or "", self.status, self._ttfb,
                              time.perf_counter() - self._t0, self.record.model)
        if health and self.status != CLIENT_CLOSED:
            if self.status >= 500:
                core.health.record_failure(replica, "5xx")
            else:
                core.health.record_success(replica)
        self._ttfb = None
