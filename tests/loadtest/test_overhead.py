"""overhead: proxy CPU from /proc, added latency against direct, ratios from one run."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from loadtest.overhead import OverheadConfig, measure, ratios
from loadtest.setups import Setup, cpu_seconds


def test_cpu_seconds_counts_this_process_and_grows() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn ~50 ms of CPU
        pass
    after = cpu_seconds(os.getpid())
    assert after >= before + 0.04  # nanoseconds: all of the ~50 ms, whatever else runs
    assert cpu_seconds(2**22 + 12345) == 0.0  # no such process


def _row(setup: str, mode: str, conc: int, cpu_req: float | None,
         cpu_chunk: float | None = None, added: float | None = None) -> dict[str, Any]:
    return {"setup": setup, "mode": mode, "concurrency": conc, "cpu_per_request": cpu_req,
            "cpu_per_chunk": cpu_chunk, "added_p50": added}


def test_ratios_use_the_high_concurrency_cells_of_one_run() -> None:
    rows = [
        _row("router-prefix", "plain", 1, 9.0, added=0.0004),
        _row("router-prefix", "plain", 16, 0.0010),
        _row("router-prefix", "stream", 1, 9.0, added=0.0020),
        _row("router-prefix", "stream", 16, 0.0030, 0.0030 / 64),
        _row("sglang-cache_aware", "plain", 16, 0.0005),
        _row("sglang-cache_aware", "stream", 16, 0.0020, 0.0020 / 64),
        _row("nginx", "plain", 16, 0.0001),
    ]
    r = ratios(rows)
    assert r["cpu_per_request_vs_sglang"] == pytest.approx(2.0)
    assert r["cpu_per_chunk_vs_sglang"] == pytest.approx(1.5)
    assert r["cpu_per_request_vs_nginx"] == pytest.approx(10.0)
    assert "cpu_per_chunk_vs_nginx" not in r  # nginx has no streamed cell here
    assert r["added_p50_c1_plain"] == pytest.approx(0.0004)
    assert r["added_p50_c1_stream"] == pytest.approx(0.0020)
    # token-paced cells, when measured, are the ones the CPU-per-chunk ratio uses
    paced = [*rows, _row("router-prefix", "paced", 16, 0.0032, 0.0032 / 64),
             _row("sglang-cache_aware", "paced", 16, 0.0016, 0.0016 / 64)]
    assert ratios(paced)["cpu_per_chunk_vs_sglang"] == pytest.approx(2.0)
    # the stack's floor, when measured, is compared both ways
    floor = ratios([*rows, _row("passthrough", "plain", 16, 0.0008),
                    _row("passthrough", "plain", 1, 9.0, added=0.0003)])
    assert floor["cpu_per_request_vs_passthrough"] == pytest.approx(1.25)
    assert floor["passthrough_cpu_per_request_vs_sglang"] == pytest.approx(1.6)
    assert floor["passthrough_added_p50_c1_plain"] == pytest.approx(0.0003)
    # direct cells measure the replica: its capacity per core against the router's
    direct = ratios([*rows, _row("direct", "plain", 16, 0.00025), _row("direct", "stream", 16, None)])
    assert direct["replica_capacity_vs_router_plain"] == pytest.approx(4.0)
    assert "replica_capacity_vs_router_stream" not in direct
    # the capacity cells (a client that only reads bodies), when measured, are the ones used
    cap = [{"setup": "direct", "mode": "plain", "cpu_per_request": 0.0002},
           {"setup": "router-prefix", "mode": "plain", "cpu_per_request": 0.0007},
           {"setup": "direct", "mode": "stream", "cpu_per_request": 0.0002},
           {"setup": "router-prefix", "mode": "stream", "cpu_per_request": 0.0008}]
    busy = ratios([*rows, _row("direct", "plain", 16, 0.00025)], cap)
    assert busy["replica_capacity_vs_router_plain"] == pytest.approx(3.5)
    assert busy["replica_capacity_vs_router_stream"] == pytest.approx(4.0)
    assert busy["cpu_per_request_vs_sglang"] == pytest.approx(2.0)  # the others: unchanged


@pytest.mark.slow
def test_measure_router_against_direct(tmp_path: Path) -> None:
    cfg = OverheadConfig(replicas=1, concurrency=4, latency_requests=10, cpu_requests=40,
                         chunks=16, rounds=1, paced_ms=2.0, paced_requests=8,
                         capacity_requests=60)
    res = measure([Setup("direct"), Setup("passthrough"), Setup("router", "prefix")], cfg,
                  tmp_path)
    rows = {(r["setup"], r["mode"], r["concurrency"]): r for r in res["rows"]}
    assert len(rows) == 15 and res["skipped"] == {}
    for (setup, mode, conc), r in rows.items():
        assert r["errors"] == 0
        assert r["requests"] == (10 if conc == 1 else 8 if mode == "paced" else 40)
        assert r["latency"]["p50"] > 0
        if setup == "direct":   # the replica's own CPU
            assert r["added_p50"] == 0.0 and r["cpu_per_request"] >= 0
        else:
            # a proxy that relayed requests spent CPU on them; read in ns, never zero
            assert r["cpu_per_request"] > 0
        if mode in ("stream", "paced"):
            assert r["chunks_per_request"] == 16
    paced = rows[("router-prefix", "paced", 4)]
    # 16 tokens 2 ms apart: a paced stream cannot be faster than ~30 ms end to end
    assert paced["latency"]["p50"] >= 0.025
    assert [r["mode"] for r in res["rows"]][:5] == ["plain", "plain", "stream", "stream", "paced"]
    assert rows[("passthrough", "plain", 4)]["cpu_per_request"] > 0
    assert "cpu_per_request_vs_passthrough" in res["ratios"]
    router_stream = rows[("router-prefix", "stream", 4)]
    assert router_stream["cpu_per_chunk"] == pytest.approx(router_stream["cpu_per_request"] / 16)
    assert "added_p50_c1_plain" in res["ratios"]
    # capacity cells: direct and the router only, every request answered
    cap = {(c["setup"], c["mode"]): c for c in res["capacity"]}
    assert set(cap) == {(s, m) for s in ("direct", "router-prefix") for m in ("plain", "stream")}
    for c in cap.values():
        assert c["requests"] == 60 and c["errors"] == 0 and c["throughput"] > 0
    # the capacity ratio is router CPU over replica CPU (both read in ns: never zero)
    for mode in ("plain", "stream"):
        direct_cpu = cap[("direct", mode)]["cpu_per_request"]
        assert direct_cpu > 0
        assert res["ratios"][f"replica_capacity_vs_router_{mode}"] == pytest.approx(
            cap[("router-prefix", mode)]["cpu_per_request"] / direct_cpu)
