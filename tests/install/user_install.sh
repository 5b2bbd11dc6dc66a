#!/usr/bin/env bash
# `make setup`, `make demo` and `make test-fast` as a user's machine gives them, on each Python asked for:
# pip sees PyPI only (none of this machine's find-links, constraints or config files), and
# torch comes the way scripts/install_torch.py takes it there. Each Python gets its own venv
# (VENV_ROOT/venv-3.X); prints the setup's time, the venv's disk, torch's source, then runs
# the fast suite in it. CI runs it for 3.12 and 3.13 (3.11 is make test's own venv).
#
#   bash tests/install/user_install.sh [--keep] 3.12 3.13
#
# --keep: leave the venvs (default: removed at the end, ~6 GB each with PyPI's CUDA torch).
# Environment: VENV_ROOT (default /var/tmp/lightpipe-user-install).
set -euo pipefail
cd "$(dirname "$0")/../.."
keep=0 versions=()
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    3.1[1-3]) versions+=("$arg") ;;
    *) echo "user-install: $arg: give --keep or Python versions 3.11, 3.12, 3.13" >&2; exit 2 ;;
  esac
done
[ "${#versions[@]}" -gt 0 ] || { echo "user-install: give one or more Python versions (3.12 3.13)" >&2; exit 2; }
ROOT_DIR="${VENV_ROOT:-/var/tmp/lightpipe-user-install}"
log() { echo "user-install: $*" >&2; }
mkdir -p "$ROOT_DIR"
# A user's pip: PyPI only.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_NO_INDEX
rc=0
for v in "${versions[@]}"; do
  py="$(bash scripts/find_python.sh "$v")" || { log "no Python $v on this machine"; rc=1; continue; }
  venv="$ROOT_DIR/venv-$v"
  rm -rf "$venv"
  t0=$(date +%s)
  if ! make --no-print-directory setup PYTHON="$py" VENV="$venv" >"$ROOT_DIR/setup-$v.log" 2>&1; then
    tail -n 20 "$ROOT_DIR/setup-$v.log" >&2
    log "Python $v: make setup FAILED"; rc=1; continue
  fi
  t1=$(date +%s)
  source_line="$(grep '^setup: torch ' "$ROOT_DIR/setup-$v.log" | tail -n 1)"
  log "Python $v ($py): make setup (pip on PyPI only) took $((t1 - t0)) s; venv $(du -sh "$venv" | cut -f1); ${source_line#setup: }"
  "$venv/bin/python" -c 'import json, sys; print(json.dumps(json.load(open(sys.prefix + "/lightpipe-torch-source.json"))))' >&2
  # The README's first command, in that venv (its set-up is done: the demo alone runs).
  if ! make --no-print-directory demo PYTHON="$py" VENV="$venv" OUT="$ROOT_DIR/demo-$v" \
      >"$ROOT_DIR/demo-$v.log" 2>&1; then
    tail -n 20 "$ROOT_DIR/demo-$v.log" >&2
    log "Python $v: make demo FAILED"; rc=1
  else
    log "Python $v: make demo wrote $(find "$ROOT_DIR/demo-$v" -type f | wc -l) files"
  fi
  rm -rf "$ROOT_DIR/demo-$v"
  if ! make --no-print-directory test-fast PYTHON="$py" VENV="$venv" >"$ROOT_DIR/test-fast-$v.log" 2>&1; then
    tail -n 30 "$ROOT_DIR/test-fast-$v.log" >&2
    log "Python $v: make test-fast FAILED"; rc=1
  else
    log "Python $v: make test-fast: $(tail -n 1 "$ROOT_DIR/test-fast-$v.log") ($(( $(date +%s) - t1 )) s)"
  fi
  [ "$keep" = 1 ] || rm -rf "$venv"
done
exit "$rc"
