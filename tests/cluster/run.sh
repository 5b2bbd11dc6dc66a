#!/usr/bin/env bash
# The cluster harness (root; never collected by `make test`):
#   test_cluster_tunnel.py  two stand-in machines as network namespaces on this host, a
#                           VXLAN tunnel per crossing fibre as testbed.cluster.tunnel plans
#                           it, raw frames through it at the MTU boundary, RTT figures;
#   test_cluster_ssh.py     `lightpipe cluster check` over real SSH against Dropbear servers
#                           on 127.0.0.x (host keys strict/accept-new/changed, wrong key);
#   test_cluster_sshtap.py  Mininet Cluster Edition's tunnel (ssh -w tap) against VXLAN on
#                           the same pair: RTT, TCP goodput at 200 Mbit/s, ssh's CPU;
#   test_cluster_up.py      `lightpipe cluster up/down` on two stand-ins over SSH;
#   test_cluster_emu.py     `lightpipe emu --cluster`: a pipeline job's workers on both
#                           stand-ins, one Prometheus, records on one clock, kill -9.
# Dropbear and OpenSSH's server are not installed here: without them on PATH their .debs
# are fetched once with `apt-get download` and unpacked (dpkg -x, nothing installed) into
# $LIGHTPIPE_CLUSTER_CACHE. Extra arguments go to pytest.
#   sudo bash tests/cluster/run.sh [-k mtu]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${VENV:-.venv}/bin/python"
CACHE="${LIGHTPIPE_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lightpipe/cluster-harness}"
unpack() {  # unpack DIR BINARY DEB...: DIR/root/BINARY from the .debs, fetched once
  local dir="$CACHE/$1" bin="$2"
  shift 2
  if [ ! -x "$dir/root/$bin" ]; then
    mkdir -p "$dir/debs"
    (cd "$dir/debs" && apt-get download "$@") \
      || echo "cluster harness: could not fetch $*; the tests that need it skip" >&2
    for deb in "$dir"/debs/*.deb; do [ -f "$deb" ] && dpkg -x "$deb" "$dir/root"; done
  fi
  [ -x "$dir/root/$bin" ]
}
if [ -z "${LIGHTPIPE_DROPBEAR_ROOT:-}" ] && ! command -v dropbear >/dev/null \
    && unpack dropbear usr/sbin/dropbear dropbear-bin libtomcrypt1 libtommath1; then
  export LIGHTPIPE_DROPBEAR_ROOT="$CACHE/dropbear/root"
fi
if [ -z "${LIGHTPIPE_OPENSSH_ROOT:-}" ] && ! command -v sshd >/dev/null \
    && unpack openssh usr/sbin/sshd openssh-server; then
  export LIGHTPIPE_OPENSSH_ROOT="$CACHE/openssh/root"
fi
LIGHTPIPE_CLUSTER_HARNESS=1 exec "$PY" -m pytest tests/cluster -v -s -rs -p no:cacheprovider "$@"
