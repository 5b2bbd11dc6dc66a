"""The cluster harness is opt-in: `make test` never collects it (it makes namespaces and
VXLAN devices of its own and prints figures). Run it with tests/cluster/run.sh, or
LIGHTPIPE_CLUSTER_HARNESS=1 pytest tests/cluster -s (root)."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("LIGHTPIPE_CLUSTER_HARNESS") == "1" else ["test_*.py"]
