"""The document a machine gets for its share of a run, and the probes of the check across
machines: built by the driver, validated on the far side (no root, no Mininet here).

The document carries what the plan is made from (the scenario, the run prefix, the
cluster file, every DC's machine) and the plan's digest, so each machine rebuilds the one
plan the driver made and refuses a different one (another LightPipe version, say).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.cluster.place import Placement, place
from testbed.cluster.share import MachineShare, split
from testbed.cluster.spec import ClusterSpec, parse_cluster
from testbed.cluster.tunnel import plan_tunnels
from testbed.emu.plan import EmuPlan, build_plan
from testbed.emu.state import PREFIX_RE
from testbed.errors import InputError

DOC_VERSION = 1
DOC_MAX_BYTES = 1 << 20        # a share document (NSFNET-14's is ~6 KB)
PROBES_MAX_BYTES = 1 << 20
PROBES_MAX = 4096
LINK_MODES = ("auto", "userspace", "netem")
DATAPATHS = ("auto", "user", "kernel")


def plan_digest(plan: EmuPlan) -> str:
    """A digest of everything in the plan (hex, 16 digits)."""
    text = json.dumps(dataclasses.asdict(plan), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_cluster(scenario: Any, cluster: ClusterSpec, prefix: str | None,
                 overrides: Mapping[str, str] | None = None
                 ) -> tuple[EmuPlan, Placement, dict[str, MachineShare]]:
    """The plan, its placement and one share per machine."""
    plan = build_plan(scenario, prefix)
    placement = place(scenario, plan, cluster.machine_names, dict(overrides or {}))
    roadm = {s.label: s.node for s in plan.switches if s.kind == "roadm"}
    tunnels = plan_tunnels(plan.prefix, placement, cluster, roadm)
    return plan, placement, split(plan, placement, tunnels)


def share_doc(scenario: Any, cluster: ClusterSpec, plan: EmuPlan, placement: Placement,
              machine: str, link_mode: str = "auto", datapath: str = "auto") -> bytes:
    """The document for `machine` (JSON bytes)."""
    doc = {"version": DOC_VERSION, "prefix": plan.prefix, "machine": machine,
           "scenario": scenario.model_dump(mode="json"),
           "cluster": cluster.model_dump(mode="json"),
           "dcs": dict(placement.dc_machine), "link_mode": link_mode,
           "datapath": datapath, "plan_digest": plan_digest(plan)}
    data = json.dumps(doc, sort_keys=True).encode()
    if len(data) > DOC_MAX_BYTES:
        raise InputError("SPEC", f"the share document is {len(data)} bytes, over "
                         f"{DOC_MAX_BYTES}")
    return data


@dataclass(frozen=True)
class ShareOrder:
    """A validated share document."""

    doc: dict[str, Any]
    plan: EmuPlan
    share: MachineShare
    link_mode: str
    datapath: str


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise InputError(f"share.{key}", f"expected a {kind.__name__}")
    return value


def read_share_doc(raw: bytes) -> ShareOrder:
    """Validate a share document (InputError naming the field) and rebuild the share."""
    from testbed.spec.load import parse_scenario

    if len(raw) > DOC_MAX_BYTES:
        raise InputError("share", f"over {DOC_MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError("share", f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputError("share", "expected a JSON object")
    if doc.get("version") != DOC_VERSION:
        raise InputError("share.version", f"expected {DOC_VERSION}")
    prefix = _field(doc, "prefix", str)
    if not PREFIX_RE.fullmatch(prefix):
        raise InputError("share.prefix", f"not a run prefix: {prefix[:20]!r}")
    machine = _field(doc, "machine", str)
    link_mode, datapath = _field(doc, "link_mode", str), _field(doc, "datapath", str)
    if link_mode not in LINK_MODES:
        raise InputError("share.link_mode", f"one of {', '.join(LINK_MODES)}")
    if datapath not in DATAPATHS:
        raise InputError("share.datapath", f"one of {', '.join(DATAPATHS)}")
    scenario = parse_scenario(_field(doc, "scenario", dict), source="share.scenario")
    cluster = parse_cluster(_field(doc, "cluster", dict), source="share.cluster")
    if machine not in cluster.machine_names:
        raise InputError("share.machine", f"{machine[:20]!r} is not in the cluster")
    dcs = _field(doc, "dcs", dict)
    names = sorted(d.name for d in scenario.dcs)
    if sorted(dcs) != names or not all(m in cluster.machine_names for m in dcs.values()):
        raise InputError("share.dcs", "expected every DC of the scenario on a machine of "
                         "the cluster")
    plan, _, shares = plan_cluster(scenario, cluster, prefix, dcs)
    if plan_digest(plan) != doc.get("plan_digest"):
        raise InputError("share.plan_digest", "this machine plans the run differently "
                         "(another LightPipe version?)")
    return ShareOrder(doc, plan, shares[machine], link_mode, datapath)


# -- the check across machines ----------------------------------------------------------

@dataclass(frozen=True)
class PairProbe:
    """Ping one DC pair from one host of its first DC to one host of the other."""

    pair: str
    src_machine: str
    dst_machine: str
    src_node: str
    dst_ip: str
    fibres: tuple[str, ...]
    configured_ms: float   # one-way along the lightpath (the plan's)
    vlan: int | None = None  # the lightpath's VLAN id
    # How to ping (the check's defaults; the delay calibration asks for more, and for a
    # dense stream as the one-machine calibration does).
    pings: int = 10
    interval_s: float = 0.05
    dense_pings: int = 0
    dense_interval_s: float = 0.002


def pair_probes(plan: EmuPlan, placement: Placement) -> list[PairProbe]:
    """One probe per lightpath (DC pair), from its dc_a's first host."""
    first: dict[str, Any] = {}
    for h in plan.hosts:
        first.setdefault(h.dc, h)
    out = []
    for lp in plan.lightpaths:
        src, dst = first[lp.dc_a], first[lp.dc_b]
        out.append(PairProbe(f"{lp.dc_a}~{lp.dc_b}", placement.dc_machine[lp.dc_a],
                             placement.dc_machine[lp.dc_b], src.node,
                             dst.ip.split("/")[0],
                             tuple(f"{u}-{v}" for u, v in zip(lp.path, lp.path[1:],
                                                               strict=False)),
                             lp.delay_ms, lp.vlan))
    return out


