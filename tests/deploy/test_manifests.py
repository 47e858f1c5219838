"""deploy/: the kustomizations render, validate offline against the Kubernetes 1.32 schemas
(kubernetes-validate bundles them), and hold the properties the router depends on."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from loadtest.replica.kv_config import is_bind_endpoint, parse_kv_events_config
from router.settings import Settings
from tests.deploy.kustomize import find, kubectl, normalise, render_python
from tests.deploy.kustomize import render as _render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TREES = ["base", "examples/vllm", "examples/monitoring", "examples/multi-model",
         "examples/tracing"]
K8S_VERSION = "1.32.0"


@functools.cache
def _rendered(path: str) -> str:
    return yaml.safe_dump_all(_render(DEPLOY / path))


def render(path: Path) -> list[dict[str, Any]]:
    """Rendered once per tree (kubectl takes ~1 s to start); each caller gets its own copy."""
    return [d for d in yaml.safe_load_all(_rendered(str(path.relative_to(DEPLOY)))) if d]


@pytest.fixture(scope="module", params=TREES)
def tree(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(DEPLOY / request.param)


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return render(DEPLOY / "examples/vllm")


def router_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(objs, "Deployment", "prefix-router")["spec"]["template"]  # type: ignore[no-any-return]


def router_config(objs: list[dict[str, Any]]) -> tuple[str, Settings]:
    text = find(objs, "ConfigMap", "prefix-router-config")["data"]["router.yaml"]
    return text, Settings.from_dict(yaml.safe_load(text))


@pytest.mark.parametrize("path", TREES)
def test_fallback_renderer_matches_kubectl(path: str) -> None:
    if not kubectl():
        pytest.skip("kubectl not installed: the Python renderer is used alone")
    assert normalise(render_python(DEPLOY / path)) == normalise(render(DEPLOY / path))


def test_every_object_validates_strictly(tree: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = tree
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked in test_servicemonitor_component
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_validator_is_not_a_no_op() -> None:
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"ports": [{"port": "eighty"}], "selectr": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_router_pod_security(tree: tuple[str, list[dict[str, Any]]]) -> None:
    spec = router_pod(tree[1])["spec"]
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "memory" in c["resources"]["limits"] and "cpu" in c["resources"]["requests"]
        # a read-only root still needs a writable /tmp
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])


def test_router_probes_config_and_shutdown(tree: tuple[str, list[dict[str, Any]]]) -> None:
    objs = tree[1]
    deployment = find(objs, "Deployment", "prefix-router")
    assert deployment["spec"]["replicas"] >= 2
    spec = router_pod(objs)["spec"]
    (c,) = spec["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    text, settings = router_config(objs)
    assert settings.discovery.type == "kubernetes"
    assert settings.discovery.kubernetes.kubeconfig is None  # in-cluster credentials
    assert c["ports"][0]["containerPort"] == settings.listen.port
    # the config file the image's CMD reads is the mounted ConfigMap
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/prefix-router" and mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == find(objs, "ConfigMap",
                                               "prefix-router-config")["metadata"]["name"]
    # endpoints drain first (preStop sleep), then the router's own grace period, with margin
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep >= 5
    assert spec["terminationGracePeriodSeconds"] >= sleep + settings.shutdown.grace_period + 5
    assert str(spec["terminationGracePeriodSeconds"]) in text  # the config says how it matches


def test_rbac_is_exactly_get_list_watch_on_endpointslices(
        tree: tuple[str, list[dict[str, Any]]]) -> None:
    objs = tree[1]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = find(objs, "Role")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    binding = find(objs, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    sa = find(objs, "ServiceAccount")
    pod = router_pod(objs)["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["name"] == sa["metadata"]["name"]
    assert subject["namespace"] == sa["metadata"].get("namespace", "default")


def test_selectors_and_targets_line_up(tree: tuple[str, list[dict[str, Any]]]) -> None:
    objs = tree[1]
    labels = router_pod(objs)["metadata"]["labels"]

    def selects(selector: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    assert selects(find(objs, "Service", "prefix-router")["spec"]["selector"])
    assert selects(find(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    assert selects(find(objs, "NetworkPolicy", "prefix-router")["spec"]["podSelector"]
                   ["matchLabels"])
    hpa = find(objs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "prefix-router"}
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert find(objs, "PodDisruptionBudget")["spec"]["minAvailable"] >= 1


def test_example_wires_router_to_the_vllm_statefulset(example: list[dict[str, Any]]) -> None:
    _, settings = router_config(example)
    k8s = settings.discovery.kubernetes
    ns = find(example, "Namespace")["metadata"]["name"]
    assert {o["metadata"].get("namespace") for o in example if o["kind"] != "Namespace"} == {ns}
    assert k8s.namespace == ns
    service = find(example, "Service", k8s.service)
    assert service["spec"]["clusterIP"] == "None"  # headless
    assert k8s.port_name in [p["name"] for p in service["spec"]["ports"]]
    sts = find(example, "StatefulSet")
    assert sts["spec"]["serviceName"] == k8s.service
    pod = sts["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v
               for k, v in service["spec"]["selector"].items())
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["vllm", "serve"] and "--enable-prefix-caching" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    # the router's NetworkPolicy lets it reach these pods on their port
    egress = find(example, "NetworkPolicy", "prefix-router")["spec"]["egress"]
    vllm_rule = next(r for r in egress if "to" in r and "podSelector" in r["to"][0])
    assert all(pod["metadata"]["labels"].get(k) == v
               for k, v in vllm_rule["to"][0]["podSelector"]["matchLabels"].items())
    assert c["ports"][0]["containerPort"] in [p["port"] for p in vllm_rule["ports"]]
    # KV cache events on: vLLM's flag parses as vLLM would read it, it binds the ports the pod
    # declares, the headless Service names them and the router may reach them
    (flag,) = [a for a in c["args"] if a.startswith("--kv-events-config=")]
    kv = parse_kv_events_config(flag.split("=", 1)[1])
    assert kv.publishes and is_bind_endpoint(kv.endpoint) and kv.replay_endpoint is not None
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["kv-events"] == int(kv.endpoint.rsplit(":", 1)[1])
    assert ports["kv-replay"] == int(kv.replay_endpoint.rsplit(":", 1)[1])
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    for name in ("kv-events", "kv-replay"):
        assert by_name[name]["targetPort"] == name and by_name[name]["port"] == ports[name]
        assert ports[name] in [p["port"] for p in vllm_rule["ports"]]


def test_multi_model_example_has_one_service_per_model_and_the_router_selects_them() -> None:
    objs = render(DEPLOY / "examples/multi-model")
    _, settings = router_config(objs)
    k8s = settings.discovery.kubernetes
    assert k8s.selector is not None
    wanted = dict(part.split("=", 1) for part in k8s.selector.split(","))
    services = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"]
                not in ("prefix-router", "prefix-router-peers")]
    sets = {o["spec"]["serviceName"]: o for o in objs if o["kind"] == "StatefulSet"}
    models = set()
    for svc in services:
        labels = svc["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in wanted.items())  # its slices are discovered
        assert svc["spec"]["clusterIP"] == "None"
        sts = sets[svc["metadata"]["name"]]
        pod = sts["spec"]["template"]
        assert all(pod["metadata"]["labels"].get(k) == v
                   for k, v in svc["spec"]["selector"].items())
        (c,) = pod["spec"]["containers"]
        served = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--served-model-name=")]
        # the Service's model label is what those pods answer to, and a valid label value
        assert served == [labels["prefix-router.io/model"]]
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", served[0])
        models.add(served[0])
        # every other model's pods are out of this Service's selector
        others = [s for name, s in sets.items() if name != svc["metadata"]["name"]]
        assert not any(all(o["spec"]["template"]["metadata"]["labels"].get(k) == v
                           for k, v in svc["spec"]["selector"].items()) for o in others)
    assert len(models) == len(services) == 2
    egress = find(objs, "NetworkPolicy", "prefix-router")["spec"]["egress"]
    rule = next(r for r in egress if "to" in r and "podSelector" in r["to"][0])
    assert all(all(s["spec"]["template"]["metadata"]["labels"].get(k) == v
                   for k, v in rule["to"][0]["podSelector"]["matchLabels"].items())
               for s in sets.values())


def test_servicemonitor_only_in_the_monitoring_component() -> None:
    assert not [o for o in render(DEPLOY / "base") if o["kind"] == "ServiceMonitor"]
    assert not [o for o in render(DEPLOY / "examples/vllm") if o["kind"] == "ServiceMonitor"]
    objs = render(DEPLOY / "examples/monitoring")
    sm = find(objs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    service = find(objs, "Service", "prefix-router")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"


def test_tracing_example_wires_router_and_vllm_to_the_collector() -> None:
    objs = render(DEPLOY / "examples/tracing")
    _, settings = router_config(objs)
    assert settings.tracing.enabled and not settings.tracing.record_routing_keys
    collector = yaml.safe_load(find(objs, "ConfigMap", "otel-collector-config")["data"]
                               ["config.yaml"])
    # every component a pipeline names is defined; the traces pipeline batches
    pipeline = collector["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert pipeline[kind] and set(pipeline[kind]) <= set(collector[kind]), kind
    assert "batch" in pipeline["processors"] and pipeline["processors"][0] == "memory_limiter"
    assert {e.split("/")[0] for e in pipeline["exporters"]} <= {"otlp", "otlphttp"}
    assert collector["exporters"]["otlphttp/langfuse"]["endpoint"].endswith("/api/public/otel")
    assert set(collector["service"]["extensions"]) <= set(collector["extensions"])
    protocols = collector["receivers"]["otlp"]["protocols"]
    ports = {name: int(p["endpoint"].rsplit(":", 1)[1]) for name, p in protocols.items()}

    # the router's endpoint is the collector Service's OTLP/HTTP port, and its path
    service = find(objs, "Service", "otel-collector")
    ns = service["metadata"]["namespace"]
    assert settings.tracing.endpoint == f"http://otel-collector.{ns}.svc:{ports['http']}/v1/traces"
    svc_ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    pod = find(objs, "Deployment", "otel-collector")["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named[svc_ports[ports["http"]]] == ports["http"]
    assert named[svc_ports[ports["grpc"]]] == ports["grpc"]
    assert all(pod["metadata"]["labels"].get(k) == v
               for k, v in service["spec"]["selector"].items())
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert f"--config={mount['mountPath']}/config.yaml" in c["args"]
    health = int(collector["extensions"]["health_check"]["endpoint"].rsplit(":", 1)[1])
    assert named[c["readinessProbe"]["httpGet"]["port"]] == health

    # vLLM exports (gRPC, its default protocol) to the same collector
    (vllm,) = find(objs, "StatefulSet", "vllm")["spec"]["template"]["spec"]["containers"]
    assert f"--otlp-traces-endpoint=http://otel-collector.{ns}.svc:{ports['grpc']}" in \
        vllm["args"]
    assert "--enable-prefix-caching" in vllm["args"]  # the vllm example's args are kept
    # and the router's NetworkPolicy lets its spans out
    egress = find(objs, "NetworkPolicy", "prefix-router")["spec"]["egress"]
    rule = next(r for r in egress if "to" in r and r["to"][0].get("podSelector", {}).get(
        "matchLabels") == {"app.kubernetes.io/name": "otel-collector"})
    assert rule["ports"] == [{"port": ports["http"], "protocol": "TCP"}]


def test_router_pods_reach_each_other_as_peers(tree: tuple[str, list[dict[str, Any]]]) -> None:
    # routing.peers.dns names a headless Service over the router pods, on the port each binds
    objs = tree[1]
    _, settings = router_config(objs)
    peers = settings.routing.peers
    assert peers.enabled and peers.host == "0.0.0.0" and settings.workers == 1
    svc = find(objs, "Service", peers.dns)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    labels = router_pod(objs)["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    (c,) = router_pod(objs)["spec"]["containers"]
    port = next(p for p in c["ports"] if p["name"] == "peers")
    assert port["containerPort"] == peers.port
    assert [p["port"] for p in svc["spec"]["ports"]] == [peers.port]
    policy = find(objs, "NetworkPolicy", "prefix-router")["spec"]
    for rules, side in ((policy["ingress"], "from"), (policy["egress"], "to")):
        assert any(r.get(side) == [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "prefix-router"}}}] and
            r["ports"] == [{"port": peers.port, "protocol": "TCP"}] for r in rules), side
