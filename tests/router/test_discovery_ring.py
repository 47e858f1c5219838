"""Two router instances fed by their own Kubernetes discovery route identically (no shared state),
and a StatefulSet pod restart (new IP, same name) moves no keys."""

from __future__ import annotations

from pathlib import Path

from router.discovery import Backoff, Endpoint, KubernetesDiscovery
from router.keys import KeySource, RoutingKey
from router.policy import make_policy
from router.replicas import ReplicaSet
from tests.deploy.discovery_runner import DiscoveryRunner
from tests.deploy.fake_kube import FakeKubeAPI, make_slice, pod_endpoint

KEYS = [RoutingKey(prefix=f"system prompt #{i}", conversation=None, source=KeySource.PREFIX)
        for i in range(1000)]


def routes(endpoints: list[Endpoint], ring: str = "xxhash") -> list[str]:
    replicas = ReplicaSet(endpoints, ring_kind=ring)
    policy = make_policy("prefix", 1.25, 0)
    out = []
    for seq, key in enumerate(KEYS):
        decision = policy.choose(key, replicas.states(), replicas.ring, seq)
        assert decision is not None
        out.append(decision.replica)
    return out


def discovery(api: FakeKubeAPI, path: Path) -> KubernetesDiscovery:
    return KubernetesDiscovery("default", "vllm", kubeconfig=api.write_kubeconfig(path),
                               backoff=Backoff(base=0.05, cap=0.5))


def test_two_routers_route_1000_keys_identically(tmp_path: Path) -> None:
    pods = {f"vllm-{i}": f"10.0.0.{10 + i}" for i in range(5)}
    with FakeKubeAPI() as api:
        api.put_slice(make_slice("vllm-a", "vllm", [pod_endpoint(p, ip) for p, ip in
                                                    list(pods.items())[:3]]))
        with DiscoveryRunner(discovery(api, tmp_path / "a")) as a:
            a.wait_for(lambda eps: len(eps) == 3)
            # router A learns the rest from watch events, router B from its initial list
            api.put_slice(make_slice("vllm-b", "vllm", [pod_endpoint(p, ip) for p, ip in
                                                        list(pods.items())[3:]]))
            api.set_conditions("vllm-a", "vllm-1", ready=False)
            a.wait_for(lambda eps: len(eps) == 5 and not a.by_name()["vllm-1"].ready)
            with DiscoveryRunner(discovery(api, tmp_path / "b")) as b:
                b.wait_for(lambda eps: len(eps) == 5)
                assert a.latest == b.latest
                first = routes(a.latest or [])
                assert first == routes(b.latest or [])
                # nginx's ring (hashes addresses, not names) agrees across instances too
                assert routes(a.latest or [], "nginx") == routes(b.latest or [], "nginx")
                assert "vllm-1" not in first  # not ready: no traffic
                assert len(set(first)) == 4

                # vllm-3 restarts: same pod name, new IP -> no key changes home on the
                # (name-keyed) xxhash ring; the nginx ring is address-keyed and would move them
                api.put_slice(make_slice("vllm-b", "vllm", [
                    pod_endpoint("vllm-3", "10.0.0.99"), pod_endpoint("vllm-4", "10.0.0.14")]))
                for r in (a, b):
                    r.wait_for(lambda eps: {e.name: e.url for e in eps}["vllm-3"] ==
                               "http://10.0.0.99:8000")
                assert routes(a.latest or []) == routes(b.latest or []) == first
