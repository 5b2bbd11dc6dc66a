"""OpenFlow 1.3 wire encoding of the controller's rules, groups and barriers (pure: struct only).

The app's `sync` writes these bytes instead of building os-ken message objects: os-ken's
classes took 30-60 us per flow-mod to build and serialize, and a restoration sends a
few hundred (a cut of fibre 13-9 with 20 lightpaths up: ~216 messages, 8 ms of the
17 ms). The bytes are exactly os-ken's (tests/test_controller_ofwire.py compares them
for every entry the controller makes). Supported: the matches, actions and groups of
controllers.rules, flowroute, wanroute and protection; anything else is `Unsupported`
(the app deletes a foreign stale entry through os-ken instead).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controllers.flowroute import GroupRule
from controllers.protection import FailoverGroup
from controllers.rules import FlowRule

OFP_VERSION = 4
OFPT_FLOW_MOD, OFPT_GROUP_MOD, OFPT_BARRIER_REQUEST = 14, 15, 20
OFPFC_ADD, OFPFC_DELETE_STRICT = 0, 4
GROUP_COMMANDS = {"add": 0, "modify": 1, "delete": 2}
OFPGT_SELECT, OFPGT_FF = 1, 3
OFPP_ANY = OFPG_ANY = OFP_NO_BUFFER = 0xFFFFFFFF
OFPP_CONTROLLER = 0xFFFFFFFD
OFPCML_MAX, OFPCML_NO_BUFFER = 0xFFE5, 0xFFFF
OFP_DEFAULT_PRIORITY = 0x8000
MAX_XID = 0xFFFFFFFF
ALL_COOKIE_BITS = 0xFFFFFFFFFFFFFFFF

HEADER = struct.Struct("!BBHI")  # version, type, length, xid
FLOW_MOD = struct.Struct("!QQBBHHHIIIH2x")  # cookie .. flags (after the header)
GROUP_MOD = struct.Struct("!HBxI")  # command, type, group id
BUCKET = struct.Struct("!HHII4x")  # length, weight, watch port, watch group

# OXM basic fields: name -> (field number, value format); sorted by number when encoded,
# as os-ken's OFPMatch sorts them.
OXM = {"in_port": (0, "I"), "eth_type": (5, "H"), "vlan_vid": (6, "H"),
       "vlan_pcp": (7, "B"), "ipv4_src": (11, "4s"), "ipv4_dst": (12, "4s")}
OXM_CLASS_BASIC = 0x8000
# name -> (field number, header + value packer), built once
_OXM_PACK = {name: (field, struct.Struct("!I" + fmt), OXM_CLASS_BASIC << 16 | field << 9
                    | struct.calcsize("!" + fmt))
             for name, (field, fmt) in OXM.items()}
MATCH_HEADER = struct.Struct("!HH")  # type (OXM), length

Message = tuple[int, bytes]  # (message type, body after the header)


class Unsupported(ValueError):
    """An entry outside this encoder's vocabulary (e.g. a stale entry read back from a
    switch, which may match on anything)."""


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _oxm(name: str, value: Any) -> tuple[int, bytes]:
    try:
        field, packer, header = _OXM_PACK[name]
    except KeyError:
        raise Unsupported(f"match field {name!r} has no encoder") from None
    try:
        if field >= 11:  # an IPv4 address
            value = socket.inet_aton(value)
        return field, packer.pack(header, value)
    except (TypeError, OSError, struct.error) as exc:  # e.g. a masked value: (value, mask)
        raise Unsupported(f"match field {name!r}: {value!r} has no encoder ({exc})") from None


def match(fields: Iterable[tuple[str, Any]]) -> bytes:
    """ofp_match (OXM) of the fields, padded to 8 bytes."""
    tlvs = b"".join(t for _, t in sorted(_oxm(k, v) for k, v in fields))
    length = 4 + len(tlvs)
    return MATCH_HEADER.pack(1, length) + tlvs + bytes(_pad8(length) - length)


def _set_field(name: str, value: Any) -> bytes:
    tlv = _oxm(name, value)[1]
    length = _pad8(4 + len(tlv))
    return struct.pack("!HH", 25, length) + tlv + bytes(length - 4 - len(tlv))


def action(name: str, arg: int) -> bytes:
    """One action of a rule's or bucket's action list (controllers.rules' names)."""
    if name == "output":
        return struct.pack("!HHIH6x", 0, 16, arg, OFPCML_MAX)
    if name == "controller":
        return struct.pack("!HHIH6x", 0, 16, OFPP_CONTROLLER, OFPCML_NO_BUFFER)
    if name == "push_vlan":
        return struct.pack("!HHH2x", 17, 8, arg)
    if name == "pop_vlan":
        return struct.pack("!HH4x", 18, 8)
    if name == "set_vlan_vid":
        return _set_field("vlan_vid", arg)
    if name == "set_vlan_pcp":
        return _set_field("vlan_pcp", arg)
    if name == "group":
        return struct.pack("!HHI", 22, 8, arg)
    raise Unsupported(f"unknown action {name!r}")


def _instructions(spec: tuple[tuple[str, int], ...]) -> bytes:
    """Apply-actions (if any), then goto-table, as the app's os-ken path orders them."""
    acts = b"".join(action(n, a) for n, a in spec if n != "goto_table")
    gotos = b"".join(struct.pack("!HHB3x", 1, 8, a) for n, a in spec if n == "goto_table")
    apply = struct.pack("!HH4x", 4, 8 + len(acts)) + acts if acts else b""
    return apply + gotos


def flow_mod(rule: FlowRule, delete: bool = False) -> Message:
    """The flow-mod that adds (or strictly deletes) a rule."""
    if delete:
        body = FLOW_MOD.pack(rule.cookie, ALL_COOKIE_BITS, rule.table, OFPFC_DELETE_STRICT,
                             0, 0, rule.priority, OFP_NO_BUFFER, OFPP_ANY, OFPG_ANY, 0)
        return OFPT_FLOW_MOD, body + match(rule.match)
    body = FLOW_MOD.pack(rule.cookie, 0, rule.table, OFPFC_ADD, 0, 0, rule.priority,
                         OFP_NO_BUFFER, 0, 0, 0)
    return OFPT_FLOW_MOD, body + match(rule.match) + _instructions(rule.actions)


def group_mod(group: GroupRule | FailoverGroup, command: str) -> Message:
    """The group-mod that adds, modifies or deletes a select or fast-failover group."""
    cmd = GROUP_COMMANDS[command]
    buckets = b""
    if isinstance(group, FailoverGroup):
        kind = OFPGT_FF
        if command != "delete":
            for watch, acts in group.buckets:
                a = b"".join(action(n, x) for n, x in acts if n != "goto_table")
                buckets += BUCKET.pack(BUCKET.size + len(a), 0, watch, OFPG_ANY) + a
    else:
        kind = OFPGT_SELECT
        if command != "delete":
            for port in group.ports:
                a = action("output", port)
                buckets += BUCKET.pack(BUCKET.size + len(a), 1, OFPP_ANY, OFPG_ANY) + a
    return OFPT_GROUP_MOD, GROUP_MOD.pack(cmd, kind, group.group_id) + buckets


def _is_group(x: Any) -> bool:
    return isinstance(x, GroupRule | FailoverGroup)


def changes(installed: Mapping[tuple, Any], add: tuple[Any, ...], delete: tuple[Any, ...],
            delete_other: Callable[[FlowRule], Message] | None = None) -> list[Message]:
    """The messages, in order: groups before the flows that use them; flows deleted
    before their groups (a group already installed is modified). `delete_other`
    encodes the deletion of a flow entry outside this encoder's vocabulary (a stale
    entry a switch listed); without it such an entry raises Unsupported."""

    def delete_flow(r: FlowRule) -> Message:
        try:
            return flow_mod(r, delete=True)
        except Unsupported:
            if delete_other is None:
                raise
            return delete_other(r)

    msgs = [group_mod(g, "modify" if g.key in installed else "add") for g in add if _is_group(g)]
    msgs += [flow_mod(r) for r in add if not _is_group(r)]
    msgs += [delete_flow(r) for r in delete if not _is_group(r)]
    msgs += [group_mod(g, "delete") for g in delete if _is_group(g)]
    return msgs


def barrier() -> Message:
    return OFPT_BARRIER_REQUEST, b""


def frame(msgs: Iterable[Message], first_xid: int) -> bytes:
    """The messages with their headers, xids first_xid, first_xid + 1, ..., as one write."""
    out = []
    for i, (kind, body) in enumerate(msgs):
        out.append(HEADER.pack(OFP_VERSION, kind, HEADER.size + len(body),
                               (first_xid + i) & MAX_XID))
        out.append(body)
    return b"".join(out)
