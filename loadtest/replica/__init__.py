"""The vLLM-faithful simulated replica (see docs/simulator.md).

Public API: `ReplicaConfig` (every option), `Replica` (the ASGI app), `FaultSpec`, `serve`
(run one replica in this process) and `scrape` (read a replica's /metrics).
"""

from __future__ import annotations

from .config import ReplicaConfig
from .faults import FaultSpec
from .process import serve
from .scrape import scrape
from .server import Replica

__all__ = ["FaultSpec", "Replica", "ReplicaConfig", "scrape", "serve"]
