# prefix-router: the router, the auditor and the load-test kit's console scripts.
# Build:  docker build -t prefix-router:0.1.0 .
# Runtime deps only: the project plus its `kubernetes` extra (lightkube, for discovery), its
# `otel` extra (OpenTelemetry SDK + OTLP/HTTP exporter, loaded only with tracing.enabled) and its
# `kv` extra (pyzmq + msgpack, loaded only when the router subscribes to vLLM's KV cache events)
# and its `epp` extra (grpcio + Envoy's protos, loaded only by `prefix-router epp`); no test or
# dev extras, no compilers in the final image (pyzmq and grpcio ship manylinux wheels).
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router ./router
COPY templates_audit ./templates_audit
COPY loadtest ./loadtest
COPY prefix_asgi ./prefix_asgi
COPY scripts/restore_protos.py ./scripts/restore_protos.py
# restore_protos: xds-protos (epp) overwrites opentelemetry-proto's modules (otel); put them back
RUN pip install ".[kubernetes,otel,kv,epp]" && python scripts/restore_protos.py \
    && pip uninstall -y pip setuptools wheel

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 router \
 && useradd --system --uid 10001 --gid router --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin router
COPY --from=build /opt/venv /opt/venv
COPY deploy/base/router.yaml /etc/prefix-router/router.yaml
USER 10001:10001
EXPOSE 8000
# Kubernetes ignores HEALTHCHECK and uses the Deployment's probes (/ready, /health); this is for
# plain `docker run`.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
# `docker run IMAGE` serves the mounted config; `docker run IMAGE --backend http://...` replaces it.
ENTRYPOINT ["prefix-router", "serve"]
CMD ["--config", "/etc/prefix-router/router.yaml"]
