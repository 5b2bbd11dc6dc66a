#!/usr/bin/env bash
# Move the lock: resolve pyproject.toml's dependencies (the dev extras included) again,
# write requirements.lock (exact versions and sha256 hashes), reinstall from it and run
# the suite. `make lock` runs this; commit requirements.lock only when the suite passes.
#   bash scripts/lock.sh [--keep] [--no-test]
# --keep: keep every pin of the current lock and only resolve what pyproject.toml added
# (pip-compile prefers the pins already in its output file).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0 test=1
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --no-test) test=0 ;;
    *) echo "lock: unknown option $arg (use --keep, --no-test)" >&2; exit 2 ;;
  esac
done
PIP_TOOLS_VERSION=7.6.2
log() { echo "lock: $*" >&2; }
tools=$(mktemp -d /tmp/lightpipe-lock.XXXXXX)
trap 'rm -rf "$tools"' EXIT
"${PYTHON:-python3}" -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "pip-tools==$PIP_TOOLS_VERSION"
if [ "$keep" = 1 ]; then cp requirements.lock "$tools/raw.lock"; fi
log "resolving (pip-compile --generate-hashes; a few minutes)"
"$tools/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --extra dev --strip-extras \
  --no-emit-index-url --no-emit-find-links --no-header \
  -o "$tools/raw.lock" pyproject.toml
# torch is installed on its own (scripts/setup.sh: the pinned CPU build where the machine
# has it, PyPI's 2.13.0 elsewhere): its local build has no hash that holds everywhere.
# LightPipe itself is installed editable, not from the lock.
"$tools/venv/bin/python" - "$tools/raw.lock" requirements.lock.tmp <<'PY'
import re
import sys

src, dst = sys.argv[1:3]
out, skip = [], False
for line in open(src, encoding="utf-8"):
    if re.match(r"^[A-Za-z0-9]", line):
        skip = line.startswith(("torch==", "lightpipe @"))
    if not skip and not line.startswith(("# WARNING: pip install", "# Consider using")):
        out.append(line)
head = ("# LightPipe's locked Python dependencies: exact versions and sha256 hashes.\n"
        "# Written by `make lock` (scripts/lock.sh); used by `make setup` (scripts/setup.sh).\n"
        "# torch==2.13.0 is installed separately (its CPU build has no portable hash).\n")
open(dst, "w", encoding="utf-8").write(head + "".join(out))
PY
mv requirements.lock.tmp requirements.lock
log "wrote requirements.lock ($(grep -c '==' requirements.lock) packages)"
rm -f .venv/.lightpipe-setup
if [ "$test" = 1 ]; then
  make test
fi
