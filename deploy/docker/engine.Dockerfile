# vLLM engine with the specctl patch (scheduler subclass, API middleware, vllm.general_plugins entry point).
#
# One Dockerfile for both platforms; the base image picks CUDA or ROCm. Build from the repository root:
#   CUDA:  docker build -f deploy/docker/engine.Dockerfile -t specctl-engine:cuda .
#   ROCm:  docker build -f deploy/docker/engine.Dockerfile -t specctl-engine:rocm \
#            --build-arg VLLM_IMAGE=vllm/vllm-openai-rocm:v0.32.0 .
# Supported vLLM releases: 0.26 - 0.32 (engine_patch/versions.py); pin the tag you run.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

WORKDIR /opt/specctl
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY engine_patch ./engine_patch
COPY kernel ./kernel
# the import namespace; pyproject.toml maps its subpackages to the three folders above
COPY specctl_vllm ./specctl_vllm

# Install specctl into the image's own Python, next to vLLM. Every package the image already has is pinned
# to its installed version (constraints from `pip list`), so the install can add what is missing
# (pydantic-settings, typer) but can never replace vLLM, torch or their pins; a conflict fails the build
# instead of silently changing the engine. Images built with uv have no pip module: use uv the same way.
RUN set -eux; \
    if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip list --format=freeze > /tmp/image-constraints.txt; \
        python3 -m pip install --no-cache-dir -c /tmp/image-constraints.txt /opt/specctl; \
    else \
        uv pip list --system --format=freeze > /tmp/image-constraints.txt; \
        uv pip install --system --no-cache -c /tmp/image-constraints.txt /opt/specctl; \
    fi; \
    rm /tmp/image-constraints.txt; \
    python3 -c "import specctl_vllm.engine_patch.scheduler, specctl_vllm.engine_patch.middleware, specctl_vllm.engine_patch.plugin"; \
    python3 -c "from importlib.metadata import entry_points as e; assert any(p.name == 'specctl' for p in e(group='vllm.general_plugins'))"

# The scheduler runs inside vLLM's EngineCore process and reaches the controller from there.
ENV SPECCTL_CONTROLLER_URL=http://127.0.0.1:8081 \
    SPECCTL_REPORT_INTERVAL_S=0.1

WORKDIR /
# The OpenAI server module works in every supported release and both base images (the CUDA image's own
# entry point is `vllm serve`, the ROCm images have none).
ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]
