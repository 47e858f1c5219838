"""``--kv-transfer-config``: vLLM's disaggregated prefill (NixlConnector) as the simulator plays it.

Config. The JSON of vLLM 0.32.0's ``KVTransferConfig`` (vllm/config/kv_transfer.py): keys
``kv_connector``, ``engine_id`` (a fresh uuid4 when unset, so a restarted instance is another
engine), ``kv_buffer_device``, ``kv_role`` (``kv_producer`` | ``kv_consumer`` | ``kv_both``;
required with a connector), ``kv_port``, ``kv_connector_extra_config``,
``kv_connector_module_path``, ``enable_permute_local_kv``, ``kv_load_failure_policy``. Unknown
keys are an error. Only ``NixlConnector`` is simulated; its ``kv_lease_duration`` (extra config,
30 s as in vLLM) is how long a prefill holds a request's KV for the decode that should read it.

Protocol (field names exactly as vLLM 0.32.0's NixlConnector, nixl/pull_scheduler.py):

* a *prefill* request carries ``kv_transfer_params`` with ``do_remote_decode: true``. When it
  finishes, the response's top-level ``kv_transfer_params`` is ``{do_remote_prefill: true,
  do_remote_decode: false, remote_block_ids: [[ids...]], remote_engine_id, remote_request_id,
  remote_host, remote_port, tp_size: 1, dcp_size: 1, pp_size: 1, remote_num_tokens,
  remote_blocks_expiry_time: null, transfer_mode: "pull", remote_prefill_cached_tokens}`` (the
  last one vLLM's scheduler adds: the prefill's own cache hit, which the decode instance then
  reports as its ``cached_tokens``), and the instance holds the request's prompt blocks
  (`Ledger`) until a decode reads them or the lease expires;
* a *decode* request carries those params (``do_remote_prefill: true``). The instance reads the
  blocks from ``remote_host:remote_port`` - here the prefill's own HTTP listener stands in for
  NIXL's side channel: ``POST /kv_transfer/read`` (`Ledger.read`) - checks that they are this
  prompt's blocks, waits ``--kv-transfer-us-per-block`` per block its own prefix cache lacks
  (vLLM pulls only those; asynchronously, as NIXL loads between engine steps), and its engine
  then counts those tokens as computed: it prefills only what is left (at least one token, as
  for a local hit).
* missing fields, an unreachable or other engine at that address, a request id it does not hold
  (already read, expired, never held) or blocks of another prompt are an error response
  (`TransferError`; vLLM's default ``kv_load_failure_policy`` is ``fail`` too) - never a silent
  recompute.

Cost: O(blocks) per transfer; the ledger is a dict pruned of expired entries on every hold.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from .kv_config import flag_object

__all__ = ["CONNECTORS", "Held", "KvTransferConfig", "Ledger", "READ_PATH", "ROLES",
           "TransferError", "parse_kv_transfer_config", "remote_of"]

CONNECTORS = ("NixlConnector",)
ROLES = ("kv_producer", "kv_consumer", "kv_both")
READ_PATH = "/kv_transfer/read"
_REMOTE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port",
                "remote_block_ids")


class TransferError(ValueError):
    """A KV transfer that cannot happen; ``status`` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KvTransferConfig:
    kv_connector: str | None = None
    engine_id: str | None = None
    kv_buffer_device: str = "cpu"
    kv_role: str | None = None
    kv_port: int = 14579
    kv_connector_extra_config: Mapping[str, Any] = field(default_factory=dict)
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: str = "fail"

    def __post_init__(self) -> None:
        if self.engine_id is None:
            object.__setattr__(self, "engine_id", str(uuid.uuid4()))
        checks = {
            "kv_connector": self.kv_connector in CONNECTORS,
            "engine_id": isinstance(self.engine_id, str) and self.engine_id != "",
            "kv_role": self.kv_role in ROLES,
            "kv_port": type(self.kv_port) is int and 0 < self.kv_port < 65536,
            "kv_connector_extra_config": isinstance(self.kv_connector_extra_config, dict),
            "enable_permute_local_kv": isinstance(self.enable_permute_local_kv, bool),
            "kv_load_failure_policy": self.kv_load_failure_policy in ("recompute", "fail"),
            "kv_lease_duration": _positive(self.lease_seconds),
        }
        for key, ok in checks.items():
            if not ok:
                value = (self.kv_connector_extra_config.get("kv_lease_duration")
                         if key == "kv_lease_duration" else getattr(self, key))
                expected = {"kv_connector": "one of " + " | ".join(CONNECTORS) + " (simulated)",
                            "kv_role": "one of " + " | ".join(ROLES)}.get(key, "a valid value")
                raise ValueError(f"--kv-transfer-config: {key}: expected {expected}, "
                                 f"got {value!r}")

    @property
    def lease_seconds(self) -> float:
        """How long a prefill holds a request's KV for its decode (vLLM: kv_lease_duration)."""
        value = self.kv_connector_extra_config.get("kv_lease_duration", 30)
        return float(value) if isinstance(value, int | float) and \
            not isinstance(value, bool) else -1.0