def probes_doc(probes: Sequence[PairProbe]) -> bytes:
    return json.dumps([dataclasses.asdict(p) for p in probes]).encode()


def _int_in(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _seconds(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and 0.001 <= value <= 1.0)


def read_probes(raw: bytes) -> list[PairProbe]:
    """Validate a list of probes (InputError naming the field)."""
    if len(raw) > PROBES_MAX_BYTES:
        raise InputError("probes", f"over {PROBES_MAX_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError("probes", f"not JSON ({exc})") from None
    if not isinstance(data, list) or len(data) > PROBES_MAX:
        raise InputError("probes", f"expected a list of at most {PROBES_MAX}")
    out = []
    for i, d in enumerate(data):
        where = f"probes[{i}]"
        try:
            p = PairProbe(**d)
            ok = (isinstance(p.dst_ip, str) and bool(ipaddress.ip_address(p.dst_ip))
                  and all(isinstance(x, str) and 0 < len(x) <= 64 for x in
                      (p.pair, p.src_machine, p.dst_machine, p.src_node, p.dst_ip))
                  and isinstance(p.fibres, list)
                  and all(isinstance(f, str) and len(f) <= 64 for f in p.fibres)
                  and isinstance(p.configured_ms, int | float) and p.configured_ms >= 0
                  and (p.vlan is None or _int_in(p.vlan, 1, 4094))
                  and _int_in(p.pings, 1, 1000) and _int_in(p.dense_pings, 0, 1000)
                  and _seconds(p.interval_s) and _seconds(p.dense_interval_s))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise InputError(where, "expected pair, src_machine, dst_machine, src_node, "
                             "dst_ip (an IP), fibres (names), configured_ms (>= 0), vlan "
                             "(1-4094), pings (1-1000), dense_pings (0-1000), interval_s "
                             "and dense_interval_s (0.001-1 s)")
        out.append(dataclasses.replace(p, fibres=tuple(p.fibres),
                                       configured_ms=float(p.configured_ms),
                                       interval_s=float(p.interval_s),
                                       dense_interval_s=float(p.dense_interval_s)))
    return out
