"""The `make bench` compare cells: each workload, its fleet, its rate, and its requests.

Also the 64-replica simulation workloads of `make bench` (`SIM_WORKLOADS`). Shared by
`loadtest.bench` (which runs every cell over HTTP against every setup) and
`loadtest.simulate` (``--bench-cell``: the same requests and fleet in virtual time). A
`BenchWorkload` is sized for `BASE_REPLICAS` replicas; `BenchWorkload.at(n)` scales its rate and
its request count by n/4 on the same KV per replica, so every fleet size sees the same load per
replica and the same traffic time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loadtest.compare import FleetParams
from loadtest.runner import DEFAULT_TRACE
from loadtest.workloads import Request, WorkloadSpec, generate

__all__ = ["BASE_REPLICAS", "FLEETS", "SIM_WORKLOADS", "SPLIT_FLEETS", "WORKLOADS",
           "BenchWorkload", "SimWorkload", "cell_requests", "mooncake_slice"]

BASE_REPLICAS = 4


@dataclass(frozen=True)
class BenchWorkload:
    name: str
    requests: int
    rate: float
    fleet: FleetParams
    spec: dict[str, Any]
    max_input_tokens: int | None = None  # mooncake: see `mooncake_slice`

    @property
    def key(self) -> str:
        """The cell's name in results and figures."""
        return f"{self.name}, {self.fleet.replicas} replicas"

    def at(self, replicas: int) -> BenchWorkload:
        """This workload on ``replicas`` replicas: rate and requests scaled by replicas / 4."""
        k = replicas / self.fleet.replicas
        return replace(self, requests=round(self.requests * k), rate=self.rate * k,
                       fleet=replace(self.fleet, replicas=replicas))


# Sized for 4 replicas (see the module docstring for the scaling). The rates load the fleet:
# round-robin queues behind its misses, and a replica that gets all of hot-prefix's hot prompt
# is overloaded (its users paste 300 new tokens a turn: cached short questions alone cost a
# replica so little that concentrating them never hurts).
_SMALL_PROMPTS = {"prompts": 4, "min_prompt_tokens": 500, "max_prompt_tokens": 1500}
WORKLOADS = (
    BenchWorkload("shared-prefix", 160, 20.0, FleetParams(), {}),
    BenchWorkload("hot-prefix", 160, 20.0, FleetParams(), {"turns": 4, "user_tokens": 300}),
    BenchWorkload("multi-turn", 160, 20.0, FleetParams(), {"turns": 4}),
    BenchWorkload("mooncake", 80, 8.0, FleetParams(kv_blocks=2048, speed=2.0),
                  {"trace_path": DEFAULT_TRACE, "max_output_tokens": 32},
                  max_input_tokens=9000),
    BenchWorkload("rag", 120, 14.0, FleetParams(kv_blocks=1024),
                  {**_SMALL_PROMPTS, "min_doc_tokens": 150, "max_doc_tokens": 500, "turns": 3}),
    BenchWorkload("agent", 120, 12.0, FleetParams(kv_blocks=2048, speed=2.0), _SMALL_PROMPTS),
)
FLEETS = (4, 8)
SPLIT_FLEETS = (8,)  # cells that also measure several router processes


@dataclass(frozen=True)
class SimWorkload:
    """A workload of the 64-replica simulation part of `make bench` (`loadtest.bench`)."""

    name: str
    requests: int
    rate: float
    kv_blocks: int
    spec: dict[str, Any] = field(default_factory=dict)
    replicas: int = 64


SIM_WORKLOADS = (
    SimWorkload("shared-prefix", 3000, 240.0, 768, {"prompts": 256}),
    SimWorkload("multi-turn", 3000, 240.0, 768, {"prompts": 256, "turns": 4}),
    SimWorkload("rag", 3000, 200.0, 1024, {**_SMALL_PROMPTS, "prompts": 16,
                                           "min_doc_tokens": 150, "max_doc_tokens": 500,
                                           "turns": 3}),
    SimWorkload("agent", 2000, 60.0, 2048, {**_SMALL_PROMPTS, "prompts": 8}),
)


def mooncake_slice(trace: Path, out: Path, requests: int, max_input_tokens: int) -> Path:
    """A scaled-down replay that keeps the trace's sharing: whole conversations.

    A conversation is the requests sharing their second block id (the first is the system
    prompt every record starts with). Conversations with >= 2 turns are taken in order of first
    appearance, with every turn of at most ``max_input_tokens``, until ``requests`` records;
    records keep their trace order and timestamps (the runner rescales time to the bench rate).
    Taking the first N records instead would keep almost no follow-up turns.
    """
    recs = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines() if line]
    conversations: dict[int, list[int]] = {}
    for i, r in enumerate(recs):
        if len(r["hash_ids"]) > 1 and r["input_length"] <= max_input_tokens:
            conversations.setdefault(r["hash_ids"][1], []).append(i)
    chosen: list[int] = []
    for turns in sorted((v for v in conversations.values() if len(v) >= 2), key=lambda v: v[0]):
        if len(chosen) + len(turns) <= requests:
            chosen += turns
        if len(chosen) >= requests - 1:
            break
    out.write_text("".join(json.dumps(recs[i]) + "\n" for i in sorted(chosen)))
    return out


def cell_requests(w: BenchWorkload, seed: int, workdir: Path) -> tuple[list[Request], dict[str, Any]]:
    """The requests of cell ``w`` (mooncake: its slice, written under ``workdir``) and their
    description for the report."""
    spec = dict(w.spec)
    meta: dict[str, Any] = {"name": w.name, "rate": w.rate, "seed": seed}
    if w.max_input_tokens:
        workdir.mkdir(parents=True, exist_ok=True)
        spec["trace_path"] = str(mooncake_slice(Path(spec["trace_path"]), workdir / "slice.jsonl",
                                                w.requests, w.max_input_tokens))
        meta["slice"] = (f"whole conversations (>= 2 turns, <= {w.max_input_tokens} input "
                         "tokens per turn) in order of first appearance")
    reqs = generate(WorkloadSpec(w.name, requests=w.requests, rate=w.rate, seed=seed, **spec))
    meta["requests"] = len(reqs)
    meta.update({k: v for k, v in w.spec.items() if k != "trace_path"})
    return reqs, meta
