"""The data-plane layout the controller programs: switches, ports, hosts (pure data).

A layout says which OpenFlow switch (dpid) is the ROADM of an optical node or a switch
of a DC fabric, which port leads where, and where each host sits. The emulation
backend writes one for the network it builds (`--layout FILE` or `PUT /layout`);
`default_layout(scenario)` gives a canonical one (used by the tests and benchmarks,
which build exactly it with real OVS bridges).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.names import DC_NAME_RE, NODE_NAME_RE
from testbed.spec.models import Scenario

MAC_RE = r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$"
Dpid = Annotated[int, Field(ge=1, lt=2**64)]
Port = Annotated[int, Field(ge=1, lt=0xFFFFFF00)]
# Numbers and list sizes that reach loops, tc and the fibre emulators are bounded (a
# PUT /layout body is the controller's input): see docs/security.md.
MAX_RATE_MBPS = 1e7   # emulated rate of a host or fabric link (HTB)
MAX_ITEMS = 65_536    # switches, links, hosts


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SwitchSpec(_Frozen):
    """An OpenFlow switch: a ROADM (optical node) or a DC fabric switch."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    dpid: Dpid
    kind: Literal["roadm", "dc"]
    node: str | None = Field(default=None, description="optical node (kind roadm)")
    dc: str | None = Field(default=None, description="DC name (kind dc)")

    @model_validator(mode="after")
    def _role(self) -> SwitchSpec:
        if self.kind == "roadm" and (self.node is None or not NODE_NAME_RE.fullmatch(self.node)):
            raise ValueError(f"switch {self.name}: a roadm needs a valid node id")
        if self.kind == "dc" and (self.dc is None or not DC_NAME_RE.fullmatch(self.dc)):
            raise ValueError(f"switch {self.name}: a dc switch needs a valid dc name")
        return self


class LinkSpec(_Frozen):
    """A link between two switch ports: a fibre, a DC uplink (DC switch - ROADM) or fabric."""

    a: str
    a_port: Port
    b: str
    b_port: Port
    kind: Literal["fibre", "uplink", "fabric"]
    control: str | None = Field(default=None, description="fibre emulator control socket "
                                "(per-lightpath capacity), or 'netem:<descriptor file>' for a "
                                "netem/HTB fibre (testbed.emu.links.NetemLink), if any")
    rate_mbps: Annotated[float, Field(gt=0, le=MAX_RATE_MBPS, allow_inf_nan=False)] | None = Field(
        default=None, description="emulated rate of a fabric link (HTB both ways), if limited")


