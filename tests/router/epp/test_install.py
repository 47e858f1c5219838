"""The epp extra installs beside the otel extra: xds-protos ships old copies of modules that
opentelemetry-proto and googleapis-common-protos own, and `make install` puts theirs back
(scripts/restore_protos.py). A stale copy shows here before it breaks tracing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _script() -> object:
    spec = importlib.util.spec_from_file_location("restore_protos",
                                                  ROOT / "scripts" / "restore_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_envoy_and_otel_protos_import_side_by_side() -> None:
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc  # noqa: F401
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope

    assert InstrumentationScope.DESCRIPTOR.full_name == \
        "opentelemetry.proto.common.v1.InstrumentationScope"


def test_the_restore_script_finds_the_overlapping_distributions() -> None:
    pins = _script().shadowed()  # type: ignore[attr-defined]
    names = {p.split("==")[0] for p in pins}
    assert "opentelemetry-proto" in names  # the overlap xds-protos 1.85 has
    assert all("==" in p for p in pins) and "xds-protos" not in names
