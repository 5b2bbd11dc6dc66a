#!/usr/bin/env bash
# Provision a Debian/Ubuntu machine (the Vagrant VM) as a LightPipe testbed, as root:
# LightPipe (make setup) with `lightpipe` on PATH, the kernel's extra modules (netem), Open
# vSwitch with the kernel datapath, the LightPipe monitor (Prometheus) as a systemd service on
# port 9090, and Grafana from Grafana's apt repository with LightPipe's datasource and
# dashboards. Idempotent: running it again changes nothing.
#
#   sudo vagrant/provision.sh [--repo DIR] [--listen ADDR] [--no-setup] [--no-grafana]
#                             [--no-prometheus] [--no-ovs] [--no-modules] [--no-services]
#
# --listen: the address the monitor (9090) and Grafana (3000) listen on, 127.0.0.1 by default
# (VirtualBox's port forwarding needs 0.0.0.0). --no-services: no systemd units, nothing started.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
LISTEN=127.0.0.1
MONITOR_PORT=9090
DO_SETUP=1 DO_GRAFANA=1 DO_PROMETHEUS=1 DO_OVS=1 DO_MODULES=1 DO_SERVICES=1
GRAFANA_APT="https://apt.grafana.com"
GRAFANA_KEY=/etc/apt/keyrings/grafana.gpg
GRAFANA_ETC="${LIGHTPIPE_GRAFANA_ETC:-/etc/grafana}"  # (another place only for tests)
GRAFANA_PROV="$GRAFANA_ETC/provisioning"
GRAFANA_DASH="$GRAFANA_ETC/dashboards/lightpipe"
SECRETS=/etc/lightpipe
GRAFANA_PASSWORD_FILE="$SECRETS/grafana-admin-password"
STATE=/var/lib/lightpipe

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
log() { echo "provision: $*" >&2; }
die() { echo "provision: $*" >&2; exit 2; }

while [ "$#" -gt 0 ]; do
  case "$1" in
    --repo) [ "$#" -ge 2 ] || die "--repo needs a directory"; REPO="$2"; shift ;;
    --listen) [ "$#" -ge 2 ] || die "--listen needs an address"; LISTEN="$2"; shift ;;
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
case "$LISTEN" in
  127.0.0.1|0.0.0.0) ;;
  *) die "--listen $LISTEN: 127.0.0.1 or 0.0.0.0" ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "needs apt-get (Debian or Ubuntu)"
