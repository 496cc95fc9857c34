# A stand-in for the `prom/prometheus` image where no registry can be reached: Debian's
# prometheus package on the locally made base (scripts/build-images deps builds it and tags it as
# $PROMETHEUS_IMAGE, `prom/prometheus:latest` by default). Its entrypoint is prometheus and it
# runs as nobody with its data in /prometheus, as the official image does, so compose.yml's
# `command` works with either.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
    && mkdir -p /prometheus \
    && chown nobody:nogroup /prometheus
USER nobody
EXPOSE 9090
ENTRYPOINT ["prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
