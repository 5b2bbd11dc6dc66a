#!/usr/bin/env bash
# Runs inside the virtme-ng guest (see run.sh): the `vm` tests against the guest kernel.
# Args: OUT (host directory, writable over 9p) VENV PYTHONPATH [pytest args...]
set -uo pipefail
OUT="$1"; VENV="$2"; export PYTHONPATH="$3"; shift 3
export PATH="$VENV/bin:/usr/sbin:/sbin:$PATH"
# The root filesystem is the host's, read-only: everything written goes to guest tmpfs
# (/run is tmpfs, /tmp an overlay); SQLite's WAL does not work on a 9p directory.
export TMPDIR=/tmp LIGHTPIPE_STATE_DIR=/run/lightpipe PYTHONDONTWRITEBYTECODE=1
export LIGHTPIPE_IN_VM=1 HOME=/tmp LIGHTPIPE_VM_OUT_DIR="$OUT"
export LIGHTPIPE_VM_CALIBRATION="${LIGHTPIPE_VM_CALIBRATION:-1}" LIGHTPIPE_VM_RING="${LIGHTPIPE_VM_RING:-1}"
echo "guest kernel: $(uname -r) ($(uname -v))"
echo "guest cpus: $(nproc), memory: $(awk '/MemTotal/ {print $2 / 1024 " MiB"}' /proc/meminfo)"
t0=$(date +%s)
if [ -n "${LIGHTPIPE_VM_CMD:-}" ]; then
  bash -c "$LIGHTPIPE_VM_CMD"
else
  python -m pytest -m vm tests/vm -v -s -rs -p no:cacheprovider \
    --junitxml="$OUT/junit.xml" "$@"
fi
rc=$?
echo "guest: exit $rc in $(( $(date +%s) - t0 )) s"
echo "$rc" > "$OUT/rc"
