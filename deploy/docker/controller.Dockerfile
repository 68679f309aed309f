# specctl controller: a small FastAPI service, no vLLM and no torch (base install of the package).
# Build from the repository root:  docker build -f deploy/docker/controller.Dockerfile -t specctl-controller .
FROM python:3.11-slim

WORKDIR /opt/specctl
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY engine_patch ./engine_patch
COPY kernel ./kernel
# the import namespace; pyproject.toml maps its subpackages to the three folders above
COPY specctl_vllm ./specctl_vllm
RUN set -eux; \
    python -m pip install --no-cache-dir /opt/specctl; \
    python -c "import specctl_vllm.controller.cli"; \
    useradd --uid 10001 --create-home --shell /usr/sbin/nologin specctl; \
    mkdir -p /data; chown specctl /data

USER 10001
# SQLite (WAL) file: overrides, audit log and learned-state snapshots. Mount a volume here to keep them.
ENV SPECCTL_DB=/data/specctl.db
# At most 2 glibc malloc arenas: the worker threads that merge, read and snapshot otherwise each grow an arena
# of their own; under a 15-minute flood of new engine ids and category names this held RSS at 114 MB (peak 127)
# against 136 MB and still rising (peak 142) with glibc's default (docs/reliability.md, Memory).
ENV MALLOC_ARENA_MAX=2
VOLUME ["/data"]
EXPOSE 8081
# Tokens come from the environment (SPECCTL_INGEST_TOKEN, SPECCTL_ADMIN_TOKEN); without them serve refuses
# to start. Listening on all interfaces so Prometheus and the engines can reach it.
ENTRYPOINT ["specctl"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8081"]
HEALTHCHECK --interval=10s --timeout=2s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2).status != 200)"
