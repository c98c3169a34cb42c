# mcp-gateway as an image: `docker build -t mcp-gateway .` (docs/deployment.md).
# Two stages: the first builds a virtualenv with the gateway and its dependencies, the second
# copies it onto a clean slim Python and runs it as a non-root user. Configuration comes from a
# mounted YAML file (GATEWAY_CONFIG) and GATEWAY_* variables; state that must outlive a container
# lives in PostgreSQL (GATEWAY_DATABASE_URL), the rest in GATEWAY_DATA_DIR.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# otel: OpenTelemetry export (GATEWAY_TRACING__ENABLED); empty to leave it out.
ARG EXTRAS=otel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY plugins ./plugins
RUN python -m venv /opt/mcp-gateway \
    && /opt/mcp-gateway/bin/pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="mcp-gateway" \
      org.opencontainers.image.description="One MCP endpoint in front of many MCP servers" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 mcp-gateway \
    && useradd --system --uid 10001 --gid mcp-gateway --home-dir /var/lib/mcp-gateway --shell /usr/sbin/nologin mcp-gateway \
    && install -d -o mcp-gateway -g mcp-gateway -m 0750 /var/lib/mcp-gateway \
    && install -d -m 0755 /etc/mcp-gateway
COPY --from=build /opt/mcp-gateway /opt/mcp-gateway
COPY deploy/docker/healthcheck.py /opt/mcp-gateway/healthcheck.py
COPY deploy/gateway.yaml /etc/mcp-gateway/gateway.yaml
ENV PATH=/opt/mcp-gateway/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GATEWAY_CONFIG=/etc/mcp-gateway/gateway.yaml \
    GATEWAY_DATA_DIR=/var/lib/mcp-gateway \
    GATEWAY_HTTP__HOST=0.0.0.0 \
    GATEWAY_HTTP__PORT=8765 \
    GATEWAY_LOG_FORMAT=json
USER 10001:10001
WORKDIR /var/lib/mcp-gateway
# The bundled embedding model, checked against its pinned size and sha256 at build time (a
# damaged or replaced file fails the build) and assembled in the data dir, so that a start
# hashes nothing.
RUN ["/opt/mcp-gateway/bin/python", "-c", "from pathlib import Path; from gateway.router.bundled_model import prepare_model_dir; print('bundled model verified:', prepare_model_dir(Path('/var/lib/mcp-gateway')))"]
EXPOSE 8765
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/opt/mcp-gateway/bin/python", "/opt/mcp-gateway/healthcheck.py"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/mcp-gateway/bin/mcp-gateway"]
CMD ["serve", "--transport", "http"]
