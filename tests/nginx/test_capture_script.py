"""scripts/capture_nginx_ring.py: checks a live nginx against NginxRing and flags drift."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from loadtest._net import quiet_port
from tests.nginx.harness import NginxProcess, Replica, nginx_fleet, render_standalone

pytestmark = pytest.mark.nginx

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "capture_nginx_ring.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("capture_nginx_ring", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_router_yaml(path: Path, replicas: list[Replica]) -> Path:
    path.write_text(yaml.safe_dump(
        {"replicas": [{"name": n, "url": u, "weight": w} for n, u, w in replicas]}))
    return path


def test_script_agrees_with_matching_nginx_and_flags_a_stale_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script()
    with nginx_fleet(tmp_path / "backends", [1, 2, 1]) as replicas:
        port = quiet_port()
        nginx = NginxProcess(tmp_path / "front", render_standalone(replicas, port), port).start()
        try:
            config = write_router_yaml(tmp_path / "router.yaml", replicas)
            out = tmp_path / "table.json"
            assert script.main(["--config", str(config), "--nginx", nginx.url, "--keys", "300",
                                "--out", str(out)]) == 0
            assert set(json.loads(out.read_text()).values()) == {"r0", "r1", "r2"}
            # the router's config changed weights but nginx was not re-rendered: caught
            stale = write_router_yaml(tmp_path / "stale.yaml",
                                      [(n, u, 3 if n == "r0" else w) for n, u, w in replicas])
            assert script.main(["--config", str(stale), "--nginx", nginx.url,
                                "--keys", "300"]) == 1
        finally:
            nginx.stop()
    assert "0 placed differently" in capsys.readouterr().out
