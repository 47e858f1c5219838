"""JSON schemas for the custom resources of deploy/examples/gateway, written for these tests
from the published APIs: InferencePool ``inference.networking.k8s.io/v1`` (Gateway API
Inference Extension v1.0) and Gateway / HTTPRoute ``gateway.networking.k8s.io/v1`` (Gateway API
v1.x). They cover the fields the example uses - required fields, types, ranges, enums - and
reject any other field (``additionalProperties: false``), as the API server's structural
schema would prune or refuse it. kubernetes-validate bundles only the core API's schemas."""

from __future__ import annotations

from typing import Any

_NAME = {"type": "string", "minLength": 1, "maxLength": 253,
         "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_LABELS = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}}
_METADATA = {"type": "object", "required": ["name"],
             "properties": {"name": _NAME, "namespace": _NAME, "labels": _LABELS,
                            "annotations": {"type": "object"}}}


def _resource(group_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "additionalProperties": False,
            "properties": {"apiVersion": {"const": group_version}, "kind": {"const": kind},
                           "metadata": _METADATA, "spec": spec}}


INFERENCE_POOL = _resource("inference.networking.k8s.io/v1", "InferencePool", {
    "type": "object", "additionalProperties": False,
    "required": ["selector", "targetPorts", "endpointPickerRef"],
    "properties": {
        "selector": {"type": "object", "additionalProperties": False,
                     "required": ["matchLabels"],
                     "properties": {"matchLabels": {**_LABELS, "minProperties": 1}}},
        "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                        "items": {"type": "object", "additionalProperties": False,
                                  "required": ["number"], "properties": {"number": _PORT}}},
        "endpointPickerRef": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {
                "group": {"type": "string"}, "kind": {"type": "string", "minLength": 1},
                "name": _NAME,
                "port": {"type": "object", "additionalProperties": False,
                         "required": ["number"], "properties": {"number": _PORT}},
                "failureMode": {"enum": ["FailOpen", "FailClose"]}}},
    }})

GATEWAY = _resource("gateway.networking.k8s.io/v1", "Gateway", {
    "type": "object", "additionalProperties": False,
    "required": ["gatewayClassName", "listeners"],
    "properties": {
        "gatewayClassName": _NAME,
        "listeners": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["name", "protocol", "port"],
            "properties": {"name": _NAME, "protocol": {"enum": ["HTTP", "HTTPS"]},
                           "port": _PORT, "hostname": {"type": "string"}}}}}})

_BACKEND_REF = {"type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"group": {"type": "string"}, "kind": {"type": "string"},
                               "name": _NAME, "port": _PORT,
                               "weight": {"type": "integer", "minimum": 0}}}

HTTP_ROUTE = _resource("gateway.networking.k8s.io/v1", "HTTPRoute", {
    "type": "object", "additionalProperties": False, "required": ["parentRefs", "rules"],
    "properties": {
        "parentRefs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {"name": _NAME, "namespace": _NAME, "sectionName": _NAME}}},
        "rules": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "matches": {"type": "array", "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"path": {
                        "type": "object", "additionalProperties": False,
                        "properties": {"type": {"enum": ["Exact", "PathPrefix",
                                                         "RegularExpression"]},
                                       "value": {"type": "string", "pattern": "^/"}}}}}},
                "backendRefs": {"type": "array", "minItems": 1, "items": _BACKEND_REF},
                "timeouts": {"type": "object", "additionalProperties": False,
                             "properties": {"request": {"type": "string",
                                                        "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"},
                                            "backendRequest": {"type": "string"}}}}}}}})

SCHEMAS = {("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
           ("gateway.networking.k8s.io/v1", "Gateway"): GATEWAY,
           ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE}
