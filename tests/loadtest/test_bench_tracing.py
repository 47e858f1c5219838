"""bench_tracing: the router variants it launches really trace / really run another tree, and
its doc block survives `make bench`."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from loadtest.bench_tracing import BEGIN, END, keep_block, render, replace_block
from loadtest.fleet import Fleet
from loadtest.setups import Setup, launch, parse_setup
from tests.conftest import wait_for


@pytest.mark.parametrize(("text", "setup", "name"), [
    ("router-prefix", Setup("router", "prefix"), "router-prefix"),
    ("router-prefix+tracing", Setup("router", "prefix", tracing=True), "router-prefix+tracing"),
    ("router-prefix@/tmp/x/34f20d1", Setup("router", "prefix", source="/tmp/x/34f20d1"),
     "router-prefix@34f20d1"),
    ("nginx", Setup("nginx"), "nginx"),
])
def test_parse_setup_variants(text: str, setup: Setup, name: str) -> None:
    assert parse_setup(text) == setup and setup.name == name


@pytest.mark.parametrize("text", ["router-prefix+trace", "nginx+tracing", "direct@/tmp"])
def test_parse_setup_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_setup(text)


def test_router_tracing_setup_exports_to_its_sink(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # inherited by the router process
    with Fleet(replicas=1, instant=True, log_dir=str(tmp_path / "fleet")) as fleet:
        with launch(parse_setup("router-prefix+tracing"), list(zip(fleet.names, fleet.urls,
                                                                    strict=True)),
                    tmp_path) as router:
            (sink,) = router.helpers
            conf = (tmp_path / "router-prefix+tracing.yaml").read_text()
            port = int(conf.split("127.0.0.1:")[-1].split("/")[0])
            body = json.dumps({"model": "sim-model", "max_tokens": 2,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            req = urllib.request.Request(router.url + "/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200

            def exported() -> bool:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=2) as r:
                    return json.load(r)["requests"] >= 1

            wait_for(exported, "an OTLP export from the router")
        assert router.proc is not None and router.proc.poll() is not None
        assert sink.poll() is not None  # stopped with the router


def _data(base: bool) -> dict[str, object]:
    setups = ["direct", "router-prefix", "router-prefix+tracing"] + (
        ["router-prefix@abc1234"] if base else [])
    cpu = {"direct": [200.0, 210.0], "router-prefix": [600.0, 640.0],
           "router-prefix+tracing": [700.0, 760.0], "router-prefix@abc1234": [610.0, 630.0]}
    return {"config": {"chunks": 64, "concurrency": 16, "cpu_requests": 1500, "repeats": 2,
                       "rounds": 2, "bases": ["abc1234"] if base else []},
            "setups": setups,
            "cpu_us": {s: {"plain": cpu[s], "stream": cpu[s]} for s in setups},
            "p50_ms": {s: {"plain": [1.0, 1.2], "stream": [3.0, 3.1]} for s in setups},
            "errors": dict.fromkeys(setups, 0)}


def test_render_states_each_difference_and_whether_it_is_measurable() -> None:
    text = render(_data(base=True), {"date": "d", "commit": "c", "nproc": 2, "cpu": "x"})
    assert text.startswith(BEGIN) and text.rstrip().endswith(END)
    # tracing on: +100 and +120 -> median +110, range +100..+120: measurable
    assert "| router-prefix+tracing | plain | 730 | +110 | +100..+120 |" in text
    assert "tracing on (batch exporter), plain: median +110 µs, range +100..+120 per " \
           "request — measurable." in text
    # this tree minus the old one: -10 and +10 -> spans 0
    assert "tracing off against abc1234, stream: median +0 µs, range " \
           "-10..+10 per request — within the run's noise (the range spans 0)." in text


def test_the_block_is_replaced_in_place_and_kept_by_make_bench() -> None:
    block = f"{BEGIN}\n## Tracing overhead\nnumbers\n{END}\n"
    doc = "# Benchmarks\n\n## Proxy overhead\n\nold\n"
    with_block = replace_block(doc, block)
    assert with_block.endswith(block) and with_block.startswith(doc.rstrip("\n"))
    newer = f"{BEGIN}\n## Tracing overhead\nnewer\n{END}\n"
    assert replace_block(with_block, newer) == replace_block(doc, newer)
    regenerated = "# Benchmarks\n\n## Proxy overhead\n\nnew\n"
    kept = keep_block(with_block, regenerated)
    assert "new" in kept and kept.endswith(block)
    assert keep_block(doc, regenerated) == regenerated  # nothing to keep
