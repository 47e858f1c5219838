"""Every setting of a simulated replica, declared once.

`ReplicaConfig` is the single source: the argparse flags (`add_arguments`), the config object the
server and engine read (`from_namespace`) and the argv a fleet passes to a child process
(`to_argv`) are all derived from its fields, so a new option is one new field.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .kv_config import parse_kv_events_config
from .kv_transfer import parse_kv_transfer_config


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")  # as router.settings (no yaml here)


@dataclass(frozen=True)
class ReplicaConfig:
    name: str = _opt("sim-0", "replica name (x-replica-name header, system_fingerprint)")
    host: str = _opt("127.0.0.1", "listen address")
    port: int = _opt(8000, "listen port")
    admin_port: int | None = _opt(
        None, "extra loopback-only listener serving /admin/* (also survives the refuse fault)")
    model: str = _opt("sim-model", "served model name (/v1/models, model_name metric label)")
    lora: tuple[str, ...] = _opt((), "a LoRA adapter this replica serves (repeatable; listed in "
                                     "/v1/models with parent = --model, as vLLM's "
                                     "--lora-modules NAME=PATH)")
    max_lora: int = _opt(1, "adapters one engine step can hold (vLLM --max-loras); a request "
                            "whose adapter does not fit waits")
    lora_load_ms: float = _opt(
        50.0, "cost of loading an adapter that is not resident into a free slot (ms, added to "
              "the step that admits its first request; the least recently used one is evicted)")
    model_path: str | None = _opt(
        None, "model_path reported by /server_info (sglang-router loads a tokenizer from it); "
              "default: the --tokenizer directory, else the model name")
    api_key: str | None = _opt(None, "require 'Authorization: Bearer KEY' on /v1/* (as vLLM --api-key)")
    tokenizer: str | None = _opt(None, "HF tokenizer.json (default: built-in ~4 chars/token)")
    chat_template: str | None = _opt(None, "Jinja chat template file (default: ChatML)")
    block_size: int = _opt(16, "KV block size in tokens")
    kv_blocks: int = _opt(8192, "KV cache capacity in blocks")
    max_num_seqs: int = _opt(256, "max requests running at once; the rest wait FIFO")
    max_num_batched_tokens: int = _opt(2048, "token budget of one engine step (prefill chunk)")
    max_model_len: int = _opt(32768, "longest prompt + max_tokens accepted (else 400)")
    default_max_tokens: int = _opt(16, "completion length when the request sets none")
    step_ms: float = _opt(10.0, "fixed cost of one engine step (ms)")
    prefill_us_per_token: float = _opt(100.0, "prefill cost per uncached prompt token (us)")
    decode_us_per_seq: float = _opt(250.0, "extra step cost per running sequence (us)")
    speed: float = _opt(1.0, "time scale: 10 = ten times faster than the timing model")
    instant: bool = _opt(False, "no timing model at all (still counts cache hits)")
    preempt: bool = _opt(
        True, "grow KV per decoded token and preempt the newest request when out of blocks; "
              "--no-preempt reserves prompt + max_tokens blocks at admission instead")
    seed: int = _opt(0, "seed of the fault-injection random draws")
    fault_error_rate: float = _opt(0.0, "fraction of requests answered with --fault-error-status")
    fault_error_status: int = _opt(500, "status of injected errors (500 or 503)")
    fault_hang_rate: float = _opt(0.0, "fraction of requests accepted and never answered")
    fault_slow: float = _opt(1.0, "slow-down factor of the timing model")
    fault_stop_after: int | None = _opt(
        None, "close the connection abruptly after K stream chunks")
    fault_exit_after: int | None = _opt(None, "exit the process when request N arrives")
    log_level: str = _opt("warning", f"log level ({', '.join(LOG_LEVELS)})")
    kv_events_config: str | None = _opt(
        None, "publish KV cache events as vLLM does: the JSON of vLLM's --kv-events-config, e.g. "
              '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
              '"endpoint": "tcp://*:5557", "topic": "kv"}\' (docs/kv-events.md)')
    kv_transfer_config: str | None = _opt(
        None, "play prefill and decode of disaggregated serving as vLLM's NixlConnector does: "
              'the JSON of vLLM\'s --kv-transfer-config, e.g. \'{"kv_connector": "NixlConnector", '
              '"kv_role": "kv_both"}\' (docs/simulator.md)')
    kv_transfer_us_per_block: float = _opt(
        80.0, "cost of reading one KV block from a remote prefill (us; a decode given "
              "kv_transfer_params waits blocks x this, outside the engine's steps)")

    def __post_init__(self) -> None:
        checks = {
            "block_size": self.block_size >= 1,
            "kv_blocks": self.kv_blocks >= 1,
            "max_num_seqs": self.max_num_seqs >= 1,
            "max_num_batched_tokens": self.max_num_batched_tokens >= 1,
            "speed": self.speed > 0,
            "fault_error_status": 400 <= self.fault_error_status <= 599,
            "fault_slow": self.fault_slow > 0,
            "fault_error_rate": 0 <= self.fault_error_rate <= 1,
            "fault_hang_rate": 0 <= self.fault_hang_rate <= 1,
            "log_level": self.log_level.lower() in LOG_LEVELS,
            "max_lora": self.max_lora >= 1,
            "kv_transfer_us_per_block": self.kv_transfer_us_per_block >= 0,
            "lora_load_ms": self.lora_load_ms >= 0,
            "lora": all(n and n != self.model for n in self.lora)
            and len(set(self.lora)) == len(self.lora),
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"{key}: invalid value {getattr(self, key)!r}")
        if self.kv_events_config is not None:
            parse_kv_events_config(self.kv_events_config)  # ValueError naming the bad key
        if self.kv_transfer_config is not None:
            parse_kv_transfer_config(self.kv_transfer_config)


_FIELDS = {f.name: f for f in dataclasses.fields(ReplicaConfig)}
_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool,
                           "tuple[str, ...]": tuple}


def _base_type(annotation: Any) -> type:
    return _TYPES[str(annotation).split("|")[0].strip()]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, *, skip: frozenset[str] = frozenset()) -> None:
    """One flag per ReplicaConfig field (bools as --x/--no-x)."""
    for f in _FIELDS.values():
        if f.name in skip:
            continue
        kind = _base_type(f.type)
        if kind is tuple:  # repeatable: --lora a --lora b
            parser.add_argument(_flag(f.name), dest=f.name, action="append", default=None,
                                metavar="NAME", help=f.metadata["help"])
        elif kind is bool:
            parser.add_argument(_flag(f.name), dest=f.name, default=f.default,
                                action=argparse.BooleanOptionalAction, help=f.metadata["help"])
        else:
            parser.add_argument(_flag(f.name), dest=f.name, type=kind, default=f.default,
                                help=f.metadata["help"])


def from_namespace(ns: argparse.Namespace, **override: Any) -> ReplicaConfig:
    values = {k: getattr(ns, k) for k in _FIELDS if hasattr(ns, k)}
    values.update(override)
    for k, f in _FIELDS.items():
        if _base_type(f.type) is tuple and k in values:
            values[k] = tuple(values[k] or ())
    return ReplicaConfig(**values)


def to_argv(options: Mapping[str, Any]) -> list[str]:
    """The `replica` flags reproducing `options` (ReplicaConfig field names); unknown keys raise."""
    unknown = sorted(set(options) - set(_FIELDS))
    if unknown:
        raise TypeError(f"unknown replica option(s): {', '.join(unknown)}")
    argv: list[str] = []
    for key, value in options.items():
        if value is None:
            continue
        kind = _base_type(_FIELDS[key].type)
        if kind is tuple:
            for item in value:
                argv += [_flag(key), str(item)]
        elif kind is bool:
            argv.append(_flag(key) if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [_flag(key), str(value)]
    return argv
