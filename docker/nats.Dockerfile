# A stand-in for the `nats:2` image where no registry can be reached: Debian's nats-server
# package on the locally made base (scripts/build-images deps builds it and tags it as
# $NATS_IMAGE, `nats:2` by default). Its entrypoint is nats-server, as in the official image, so
# compose.yml's `command` works with either.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends nats-server \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && mkdir -p /data
EXPOSE 4222 8222
ENTRYPOINT ["nats-server"]
CMD ["-js", "-sd", "/data"]
