# A stand-in for the `redis:7` image where no registry can be reached: Debian's redis-server
# package on the locally made base (scripts/build-images deps builds it and tags it as
# $REDIS_IMAGE, `redis:7` by default). Like the official image it works in /data and takes
# `redis-server …` as its command.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && mkdir -p /data
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
