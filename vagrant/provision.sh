#!/usr/bin/env bash
# Provision a Debian/Ubuntu machine (the Vagrant VM) as a LightPipe testbed, as root:
# LightPipe (make setup), the kernel's extra modules (netem), Open vSwitch with the kernel
# datapath, Prometheus, and Grafana from Grafana's own apt repository with the project's
# grafana/provisioning linked in. Idempotent: running it again changes nothing.
#
#   sudo vagrant/provision.sh [--repo DIR] [--no-setup] [--no-grafana] [--no-prometheus]
#                             [--no-ovs] [--no-modules] [--no-services]
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DO_SETUP=1 DO_GRAFANA=1 DO_PROMETHEUS=1 DO_OVS=1 DO_MODULES=1 DO_SERVICES=1
GRAFANA_APT="https://apt.grafana.com"
GRAFANA_KEY=/etc/apt/keyrings/grafana.gpg

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
log() { echo "provision: $*" >&2; }
die() { echo "provision: $*" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --repo) [ "$#" -ge 2 ] || die "--repo needs a directory"; REPO="$2"; shift ;;
    --no-setup) DO_SETUP=0 ;;
    --no-grafana) DO_GRAFANA=0 ;;
    --no-prometheus) DO_PROMETHEUS=0 ;;
    --no-ovs) DO_OVS=0 ;;
    --no-modules) DO_MODULES=0 ;;
    --no-services) DO_SERVICES=0 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "needs apt-get (Debian or Ubuntu)"
[ -f "$REPO/Makefile" ] || die "--repo $REPO is not a LightPipe checkout"
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends)
UPDATED=0

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
apt_install() {
  local want=() p
  for p in "$@"; do installed "$p" || want+=("$p"); done
  [ "${#want[@]}" -eq 0 ] && return 0
  if [ "$UPDATED" = 0 ]; then apt-get -o DPkg::Lock::Timeout=300 update -qq; UPDATED=1; fi
  log "installing ${want[*]}"
  "${APT[@]}" install "${want[@]}"
}
have_systemd() { [ -d /run/systemd/system ]; }
enable_service() {
  if [ "$DO_SERVICES" = 1 ] && have_systemd; then
    systemctl enable --now "$1" >/dev/null 2>&1 || log "could not start $1 (systemctl status $1)"
  else
    log "not starting $1 (no systemd or --no-services)"
  fi
}

apt_install ca-certificates curl gnupg make python3 python3-venv iproute2 kmod

if [ "$DO_MODULES" = 1 ]; then
  # Ubuntu keeps sch_netem (and more qdiscs) in linux-modules-extra; Debian ships them.
  if grep -qi ubuntu /etc/os-release; then
    extra="linux-modules-extra-$(uname -r)"
    if apt-cache show "$extra" >/dev/null 2>&1; then apt_install "$extra"
    else log "no $extra for this kernel: netem may be missing"; fi
  fi
  mkdir -p /etc/modules-load.d
  printf '%s\n' sch_netem openvswitch > /etc/modules-load.d/lightpipe.conf
  for m in sch_netem openvswitch; do
    modprobe "$m" 2>/dev/null || log "modprobe $m failed (module not in this kernel?)"
  done
fi

if [ "$DO_OVS" = 1 ]; then
  apt_install openvswitch-switch
  enable_service openvswitch-switch
fi

if [ "$DO_PROMETHEUS" = 1 ]; then
  apt_install prometheus
  enable_service prometheus
fi

if [ "$DO_GRAFANA" = 1 ]; then
  mkdir -p /etc/apt/keyrings
  if [ ! -s "$GRAFANA_KEY" ]; then
    curl -fsSL "$GRAFANA_APT/gpg.key" | gpg --dearmor --yes -o "$GRAFANA_KEY"
  fi
  line="deb [signed-by=$GRAFANA_KEY] $GRAFANA_APT stable main"
  if [ "$(cat /etc/apt/sources.list.d/grafana.list 2>/dev/null)" != "$line" ]; then
    echo "$line" > /etc/apt/sources.list.d/grafana.list
    UPDATED=0
  fi
  apt_install grafana
  # The project's provisioning (datasource + dashboards provider) replaces the default.
  if [ -d "$REPO/grafana/provisioning" ]; then
    target="$(readlink -f "$REPO/grafana/provisioning")"
    if [ "$(readlink -f /etc/grafana/provisioning)" != "$target" ]; then
      if [ -d /etc/grafana/provisioning ] && [ ! -L /etc/grafana/provisioning ]; then
        rm -rf /etc/grafana/provisioning.dist
        mv /etc/grafana/provisioning /etc/grafana/provisioning.dist
      fi
      ln -sfn "$target" /etc/grafana/provisioning
    fi
  else
    log "no $REPO/grafana/provisioning: Grafana keeps its default provisioning"
  fi
  enable_service grafana-server
fi

if [ "$DO_SETUP" = 1 ]; then
  log "make setup in $REPO"
  make -C "$REPO" setup
fi
log "done"
