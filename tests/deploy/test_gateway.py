"""deploy/examples/gateway: the EPP behind an InferencePool and a kgateway Gateway. Core objects
validate strictly against the Kubernetes 1.32 schemas, the custom resources against the schemas
of tests/deploy/gateway_schemas.py, and the references between them hold."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from router.settings import Settings
from tests.deploy.gateway_schemas import SCHEMAS
from tests.deploy.kustomize import find, kubectl, normalise, render, render_python

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "deploy" / "examples" / "gateway"
ISTIO = ROOT / "deploy" / "examples" / "gateway-istio"
K8S_VERSION = "1.32.0"


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    return render(TREE)


@pytest.mark.parametrize("tree", [TREE, ISTIO], ids=["kgateway", "istio"])
def test_fallback_renderer_matches_kubectl(tree: Path) -> None:
    if not kubectl():
        pytest.skip("kubectl not installed: the Python renderer is used alone")
    assert normalise(render_python(tree)) == normalise(render(tree))


def test_the_istio_overlay_changes_only_the_gateway_class(objs: list[dict[str, Any]]) -> None:
    istio = render(ISTIO)
    assert find(istio, "Gateway", "inference-gateway")["spec"]["gatewayClassName"] == "istio"
    for obj in istio:
        schema = SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        if schema is not None:
            jsonschema.validate(obj, schema)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    rest = [o for o in normalise(istio) if o["kind"] != "Gateway"]
    assert rest == [o for o in normalise(objs) if o["kind"] != "Gateway"]


def test_every_object_validates_strictly(objs: list[dict[str, Any]]) -> None:
    custom = 0
    for obj in objs:
        schema = SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        if schema is not None:
            jsonschema.validate(obj, schema)
            custom += 1
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert custom == 3  # InferencePool, Gateway, HTTPRoute


@pytest.mark.parametrize(("kind", "path", "value"), [
    # each schema rejects what the API server would: an unknown field, a wrong type, an enum
    ("InferencePool", ["spec", "endpointPickerRef", "portNumber"], 9002),  # the v1alpha2 field
    ("InferencePool", ["spec", "endpointPickerRef", "failureMode"], "Sometimes"),
    ("InferencePool", ["spec", "targetPorts"], []),
    ("Gateway", ["spec", "listeners", 0, "port"], "eighty"),
    ("HTTPRoute", ["spec", "rules", 0, "backendRefs", 0, "namespce"], "llm"),
])
def test_the_custom_schemas_are_not_no_ops(objs: list[dict[str, Any]], kind: str,
                                           path: list[Any], value: Any) -> None:
    obj = copy.deepcopy(find(objs, kind))
    node: Any = obj
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, SCHEMAS[(obj["apiVersion"], kind)])


def _config(objs: list[dict[str, Any]]) -> Settings:
    text = find(objs, "ConfigMap", "prefix-router-config")["data"]["router.yaml"]
    return Settings.from_dict(yaml.safe_load(text))


def test_the_pool_names_the_epp_and_the_epp_serves_its_port(objs: list[dict[str, Any]]) -> None:
    pool = find(objs, "InferencePool", "vllm-pool")["spec"]
    ref = pool["endpointPickerRef"]
    service = find(objs, "Service", ref["name"])
    grpc_port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    deployment = find(objs, "Deployment", "prefix-router-epp")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[grpc_port["targetPort"]] == ref["port"]["number"] == _config(objs).epp.port
    assert container["command"] == ["prefix-router", "epp"]
    assert container["args"] == ["--config", "/etc/prefix-router/router.yaml"]
    # grpc.health.v1 on the ext_proc port, with the protocol's service names
    assert container["readinessProbe"]["grpc"] == {"port": ref["port"]["number"],
                                                   "service": "readiness"}
    assert container["livenessProbe"]["grpc"]["service"] == "liveness"
    assert ports["admin"] == _config(objs).admin.port


def test_the_epp_discovers_exactly_the_pool(objs: list[dict[str, Any]]) -> None:
    pool = find(objs, "InferencePool", "vllm-pool")["spec"]
    settings = _config(objs)
    assert settings.discovery.type == "kubernetes" and settings.routing.policy == "cache_aware"
    k = settings.discovery.kubernetes
    pods = find(objs, "Service", k.service)
    assert pods["spec"]["clusterIP"] == "None"
    assert pods["spec"]["selector"] == pool["selector"]["matchLabels"]
    [port] = [p for p in pods["spec"]["ports"] if p["name"] == k.port_name]
    assert port["targetPort"] == pool["targetPorts"][0]["number"]
    assert k.namespace == pods["metadata"]["namespace"]


def test_discovery_rbac_is_read_only_endpointslices(objs: list[dict[str, Any]]) -> None:
    role = find(objs, "Role", "prefix-router-epp-discovery")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    binding = find(objs, "RoleBinding", "prefix-router-epp-discovery")
    [subject] = binding["subjects"]
    pod = find(objs, "Deployment", "prefix-router-epp")["spec"]["template"]["spec"]
    assert subject["name"] == pod["serviceAccountName"]
    assert subject["namespace"] == "llm"


def test_the_route_sends_v1_to_the_pool_through_the_gateway(objs: list[dict[str, Any]]) -> None:
    route = find(objs, "HTTPRoute", "vllm-route")["spec"]
    gateway = find(objs, "Gateway", "inference-gateway")
    assert route["parentRefs"] == [{"name": gateway["metadata"]["name"]}]
    [rule] = route["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool", "name": "vllm-pool"}]
    assert gateway["spec"]["gatewayClassName"] == "kgateway"


def test_the_grace_period_covers_the_epp_shutdown(objs: list[dict[str, Any]]) -> None:
    pod = find(objs, "Deployment", "prefix-router-epp")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= _config(objs).shutdown.grace_period + 5
    sc = pod["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
