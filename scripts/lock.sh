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
# The lock is resolved as a user's machine would: pip sees PyPI only (no local wheel
# directories, constraints or config files of this machine), so that every hash in it is
# PyPI's own and holds on any machine.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_EXTRA_INDEX_URL PIP_INDEX_URL
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

import tomllib

src, dst = sys.argv[1:3]
# pip-compile resolves for the Python it runs on and drops pyproject's environment markers
# (gnpy's `python_version < '3.13'`): they are written back onto those pins, so that one lock
# serves Python 3.11-3.13 and each Python's pip decides.
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
declared = list(project.get("dependencies", []))
for extra in project.get("optional-dependencies", {}).values():
    declared += extra
markers = {}
for req in declared:
    if ";" in req:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip()).group(0)
        markers[re.sub(r"[-_.]+", "-", name).lower()] = req.split(";", 1)[1].strip()
out, skip = [], False
for line in open(src, encoding="utf-8"):
    if re.match(r"^[A-Za-z0-9]", line):
        # torch and what only PyPI's CUDA build of it pulls in (NVIDIA's libraries, triton):
        # scripts/install_torch.py installs a CPU build, and those only where it must take
        # PyPI's CUDA build.
        skip = line.startswith(("torch==", "lightpipe @")) or bool(
            re.match(r"^(nvidia-|cuda-|triton==)", line))
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)( \\)?$", line.rstrip("\n"))
        key = re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else ""
        if m and key in markers:
            line = f"{m.group(1)}=={m.group(2)} ; {markers[key]}{m.group(3) or ''}\n"
    if not skip and not line.startswith(("# WARNING: pip install", "# Consider using")):
        out.append(line)
head = ("# LightPipe's locked Python dependencies: exact versions and sha256 hashes.\n"
        "# Written by `make lock` (scripts/lock.sh); used by `make setup` (scripts/setup.sh).\n"
        "# One lock for Python 3.11, 3.12 and 3.13 (markers decide per Python).\n"
        "# torch==2.13.0 is installed separately (scripts/install_torch.py: a CPU build).\n")
open(dst, "w", encoding="utf-8").write(head + "".join(out))
PY
# One lock for every supported Python (3.11, 3.12, 3.13): each one found here must be able
# to install all of it (a dry run against PyPI; markers such as gnpy's decide per Python).
for minor in 11 12 13; do
  py="$(bash scripts/find_python.sh "3.$minor" 2>/dev/null)" || { log "no Python 3.$minor here: not checked"; continue; }
  "$py" -m venv "$tools/check-3.$minor"
  "$tools/check-3.$minor/bin/pip" install -q --upgrade pip
  if ! "$tools/check-3.$minor/bin/pip" install -q --dry-run --no-deps --require-hashes \
      -r requirements.lock.tmp >"$tools/check.log" 2>&1; then
    tail -n 5 "$tools/check.log" >&2
    log "requirements.lock does not install on Python 3.$minor ($py): not kept"; rm -f requirements.lock.tmp; exit 1
  fi
  log "Python 3.$minor ($py): the lock installs (dry run)"
done
mv requirements.lock.tmp requirements.lock
log "wrote requirements.lock ($(grep -c '==' requirements.lock) packages)"
rm -f .venv/.lightpipe-setup*
if [ "$test" = 1 ]; then
  make test
fi
