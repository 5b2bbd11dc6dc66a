#!/usr/bin/env bash
# Put `lightpipe` on PATH (make setup runs this): as root, /usr/local/bin/lightpipe becomes a
# link to this checkout's VENV/bin/lightpipe when that path is free, a link that leads
# nowhere, or already this link. Anything else there (the VM's wrapper from
# vagrant/provision.sh, another checkout's link) is left alone and named. Not root: says
# how to get it on PATH. Usage: link_cli.sh VENV [LINK]
set -euo pipefail
VENV="${1:-.venv}"
LINK="${2:-${LIGHTPIPE_CLI_LINK:-/usr/local/bin/lightpipe}}"
log() { echo "setup: $*" >&2; }

target="$(cd "$VENV/bin" && pwd -P)/lightpipe"
[ -x "$target" ] || { log "no $target to link"; exit 1; }
if [ "$(id -u)" != 0 ]; then
  log "lightpipe is $target (not root: nothing linked on PATH; 'source $VENV/bin/activate')"
  exit 0
fi
if [ -L "$LINK" ] && [ "$(readlink "$LINK")" = "$target" ]; then
  log "lightpipe on PATH: $LINK -> $target"
elif [ ! -e "$LINK" ]; then  # free, or a link that leads nowhere (a removed checkout)
  mkdir -p "$(dirname "$LINK")"
  ln -sfn "$target" "$LINK"
  log "lightpipe on PATH: linked $LINK -> $target"
else
  log "$LINK is not this checkout's (it is $(readlink -f "$LINK")); left as it is:" \
      "this checkout's CLI is $target"
fi
