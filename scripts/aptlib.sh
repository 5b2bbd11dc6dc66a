# shellcheck shell=bash
# Debian packages a script needs, installed only where missing; sourced, not run (by
# scripts/setup.sh and the VM harnesses in tests/vm/).
#
#   apt_missing PKG...          prints, one per line, the packages not installed
#   apt_ensure TAG PKG...       installs the missing ones as root (a line "TAG: installing
#                               ..." on stderr); returns 2, with a line naming them, when
#                               some are missing and this is not root or has no apt-get
# APT_QUIET=1 sends apt-get's own output to /dev/null.

apt_missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || printf '%s\n' "$p"
  done
}

apt_ensure() {
  local tag="$1" missing=()
  shift
  mapfile -t missing < <(apt_missing "$@")
  [ "${#missing[@]}" -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "$tag: missing packages ${missing[*]} (run as root on Debian/Ubuntu to install them)" >&2
    return 2
  fi
  echo "$tag: installing ${missing[*]}" >&2
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
  if [ "${APT_QUIET:-0}" = 1 ]; then
    "${apt[@]}" update -qq >/dev/null &&
      "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  else
    "${apt[@]}" update -qq && "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}"
  fi
}