def _positive(v: float) -> bool:
    return v > 0


_KEYS = frozenset(f.name for f in fields(KvTransferConfig))


def parse_kv_transfer_config(text: str) -> KvTransferConfig:
    """The config in a ``--kv-transfer-config`` JSON object; ValueError naming what is wrong."""
    return KvTransferConfig(**flag_object("--kv-transfer-config", text, _KEYS))


@dataclass(frozen=True)
class Held:
    """One finished prefill's KV, held for the decode that reads it."""

    block_ids: tuple[int, ...]
    hashes: tuple[int, ...]  # the prompt's full-block hashes
    num_tokens: int  # prompt tokens computed (remote_num_tokens)
    expires: float  # monotonic clock


class Ledger:
    """The prefill side: requests whose KV a decode may read, until read or expired.

    Block ids are opaque per transfer (consecutive ints, never reused); a read names them and
    must match. ``clock`` is injectable for tests."""

    def __init__(self, config: KvTransferConfig, host: str, port: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.host = host
        self.port = port
        self._clock = clock
        self._held: dict[str, Held] = {}
        self._next_block = 0
        self.reads = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, request_id: str, hashes: Sequence[int], num_tokens: int,
             block_size: int, cached_tokens: int = 0) -> dict[str, Any]:
        """Hold a finished prefill's blocks; the ``kv_transfer_params`` its response returns."""
        now = self._clock()
        for rid in [r for r, h in self._held.items() if h.expires <= now]:
            del self._held[rid]
            self.expired += 1
        n = -(-num_tokens // block_size)  # every block the prompt touches, the partial one too
        ids = tuple(range(self._next_block, self._next_block + n))
        self._next_block += n
        self._held[request_id] = Held(ids, tuple(hashes), num_tokens,
                                      now + self.config.lease_seconds)
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": [list(ids)], "remote_engine_id": self.config.engine_id,
                "remote_request_id": request_id, "remote_host": self.host,
                "remote_port": self.port, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
                "remote_num_tokens": num_tokens, "remote_blocks_expiry_time": None,
                "transfer_mode": "pull", "remote_prefill_cached_tokens": cached_tokens}

    def read(self, body: Any) -> dict[str, Any]:
        """A decode reads (and so releases) a held request: the answer to `READ_PATH`."""
        if not isinstance(body, dict):
            raise TransferError("expected a JSON object", 400)
        if body.get("engine_id") != self.config.engine_id:
            raise TransferError(f"unknown engine {body.get('engine_id')!r} (this is "
                                f"{self.config.engine_id!r})", 404)
        rid = body.get("request_id")
        if not isinstance(rid, str):
            raise TransferError(f"request_id: expected a string, got {rid!r}", 400)
        held = self._held.get(rid)
        if held is None or held.expires <= self._clock():
            self._held.pop(rid, None)
            raise TransferError(f"request {rid!r} holds no KV here (already read, lease "
                                f"expired or never prefilled)", 404)
        if body.get("block_ids") != list(held.block_ids):
            raise TransferError(f"request {rid!r}: block ids do not match what it holds", 409)
        del self._held[rid]
        self.reads += 1
        return {"hashes": list(held.hashes), "num_tokens": held.num_tokens}


def remote_of(params: Mapping[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """(host, port, read body) of a decode request's ``kv_transfer_params``; TransferError
    (400) naming what is missing or malformed."""
    missing = [k for k in _REMOTE_KEYS if params.get(k) in (None, "", [])]
    if missing:
        raise TransferError("kv_transfer_params: do_remote_prefill needs "
                            + ", ".join(missing), 400)
    blocks = params["remote_block_ids"]
    if isinstance(blocks, list) and blocks and all(isinstance(g, list) for g in blocks):
        blocks = blocks[0]  # one list per KV cache group; a plain model has one group
    port = params["remote_port"]
    if not (isinstance(blocks, list) and all(type(b) is int for b in blocks)) or \
            type(port) is not int or not isinstance(params["remote_host"], str):
        raise TransferError("kv_transfer_params: remote_block_ids, remote_host or remote_port "
                            "malformed", 400)
    return params["remote_host"], port, {"engine_id": params["remote_engine_id"],
                                         "request_id": params["remote_request_id"],
                                         "block_ids": blocks}
