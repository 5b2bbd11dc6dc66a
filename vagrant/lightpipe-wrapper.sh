#!/usr/bin/env bash
# `lightpipe` on PATH in the LightPipe VM (vagrant/provision.sh installs this as
# /usr/local/bin/lightpipe with @REPO@ and @STATE@ filled in): runs the checkout's CLI,
# @REPO@/.venv/bin/lightpipe, as root (through sudo when needed), so that
#   vagrant ssh -c 'lightpipe run scenarios/monitor-demo.yaml'
# works from any directory:
# - a relative path that does not exist here but does in @REPO@ (scenarios/..., traces) is
#   taken from @REPO@;
# - `run`, `emu`, `sim` and `sweep` without --out write to @STATE@/runs/NAME-UTCTIME
#   (NAME: the scenario file's name) and say so.
set -euo pipefail
REPO=@REPO@
STATE=@STATE@
CLI="$REPO/.venv/bin/lightpipe"
[ -x "$CLI" ] || { echo "lightpipe: $CLI is missing (run 'make setup' in $REPO)" >&2; exit 2; }
if [ "$(id -u)" != 0 ]; then
  keep="$(env | sed -n 's/^\(LIGHTPIPE_[A-Za-z0-9_]*\)=.*/\1/p' | paste -sd, -)"
  exec sudo ${keep:+--preserve-env="$keep"} -- "$0" "$@"
fi

args=()
cmd="" spec="" has_out=0 help=0
for a in "$@"; do
  case "$a" in
    --out|--out=*) has_out=1 ;;
    -h|--help) help=1 ;;
  esac
  if [ -z "$cmd" ]; then
    [ "${a#-}" = "$a" ] && cmd="$a"
  else
    case "$a" in
      -*|/*) ;;
      */*|*.yaml|*.yml|*.json|*.csv)
        if [ ! -e "$a" ] && [ -e "$REPO/$a" ]; then a="$REPO/$a"; fi ;;
    esac
    case "$a" in
      -*) ;;
      *.yaml|*.yml|*.json) [ -n "$spec" ] || spec="$a" ;;
    esac
  fi
  args+=("$a")
done
case "$cmd" in
  run|emu|sim|sweep)
    if [ "$has_out" = 0 ] && [ "$help" = 0 ] && [ -n "$spec" ]; then
      name="$(basename "$spec")"
      name="${name%.yaml}"; name="${name%.yml}"; name="${name%.json}"
      out="$STATE/runs/$name-$(date -u +%Y%m%d-%H%M%S)"
      install -d -m 0755 "$STATE" "$STATE/runs"
      echo "lightpipe: no --out: writing to $out" >&2
      args+=(--out "$out")
    fi ;;
esac
exec "$CLI" "${args[@]}"
