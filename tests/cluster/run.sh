#!/usr/bin/env bash
# The cluster tunnel harness (root): two network namespaces per stand-in machine on this
# host, a VXLAN tunnel per crossing fibre as testbed.cluster.tunnel plans it, raw frames
# through it at the MTU boundary, figures printed. Extra arguments go to pytest.
#   sudo bash tests/cluster/run.sh [-k mtu]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${VENV:-.venv}/bin/python"
LIGHTPIPE_CLUSTER_HARNESS=1 exec "$PY" -m pytest tests/cluster -v -s -rs -p no:cacheprovider "$@"