[ -f "$REPO/Makefile" ] || die "--repo $REPO is not a LightPipe checkout"
REPO="$(cd "$REPO" && pwd -P)"
HERE="$REPO/vagrant"  # (the templates; Vagrant runs this script from a copy in /tmp)
export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends)
UPDATED=0
GRAFANA_CHANGED=0

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
apt_install() {
  local want=() p
  for p in "$@"; do installed "$p" || want+=("$p"); done
  [ "${#want[@]}" -eq 0 ] && return 0
  if [ "$UPDATED" = 0 ]; then apt-get -o DPkg::Lock::Timeout=300 update -qq; UPDATED=1; fi
  log "installing ${want[*]}"
  "${APT[@]}" install "${want[@]}"
}
# Packages whose postinst starts a service that must not run (Debian's prometheus on 9090):
# installed with services held back by policy-rc.d, which deb-systemd-invoke obeys.
apt_install_held() {
  local p need=0
  for p in "$@"; do installed "$p" || need=1; done
  [ "$need" = 1 ] || return 0
  [ -e /usr/sbin/policy-rc.d ] && die "/usr/sbin/policy-rc.d exists: not overwriting it"
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt_install "$@"
  rm -f /usr/sbin/policy-rc.d
  trap - EXIT
}
have_systemd() { [ -d /run/systemd/system ]; }
services() { [ "$DO_SERVICES" = 1 ] && have_systemd; }
enable_service() {
  if services; then
    systemctl enable --now "$1" >/dev/null 2>&1 || log "could not start $1 (systemctl status $1)"
  else
    log "not starting $1 (no systemd or --no-services)"
  fi
}
# install_file SRC DEST MODE: copy when the content or mode differs; says whether it did.
install_file() {
  if cmp -s "$1" "$2" && [ "$(stat -c %a "$2")" = "$3" ] && [ ! -L "$2" ] &&
     [ "$(stat -c %u "$2")" = 0 ]; then
    return 1
  fi
  install -D -o root -g root -m "$3" "$1" "$2"
  return 0
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
  want_modules="$(printf '%s\n' sch_netem openvswitch)"
  [ "$(cat /etc/modules-load.d/lightpipe.conf 2>/dev/null)" = "$want_modules" ] ||
    echo "$want_modules" > /etc/modules-load.d/lightpipe.conf
  for m in sch_netem openvswitch; do
    modprobe "$m" 2>/dev/null || log "modprobe $m failed (module not in this kernel?)"
  done
fi

if [ "$DO_OVS" = 1 ]; then
  apt_install openvswitch-switch
  enable_service openvswitch-switch
fi

# The distribution's Prometheus: LightPipe's monitor runs the binary itself on port 9090
# (the Grafana datasource's), so the packaged service must never start and take that port.
mask_distro_prometheus() {
  if services; then
    local was=""
    systemctl is-active --quiet prometheus 2>/dev/null && was="stopped, "
    if [ "$(systemctl is-enabled prometheus 2>/dev/null)" != masked ]; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
      systemctl mask prometheus >/dev/null 2>&1
      log "the distribution's prometheus.service: ${was}disabled and masked (port $MONITOR_PORT is lightpipe-monitor.service's)"
    elif [ -n "$was" ]; then
      systemctl stop prometheus >/dev/null 2>&1 || true
      log "the distribution's prometheus.service: stopped (masked already)"
    fi
  elif have_systemd; then
    log "--no-services: the distribution's prometheus.service left as it is"
  fi
}
if [ "$DO_PROMETHEUS" = 1 ] || [ "$DO_SETUP" = 1 ]; then
  # (make setup's system packages include prometheus too: installed here first, held.)
  apt_install_held prometheus
  mask_distro_prometheus
fi

if [ "$DO_SETUP" = 1 ]; then
  log "make setup in $REPO"
  make -C "$REPO" setup
  mask_distro_prometheus
  # `lightpipe` on PATH: the checkout's CLI, as root, run scenarios by their repository path.
  tmp="$(mktemp)"
  sed -e "s|@REPO@|$REPO|g" -e "s|@STATE@|$STATE|g" "$HERE/lightpipe-wrapper.sh" > "$tmp"
  if install_file "$tmp" /usr/local/bin/lightpipe 755; then
    log "installed /usr/local/bin/lightpipe (runs $REPO/.venv/bin/lightpipe as root)"
  fi
  rm -f "$tmp"
fi

# --- the LightPipe monitor: a systemd service on $LISTEN:$MONITOR_PORT -------------------
if [ "$DO_PROMETHEUS" = 1 ]; then
  if services; then
    install -d -o root -g root -m 0755 "$STATE"
    tmp="$(mktemp)"
    sed -e "s|@REPO@|$REPO|g" -e "s|@LISTEN@|$LISTEN|g" -e "s|@PORT@|$MONITOR_PORT|g" \
      "$HERE/lightpipe-monitor.service" > "$tmp"
    changed=0
    install_file "$tmp" /etc/systemd/system/lightpipe-monitor.service 644 && changed=1
    rm -f "$tmp"
    [ "$changed" = 1 ] && systemctl daemon-reload
    systemctl enable lightpipe-monitor >/dev/null 2>&1
    if [ ! -x "$REPO/.venv/bin/lightpipe" ]; then
      log "lightpipe-monitor.service enabled, not started: no $REPO/.venv (make setup)"
    elif [ "$changed" = 1 ] || ! systemctl is-active --quiet lightpipe-monitor; then
      systemctl restart lightpipe-monitor ||
        log "lightpipe-monitor did not start (journalctl -u lightpipe-monitor)"
      log "lightpipe-monitor.service: http://$LISTEN:$MONITOR_PORT, data in $STATE/prometheus"
    fi
  else
    log "no systemd or --no-services: start the monitor with 'sudo lightpipe monitor up'"
  fi
fi

# --- Grafana -----------------------------------------------------------------------------
# The provisioning goes where Grafana reads it, owned by root (copies, not links into the
# synced checkout), with the dashboards' path written in: nothing for a user to set.
install_grafana_provisioning() {
  local src="$REPO/grafana" f tmp changed=0
  [ -d "$src/provisioning" ] || { log "no $src/provisioning: Grafana not provisioned"; return 0; }
  if [ -L "$GRAFANA_PROV" ]; then  # an older provision.sh linked the checkout in
    rm -f "$GRAFANA_PROV"
    [ -d "$GRAFANA_PROV.dist" ] && mv "$GRAFANA_PROV.dist" "$GRAFANA_PROV"
  fi
  for f in "$GRAFANA_ETC" "$GRAFANA_PROV" "$GRAFANA_PROV/datasources" \
      "$GRAFANA_PROV/dashboards" "$GRAFANA_ETC/dashboards" "$GRAFANA_DASH"; do
    if [ -L "$f" ] || { [ -e "$f" ] && [ "$(stat -c %u "$f")" != 0 ]; }; then
      die "$f is a link or not root's: not writing Grafana's provisioning through it"
    fi
    [ -d "$f" ] || install -d -o root -g root -m 0755 "$f"
    chmod go-w "$f"
  done
  install_file "$src/provisioning/datasources/lightpipe.yaml" \
    "$GRAFANA_PROV/datasources/lightpipe.yaml" 644 && changed=1
  tmp="$(mktemp)"
  sed "s|\${LIGHTPIPE_GRAFANA_DASHBOARDS}|$GRAFANA_DASH|g" \
    "$src/provisioning/dashboards/lightpipe.yaml" > "$tmp"
  # shellcheck disable=SC2016  # (a literal ${)
  if grep -qF '${' "$tmp"; then rm -f "$tmp"; die "unresolved variable in $src/provisioning/dashboards/lightpipe.yaml"; fi
  install_file "$tmp" "$GRAFANA_PROV/dashboards/lightpipe.yaml" 644 && changed=1
  rm -f "$tmp"
  for f in "$src"/dashboards/*.json; do
    install_file "$f" "$GRAFANA_DASH/$(basename "$f")" 644 && changed=1
  done
  for f in "$GRAFANA_DASH"/*.json; do  # dashboards no longer in the checkout
    [ -e "$f" ] || continue
    [ -e "$src/dashboards/$(basename "$f")" ] || { rm -f "$f"; changed=1; }
  done
  if [ "$changed" = 1 ]; then
    GRAFANA_CHANGED=1
    log "Grafana provisioning in $GRAFANA_PROV, dashboards in $GRAFANA_DASH"
  fi
  if services; then
    tmp="$(mktemp)"
    printf '[Service]\nEnvironment=GF_SERVER_HTTP_ADDR=%s\n' "$LISTEN" > "$tmp"
    if install_file "$tmp" /etc/systemd/system/grafana-server.service.d/lightpipe.conf 644; then
      systemctl daemon-reload
      GRAFANA_CHANGED=1
    fi
    rm -f "$tmp"
  fi
  return 0
}
grafana_repo() {
  local line="deb [signed-by=$GRAFANA_KEY] $GRAFANA_APT stable main"
  mkdir -p /etc/apt/keyrings
  if [ ! -s "$GRAFANA_KEY" ]; then
    local key
    key="$(mktemp)"
    if ! curl -fsSL --max-time 30 "$GRAFANA_APT/gpg.key" -o "$key" 2>/dev/null; then
      rm -f "$key"
      return 1
    fi
    gpg --dearmor --yes -o "$GRAFANA_KEY" < "$key"
    rm -f "$key"
  fi
  if [ "$(cat /etc/apt/sources.list.d/grafana.list 2>/dev/null)" != "$line" ]; then
    echo "$line" > /etc/apt/sources.list.d/grafana.list
    UPDATED=0
  fi
}
grafana_admin_password() {
  install -d -o root -g root -m 0700 "$SECRETS"
  if [ ! -s "$GRAFANA_PASSWORD_FILE" ]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr '+/' '-_' > "$GRAFANA_PASSWORD_FILE")
    rm -f "$SECRETS/.grafana-admin-set"
  fi
  chmod 0600 "$GRAFANA_PASSWORD_FILE"
  if [ ! -e "$SECRETS/.grafana-admin-set" ]; then
    # Before Grafana's first start, so admin/admin is never live; read from stdin, not argv.
    if runuser -u grafana -- grafana-cli --homepath /usr/share/grafana \
         --config /etc/grafana/grafana.ini admin reset-admin-password --password-from-stdin \
         < "$GRAFANA_PASSWORD_FILE" >/dev/null 2>&1; then
      touch "$SECRETS/.grafana-admin-set"
    else
      log "could not set Grafana's admin password (grafana-cli admin reset-admin-password)"
    fi
  fi
  log "Grafana: user admin, password in $GRAFANA_PASSWORD_FILE (root only: sudo cat it)"
}
install_grafana_provisioning
if [ "$DO_GRAFANA" = 1 ]; then
  if grafana_repo && apt_install grafana; then
    grafana_admin_password
    enable_service grafana-server
    if [ "$GRAFANA_CHANGED" = 1 ] && services && systemctl is-active --quiet grafana-server; then
      systemctl restart grafana-server  # (new provisioning or listen address)
    fi
  else
    log "Grafana's apt repository ($GRAFANA_APT) is unreachable: Grafana not installed, everything else continues"
  fi
else
  log "--no-grafana: Grafana not installed (its provisioning is in $GRAFANA_PROV for when it is)"
fi
log "done"
