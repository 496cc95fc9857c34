# The bridge image: the node image plus Python and the MCP servers that
# docker/mcp-servers.json names, installed from PyPI into a venv on the PATH. To serve other
# servers, list their packages in docker/mcp-servers-requirements.txt and name them in
# docker/mcp-servers.json.
#
#   docker build -f docker/bridge.Dockerfile -t toolmesh/bridge:latest docker/
#
# (scripts/build-images bridge does this, after the node image.) The context is docker/. The
# servers file is at /etc/toolmesh/mcp-servers.json, which TOOLMESH_MCP_SERVERS names; compose
# runs this image with TOOLMESH_ROLES=bridge.
ARG NODE_IMAGE=toolmesh/node:latest
FROM ${NODE_IMAGE}
USER root
ARG DEBIAN_FRONTEND=noninteractive
# python3-venv: the venv the servers live in. The servers' Python dependencies (tzdata among
# them) come from PyPI with them.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
# The servers' PyPI packages (docker/mcp-servers-requirements.txt): from the wheels in
# docker/wheels/ when there are any (scripts/build-images downloads them with the host's pip,
# which knows the host's proxy, mirror and certificates), else from PyPI.
COPY mcp-servers-requirements.txt /tmp/
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/mcp-servers \
    && if ls /tmp/wheels/*.whl >/dev/null 2>&1; then \
         set -- --no-index --find-links /tmp/wheels; \
       fi \
    && /opt/mcp-servers/bin/pip install --no-cache-dir --disable-pip-version-check "$@" \
         -r /tmp/mcp-servers-requirements.txt \
    && rm -rf /tmp/wheels /tmp/mcp-servers-requirements.txt
ENV PATH=/opt/mcp-servers/bin:$PATH
COPY mcp-servers.json /etc/toolmesh/mcp-servers.json
ENV TOOLMESH_MCP_SERVERS=/etc/toolmesh/mcp-servers.json
LABEL org.opencontainers.image.title="toolmesh-bridge" \
      org.opencontainers.image.description="toolmesh node with Python MCP servers for the bridge role"
USER toolmesh
CMD ["node", "--roles", "bridge"]
