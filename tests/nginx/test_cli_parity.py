"""`prefix-router nginx-config` takes `serve`'s replica flags and means the same by them.

Given the same ``--config`` and ``--backend`` flags (every ``[NAME=]URL[=WEIGHT]`` form), the
config `nginx-config` renders passes ``nginx -t``, and a real nginx running it sends every keyed
request to the same upstream as a real `prefix-router serve` process started with those flags
(``routing.ring: nginx`` in the shared router.yaml: the router's copy of nginx's ring).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from loadtest._net import http_ok, quiet_port
from router.cli import main as router_cli
from tests.nginx.harness import NginxProcess, check_config, nginx_fleet, placements

pytestmark = pytest.mark.nginx


def backend_flags(replicas: list[tuple[str, str, int]]) -> list[str]:
    """One replica per accepted form: NAME=URL=WEIGHT, URL=WEIGHT, NAME=URL, URL."""
    (n0, u0, w0), (_, u1, w1), (n2, u2, _), (_, u3, _) = replicas
    return ["--backend", f"{n0}={u0}={w0}", "--backend", f"{u1}={w1}",
            "--backend", f"{n2}={u2}", "--backend", u3]


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not http_ok(f"{url}/ready"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"router not ready: {log.read_text()[-2000:]}")
        time.sleep(0.05)


def test_nginx_config_from_backend_flags_routes_like_serve(tmp_path: Path) -> None:
    keys = [f"parity-{i}" for i in range(300)]
    config = tmp_path / "router.yaml"
    config.write_text(yaml.safe_dump({"routing": {"ring": "nginx"}, "scrape": {"enabled": False},
                                      "health": {"interval": 60.0}}))
    with nginx_fleet(tmp_path / "backends", [2, 3, 1, 1]) as replicas:
        flags = ["--config", str(config), *backend_flags(replicas)]
        nginx_port, router_port = quiet_port(), quiet_port()
        rendered = tmp_path / "nginx.conf"
        assert router_cli(["nginx-config", *flags, "--standalone",
                           "--listen", f"127.0.0.1:{nginx_port}", "--out", str(rendered)]) == 0
        text = rendered.read_text()
        # weights from URL=WEIGHT forms, names from NAME=URL forms (r<i> where none is given)
        assert "weight=2" in text and "weight=3" in text and "# r1" in text and "# r3" in text
        checked = check_config(tmp_path / "check", text)
        assert checked.returncode == 0, checked.stderr
        log = tmp_path / "router.log"
        with open(log, "wb") as out:
            router = subprocess.Popen([sys.executable, "-m", "router", "serve", *flags,
                                       "--port", str(router_port)], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        nginx = NginxProcess(tmp_path / "front", text, nginx_port).start()
        try:
            wait_ready(f"http://127.0.0.1:{router_port}", router, log)
            via_router = placements(router_port, keys)
            via_nginx = placements(nginx_port, keys)
        finally:
            nginx.stop()
            os.killpg(router.pid, signal.SIGTERM)
            router.wait(timeout=30)
    assert {k for k in keys if via_router[k] != via_nginx[k]} == set()
    assert len(set(via_nginx.values())) == 4


@pytest.mark.parametrize(("flags", "message"), [
    ([], "nginx-config: no replicas; pass --config or --backend"),
    (["--backend", "a=b=c=d"], "--backend: expected [NAME=]URL[=WEIGHT], got 'a=b=c=d'"),
    (["--backend", "http://10.0.0.1:8000=x"], "--backend: weight must be an integer"),
    (["--backend", "http://10.0.0.1:8000=0"], "replicas[0].weight: expected an integer"),
    (["--backend", "a=http://10.0.0.1:8000", "--backend", "a=http://10.0.0.2:8000"],
     "replicas[1].name: duplicate replica name"),
])  # fmt: skip
def test_bad_replica_flags_are_one_clear_line(flags: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        router_cli(["nginx-config", *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
