#!/usr/bin/env bash
# The cluster harness (root; never collected by `make test`):
#   test_cluster_tunnel.py  two stand-in machines as network namespaces on this host, a
#                           VXLAN tunnel per crossing fibre as testbed.cluster.tunnel plans
#                           it, raw frames through it at the MTU boundary, RTT figures;
#   test_cluster_ssh.py     `lightpipe cluster check` over real SSH against Dropbear servers
#                           on 127.0.0.x (host keys strict/accept-new/changed, wrong key).
# Dropbear is not installed: without one on PATH its .debs are fetched once with
# `apt-get download` and unpacked (dpkg -x) into $LIGHTPIPE_CLUSTER_CACHE. Extra
# arguments go to pytest.
#   sudo bash tests/cluster/run.sh [-k mtu]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${VENV:-.venv}/bin/python"
CACHE="${LIGHTPIPE_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lightpipe/cluster-harness}"
if [ -z "${LIGHTPIPE_DROPBEAR_ROOT:-}" ] && ! command -v dropbear >/dev/null; then
  if [ ! -x "$CACHE/root/usr/sbin/dropbear" ]; then
    mkdir -p "$CACHE/debs"
    (cd "$CACHE/debs" && apt-get download dropbear-bin libtomcrypt1 libtommath1) \
      || echo "cluster harness: could not fetch Dropbear; the SSH tests will skip" >&2
    for deb in "$CACHE"/debs/*.deb; do [ -f "$deb" ] && dpkg -x "$deb" "$CACHE/root"; done
  fi
  [ -x "$CACHE/root/usr/sbin/dropbear" ] && export LIGHTPIPE_DROPBEAR_ROOT="$CACHE/root"
fi
LIGHTPIPE_CLUSTER_HARNESS=1 exec "$PY" -m pytest tests/cluster -v -s -rs -p no:cacheprovider "$@"
