"""Kubernetes discovery against a fake API server speaking the real list/watch protocol.

Deadlines are generous (loaded CI boxes); measured propagation times are printed (`-s`) and
recorded in docs/kubernetes.md rather than asserted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.discovery import Backoff, Endpoint, KubernetesDiscovery
from tests.deploy.discovery_runner import DiscoveryRunner, until
from tests.deploy.fake_kube import FakeKubeAPI, make_slice, pod_endpoint

DEADLINE = 10.0
TOKEN = "fake-sa-token"


def fleet_slice(name: str, pods: dict[str, str], service: str = "vllm", **kw: object) -> dict:
    return make_slice(name, service, [pod_endpoint(p, ip) for p, ip in pods.items()], **kw)  # type: ignore[arg-type]


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(token=TOKEN) as server:
        server.put_slice(fleet_slice("vllm-abc", {"vllm-0": "10.0.0.10", "vllm-1": "10.0.0.11"}))
        server.put_slice(fleet_slice("vllm-def", {"vllm-2": "10.0.0.12"}))
        server.put_slice(fleet_slice("other-xyz", {"other-0": "10.0.9.9"}, service="other"))
        yield server


def discovery_for(api: FakeKubeAPI, tmp_path: Path, **kw: object) -> KubernetesDiscovery:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return KubernetesDiscovery("default", "vllm", "http", "http", kubeconfig=kubeconfig,
                               backoff=Backoff(base=0.05, cap=0.5), **kw)  # type: ignore[arg-type]


@pytest.fixture
def runner(api: FakeKubeAPI, tmp_path: Path) -> Iterator[DiscoveryRunner]:
    with DiscoveryRunner(discovery_for(api, tmp_path)) as r:
        r.wait_for(lambda eps: len(eps) == 3, DEADLINE, "initial list")
        _wait_watching(api)
        yield r


def _wait_watching(api: FakeKubeAPI) -> None:
    until(lambda: api.watch_count() >= 1, "discovery opens a watch", DEADLINE)


def names(eps: list[Endpoint]) -> list[str]:
    return [e.name for e in eps]


def test_initial_list_merges_slices_of_the_service_only(runner: DiscoveryRunner) -> None:
    assert runner.latest == [
        Endpoint("vllm-0", "http://10.0.0.10:8000"),
        Endpoint("vllm-1", "http://10.0.0.11:8000"),
        Endpoint("vllm-2", "http://10.0.0.12:8000"),
    ]
    assert runner.discovery.relists == 1


def test_follows_added_modified_deleted(api: FakeKubeAPI, runner: DiscoveryRunner) -> None:
    api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.13"}))
    t_add = runner.wait_for(lambda eps: "vllm-3" in names(eps), DEADLINE, "ADDED")
    api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.99"}))
    t_mod = runner.wait_for(lambda eps: runner.by_name()["vllm-3"].url == "http://10.0.0.99:8000",
                            DEADLINE, "MODIFIED")
    api.delete_slice("vllm-abc")
    t_del = runner.wait_for(lambda eps: names(eps) == ["vllm-2", "vllm-3"], DEADLINE, "DELETED")
    print(f"propagation: added {t_add * 1000:.1f} ms, modified {t_mod * 1000:.1f} ms, "
          f"deleted {t_del * 1000:.1f} ms")
    assert api.count("list") == 1  # all of it over one watch


def test_readiness_flip_and_terminating(api: FakeKubeAPI, runner: DiscoveryRunner) -> None:
    api.set_conditions("vllm-abc", "vllm-1", ready=False)
    t = runner.wait_for(lambda eps: not runner.by_name()["vllm-1"].ready, DEADLINE, "not ready")
    assert runner.by_name()["vllm-0"].ready
    api.set_conditions("vllm-abc", "vllm-1", ready=True)
    runner.wait_for(lambda eps: runner.by_name()["vllm-1"].ready, DEADLINE, "ready again")
    # a pod being deleted: ready=false, serving=true, terminating=true -> kept, draining
    api.set_conditions("vllm-def", "vllm-2", ready=False, serving=True, terminating=True)
    runner.wait_for(lambda eps: runner.by_name()["vllm-2"].terminating, DEADLINE, "terminating")
    assert runner.by_name()["vllm-2"] == Endpoint("vllm-2", "http://10.0.0.12:8000", ready=False,
                                                  terminating=True)
    print(f"readiness flip visible after {t * 1000:.1f} ms")


def test_unset_ready_condition_means_ready(api: FakeKubeAPI, runner: DiscoveryRunner) -> None:
    api.set_conditions("vllm-abc", "vllm-0", ready=None)
    api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.13"}))
    runner.wait_for(lambda eps: "vllm-3" in names(eps), DEADLINE)
    assert runner.by_name()["vllm-0"].ready


def test_410_event_on_open_watch_relists_and_forgets_deleted(api: FakeKubeAPI,
                                                             runner: DiscoveryRunner) -> None:
    api.drop_watches()
    api.delete_slice("vllm-def")  # happens "while away"; history is then compacted
    api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.13"}))
    api.compact()
    t = runner.wait_for(lambda eps: names(eps) == ["vllm-0", "vllm-1", "vllm-3"], DEADLINE,
                        "state after 410 relist")
    assert api.count("list") == 2
    print(f"relist after 410 converged in {t * 1000:.1f} ms")


def test_410_error_event_mid_stream(api: FakeKubeAPI, runner: DiscoveryRunner) -> None:
    api.expire_watches()  # ERROR {code: 410} on the open stream
    until(lambda: api.count("list") >= 2, "relist after an ERROR 410 event", DEADLINE)
    api.delete_slice("vllm-abc")
    runner.wait_for(lambda eps: names(eps) == ["vllm-2"], DEADLINE, "watch after relist")


def test_410_as_http_status(tmp_path: Path) -> None:
    with FakeKubeAPI(gone_as_http=True) as api:
        api.put_slice(fleet_slice("vllm-abc", {"vllm-0": "10.0.0.10"}))
        with DiscoveryRunner(discovery_for(api, tmp_path)) as r:
            r.wait_for(lambda eps: names(eps) == ["vllm-0"], DEADLINE)
            _wait_watching(api)
            api.drop_watches()
            api.delete_slice("vllm-abc")
            api.put_slice(fleet_slice("vllm-xyz", {"vllm-9": "10.0.0.19"}))
            api.compact()
            r.wait_for(lambda eps: names(eps) == ["vllm-9"], DEADLINE, "state after HTTP 410")
            assert api.count("list") >= 2


def test_dropped_connection_rewatches_from_last_version(api: FakeKubeAPI,
                                                        runner: DiscoveryRunner) -> None:
    rv = api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.13"}))
    runner.wait_for(lambda eps: "vllm-3" in names(eps), DEADLINE)
    api.drop_watches()
    api.delete_slice("vllm-ghi")  # missed on the wire, replayed from history on re-watch
    runner.wait_for(lambda eps: "vllm-3" not in names(eps), DEADLINE, "replayed DELETED")
    watches = [r for r in api.requests if r["kind"] == "watch"]
    assert watches[-1]["query"]["resourceVersion"] == str(rv)
    assert watches[-1]["query"]["allowWatchBookmarks"] == "true"
    assert api.count("list") == 1  # no relist needed


def test_clean_watch_end_and_bookmarks_advance_the_version(api: FakeKubeAPI,
                                                           runner: DiscoveryRunner) -> None:
    api.put_slice(fleet_slice("other-2", {"o": "10.1.1.1"}, service="other"))  # not ours
    api.bookmark()
    api.end_watches()  # queued after the bookmark on the same stream, so it arrives first
    until(lambda: api.count("watch") >= 2, "re-watch after a clean end", DEADLINE)
    last = [r for r in api.requests if r["kind"] == "watch"][-1]
    assert last["query"]["resourceVersion"] == str(api.resource_version)
    assert api.count("list") == 1


def test_api_server_restart_and_errors_are_survived(api: FakeKubeAPI, runner: DiscoveryRunner,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="router.discovery")
    api.stop()  # connection refused while down; membership is kept
    api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.13"}))
    api.fail_next(2, 503)
    api.start()
    runner.wait_for(lambda eps: "vllm-3" in names(eps), DEADLINE, "after restart")
    assert all(len(p) >= 3 for p in runner.published)  # never published an emptied fleet
    text = caplog.text
    assert "API server failing" in text and "reachable again" in text


def test_forbidden_then_fixed(api: FakeKubeAPI, tmp_path: Path,
                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="router.discovery")
    api.fail_next(3, 403)
    with DiscoveryRunner(discovery_for(api, tmp_path)) as r:
        r.wait_for(lambda eps: len(eps) == 3, DEADLINE)
        assert r.published[0] == []  # published once at start, even while failing
    assert "HTTP 403" in caplog.text


def test_unreadable_kubeconfig_never_crashes(tmp_path: Path) -> None:
    d = KubernetesDiscovery("default", "vllm", kubeconfig=str(tmp_path / "missing"),
                            backoff=Backoff(base=0.01, cap=0.05))
    with DiscoveryRunner(d) as r:
        r.wait_for(lambda eps: eps == [], DEADLINE)
    assert r.error is None


def test_port_name_and_dual_stack(api: FakeKubeAPI, tmp_path: Path) -> None:
    two_ports = fleet_slice("vllm-mp", {"vllm-7": "10.0.0.17"})
    two_ports["ports"] = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8080}]
    v6 = fleet_slice("vllm-v6", {"vllm-0": "fd00::10", "vllm-8": "fd00::18"}, address_type="IPv6")
    api.put_slice(two_ports)
    api.put_slice(v6)
    with DiscoveryRunner(discovery_for(api, tmp_path)) as r:
        r.wait_for(lambda eps: len(eps) == 5, DEADLINE)
        got = r.by_name()
    assert got["vllm-7"].url == "http://10.0.0.17:8080"
    assert got["vllm-0"].url == "http://10.0.0.10:8000"  # IPv4 copy preferred
    assert got["vllm-8"].url == "http://[fd00::18]:8000"


def test_repeated_drops_after_good_watches_do_not_escalate_backoff(
        api: FakeKubeAPI, runner: DiscoveryRunner) -> None:
    d = runner.discovery
    for i in range(4):
        api.put_slice(fleet_slice(f"vllm-x{i}", {f"vllm-x{i}": f"10.0.1.{i}"}))
        runner.wait_for(lambda eps, i=i: f"vllm-x{i}" in names(eps), DEADLINE)  # type: ignore[misc]
        watches = api.count("watch")
        api.drop_watches()
        until(lambda w=watches: api.count("watch") > w, "re-watch after a drop", DEADLINE)  # type: ignore[misc]
    assert d.backoff.failures <= 1  # each drop followed a useful watch: backoff started over


def test_backoff_grows_while_the_api_server_is_down(api: FakeKubeAPI,
                                                    runner: DiscoveryRunner) -> None:
    api.stop()
    until(lambda: runner.discovery.backoff.failures >= 4, "backoff grows", DEADLINE)
    api.start()
    api.put_slice(fleet_slice("vllm-ghi", {"vllm-3": "10.0.0.13"}))
    runner.wait_for(lambda eps: "vllm-3" in names(eps), DEADLINE)


def test_injected_lightkube_client_is_used_and_left_open(api: FakeKubeAPI,
                                                         tmp_path: Path) -> None:
    from lightkube import AsyncClient, KubeConfig

    config = KubeConfig.from_file(api.write_kubeconfig(tmp_path / "kc"))
    closed: list[bool] = []

    class Client(AsyncClient):  # type: ignore[misc]
        async def close(self) -> None:
            closed.append(True)
            await super().close()

    client = Client(config=config, namespace="default", trust_env=False)
    d = KubernetesDiscovery("default", "vllm", client=client, backoff=Backoff(0.05, 0.5))
    with DiscoveryRunner(d) as r:
        r.wait_for(lambda eps: len(eps) == 3, DEADLINE)
    assert closed == []  # the caller owns an injected client


def model_slice(name: str, service: str, model: str, pods: dict[str, str]) -> dict:
    obj = fleet_slice(name, pods, service=service)
    # what Kubernetes copies from the Service's labels onto its EndpointSlices
    obj["metadata"]["labels"].update({"app.kubernetes.io/part-of": "vllm-fleet",
                                      "prefix-router.io/model": model})
    return obj


def test_a_selector_over_one_service_per_model_carries_each_model(
        api: FakeKubeAPI, tmp_path: Path) -> None:
    api.put_slice(model_slice("llama-a", "vllm-llama", "llama", {"llama-0": "10.0.1.10"}))
    api.put_slice(model_slice("qwen-a", "vllm-qwen", "qwen", {"qwen-0": "10.0.2.10"}))
    disc = discovery_for(api, tmp_path, label_selector="app.kubernetes.io/part-of=vllm-fleet")
    with DiscoveryRunner(disc) as r:
        r.wait_for(lambda eps: len(eps) == 2, DEADLINE, "both models' slices")
        _wait_watching(api)
        api.put_slice(model_slice("qwen-b", "vllm-qwen", "qwen", {"qwen-1": "10.0.2.11"}))
        r.wait_for(lambda eps: len(eps) == 3, DEADLINE, "a new qwen pod")
        got = r.by_name()
    assert {n: e.models for n, e in got.items()} == {  # the vllm Service's slices are not selected
        "llama-0": ("llama",), "qwen-0": ("qwen",), "qwen-1": ("qwen",)}


def test_a_slice_without_the_model_label_leaves_the_model_to_be_learned(
        runner: DiscoveryRunner) -> None:
    assert all(e.models is None for e in runner.latest)
