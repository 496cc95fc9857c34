# The toolmesh node image: build the binary, ship it on a slim Debian.
# Images are overridable so that a machine without a registry can use locally made ones.
ARG RUST_IMAGE=rust:1-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin toolmesh

FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/toolmesh --create-home toolmesh
COPY --from=build /src/target/release/toolmesh /usr/local/bin/toolmesh
USER toolmesh
WORKDIR /var/lib/toolmesh
ENV TOOLMESH_DATA_DIR=/var/lib/toolmesh/data
ENTRYPOINT ["/usr/local/bin/toolmesh"]
CMD ["node", "--roles", "all"]