class HostSpec(_Frozen):
    """A host (worker) attached to a DC switch port."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    dc: str
    ip: str
    mac: Annotated[str, Field(pattern=MAC_RE)]
    switch: str
    port: Port
    rate_mbps: Annotated[float, Field(gt=0, le=MAX_RATE_MBPS, allow_inf_nan=False)] | None = Field(
        default=None, description="emulated rate of the host's link, if limited")

    @model_validator(mode="after")
    def _ip(self) -> HostSpec:
        ipaddress.IPv4Address(self.ip)
        return self


class Layout(_Frozen):
    """The whole data plane: validated so that every reference resolves."""

    switches: Annotated[list[SwitchSpec], Field(min_length=1, max_length=MAX_ITEMS)]
    links: Annotated[list[LinkSpec], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    hosts: Annotated[list[HostSpec], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    mbps_per_gbps: Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)] = Field(
        default=1.0, description="emulated Mb/s per real Gb/s of lightpath capacity "
        "(testbed.emu.scale.Scale.mbps_per_gbps)")

    @model_validator(mode="after")
    def _refs(self) -> Layout:
        names = [s.name for s in self.switches]
        if len(set(names)) != len(names):
            raise ValueError("duplicate switch names")
        dpids = [s.dpid for s in self.switches]
        if len(set(dpids)) != len(dpids):
            raise ValueError("duplicate dpids")
        by = {s.name: s for s in self.switches}
        used: set[tuple[str, int]] = set()
        for link in self.links:
            for sw, port in ((link.a, link.a_port), (link.b, link.b_port)):
                if sw not in by:
                    raise ValueError(f"link refers to unknown switch {sw!r}")
                if (sw, port) in used:
                    raise ValueError(f"port {sw}:{port} used twice")
                used.add((sw, port))
            kinds = {by[link.a].kind, by[link.b].kind}
            want = {"fibre": {"roadm"}, "uplink": {"roadm", "dc"}, "fabric": {"dc"}}[link.kind]
            if kinds != want:
                raise ValueError(f"{link.kind} link {link.a}-{link.b} joins {sorted(kinds)}")
        for h in self.hosts:
            if h.switch not in by or by[h.switch].kind != "dc":
                raise ValueError(f"host {h.name}: {h.switch!r} is not a dc switch")
            if by[h.switch].dc != h.dc:
                raise ValueError(f"host {h.name}: switch {h.switch} is in another DC")
            if (h.switch, h.port) in used:
                raise ValueError(f"port {h.switch}:{h.port} used twice")
            used.add((h.switch, h.port))
        return self


def default_layout(scenario: Scenario, hosts_per_dc: int | None = None,
                   controls: dict[tuple[str, str], str] | None = None) -> Layout:
    """Canonical layout: one ROADM per node, one switch per DC with its hosts.

    dpids: ROADM of node i = 0x1000 + i, DC j = 0x2000 + j. ROADM ports: one uplink per
    DC at the node (1, 2, ...), then one port per fibre in topology order. DC switch:
    port 1 = uplink, hosts on 2, 3, ... Host k of DC j: 10.<j+1>.0.<k+1>,
    MAC 02:00:00:<j+1>:00:<k+1> (hex).
    """
    from testbed.spec import topology_of

    topo = topology_of(scenario)
    switches: list[SwitchSpec] = []
    links: list[LinkSpec] = []
    hosts: list[HostSpec] = []
    next_port: dict[str, int] = {}
    roadm = {}
    for i, node in enumerate(topo.nodes):
        name = f"r{i}"
        roadm[node] = name
        switches.append(SwitchSpec(name=name, dpid=0x1000 + i, kind="roadm", node=node))
        next_port[name] = 1
    for j, dc in enumerate(scenario.dcs):
        name = f"d{j}"
        switches.append(SwitchSpec(name=name, dpid=0x2000 + j, kind="dc", dc=dc.name))
        r = roadm[dc.node]
        links.append(LinkSpec(a=name, a_port=1, b=r, b_port=next_port[r], kind="uplink"))
        next_port[r] += 1
        n_hosts = dc.hosts or hosts_per_dc or scenario.emulation.hosts_per_dc
        for k in range(n_hosts):
            hosts.append(HostSpec(name=f"{dc.name}-h{k}", dc=dc.name,
                                  ip=f"10.{j + 1}.0.{k + 1}",
                                  mac=f"02:00:00:{j + 1:02x}:00:{k + 1:02x}",
                                  switch=name, port=2 + k))
    for f in topo.fibres:
        a, b = roadm[f.u], roadm[f.v]
        ctl = (controls or {}).get((f.u, f.v)) or (controls or {}).get((f.v, f.u))
        links.append(LinkSpec(a=a, a_port=next_port[a], b=b, b_port=next_port[b],
                              kind="fibre", control=ctl))
        next_port[a] += 1
        next_port[b] += 1
    # the emulation's unit conversion, loaded here only: importing the layout model (as
    # the controller core does) loads nothing of testbed.emu
    from testbed.emu.scale import Scale

    return Layout(switches=switches, links=links, hosts=hosts,
                  mbps_per_gbps=Scale.of(scenario.emulation).mbps_per_gbps)
