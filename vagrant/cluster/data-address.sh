#!/usr/bin/env bash
# The VM's address on the cluster's data network (vagrant/cluster/Vagrantfile), where the
# box's own network configuration did not apply Vagrant's: on the Debian box of LightPipe's
# VM tests, systemd-networkd's catch-all DHCP file outranks the one Vagrant writes. The
# address goes on the one Ethernet interface that does not hold the default route, in a
# networkd file that outranks both (persistent across reboots). Idempotent.
#   data-address.sh 192.168.58.11/24
set -euo pipefail
cidr="${1:?usage: data-address.sh ADDRESS/PREFIX}"
log() { echo "data-address: $*" >&2; }
die() { echo "data-address: $*" >&2; exit 1; }
[[ "$cidr" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}$ ]] || die "not an IPv4 ADDRESS/PREFIX: $cidr"
has_addr() { ip -o -4 addr show | awk '{print $4}' | grep -qxF "$cidr"; }
if has_addr; then
  log "$cidr is configured"
  exit 0
fi
mgmt="$(ip -o -4 route show default | awk '{print $5; exit}')"
mapfile -t nics < <(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' |
                    grep -E '^(en|eth)' | grep -vxF "${mgmt:-none}")
[ "${#nics[@]}" = 1 ] || die "expected one Ethernet interface besides ${mgmt:-none}: ${nics[*]:-none}"
nic="${nics[0]}"
if systemctl is-active --quiet systemd-networkd; then
  printf '[Match]\nName=%s\n\n[Network]\nAddress=%s\nDHCP=no\nLinkLocalAddressing=no\n' \
    "$nic" "$cidr" > /etc/systemd/network/10-lightpipe-data.network
  networkctl reload
  networkctl reconfigure "$nic"
else
  log "systemd-networkd is not running: $cidr on $nic until the next boot only"
  ip link set "$nic" up
  ip addr add "$cidr" dev "$nic"
fi
for _ in $(seq 100); do has_addr && break; sleep 0.1; done
has_addr || die "$cidr did not come up on $nic"
log "$cidr on $nic"
