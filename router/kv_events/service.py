"""Precise routing, assembled: the index, the request keys and the subscribers of one app.

`KvEvents(settings, metrics)` is what `router.app.RouterApp` builds when
``routing.kv_events.enabled`` (importing this module needs the ``kv`` extra): ``index`` (a
`router.kv_events.index.KvIndex` over a fresh approximate index) and ``exact`` (the
`router.routing.ExactKeys` hook) go to the `router.routing.Router`; ``update`` follows the
membership; ``start`` / ``stop`` run in the app's lifespan. Constructing it loads the tokenizer
and chat template (a bad file fails start-up, not the first request) and starts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from router.chunks import Chunks
from router.kv_events.index import KvIndex, PreciseIndex
from router.kv_events.request_keys import RequestKeys
from router.kv_events.subscriber import KvSubscribers
from router.metrics import RouterMetrics
from router.models import Pool
from router.prefix_index import ApproxIndex
from router.replicas import ReplicaState
from router.settings import Settings

__all__ = ["KvEvents"]

log = logging.getLogger("prefix_router.kv_events")


class KvEvents:
    def __init__(self, settings: Settings, metrics: RouterMetrics) -> None:
        r = settings.routing
        self.precise = PreciseIndex(r.kv_events.speculative_ttl)
        self.index = KvIndex(ApproxIndex(r.kv_capacity_tokens, r.index_max_entries),
                             self.precise)
        self.keys = RequestKeys(r.tokenizer, r.chat_template)
        self.keys.load()
        source, warning = self.keys.source()
        if warning:
            log.warning("routing.tokenizer: %s", warning)
        else:
            log.info("routing.tokenizer: tokenising as vLLM does with %s", source)
        self.subscribers = KvSubscribers(r.kv_events, settings.replicas, self.precise, metrics)

    def exact(self, path: str, body: Mapping[str, Any] | None,
              pool: Pool | None) -> Chunks | None:
        """`router.routing.ExactKeys`: keys at the live replicas' block size (None while no
        replica's stream is live)."""
        self.subscribers.catch_up()
        bs = self.precise.block_size()
        if not bs:
            return None
        adapter = pool.label if pool is not None and pool.adapter else None
        return self.keys.exact(path, body, adapter, bs)

    def update(self, states: Iterable[ReplicaState]) -> None:
        self.subscribers.update(states)

    async def start(self) -> None:
        await self.subscribers.start()

    async def stop(self) -> None:
        await self.subscribers.stop()
