"""``--kv-events-config``: the JSON of vLLM's flag, parsed and validated (no ZMQ, no msgpack here).

The fields and defaults are vLLM 0.32.0's ``KVEventsConfig`` (vllm/config/kv_events.py):
``enable_kv_cache_events`` (false), ``publisher`` ("zmq" when enabled, else "null"),
``endpoint`` ("tcp://*:5557"), ``replay_endpoint`` (none), ``buffer_steps`` (10,000), ``hwm``
(100,000), ``max_queue_size`` (100,000) and ``topic`` (""). An endpoint containing ``*`` or
``::``, or an ``ipc://`` / ``inproc://`` one, is bound; any other is connected to, as vLLM does.
Unknown keys are an error (a typo would otherwise silently publish nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["PUBLISHERS", "KvEventsConfig", "flag_object", "is_bind_endpoint",
           "parse_kv_events_config",
           "split_tcp", "with_port"]

PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KvEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher",
                               "zmq" if self.enable_kv_cache_events else "null")
        checks = {
            "enable_kv_cache_events": isinstance(self.enable_kv_cache_events, bool),
            "publisher": self.publisher in PUBLISHERS,
            "endpoint": isinstance(self.endpoint, str) and "://" in self.endpoint,
            "replay_endpoint": self.replay_endpoint is None or (
                isinstance(self.replay_endpoint, str) and "://" in self.replay_endpoint),
            "buffer_steps": _positive(self.buffer_steps),
            "hwm": type(self.hwm) is int and self.hwm >= 0,  # 0: no limit (ZMQ)
            "max_queue_size": _positive(self.max_queue_size),
            "topic": isinstance(self.topic, str),
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"--kv-events-config: {key}: invalid value "
                                 f"{getattr(self, key)!r}")

    @property
    def publishes(self) -> bool:
        """Whether events go out at all (enabled with the zmq publisher)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})


def _positive(value: Any) -> bool:
    return type(value) is int and value > 0


_KEYS = frozenset(f.name for f in fields(KvEventsConfig))


def flag_object(flag: str, text: str, keys: frozenset[str]) -> dict[str, Any]:
    """The JSON object a vLLM config flag (``--kv-events-config``, ``--kv-transfer-config``)
    carries, checked to name only ``keys``; ValueError naming the flag and what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{flag}: expected a JSON object")
    unknown = sorted(set(data) - keys)
    if unknown:
        raise ValueError(f"{flag}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(keys))})")
    return data


def parse_kv_events_config(text: str) -> KvEventsConfig:
    """The config in a ``--kv-events-config`` JSON object; ValueError naming what is wrong."""
    return KvEventsConfig(**flag_object("--kv-events-config", text, _KEYS))


def is_bind_endpoint(endpoint: str) -> bool:
    """Whether the publisher binds ``endpoint`` (else it connects), vLLM's rule."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def split_tcp(url: str) -> tuple[str, str] | None:
    """(``tcp://HOST``, the text after the last ``:``) of a ``tcp://`` endpoint; None otherwise."""
    base, sep, port = url.rpartition(":")
    return (base, port) if sep and url.startswith("tcp://") else None


def with_port(config: KvEventsConfig, endpoint: int, replay: int | None) -> KvEventsConfig:
    """``config`` with the TCP ports of its endpoints replaced (a fleet gives every replica its
    own); ``replay`` None keeps the replay endpoint off if it was off."""
    def swap(url: str, port: int) -> str:
        parts = split_tcp(url)
        if parts is None:
            raise ValueError(f"--kv-events-config: cannot set the port of {url!r}")
        return f"{parts[0]}:{port}"

    return replace(
        config, endpoint=swap(config.endpoint, endpoint),
        replay_endpoint=None if config.replay_endpoint is None or replay is None
        else swap(config.replay_endpoint, replay))
