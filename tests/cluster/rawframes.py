"""Send or receive raw Ethernet frames on one interface, as the fibre emulator and the
userspace Open vSwitch do (AF_PACKET), for the cluster tunnel harness.

  python rawframes.py send IFACE DST_MAC VLAN COUNT PAYLOAD_BYTES
  python rawframes.py recv IFACE COUNT TIMEOUT_S     (prints "ready", then one JSON line)

Frames carry an 802.1Q tag (VLAN) and EtherType 0x88B5 (local experimental) with a
payload starting with b"LPCT" and a 4-byte sequence number.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
ETH_P_8021Q = 0x8100
ETH_P_LOCAL = 0x88B5
SOL_PACKET = 263
PACKET_AUXDATA = 8
TP_STATUS_VLAN_VALID = 1 << 4
MARK = b"LPCT"


def send(iface: str, dst_mac: str, vlan: int, count: int, payload_bytes: int) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    src = bytes.fromhex(open(f"/sys/class/net/{iface}/address").read().strip().replace(":", ""))
    dst = bytes.fromhex(dst_mac.replace(":", ""))
    for seq in range(count):
        body = MARK + struct.pack("!I", seq)
        body += bytes(payload_bytes - len(body))
        frame = dst + src + struct.pack("!HHH", ETH_P_8021Q, vlan, ETH_P_LOCAL) + body
        s.send(frame)
        time.sleep(0.01)
    s.close()


def recv(iface: str, count: int, timeout_s: float) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
    s.bind((iface, 0))
    print("ready", flush=True)
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        data, anc, _flags, _addr = s.recvmsg(65535, socket.CMSG_SPACE(32))
        vlan = None
        for level, kind, value in anc:
            if level == SOL_PACKET and kind == PACKET_AUXDATA and len(value) >= 20:
                status, = struct.unpack_from("I", value, 0)
                tci, = struct.unpack_from("H", value, 16)
                if status & TP_STATUS_VLAN_VALID:
                    vlan = tci & 0x0FFF
        if len(data) > 14 and struct.unpack_from("!H", data, 12)[0] == ETH_P_8021Q:
            vlan = struct.unpack_from("!H", data, 14)[0] & 0x0FFF
            data = data[:12] + data[16:]  # the tag in the frame itself: take it out
        if struct.unpack_from("!H", data, 12)[0] != ETH_P_LOCAL or data[14:18] != MARK:
            continue
        seq, = struct.unpack_from("!I", data, 18)
        # Size on the wire with the tag: the untagged frame + 4 when a tag came with it.
        got.append({"seq": seq, "vlan": vlan,
                    "frame_bytes": len(data) + (4 if vlan is not None else 0)})
    print(json.dumps(got), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        recv(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
