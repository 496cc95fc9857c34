# The toolmesh node image: build the binary with cargo, ship it on a slim Debian.
#
#   docker build -f docker/node.Dockerfile -t toolmesh/node:latest .
#
# The build context is the repository root (keep `target/` out of it: scripts/build-images
# sends only the files git knows of). Images are overridable so that a machine without a
# registry can use locally made ones; where the Rust image cannot be had at all,
# docker/node-prebuilt.Dockerfile packs a binary built on the host into the same runtime stage.
ARG RUST_IMAGE=rust:1-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin toolmesh \
    && cp target/release/toolmesh /usr/local/bin/toolmesh

# Runtime stage: keep it identical to docker/node-prebuilt.Dockerfile.
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
# ca-certificates: TLS to NATS, Redis and the skill service. bubblewrap: the `process` sandbox
# backend. The `docker` backend needs only the Docker socket mounted (the node speaks the
# Engine API itself), not the docker CLI: run it with -v /var/run/docker.sock:/var/run/docker.sock
# and --group-add <the socket's gid> so the non-root user can reach it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates bubblewrap iptables \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && useradd --uid 10001 --user-group --home-dir /var/lib/toolmesh --create-home \
        --shell /usr/sbin/nologin toolmesh
COPY --from=build /usr/local/bin/toolmesh /usr/local/bin/toolmesh
LABEL org.opencontainers.image.title="toolmesh-node" \
      org.opencontainers.image.description="toolmesh node: gateway, approval, workspace, skills, sandbox and web roles" \
      org.opencontainers.image.source="https://github.com/toolmesh/toolmesh" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="toolmesh"
USER toolmesh
WORKDIR /var/lib/toolmesh
ENV TOOLMESH_DATA_DIR=/var/lib/toolmesh/data
ENTRYPOINT ["toolmesh"]
CMD ["node", "--roles", "all"]
