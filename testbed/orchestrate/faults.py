"""Plays a scenario's events on an emulation run's clock and records each fault's outcome.

`FaultInjector` runs in a background thread while the pp_jobs workers run; an event at
`at_s` fires `at_s x scale` seconds after its clock starts (scale: the emulation's time
factor). For pp_jobs workers (`start(on_training=True)`) the clock starts when training
does: once every worker has joined its job's process group (Launcher.training_started),
the emulation's nearest to the simulator's time 0 (docs/faults.md); worker start-up
(tens of seconds on a busy machine) does not count. A held network's clock starts with start():

    fiber_cut / fiber_repair   the fibre's link down / up in the data plane (link_switch);
                               the controller sees the port change and restores
    wavelength_loss / _repair  a block of the fibre's slots out of / back in service
                               through POST /failures | /repairs (no data-plane signal
                               exists for it); the controller re-places the lightpaths
                               it hits (other slots or route) or drops them
    link_flap                  the same, count times: down at at_s + k x period_s, up
                               half a period later (testbed.spec.faults.flap_steps)
    prometheus_kill            the run's Prometheus SIGKILLed by its own PID, started
                               again down_s (scaled) later with the same config and TSDB
    controller_kill            the SDN controller SIGKILLed by its PID, started again
                               down_s (scaled) later on the same SQLite state, ports and
                               token (ControllerRestarter); the switches keep their rules
                               meanwhile, so the data plane forwards through the outage
    worker_kill                the job's stage worker SIGKILLed by the PID the launcher
                               recorded (not before it has finished one iteration, so the
                               kill lands mid-run); the launcher marks the job failed with
                               the reason, the other jobs go on

stop() returns the summary part: the fibre steps as before (`events`,
`cut_to_restored_s`, ...) and `faults`, one row per spec event: kind, target, at_s,
when it fired (UTC and seconds into the run), detection_s / recovery_s where they
apply, and what was lost. Processes are touched by PID only, never by name.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed.orchestrate.replay import Client, LinkSwitch, apply_event
from testbed.orchestrate.results import job_iterations, read_records
from testbed.spec.faults import NETWORK_KINDS, TESTBED_KINDS, flap_steps, network_events
from testbed.spec.models import EventSpec

log = logging.getLogger(__name__)

Action = Callable[[], None]
RETRY_S = 0.1  # how often a worker_kill looks again for its worker
SCRAPE_WAIT_S = 30.0  # longest wait for the first scrape after a Prometheus restart
# set_done_file: after the last event, the workers go on this long (two of the run
# monitor's 1 s scrapes see the state the events left).
EVENTS_SETTLE_S = 2.0
GATE_LOG_S = 30.0  # while the clock waits for training: how often the log says for whom
# Fibre steps applied in the data plane without a controller (static forwarding).
STATIC_KINDS = ("fiber_cut", "fiber_repair")


def _utc(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def skipped_rows(events: Sequence[EventSpec], why: str) -> list[dict[str, Any]]:
    """`faults` rows for events a run did not apply, with the reason."""
    return [{"kind": ev.kind, "target": ev.target, "at_s": ev.at_s, "applied": False,
             "note": why} for ev in sorted(events, key=lambda e: e.at_s)]


def fibre_row(ev: EventSpec, rec: dict[str, Any]) -> dict[str, Any]:
    """The `faults` row of one applied fibre cut or repair, or slot-block loss or repair
    (a replay record)."""
    row: dict[str, Any] = {"kind": ev.kind, "target": ev.target, "at_s": ev.at_s,
                           "applied": "skipped" not in rec and "error" not in rec}
    if ev.first_slot is not None:
        row["first_slot"], row["slots"] = ev.first_slot, ev.slots
    for key in ("wall_time", "run_s", "monotonic_s", "link_set_monotonic_s", "via",
                "skipped", "error", "note",
                "loss_to_restored_s", "controller_restoration_s", "moved", "lost_slots"):
        if key in rec:
            row[key] = rec[key]
    if ev.kind == "wavelength_loss":  # no port change to notice: the REST call is the event
        row["detection_s"] = None
        if "controller_restoration_s" in rec:
            row["recovery_s"] = rec["controller_restoration_s"]
    elif "cut_to_restored_s" in rec:
        row["detection_s"] = None  # the controller's own port-down time is not measured
        row["recovery_s"] = row["cut_to_restored_s"] = rec["cut_to_restored_s"]
    elif "controller_restoration_s" in rec:
        row["recovery_s"] = rec["controller_restoration_s"]
    if "repair_seen_s" in rec:
        row["detection_s"] = row["repair_seen_s"] = rec["repair_seen_s"]
    if ev.kind in ("fiber_cut", "wavelength_loss") and "lost" in rec:
        row["lost"] = {"lightpaths": rec["lost"], "restored": rec.get("restored", [])}
    return row


def replay_rows(events: Sequence[EventSpec], recs: Sequence[dict[str, Any]],
                not_reached: str = "not reached: after the replay's last request"
                ) -> list[dict[str, Any]]:
    """`faults` rows of a run without the injector (request replay, all-reduce jobs): a
    row per fibre step the replay applied (a flap: one per step), the others not
    applied."""
    rows = []
    left = list(network_events(events))
    for rec in recs:
        ev = EventSpec(at_s=rec["at_s"], kind=rec["kind"], link=rec["link"],
                       first_slot=rec.get("first_slot"), slots=rec.get("slots"))
        rows.append(fibre_row(ev, rec))
        match = next((e for e in left if e == ev), None)
        if match is not None:
            left.remove(match)
    rows += skipped_rows(left, not_reached)
    rows += skipped_rows([e for e in events if e.kind in TESTBED_KINDS],
                         "applied only while pp_jobs workers run")
    return sorted(rows, key=lambda r: r["at_s"])


class FaultInjector:
    """Applies a scenario's events on a scaled clock (see the module docstring)."""

    def __init__(self, events: Sequence[EventSpec], *, scale: float,
                 client: Client | None = None, set_link: LinkSwitch | None = None,
                 monitor: Any = None, controller: Any = None,
                 settle_timeout_s: float = 5.0,
                 after_reroute: Callable[[list[int]], list[dict[str, Any]]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.scale = scale
        self.client = client
        self.set_link = set_link
        self.monitor = monitor
        self.controller = controller  # a ControllerRestarter (controller_kill)
        self.settle_timeout_s = settle_timeout_s
        # Restored lightpaths' RTT on their new routes (testbed.emu.reroute), in a thread
        # of its own per event so that the next event is not held up; joined by stop().
        self.after_reroute = after_reroute
        self._checks: list[threading.Thread] = []
        self.clock = clock
        self.rows: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []  # fibre steps applied (the `events` key)
        self.errors: list[str] = []
        self.n_steps = 0
        self.launcher: Any = None
        self._heap: list[tuple[float, int, str, Action]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()  # one action at a time (thread, or drain())
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)
        self._t0 = 0.0
        self._on_training = False
        self._gated = False  # the clock waits for training to start
        self._gate_logged = 0.0  # when _open_gate last said what it waits for
        self.clock_offset_s: float | None = None  # start() to the clock's zero (s)
        self._worker_rows: list[tuple[dict[str, Any], Any]] = []
        self._chain: _Chain | None = None  # whose actions are being planned (apply_now)
        self._done_file: Path | None = None  # written once every event has run (set_done_file)
        self._on_done: Callable[[], None] | None = None
        self._done_settle_s = 0.0
        self._idle_since: float | None = None
        for ev in sorted(events, key=lambda e: e.at_s):
            self._plan(ev)

    # ---- plan ----------------------------------------------------------------------------
    def _push(self, due_s: float, tag: str, action: Action) -> None:
        if self._chain is not None:  # planned by apply_now, or by one of its actions
            action = self._chain.wrap(self, action)
        heapq.heappush(self._heap, (due_s, next(self._seq), tag, action))
        self._wake.set()

    def _plan(self, ev: EventSpec) -> None:
        row: dict[str, Any] = {"kind": ev.kind, "target": ev.target, "at_s": ev.at_s,
                               "applied": False}
        self.rows.append(row)
        at = ev.at_s * self.scale
        if ev.kind in NETWORK_KINDS:
            self.n_steps += 1
            self._push(at, "fibre", lambda: self._fibre(ev, row))
        elif ev.kind == "link_flap":
            row.update(cuts=[], period_s=ev.period_s, count=ev.count)
            for t, up in flap_steps(ev):
                step = EventSpec(at_s=t, kind="fiber_repair" if up else "fiber_cut",
                                 link=ev.link)
                self.n_steps += 1
                self._push(t * self.scale, "fibre", lambda s=step: self._flap_step(s, row))
        elif ev.kind == "prometheus_kill":
            self._push(at, "prometheus", lambda: self._kill_prometheus(ev, row))
        elif ev.kind == "controller_kill":
            self._push(at, "controller", lambda: self._kill_controller(ev, row))
        elif ev.kind == "worker_kill":
            self._push(at, "worker", lambda: self._kill_worker(ev, row))
        else:
            row["note"] = "not replayed in the emulation"

    # ---- life cycle ----------------------------------------------------------------------
    def start(self, on_training: bool = False) -> FaultInjector:
        """Start the thread; the clock starts now, or with `on_training` once the
        attached launcher's training has started (see the module docstring)."""
        self._t0 = self._gate_logged = self.clock()
        self._on_training = self._gated = on_training
        if not on_training:
            self.clock_offset_s = 0.0
        self._thread.start()
        return self

    def _open_gate(self) -> bool:
        """Start the clock if training has started; False while it has not (said in the
        log every GATE_LOG_S, with the workers it waits for)."""
        if self.launcher is None or not self.launcher.training_started():
            now = self.clock()
            if now - self._gate_logged >= GATE_LOG_S:
                self._gate_logged = now
                who = ("the workers' launch" if self.launcher is None
                       else "training: " + (", ".join(self.launcher.not_ready()[:8])
                                            or "the jobs") + " not joined yet")
                log.info("events: clock not started, %.0f s in: waiting for %s",
                         now - self._t0, who)
            return False
        now = self.clock()
        self.clock_offset_s = round(now - self._t0, 3)
        self._t0 = now
        self._gated = False
        log.info("events: clock started with training, %.1f s into the workload "
                 "(placement, worker launch and start-up)", self.clock_offset_s)
        return True

    def set_done_file(self, path: Path, settle_s: float = EVENTS_SETTLE_S,
                      on_done: Callable[[], None] | None = None) -> None:
        """Create `path` once every planned event has run (a flap's repairs and a killed
        process's restart included) and its re-route checks have ended, and then settle_s
        more (the monitor scrapes the state after the last event): workers started with
        --go-on-until iterate until then (emulation.iterate_through_events). on_done:
        called then too (a cluster run tells the other machines' workers)."""
        self._done_file, self._done_settle_s = path, settle_s
        self._on_done = on_done

    def _note_idle(self) -> None:
        """With nothing left to apply: write the done file once idle for the settle time."""
        if self._done_file is None or self._gated:
            return
        if any(t.is_alive() for t in self._checks):
            self._idle_since = None
            return
        now = self.clock()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since >= self._done_settle_s:
            path, self._done_file = self._done_file, None
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))
            except OSError as exc:  # the workers then stop at their deadline
                log.error("events: cannot write %s: %s", path, exc)
                return
            log.info("events: every one has run; the workers stop iterating (%s)", path.name)
            if self._on_done is not None:
                self._on_done()

    def attach_launcher(self, launcher: Any) -> None:
        """The worker launcher of the run (worker_kill finds PIDs through it)."""
        self.launcher = launcher

    def now_s(self) -> float:
        """Seconds on the events' clock (0 while it waits for training to start)."""
        return 0.0 if self._gated else self.clock() - self._t0

    def apply_now(self, ev: EventSpec, timeout_s: float) -> dict[str, Any]:
        """Apply one event now on a started injector (a held run's `lightpipe fault`):
        planned at the current run time (its at_s becomes that, on the scenario clock),
        run by the same actions as a scenario's events; returns its `faults` row once
        every step of it has run (a flap's cuts and repairs, a killed process's restart).
        TimeoutError if that takes over timeout_s (the row is still recorded)."""
        ev = ev.model_copy(update={"at_s": round(self.now_s() / self.scale, 3)})
        chain = _Chain()
        with self._lock:
            self._chain = chain
            try:
                self._plan(ev)
            finally:
                self._chain = None
            row = self.rows[-1]
        if not chain.wait(timeout_s):
            raise TimeoutError(f"{ev.kind} {ev.target} still running after {timeout_s:g} s")
        return row

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # said, not lost with the thread: no event runs after it
            log.exception("events: the injector stopped: %s", exc)
            self.errors.append(f"injector: {exc}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._gated and not self._open_gate():
                self._stop.wait(RETRY_S)
                continue
            with self._lock:
                due = self._heap[0][0] if self._heap else None
            if due is None:
                self._note_idle()
                self._wake.clear()
                self._wake.wait(0.5)
                continue
            self._idle_since = None
            wait = due - self.now_s()
            if wait > 0:
                self._wake.clear()
                self._stop.wait(min(wait, 0.5))
                continue
            with self._lock:
                if not self._heap or self._heap[0][0] != due:
                    continue
                _due, _seq, tag, action = heapq.heappop(self._heap)
                self._apply(tag, action)

    def _apply(self, tag: str, action: Action) -> None:
        try:
            action()
        except Exception as exc:  # recorded, the run goes on
            log.warning("fault %s: %s", tag, exc)
            self.errors.append(f"{tag}: {exc}")

    def drain(self, tags: Sequence[str] = ("restart",)) -> None:
        """Run the pending actions with these tags now (e.g. restart Prometheus before
        the run's last scrape) and drop the pending worker kills (the jobs have ended)."""
        with self._lock:
            keep, run = [], []
            for item in self._heap:
                if item[2] in tags:
                    run.append(item)
                elif item[2] != "worker":
                    keep.append(item)
            self._heap = keep
            heapq.heapify(self._heap)
            for _due, _seq, tag, action in sorted(run):
                self._apply(tag, action)

    def stop(self) -> dict[str, Any]:
        """End the thread (what is not due yet is not applied); the summary part."""
        self.drain()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.settle_timeout_s + SCRAPE_WAIT_S + 5)
        for t in self._checks:
            t.join(timeout=120)
        for row, w in self._worker_rows:
            self._worker_outcome(row, w)
        why = ("not reached: the jobs' training never started" if self._gated
               else "not reached: the workload ended before it was due")
        for row in self.rows:
            if not row["applied"] and "note" not in row and "wall_time" not in row:
                row["note"] = why
        applied = [s for s in self.steps if "skipped" not in s]
        checked = [r for s in self.steps for r in s.get("rtt_after_reroute", [])]
        return {"events": self.steps,
                "reroute_rtt_checks": len(checked),
                "reroute_rtt_out": [r.get("pair", r.get("id")) for r in checked
                                    if not r["ok"]],
                "events_applied": len(applied),
                "events_not_reached": max(0, self.n_steps - len(self.steps)),
                "event_errors": self.errors,
                "cut_to_restored_s": [s["cut_to_restored_s"] for s in self.steps
                                      if "cut_to_restored_s" in s],
                "events_time_scale": self.scale,
                "events_clock": "training" if self._on_training else "start",
                "events_clock_offset_s": self.clock_offset_s,
                # the clock's zero on time.monotonic() (the workers' clock); null while
                # it never started
                "events_clock_zero_monotonic_s": None if self._gated or self.clock_offset_s
                is None else round(self._t0, 6),
                "faults": self.rows}

    # ---- fibres --------------------------------------------------------------------------
    def _stamp(self, row: dict[str, Any]) -> None:
        row["wall_time"] = _utc()
        row["run_s"] = round(self.now_s(), 3)
        # the same instant on the clock the workers stamp their iterations with
        row["monotonic_s"] = round(time.monotonic(), 6)

    def _fibre_step(self, ev: EventSpec) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": ev.kind, "link": list(ev.link or []), "at_s": ev.at_s}
        self._stamp(rec)
        if self.client is None and self.set_link is not None and ev.kind in STATIC_KINDS:
            self._static_step(ev, rec)
        elif self.client is None:
            rec["skipped"] = "static forwarding: no controller to restore lightpaths"
        else:
            try:
                rec.update(apply_event(ev, self.client, {}, self.set_link, time.monotonic,
                                       time.sleep, self.settle_timeout_s))
            except Exception as exc:
                rec["error"] = str(exc)
                self.errors.append(f"{ev.kind} {ev.target}: {exc}")
                log.warning("event %s %s failed: %s", ev.kind, ev.target, exc)
        rec["at_s"] = ev.at_s
        if "error" not in rec:
            self.steps.append(rec)
            if self.after_reroute is not None and rec.get("restored"):
                self._check_reroute(rec)
        return rec

    def _static_step(self, ev: EventSpec, rec: dict[str, Any]) -> None:
        """A fibre cut or repair without a controller (static forwarding): the fibre's
        link down or up in the data plane, its rules left as they are. Nothing restores
        the lightpaths it carries: they are down from the cut to the repair, as an
        unprotected static circuit is (the outage a job sees is the repair's time)."""
        assert ev.link is not None and self.set_link is not None
        u, v = ev.link
        cut = ev.kind == "fiber_cut"
        try:
            self.set_link(u, v, not cut)
        except Exception as exc:
            rec["error"] = str(exc)
            self.errors.append(f"{ev.kind} {ev.target}: {exc}")
            log.warning("event %s %s failed: %s", ev.kind, ev.target, exc)
            return
        rec["via"] = "data_plane"
        if cut:
            rec["lost"], rec["restored"] = [], []
            rec["note"] = ("static forwarding: the fibre's lightpaths stay down until it "
                           "is repaired (no controller restores them)")

    def _check_reroute(self, rec: dict[str, Any]) -> None:
        """rec["rtt_after_reroute"]: each restored lightpath's RTT on its new route."""
        check = self.after_reroute
        assert check is not None

        def run() -> None:
            try:
                rec["rtt_after_reroute"] = check(list(rec["restored"]))
            except Exception as exc:  # recorded, the run goes on
                rec["rtt_after_reroute"] = [{"ok": False, "error": str(exc)[:300]}]

        t = threading.Thread(target=run, name="reroute-check", daemon=True)
        t.start()
        self._checks.append(t)

    def _exported(self, row: dict[str, Any], action: str, rec: dict[str, Any],
                  step: int = 0) -> None:
        """Tell the run's monitor (its exporter: the dashboards' network-event
        annotation) that a network step was applied."""
        record = getattr(self.monitor, "record_network_event", None)
        if record is None or "skipped" in rec or "error" in rec:
            return
        mono = rec.get("monotonic_s")  # when it was applied, as Unix time
        unix_s = time.time() - (time.monotonic() - mono if mono is not None else 0.0)
        try:
            record(self.rows.index(row), row["kind"], action, row["target"], step, unix_s)
        except Exception as exc:  # a metric, never the fault's outcome
            log.debug("network event metric: %s", exc)

    def _fibre(self, ev: EventSpec, row: dict[str, Any]) -> None:
        rec = self._fibre_step(ev)
        row.update(fibre_row(ev, rec))
        self._exported(row, ev.kind, rec)

    def _flap_step(self, step: EventSpec, row: dict[str, Any]) -> None:
        rec = self._fibre_step(step)
        # steps 0, 2, 4, ...: the cuts; 1, 3, ...: their repairs (row["cuts"]: those before)
        self._exported(row, step.kind, rec,
                       2 * len(row["cuts"]) - (0 if step.kind == "fiber_cut" else 1))
        if "wall_time" not in row or not row["cuts"]:
            row["wall_time"], row["run_s"] = rec["wall_time"], rec["run_s"]
            row["monotonic_s"] = rec["monotonic_s"]
        row["applied"] = row["applied"] or ("skipped" not in rec and "error" not in rec)
        if step.kind == "fiber_cut":
            row["cuts"].append({k: rec[k] for k in ("at_s", "run_s", "link_set_monotonic_s",
                                                   "cut_to_restored_s",
                                                   "lost", "restored", "skipped", "error")
                                if k in rec})
        elif row["cuts"]:
            for k in ("repair_seen_s", "skipped", "error"):
                if k in rec:
                    row["cuts"][-1][k] = rec[k]
        times = [c["cut_to_restored_s"] for c in row["cuts"] if "cut_to_restored_s" in c]
        row["cut_to_restored_s"] = times
        row["detection_s"] = None
        row["recovery_s"] = max(times) if times else None
        row["cuts_applied"] = len(times)
        row["lost"] = {
            "lightpaths": sorted({i for c in row["cuts"] for i in c.get("lost", [])}),
            "restored": sorted({i for c in row["cuts"] for i in c.get("restored", [])})}

    # ---- Prometheus ----------------------------------------------------------------------
    def _kill_prometheus(self, ev: EventSpec, row: dict[str, Any]) -> None:
        self._stamp(row)
        mon = self.monitor
        if mon is None or getattr(mon, "prom", None) is None:
            row["note"] = "this run has no Prometheus"
            return
        last = mon.last_scrape_time()
        pid = mon.kill_prometheus()
        if pid is None:
            row["note"] = "Prometheus was not running"
            return
        killed = time.time()
        row.update(applied=True, pid_killed=pid, down_s=ev.down_s,
                   last_scrape_before=_utc(last) if last else None)
        assert ev.down_s is not None
        self._push(self.now_s() + ev.down_s * self.scale, "restart",
                   lambda: self._restart_prometheus(row, killed, last))

    def _restart_prometheus(self, row: dict[str, Any], killed: float,
                            last: float | None) -> None:
        mon = self.monitor
        t_restart = time.time()
        row["restart_time"] = _utc(t_restart)
        row["down_wall_s"] = round(t_restart - killed, 3)
        row["pid_restarted"] = mon.restart_prometheus()
        row["ready_s"] = round(time.time() - t_restart, 3)
        first = None
        end = time.monotonic() + SCRAPE_WAIT_S
        while time.monotonic() < end:
            got = mon.last_scrape_time()
            if got is not None and got >= t_restart:
                first = got
                break
            time.sleep(0.1)
        row["detection_s"] = None  # killed by the testbed itself; nothing has to notice
        row["recovery_s"] = round(first - t_restart, 3) if first is not None else None
        row["first_scrape_after"] = _utc(first) if first is not None else None
        row["lost"] = {"prometheus_gap_s": round(first - last, 3)
                       if first is not None and last is not None else None}

    # ---- SDN controller ------------------------------------------------------------------
    def _kill_controller(self, ev: EventSpec, row: dict[str, Any]) -> None:
        self._stamp(row)
        ctl = self.controller
        if ctl is None:
            row["note"] = "this run has no SDN controller (static forwarding)"
            return
        before = ctl.lightpaths()
        pid = ctl.kill()
        if pid is None:
            row["note"] = "the controller was not running"
            return
        killed = time.monotonic()
        failed_before = len(self.errors)
        row.update(applied=True, pid_killed=pid, down_s=ev.down_s,
                   lightpaths_before=len(before or {}))
        assert ev.down_s is not None
        self._push(self.now_s() + ev.down_s * self.scale, "restart",
                   lambda: self._restart_controller(row, killed, before or {},
                                                    failed_before))

    def _restart_controller(self, row: dict[str, Any], killed: float,
                            before: dict[int, list[str]], failed_before: int) -> None:
        t0 = time.monotonic()
        row["restart_time"] = _utc()
        row["down_wall_s"] = round(t0 - killed, 3)
        row["pid_restarted"] = self.controller.restart()
        after = self.controller.lightpaths() or {}
        row["detection_s"] = None  # killed by the testbed itself; nothing has to notice
        row["recovery_s"] = round(time.monotonic() - t0, 3)  # restart until re-synced
        row["outage_s"] = round(time.monotonic() - killed, 3)
        row["lightpaths_after"] = len(after)
        row["lightpaths_kept"] = sum(after.get(i) == r for i, r in before.items())
        # What needed the controller while it was down and failed (fibre steps here).
        row["lost"] = {"lightpaths": sorted(i for i in before if after.get(i) != before[i]),
                       "requests_refused": len(self.errors) - failed_before}

    # ---- workers -------------------------------------------------------------------------
    def _kill_worker(self, ev: EventSpec, row: dict[str, Any]) -> None:
        assert ev.job is not None and ev.stage is not None
        launcher = self.launcher
        if launcher is None:  # workers not started yet: look again shortly
            self._push(self.now_s() + RETRY_S, "worker", lambda: self._kill_worker(ev, row))
            return
        try:
            w = launcher.worker(ev.job, ev.stage)
        except KeyError as exc:
            self._stamp(row)
            row["note"] = str(exc.args[0])
            self.errors.append(f"worker_kill: {exc.args[0]}")
            return
        done = sum(1 for r in read_records(w.record_path) if r.get("type") == "iteration")
        if w.proc.poll() is None and done == 0:
            # Still starting (torch import, rendezvous) or in its first iteration: killed
            # once it has finished one, so the kill lands mid-run with records to keep.
            self._push(self.now_s() + RETRY_S, "worker", lambda: self._kill_worker(ev, row))
            return
        self._stamp(row)
        row["target"] = f"{w.job} stage {w.stage}"
        row["job"], row["stage"], row["pid"] = w.job, w.stage, w.proc.pid
        row["late_s"] = round(max(0.0, self.now_s() - ev.at_s * self.scale), 3)
        reason = (f"worker stage {w.stage} killed at {ev.at_s:g} s (fault injection, "
                  f"{row['run_s']:.1f} s into the run)")
        if launcher.kill_stage(w, reason):
            row.update(applied=True, reason=reason, stage_iterations_before_kill=done)
            self._worker_rows.append((row, w))
        else:
            row["note"] = f"worker had already exited (code {w.proc.returncode})"

    def _worker_outcome(self, row: dict[str, Any], w: Any) -> None:
        """Detection (kill -> the launcher marked the job failed) and what was lost."""
        run = self.launcher.jobs[w.job]
        if run.failed_s is not None and w.killed_s is not None:
            row["detection_s"] = round(run.failed_s - w.killed_s, 3)
        row["recovery_s"] = None  # a pipeline job does not come back without its stage
        row["job_failure"] = run.failure
        stages = [read_records(x.record_path) for x in run.workers]
        finished = len(job_iterations(stages))
        planned = run.plan.iterations + run.plan.warmup_iterations
        row["lost"] = {"iterations": planned - finished, "iterations_finished": finished,
                       "iterations_planned": planned}


class _Chain:
    """The actions of one apply_now event, pending or running (its follow-ups included:
    an action that pushes another while it runs passes the chain on)."""

    def __init__(self) -> None:
        self.pending = 0
        self._cond = threading.Condition()

    def wrap(self, inj: FaultInjector, action: Action) -> Action:
        with self._cond:
            self.pending += 1

        def run() -> None:
            inj._chain = self  # the caller holds inj._lock
            try:
                action()
            finally:
                inj._chain = None
                with self._cond:
                    self.pending -= 1
                    self._cond.notify_all()
        return run

    def wait(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.pending == 0, timeout=timeout_s)
