"""The router's public API, pinned: every module declares ``__all__``, this table fixes it, and
every name another module imports from the router is in it.

A name leaves a module's ``__all__`` only on purpose (a breaking change for whoever imports it);
a new name is added here in the same commit. Modules whose lists `test_policy.py` pins (keys,
policy, replicas, client, ring) are checked there and by the import scan below.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import router

ROOT = Path(__file__).resolve().parents[2]
PINNED_ELSEWHERE = {"router.keys", "router.policy", "router.replicas", "router.client", "router.ring"}
MODULES = sorted(m.name for m in pkgutil.walk_packages(router.__path__, "router.")
                 if not m.name.endswith("__main__"))

PINNED: dict[str, list[str]] = {
    "router.accesslog": ["AccessLog", "AccessRecord", "CLIENT_CLOSED", "PIPE_BUF", "encode"],
    "router.app": ["RouterApp", "app_factory", "create_app", "start_tracing"],
    "router.disagg": ["Capture", "GENERATE_PATHS", "PREFILL_PARAMS", "PhaseTrace", "TwoPhase", "decode_body",
                      "prefill_body"],
    "router.disagg_routing": ["Phases", "pick_decode", "split"],
    "router.auth": ["ClientAuth", "bearer_token", "upstream_authorization"],
    "router.body": ["ClientGone", "PROMPT_FIELDS", "read_body", "validate_body"],
    "router.cli": [
        "Demo", "DemoFactory", "add_listen_flags", "add_replica_flags", "build_parser", "main",
        "serve"
    ],
    "router.discovery": [
        "Backoff", "Discovery", "DnsDiscovery", "Endpoint", "KubernetesDiscovery", "Membership",
        "Publish", "StaticDiscovery", "make_discovery"
    ],
    "router.discovery.base": [
        "Backoff", "Discovery", "Endpoint", "Membership", "Publish", "url_for"
    ],
    "router.discovery.dns": [
        "DnsDiscovery", "Resolver", "ReverseResolver", "resolve_addresses", "reverse_name"
    ],
    "router.discovery.endpointslices": [
        "MODEL_LABEL", "ROLE_LABEL", "SERVICE_NAME_LABEL", "endpoint_name", "merge_slices", "select_port",
        "slice_endpoints"
    ],
    "router.discovery.kubernetes": [
        "KubernetesDiscovery", "ResourceVersionGone", "SliceState", "WatchError"
    ],
    "router.discovery.static": ["StaticDiscovery"],
    "router.errors": [
        "HeaderFieldsTooLarge", "InvalidRequest", "ModelNotFound", "NoReplicaAvailable", "NotFound",
        "PayloadTooLarge", "RequestTimeout", "RouterError", "StreamCancelled", "TooManyConnections",
        "TooManyRequests", "Unauthorized", "UpstreamConnectError", "UpstreamError", "UpstreamTimeout",
        "UriTooLong", "error_body", "raw_response", "sse_error_event", "translate_upstream",
        "upstream_error"
    ],
    "router.chunks": ["Chunks", "MAX_CHUNKS", "MESSAGE_TOKENS", "NO_CHUNKS", "request_chunks"],
    "router.health": [
        "CACHE_CONFIG", "HealthMonitor", "KV_USAGE", "LoraInfo", "RUNNING", "Replica", "Replicas",
        "VllmLoad", "WAITING", "kv_capacity_tokens", "parse_lora_info", "parse_vllm_metrics"
    ],
    "router.epp": [],
    "router.epp.exchange": ["Exchange", "ProtocolViolation"],
    "router.epp.outcome": ["Outcome"],
    "router.epp.server": ["EppServer", "run"],
    "router.epp.service": [
        "EXT_PROC_SERVICE", "ExternalProcessor", "READINESS_SERVICES", "watch_readiness"
    ],
    "router.epp.wire": [
        "DESTINATION", "SERVED", "SUBSET", "SUBSET_NAMESPACE", "continue_body",
        "continue_headers", "continue_trailers", "header_pairs", "immediate", "pick_in_body",
        "pick_in_headers", "served_endpoint", "streamed_body", "subset_hint"
    ],
    "router.kv_events": [],
    "router.kv_events.index": ["KvIndex", "PreciseIndex", "lora_salt"],
    "router.kv_events.replay": ["ReplayError", "fetch"],
    "router.kv_events.request_keys": ["RequestKeys"],
    "router.kv_events.service": ["KvEvents"],
    "router.kv_events.subscriber": ["Feed", "KvSubscribers", "endpoints_for"],
    "router.kv_events.wire": [
        "AllBlocksCleared", "BlockHash", "BlockRemoved", "BlockStored", "Event", "EventBatch",
        "MEDIUM_CPU", "MEDIUM_GPU", "REPLAY_END", "SEQ_BYTES", "WireError", "decode_batch",
        "decode_seq", "encode_batch", "encode_seq"
    ],
    "router.limits": [
        "ConnectionGuard", "DISCONNECTED", "DISCONNECT_HOOK", "HTTP_PROTOCOL", "LINGER",
        "LimitedHttpToolsProtocol", "Rejection", "body_deadline", "ensure_descriptors",
        "header_bytes", "refused_by"
    ],
    "router.metrics": [
        "DISAGG_OUTCOMES", "DISAGG_PHASES", "DURATION_BUCKETS", "DistinctKeys", "KV_LAG_BUCKETS", "REPLICA_STATES", "RouterMetrics",
        "TTFB_BUCKETS"
    ],
    "router.models": [
        "ModelPools", "Pool", "PoolStatus", "ServedModels", "UNKNOWN", "catalog", "lora_affinity",
        "select_pool", "served_models"
    ],
    "router.nginx_config": [
        "ModelPool", "NginxOptions", "TEMPLATE_PATH", "UpstreamServer", "model_pools", "render",
        "render_config"
    ],
    "router.pipeline": [
        "Candidate", "Filter", "Pipeline", "RequestView", "Scorer", "bounded_load", "cache_score",
        "home_score", "load_score", "queued_work", "recent_load", "request_share"
    ],
    "router.prefix_index": ["ApproxIndex", "InFlight", "PrefixIndex", "match_holders"],
    "router.proxy": [
        "AttemptTrace", "Attempts", "DisconnectWatch", "Forwarder", "HOP_BY_HOP", "IdleWatchdog",
        "REPLICA_HEADER", "RETRY_STATUSES", "Upstream", "attempt_plan", "make_session",
        "strip_hop_by_hop"
    ],
    "router.ring.base": ["Ring", "RingMember", "distinct_owners"],
    "router.ring.hashring": ["HashRing", "ORDER_CACHE_SIZE"],
    "router.ring.nginx": [
        "NGINX_MAX_SKIPS", "NginxRing", "POINTS_PER_WEIGHT", "key_bytes", "split_server"
    ],
    "router.peers": ["Outbox", "PeerEvent", "PeerState"],
    "router.peers.service": ["PeerService", "bind_endpoints", "peer_endpoints", "sibling_endpoints"],
    "router.peers.state": ["KINDS", "Outbox", "PeerEvent", "PeerState"],
    "router.peers.wire": ["VERSION", "WireError", "decode", "encode"],
    "router.roles": ["DEFAULT_ROLE", "ROLES", "ROLE_LABEL", "Role", "role_of"],
    "router.routing": ["AttemptSink", "ExactKeys", "FollowUpWork", "RecentLoad", "Routed", "Router"],
    "router.settings": [
        "AdminSettings", "AuthSettings", "DEFAULT_SERVICE_NAME", "DISCOVERY_TYPES",
        "DisaggSettings", "DiscoverySettings", "DnsDiscovery", "EPP_ADMIN_PORT", "EPP_BODY_MODES",
        "EppSettings", "HealthSettings", "KubernetesDiscovery",
        "KvEventsSettings", "LOG_LEVELS", "LimitsSettings", "Listen", "LoggingSettings", "PEER_DIR_ENV",
        "POLICIES", "PeersSettings", "ProxySettings",
        "RINGS", "ReplicaSpec", "RoutingSettings", "SCHEMES", "SETTINGS_ENV", "ScrapeSettings",
        "Settings", "SettingsError", "ShutdownSettings", "TracingSettings", "kv_installed",
        "load_settings", "parse_backend", "parse_size", "settings_from_env", "write_settings_file"
    ],
    "router.tracing": ["ATTRIBUTES", "RequestTrace", "Tracing", "operation_name"],
    "router.usage": ["TAIL_BYTES", "Usage", "UsageTap", "parse_usage"],
    "router.upstream": ["HIGH_WATER", "Origin", "Response", "UpstreamPool", "origin_of"],
}  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_its_public_names(name: str) -> None:
    module = importlib.import_module(name)
    public = getattr(module, "__all__", None)
    assert public is not None, f"{name} has no __all__"
    assert [n for n in public if not hasattr(module, n)] == []
    assert len(set(public)) == len(public)
    if name not in PINNED_ELSEWHERE:
        assert sorted(public) == PINNED[name]


def test_the_table_covers_every_module() -> None:
    assert sorted(PINNED) == sorted(set(MODULES) - PINNED_ELSEWHERE)


def imports_from_router() -> list[tuple[str, str, str]]:
    """(importing file, router module, name) for every ``from router.X import name`` in the
    packages and scripts (tests may reach into internals; shipped code may not)."""
    found = []
    for top in ("router", "loadtest", "prefix_asgi", "templates_audit", "scripts"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                        and node.module.startswith("router.")):
                    found += [(str(path.relative_to(ROOT)), node.module, alias.name)
                              for alias in node.names]
    return found


def test_names_imported_from_the_router_are_public() -> None:
    found = imports_from_router()
    assert len(found) > 50  # the scan sees the imports (app.py alone has dozens)
    private = [f"{path}: {name} from {module}" for path, module, name in found
               if name not in importlib.import_module(module).__all__]
    assert private == []
