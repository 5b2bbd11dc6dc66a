"""os-ken (Ryu API) app: lightpaths as proactive OpenFlow 1.3 rules, restoration, REST.

Handlers stay thin: decode the event and hand it to `ControllerCore` (pure decisions)
or install the rules it computes. Work that takes the core's lock runs in its own
thread, never on the app's event thread, so barrier replies keep flowing.

Configured by environment variables (so it loads the same under `ryu-manager` and
under LightPipe's launcher, `controllers.launcher`):
    LIGHTPIPE_CTL_SPEC     scenario YAML (required)
    LIGHTPIPE_CTL_DB       SQLite state file (default ./lightpipe-controller.db)
    LIGHTPIPE_CTL_LAYOUT   data-plane layout JSON (optional; or PUT /layout)
    LIGHTPIPE_CTL_REST     REST listen address host:port (default 127.0.0.1:8080)
    LIGHTPIPE_CTL_TOKEN_FILE  file holding the REST bearer token (default: a new token
                           written to the database's path with suffix .token, 0600)
    LIGHTPIPE_CTL_RUN_STATE   the emulation run's state directory: layout controls must
                           be its own (unset: every control is refused)
    LIGHTPIPE_CTL_PLACE_TIMEOUT_S  longest a POST /jobs placement may compute (default 20;
                           then 503 and its result is discarded)
    LIGHTPIPE_CTL_MAX_PLACEMENTS   placements computing at once (default 4; more: 503)
    LIGHTPIPE_CTL_PROTECTION  1 (default): fibre-disjoint backups as fast-failover groups
                           (controllers/protection.py); 0: restoration by the controller only
    LIGHTPIPE_CTL_PROTECT_DELAY_S  a new lightpath's protection is installed this long after
                           its set-up, with the other pending ones (default 0.05; "none":
                           within the set-up)
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from controllers import heap, ofwire
from controllers.api import RestApi
from controllers.channels import ForwarderChannel
from controllers.compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    BaseApp,
    arp,
    ethernet,
    hub,
    ofp_event,
    ofproto_v1_3,
    packet,
    set_ev_cls,
)
from controllers.controls import RunControls
from controllers.core import ControllerCore
from controllers.flowroute import GroupRule
from controllers.jobs import JobService
from controllers.layout import Layout
from controllers.placing import PlaceLimits
from controllers.rules import ETH_ARP, FlowRule, diff_rules
from controllers.store import Store
from controllers.tokenfile import new_token_file, read_token

log = logging.getLogger("lightpipe.controller.app")

# A sync's make-before-break rounds (metric label `round`): entries new to a switch, then
# the changed ones (head ends redirected), then the deleted ones (the old route's).
SYNC_ROUNDS = ("new", "changed", "deleted")
BARRIER_TIMEOUT_S = 5.0  # default wait for a switch's reply (--switch-timeout-s)


def switch_timeout_s(env: Any = os.environ) -> float:
    """How long to wait for a switch's barrier or multipart reply."""
    try:
        value = float(env.get("LIGHTPIPE_CTL_SWITCH_TIMEOUT_S", BARRIER_TIMEOUT_S))
    except ValueError:
        return BARRIER_TIMEOUT_S
    return value if 0 < value <= 3600 else BARRIER_TIMEOUT_S


def reserve_xids(dp: Any, n: int) -> int:
    """n consecutive transaction ids of the switch's connection, as os-ken's `set_xid`
    would give them one message at a time; the first."""
    mask = dp.ofproto.MAX_XID
    first = (dp.xid + 1) & mask
    dp.xid = (dp.xid + n) & mask
    return first


class _Multipart:
    """Bodies of one multipart request's replies, and whether the last one came."""

    def __init__(self) -> None:
        self.body: list[Any] = []
        self.done = threading.Event()


def delete_by_os_ken(dp: Any, rule: FlowRule) -> ofwire.Message:
    """The strict delete of a flow entry that controllers.ofwire does not encode (a stale
    entry the switch listed, matching on fields the controller never uses), by os-ken."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    msg = parser.OFPFlowMod(dp, cookie=rule.cookie, cookie_mask=0xFFFFFFFFFFFFFFFF,
                            table_id=rule.table, command=ofp.OFPFC_DELETE_STRICT,
                            priority=rule.priority, out_port=ofp.OFPP_ANY,
                            out_group=ofp.OFPG_ANY, match=parser.OFPMatch(**dict(rule.match)))
    msg.xid = 0
    msg.serialize()
    return ofwire.OFPT_FLOW_MOD, bytes(msg.buf[ofwire.HEADER.size:])


def match_key(match: Any) -> tuple:
    """An OFPMatch's fields in a canonical order (the switch may reorder them)."""
    return tuple(sorted(match.items()))


