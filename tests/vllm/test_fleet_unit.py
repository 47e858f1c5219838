"""VllmFleet's own logic, without vLLM: runs in the fast suite (no `vllm` marker).

A fake `vllm` executable (a stdlib HTTP server that, like vLLM, forks a child into its process
group) stands in for the real one, so process-group start/kill/restart/stop, readiness, the
per-replica environment and log files are proven in milliseconds on every CI run.
"""

from __future__ import annotations

import os
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from loadtest.vllm_fleet import VllmEnvMissing, VllmFleet, find_env, parse_metrics

FAKE_VLLM = """\
#!{python}
import http.server, json, os, subprocess, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
if "--fail-at-start" in args:
    print("fake: refusing to start", flush=True)
    sys.exit(3)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"child-{{port}}"), "w") as f:
    f.write(str(child.pid))
print("VLLM_CPU_OMP_THREADS_BIND=" + os.environ["VLLM_CPU_OMP_THREADS_BIND"], flush=True)
print("VLLM_HOST_IP=" + os.environ["VLLM_HOST_IP"], flush=True)
print("argv=" + " ".join(args), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, body, ctype="application/json"):
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/v1/models":
            self._send(json.dumps({{"data": [{{"id": "tiny-llama"}}]}}).encode())
        else:
            self._send(b'vllm:prefix_cache_hits_total{{engine="0"}} 64.0\\n'
                       b'vllm:prefix_cache_queries_total{{engine="0"}} 100.0\\n', "text/plain")
    def do_POST(self):
        self._send(b"{{}}")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.fixture
def fake_env(tmp_path: Path) -> tuple[Path, Path]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".prefix-router-vllm-env").write_text("fake")
    vllm = venv / "bin" / "vllm"
    vllm.write_text(FAKE_VLLM.format(python=sys.executable))
    vllm.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    return venv, model


def test_parse_metrics_sums_label_sets_and_skips_created() -> None:
    text = textwrap.dedent("""\
        # HELP vllm:num_requests_running Number of requests
        # TYPE vllm:num_requests_running gauge
        vllm:num_requests_running{engine="0",model_name="m"} 2.0
        vllm:num_requests_running{engine="1",model_name="m"} 1.0
        vllm:prefix_cache_hits_total{engine="0",model_name="m"} 96.0
        vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.79e+09
        process_open_fds 12.0
        vllm:cache_config_info{block_size="32",note="a } b"} 1.0
        """)
    assert parse_metrics(text) == {
        "vllm:num_requests_running": 3.0,        # label sets summed
        "vllm:prefix_cache_hits_total": 96.0,    # _created timestamps dropped
        "process_open_fds": 12.0,                # unlabelled samples kept
        "vllm:cache_config_info": 1.0,           # a '}' inside a label value is not the end
    }


def test_missing_env_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(VllmEnvMissing, match=r"virtualenv at .*nope.* and tiny model at .*none"):
        find_env(tmp_path / "nope", tmp_path / "none")


def test_block_size_must_suit_the_cpu_backend(fake_env: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        VllmFleet(1, fake_env[1], block_size=16, venv=fake_env[0])


def test_fleet_lifecycle_by_process_group(fake_env: tuple[Path, Path], tmp_path: Path) -> None:
    venv, model = fake_env
    fleet = VllmFleet(2, model, venv=venv, log_dir=tmp_path / "logs", startup_timeout=30)
    with fleet:
        assert fleet.names == ["vllm0", "vllm1"]
        assert len(set(fleet.urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in fleet.urls)
        children = [int((venv / "bin" / f"child-{p}").read_text()) for p in fleet.ports]
        logs = [fleet.log_path(i).read_text() for i in range(2)]
        # each replica pinned to its own core, loopback only, with the prefix-cache flags
        assert "VLLM_CPU_OMP_THREADS_BIND=0" in logs[0] and "VLLM_CPU_OMP_THREADS_BIND=1" in logs[1]
        assert all("VLLM_HOST_IP=127.0.0.1" in log for log in logs)
        for flag in ("--enable-prefix-caching", "--block-size 32", "--load-format dummy",
                     "--host 127.0.0.1", "--enable-prompt-tokens-details"):
            assert flag in logs[0]
        assert fleet.prefix_cache(1) == (100.0, 64.0)
        fleet.reset_prefix_cache(0)

        fleet.kill(0)
        assert not fleet.alive(0) and fleet.alive(1)
        assert _dead(children[0]), "the replica's child outlived the kill"
        port0 = fleet.ports[0]
        fleet.restart(0)
        assert fleet.alive(0) and fleet.ports[0] == port0
        with urllib.request.urlopen(fleet.urls[0] + "/v1/models", timeout=5) as resp:
            assert resp.status == 200
        children[0] = int((venv / "bin" / f"child-{port0}").read_text())
        pids = [p.pid for p in fleet.procs]
    assert fleet.procs == []
    assert all(_dead(pid) for pid in pids + children)


def test_replica_dying_at_start_fails_start_with_its_log(fake_env: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    venv, model = fake_env
    fleet = VllmFleet(1, model, venv=venv, log_dir=tmp_path / "logs",
                      extra_args=["--fail-at-start"], startup_timeout=30)
    with pytest.raises(RuntimeError, match=r"(?s)vllm0 exited with 3.*refusing to start"):
        fleet.start()
    assert fleet.procs == []


def test_environment_drops_inherited_vllm_settings(fake_env: tuple[Path, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "40")  # would override --kv-cache-memory-bytes
    fleet = VllmFleet(2, fake_env[1], venv=fake_env[0])
    env = fleet.environ(1)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(1 % (os.cpu_count() or 1))
    assert env["HF_HUB_OFFLINE"] == "1"
