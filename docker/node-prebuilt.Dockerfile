# The toolmesh node image from a binary built on the host, for machines where the Rust image
# cannot be pulled. The build context holds only this file and the binary:
#
#   cargo build --release --locked --bin toolmesh
#   ctx=$(mktemp -d) && cp target/release/toolmesh docker/node-prebuilt.Dockerfile "$ctx"/
#   docker build -f "$ctx"/node-prebuilt.Dockerfile -t toolmesh/node:latest "$ctx"
#
# (scripts/build-images does this.) Build the binary on Debian bookworm or older glibc, so it
# runs on the bookworm runtime below.
ARG BASE_IMAGE=debian:bookworm-slim

# Runtime stage: keep it identical to the one in docker/node.Dockerfile.
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
COPY toolmesh /usr/local/bin/toolmesh
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
