# The toolmesh sandbox image: what run_command, run_code and execute_skills run in.
# One long-lived container per session; the sandbox actor runs each command with `docker exec`.
#
#   docker build -f docker/sandbox.Dockerfile -t toolmesh/sandbox:latest docker/
#
# (scripts/build-images does this, and makes the base image first where no registry is
# reachable.) The base is overridable so that a machine without a registry can use a locally
# made one: --build-arg BASE_IMAGE=…
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive

# Interpreters and the tools a shell command expects; Debian bookworm ships nodejs 18.
# The user `sandbox` (1000:1000) is who every command runs as; /workspace is where the
# session's workspace is mounted.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        bash \
        ca-certificates \
        coreutils \
        nodejs \
        procps \
        python3 \
        python3-venv \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && groupadd --gid 1000 sandbox \
    && useradd --uid 1000 --gid 1000 --home-dir /home/sandbox --create-home --shell /bin/bash sandbox \
    && mkdir -p /workspace \
    && chown 1000:1000 /workspace

LABEL org.opencontainers.image.title="toolmesh-sandbox" \
      org.opencontainers.image.description="Session sandbox for toolmesh: bash, coreutils, procps, python3 (with venv), nodejs; runs as uid 1000" \
      org.opencontainers.image.source="https://github.com/toolmesh/toolmesh" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="toolmesh"

ENV HOME=/home/sandbox \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /workspace
USER 1000:1000
CMD ["sleep", "infinity"]