def _stale_entries(dp: Any, tables: tuple[list[Any], list[int]],
                   desired: dict[tuple, Any]) -> tuple[dict[tuple, Any], tuple[Any, ...]]:
    """What the switch holds (as rules keyed like `desired`) and what of it is unwanted."""
    parser = dp.ofproto_parser
    flows, group_ids = tables
    wanted = {(r.table, r.priority, match_key(parser.OFPMatch(**dict(r.match))))
              for r in desired.values() if isinstance(r, FlowRule)}
    current: dict[tuple, Any] = {}
    stale: list[Any] = []
    for st in flows:
        rule = FlowRule(dp.id, st.table_id, st.priority, tuple(st.match.items()), (),
                        st.cookie)
        current[rule.key] = rule
        if (st.table_id, st.priority, match_key(st.match)) not in wanted:
            stale.append(rule)
    for gid in group_ids:
        group = GroupRule(dp.id, gid, ())
        current[group.key] = group
        if group.key not in desired:
            stale.append(group)
    return current, tuple(stale)


class LightpathApp(BaseApp):  # type: ignore[misc,valid-type]
    """The LightPipe controller application."""

    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from testbed.spec import load_scenario

        spec = os.environ.get("LIGHTPIPE_CTL_SPEC")
        if not spec:
            raise RuntimeError("LIGHTPIPE_CTL_SPEC (scenario file) is not set")
        scenario = load_scenario(spec)
        layout = None
        layout_file = os.environ.get("LIGHTPIPE_CTL_LAYOUT")
        if layout_file:
            with open(layout_file, encoding="utf-8") as f:
                layout = Layout.model_validate(json.load(f))
        self.datapaths: dict[int, Any] = {}
        self.installed: dict[int, dict[tuple, FlowRule]] = {}
        # Switches connected before any layout: their tables are left as they are (they
        # may forward on a previous controller's rules) until a layout says what is wanted.
        self.awaiting_layout: set[int] = set()
        self.barriers: dict[tuple[int, int], threading.Event] = {}
        self.multiparts: dict[tuple[int, int], _Multipart] = {}
        self.sync_lock = threading.RLock()
        self.reply_timeout_s = switch_timeout_s()
        # Last PortStatus per fibre port, in arrival order: a repair runs only if both ends
        # are up when it gets the core's lock (a stale "up" must not undo a later cut).
        self.port_up: dict[tuple[int, int], bool] = {}
        db = os.environ.get("LIGHTPIPE_CTL_DB", "lightpipe-controller.db")
        controls = RunControls(os.environ.get("LIGHTPIPE_CTL_RUN_STATE") or None)
        protection = os.environ.get("LIGHTPIPE_CTL_PROTECTION", "1") != "0"
        delay = os.environ.get("LIGHTPIPE_CTL_PROTECT_DELAY_S", "0.05")
        try:
            delay_s: float | None = None if delay == "none" else min(1.0, max(0.0, float(delay)))
        except ValueError:
            delay_s = 0.05
        self.core = ControllerCore(scenario, Store(db), layout=layout, southbound=self,
                                   capacity=ForwarderChannel(controls), controls=controls,
                                   protection=protection, protect_delay_s=delay_s)
        self.core.connected = set()  # type: ignore[attr-defined]
        self.core.synced = set()  # type: ignore[attr-defined]  # dpids holding all rules
        host, _, port = os.environ.get("LIGHTPIPE_CTL_REST", "127.0.0.1:8080").rpartition(":")
        fd = os.environ.get("LIGHTPIPE_CTL_REST_FD")
        sock = socket.socket(fileno=int(fd)) if fd else None
        token_file = os.environ.get("LIGHTPIPE_CTL_TOKEN_FILE")
        if token_file:
            token = read_token(Path(token_file))
        else:  # loaded without the launcher (ryu-manager): a fresh token, in a 0600 file
            token_file = str(Path(db).resolve().with_suffix(".token"))
            token = new_token_file(Path(token_file))
        self.api = RestApi(self.core, host or "127.0.0.1", int(port), token=token,
                           jobs=JobService(self.core, PlaceLimits.from_env(os.environ)),
                           on_layout=self._adopt_layout, sock=sock)
        self.api.serve()
        log.info("REST API on %s (bearer token in %s)", self.api.url, token_file)
        heap.settle("start-up")  # no full-GC pause inside a later request (controllers/heap.py)

    def _send_event(self, ev: Any, state: Any) -> None:
        """os-ken hands each event to the app's queue, served by the app's own thread. A
        barrier reply is settled here, in the switch's receive thread: one thread
        hand-over less between the switch's answer and the waiting request."""
        if isinstance(ev, ofp_event.EventOFPBarrierReply):
            self._barrier_reply(ev)
            return
        super()._send_event(ev, state)

    def _adopt_layout(self, layout: Layout) -> None:
        """PUT /layout: the core adopts and programs it; its index joins the settled heap."""
        self.core.set_layout(layout)
        heap.settle("a new layout")

    def close(self) -> None:
        self.api.close()
        self.core.store.close()

    # ---- southbound: install what the core wants -------------------------------------
    def sync(self, desired: dict[int, dict[tuple, FlowRule]]) -> None:
        """Bring every connected switch to `desired`, make-before-break across switches,
        in up to three rounds, each one write and one barrier per switch (all switches
        at once) and waiting for all of them: the entries new to each switch; then the
        changed ones (a head end redirected onto a route whose hops are in place); then
        the deleted ones (the old route's, once nothing sends to it)."""
        rounds: list[list[tuple[Any, dict[tuple, Any], tuple[Any, ...], tuple[Any, ...]]]]
        rounds = [[], [], []]
        phase = self.core.metrics.phase_seconds
        t0 = time.perf_counter()
        t_diff = 0.0
        with self.sync_lock:
            for dpid in self.awaiting_layout:  # a layout at last: their first full sync
                if dpid in self.datapaths:
                    hub.spawn(self._full_sync, self.datapaths[dpid])
            self.awaiting_layout.clear()
            for dpid, rules in desired.items():
                dp = self.datapaths.get(dpid)
                if dp is None or dpid not in self.installed:
                    continue  # gets everything in its full sync (connected, or later)
                installed = self.installed[dpid]
                t = time.perf_counter()
                d = diff_rules(installed, rules, dpid)
                t_diff += time.perf_counter() - t
                if not d.add and not d.delete:
                    continue
                new = tuple(r for r in d.add if r.key not in installed)
                changed = tuple(r for r in d.add if r.key in installed)
                for i, (add, delete) in enumerate(((new, ()), (changed, ()), ((), d.delete))):
                    if add or delete:
                        rounds[i].append((dp, installed, add, delete))
                self.installed[dpid] = dict(rules)
        phase.labels(phase="rules").inc(t_diff)
        t = t0 + t_diff
        for name, batch in zip(SYNC_ROUNDS, rounds, strict=True):
            if not batch:
                continue
            waits = []
            with self.sync_lock:
                for dp, installed, add, delete in batch:
                    if self.datapaths.get(dp.id) is not dp:
                        continue  # reconnected meanwhile: its full sync installs everything
                    waits.append((dp.id, self._barrier(
                        dp, ofwire.changes(installed, add, delete))))
            sent = time.perf_counter()
            round_t = t
            phase.labels(phase="send").inc(sent - t)
            self._wait(waits)
            t = time.perf_counter()
            phase.labels(phase="barrier").inc(t - sent)
            self.core.metrics.sync_round_seconds.labels(round=name).observe(t - round_t)

    def _full_sync(self, dp: Any) -> None:
        """A switch (re)connected: bring its tables to the desired rules without a gap.

        The switch may still forward on rules a previous controller process installed
        (fail-mode secure), so its tables are read first; every desired rule is written
        over (an ADD with the same match replaces the entry in place) and only entries
        no longer wanted are deleted. If the switch does not answer the read, its tables
        are wiped and refilled instead. Before any layout, nothing is wanted yet and
        nothing is known: the tables stay untouched until the layout comes (`sync`).
        """
        parser, ofp = dp.ofproto_parser, dp.ofproto
        with self.core.lock, self.sync_lock:
            if self.core.layout is None:
                if self.datapaths.get(dp.id) is dp:
                    self.awaiting_layout.add(dp.id)
                log.info("switch %#x: connected before any layout; tables left as they are",
                         dp.id)
                return
        tables = self._read_tables(dp)
        # Lock order core -> sync (as in core._program): a layout or lightpath change
        # cannot slip between computing this switch's rules and installing them.
        with self.core.lock, self.sync_lock:
            if self.datapaths.get(dp.id) is not dp:
                return  # reconnected meanwhile: the new connection's full sync does it
            desired = self.core.desired().get(dp.id, {})
            if tables is None:
                log.warning("switch %#x: tables not readable; wiping and refilling", dp.id)
                dp.send_msg(parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE,
                                              table_id=ofp.OFPTT_ALL, out_port=ofp.OFPP_ANY,
                                              out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
                dp.send_msg(parser.OFPGroupMod(dp, ofp.OFPGC_DELETE, ofp.OFPGT_SELECT,
                                               ofp.OFPG_ALL, []))
                current: dict[tuple, Any] = {}
                stale: tuple[Any, ...] = ()
            else:
                current, stale = _stale_entries(dp, tables, desired)
            ev = self._barrier(dp, ofwire.changes(
                current, tuple(desired.values()), stale,
                delete_other=lambda r: delete_by_os_ken(dp, r)))
            self.installed[dp.id] = dict(desired)
        self._wait([(dp.id, ev)])
        with self.sync_lock:
            if self.datapaths.get(dp.id) is dp:
                self.core.synced.add(dp.id)  # type: ignore[attr-defined]
        log.info("switch %#x: %d rules installed, %d stale removed", dp.id, len(desired),
                 len(stale))

    def _read_tables(self, dp: Any) -> tuple[list[Any], list[int]] | None:
        """The switch's flow entries and group ids (multipart replies), None on time-out."""
        parser, ofp = dp.ofproto_parser, dp.ofproto
        got: dict[str, Any] = {}
        for name, req in (("flows", parser.OFPFlowStatsRequest(
                              dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0,
                              parser.OFPMatch())),
                          ("groups", parser.OFPGroupDescStatsRequest(dp, 0))):
            dp.set_xid(req)
            pending = _Multipart()
            self.multiparts[(dp.id, req.xid)] = pending
            dp.send_msg(req)
            got[name] = (req.xid, pending)
        deadline = time.monotonic() + self.reply_timeout_s
        ok = all(p.done.wait(max(0.0, deadline - time.monotonic())) for _, p in got.values())
        for xid, _ in got.values():
            self.multiparts.pop((dp.id, xid), None)
        if not ok:
            return None
        return got["flows"][1].body, [g.group_id for g in got["groups"][1].body]

    def _barrier(self, dp: Any, msgs: list[ofwire.Message] | None = None) -> threading.Event:
        """Send `msgs` and a barrier request behind them in one write (encoded by
        controllers.ofwire: one hand-over to the switch's sender thread, and a few us per
        message where os-ken's objects took tens); the event is set when the switch's
        barrier reply comes (all of them done)."""
        out = [*(msgs or ()), ofwire.barrier()]
        first = reserve_xids(dp, len(out))
        ev = threading.Event()
        self.barriers[(dp.id, (first + len(out) - 1) & dp.ofproto.MAX_XID)] = ev
        dp.send(ofwire.frame(out, first))
        return ev

    def _wait(self, waits: list[tuple[int, threading.Event]]) -> None:
        deadline = time.monotonic() + self.reply_timeout_s
        for dpid, ev in waits:
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                log.warning("switch %#x: no barrier reply within %.0f s", dpid,
                            self.reply_timeout_s)

    # ---- events -------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        # os-ken queues this event to the apps before its own handler (in the switch's
        # receive thread) sets dp.id; with the native hub's real threads this handler can
        # run first and see dp.id None. The id is in the message itself.
        dp.id = ev.msg.datapath_id
        with self.sync_lock:
            self.datapaths[dp.id] = dp
            self.installed.pop(dp.id, None)
            self.awaiting_layout.discard(dp.id)
            self.core.synced.discard(dp.id)  # type: ignore[attr-defined]
        self.core.connected.add(dp.id)  # type: ignore[attr-defined]
        self.core.metrics.switches.set(len(self.datapaths))
        hub.spawn(self._full_sync, dp)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _dead(self, ev: Any) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        with self.sync_lock:
            if self.datapaths.get(dp.id) is dp:
                self.datapaths.pop(dp.id)
                self.installed.pop(dp.id, None)
                self.awaiting_layout.discard(dp.id)
                self.core.connected.discard(dp.id)  # type: ignore[attr-defined]
                self.core.synced.discard(dp.id)  # type: ignore[attr-defined]
        self.core.metrics.switches.set(len(self.datapaths))

    # CONFIG too: the reply may be read before os-ken's handler has read the port list
    # and moved the switch to MAIN.
    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _barrier_reply(self, ev: Any) -> None:
        done = self.barriers.pop((ev.msg.datapath.id, ev.msg.xid), None)
        if done is not None:
            done.set()

    @set_ev_cls([ofp_event.EventOFPFlowStatsReply, ofp_event.EventOFPGroupDescStatsReply],
                [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _multipart_reply(self, ev: Any) -> None:
        msg = ev.msg
        pending = self.multiparts.get((msg.datapath.id, msg.xid))
        if pending is not None:
            pending.body.extend(msg.body)
            if not msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE:
                pending.done.set()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev: Any) -> None:
        t0 = time.perf_counter()
        msg = ev.msg
        ofp = msg.datapath.ofproto
        fibre = self.core.fibre_of_port(msg.datapath.id, msg.desc.port_no)
        down = bool(msg.desc.state & ofp.OFPPS_LINK_DOWN) or \
            bool(msg.desc.config & ofp.OFPPC_PORT_DOWN) or msg.reason == ofp.OFPPR_DELETE
        if fibre is None:
            if self.core.fabric_link_of_port(msg.datapath.id, msg.desc.port_no) is not None:
                # a DC fabric link: re-route the flows around it (or back)
                hub.spawn(self.core.fabric_port_status, msg.datapath.id, msg.desc.port_no,
                          not down)
            return
        self.port_up[(msg.datapath.id, msg.desc.port_no)] = not down
        log.debug("switch %#x port %d: %s (reason %d, state %#x, config %#x)",
                  msg.datapath.id, msg.desc.port_no, "down" if down else "up", msg.reason,
                  msg.desc.state, msg.desc.config)
        if down:
            hub.spawn(self._cut, fibre, t0)
        else:
            hub.spawn(self._repair, fibre)

    def _cut(self, fibre: tuple[str, str], t0: float) -> None:
        if not self.core.net.is_failed(*fibre):
            self.core.fail_fibre(*fibre, t0=t0)

    def _repair(self, fibre: tuple[str, str]) -> None:
        with self.core.lock:
            ix = self.core.layout
            if ix is not None:
                u, v = fibre
                ends = ((ix.dpid[ix.roadm[u]], ix.fibre_port[(u, v)]),
                        (ix.dpid[ix.roadm[v]], ix.fibre_port[(v, u)]))
                if not all(self.port_up.get(e, True) for e in ends):
                    return  # an end is (again) down: no repair
            self.core.repair_fibre(*fibre)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        """Proxy ARP: answer for every host in the layout (no flooding across DCs)."""
        msg = ev.msg
        pkt = packet.Packet(msg.data)
        req = pkt.get_protocol(arp.arp)
        ix = self.core.layout
        if req is None or req.opcode != arp.ARP_REQUEST or ix is None:
            return
        target = ix.host_by_ip.get(req.dst_ip)
        if target is None:
            return
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(dst=req.src_mac, src=target.mac,
                                             ethertype=ETH_ARP))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=target.mac,
                                   src_ip=target.ip, dst_mac=req.src_mac, dst_ip=req.src_ip))
        reply.serialize()
        dp = msg.datapath
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                                        in_port=ofp.OFPP_CONTROLLER,
                                        actions=[parser.OFPActionOutput(msg.match["in_port"])],
                                        data=reply.data))

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        log.warning("switch %#x: OpenFlow error type=%d code=%d", msg.datapath.id, msg.type,
                    msg.code)
