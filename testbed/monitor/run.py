"""Monitoring of one emulation run: its own Prometheus, its exporters, and registration.

`RunMonitor` is started by the emulation backend for every run once the network (and
the controller, if any) is up, whatever the workload and held or not:

* a Prometheus for this run alone, TSDB in the run directory (`prometheus/data`,
  re-servable later with `lightpipe monitor serve RUNDIR`);
* the link exporter (per fibre and lightpath counters of the link emulators) and the
  run exporter (`lightpipe_run_info`, per-job results);
* targets: controller `/metrics`, link exporter, run exporter, and later the workers
  (`set_targets`), every one labelled `run` and `scenario` (and `component`);
* the same targets registered with the long-lived Prometheus (`lightpipe monitor up`)
  when one is running, and unregistered at the end;
* the CPU the run's forwarders, software switch and workers get (`procs`, a
  testbed.emu.procstat.ProcSampler, by the PIDs the run recorded) and the machine's load
  (`host_load`), for the fidelity verdict (testbed.emu.fidelity), which it exports
  (`record_fidelity`).

Everything listens on 127.0.0.1 of the namespace the run started in (`home_fd`: the
backend thread itself may sit in the run's namespace).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from testbed.emu.scale import Scale
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)
T = TypeVar("T")


def in_netns(fd: int | None, fn: Callable[[], T]) -> T:
    """fn() in a thread that first joins the network namespace `fd` (setns is per thread)."""
    if fd is None:
        return fn()
    from testbed.emu.netns import setns

    box: dict[str, Any] = {}

    def body() -> None:
        try:
            setns(fd)
            box["v"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["e"] = exc

    t = threading.Thread(target=body, name="monitor-ns")
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def run_id_for(out_dir: Path, when: float | None = None) -> str:
    """`<run dir name>-<UTC time>`: unique per run, readable in a dashboard's picker."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(out_dir).name).strip("-.") or "run"
    return f"{name[:80]}-{stamp}"


def run_info(scenario: Any, **extra: Any) -> dict[str, str]:
    """lightpipe_run_info labels: workload kind and the scenario's policies and modes."""
    em = getattr(scenario, "emulation", None)
    pol = getattr(scenario, "policy", None)
    info = {"workload": str(getattr(scenario.workload, "kind", "")),
            "forwarding": str(getattr(em, "forwarding", "")),
            **({k: str(v) for k, v in Scale.of(em).as_record().items()} if em is not None
               else {"time_factor": "", "bandwidth_divisor": ""}),
            "placement": str(getattr(pol, "placement", "") or ""),
            "schedule": str(getattr(pol, "schedule", "") or ""),
            "spectrum": str(getattr(pol, "spectrum", "") or ""),
            # what `lightpipe grafana check` needs to tell which panels this run cannot
            # fill (testbed.monitor.producible)
            # ("none", not "": Prometheus drops a label whose value is empty, and an
            # absent label reads as an older run that did not say)
            "routing": str(getattr(pol, "routing", "") or "none"),
            "dc_fabric": str(getattr(em, "dc_fabric", "") or "none"),
            "workers": str(getattr(em, "workers", "") or "none"),
            "events": ",".join(sorted({str(e.kind) for e in getattr(scenario, "events", ())}))
            or "none"}
    info.update({k: str(v) for k, v in extra.items()})
    return info


# A run's scrape interval (and time-out: Prometheus allows no longer) is 1 s on the reference
# machine and one more second per SLOWNESS_PER_SCRAPE_S of measured slowness, at most
# MAX_SCRAPE_S. Measured in the user path's guest (software emulation, 2 vCPUs, slowness
# 20-27): at 1 s every target of the run, the workers, the run exporter, the link exporter,
# was "down" (context deadline exceeded; answers took 1.5-6.6 s) on both Prometheus servers,
# so the dashboards' worker panels stayed empty, and each timed-out scrape still cost the
# starved exporter its answer.
SLOWNESS_PER_SCRAPE_S = 4.0
MAX_SCRAPE_S = 10.0


def run_scrape_interval_s(slowness: float) -> float:
    """The scrape interval of a run on a machine `slowness` times slower than the reference
    (testbed.envprobe.machine_slowness)."""
    return float(min(MAX_SCRAPE_S, max(1.0, round(slowness / SLOWNESS_PER_SCRAPE_S))))


def scrape_labels(interval_s: float) -> dict[str, str]:
    """Target labels that set a target's scrape interval and time-out in any Prometheus
    that scrapes it (file_sd labels override the configuration's), so the long-lived
    monitor scrapes this run's targets as the run's own server does."""
    ms = max(1, round(interval_s * 1000))
    text = f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
    return {"__scrape_interval__": text, "__scrape_timeout__": text}


class RunMonitor:
    """Prometheus, exporters and registration for one run (see the module docstring)."""

    def __init__(self, scenario: Any, stage_dir: Path, final_dir: Path, *,
                 home_fd: int | None = None, monitor_dir: Path | str | None = None,
                 backend: str = "emu", scrape_interval_s: float | None = None,
                 die_with_driver: bool = False) -> None:
        """die_with_driver: the run's Prometheus ends with this process, also when it is
        killed (for a run whose state does not record the server, e.g. `emu --cluster`'s
        driver); needs home_fd None and the main thread. scrape_interval_s: None, scaled
        with the machine (run_scrape_interval_s)."""
        from testbed.envprobe import machine_slowness
        from testbed.metrics.prometheus import PrometheusServer, find_binary

        if die_with_driver and home_fd is not None:
            raise ValueError("die_with_driver needs the server started in this thread")

        self.scenario = scenario
        self.stage_dir = Path(stage_dir)
        self.final_dir = Path(final_dir).resolve()
        self.home_fd = home_fd
        self.run_id = run_id_for(self.final_dir)
        self.labels = {"run": self.run_id, "scenario": str(scenario.name)}
        if scrape_interval_s is None:
            scrape_interval_s = run_scrape_interval_s(machine_slowness())
        self.scrape_interval_s = float(scrape_interval_s)
        if self.scrape_interval_s != 1.0:
            log.info("scrape interval %g s (this machine runs %.1fx slower than the "
                     "reference)", self.scrape_interval_s, machine_slowness())
        self.prom = (PrometheusServer(self.stage_dir, scrape_interval_s=self.scrape_interval_s,
                                      die_with_parent=die_with_driver)
                     if find_binary() else None)
        self.monitor_dir = monitor_dir
        self.long_lived: Any = None
        self.backend = backend
        self.exporter: Any = None
        self.links: Any = None
        self.groups: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self._net: Any = None
        self.procs: Any = None  # ProcSampler of the run's own processes (start(net))
        self.host_load: Any = None  # HostLoad over the run (start(net))

    # ---- start -------------------------------------------------------------------------
    def start(self, net: Any = None, ctl: Any = None) -> RunMonitor:
        """Start Prometheus and the exporters, register the run; returns self."""
        from testbed.monitor.exporter import RunExporter
        from testbed.monitor.server import running_monitor

        extra = {"backend": self.backend, "scrape_interval_s": f"{self.scrape_interval_s:g}"}
        if net is not None:
            extra.update(link_mode=getattr(net, "link_mode", ""),
                         datapath=getattr(net, "datapath", ""))
        self.exporter = RunExporter(run_info(self.scenario, **extra))
        self._net = net
        try:
            if getattr(net, "state", None) is not None:
                self._watch_processes(net.state)
            in_netns(self.home_fd, self._start_in_home)
            self.set_targets("run", [(self.exporter.target, {"component": "run"})])
            if net is not None and getattr(net, "emulators", None):
                from testbed.metrics.links import LinkExporter

                self.links = LinkExporter(e for e in net.emulators.values() if e.counters)
                in_netns(self.home_fd, self.links.start)
                self.set_targets("links", [(self.links.target, {"component": "links"})])
            if ctl is not None:
                self.set_targets("controller", [(ctl.rest_url.split("://", 1)[1],
                                                 {"component": "controller"})])
            self.long_lived = in_netns(self.home_fd, lambda: running_monitor(self.monitor_dir))
            if self.long_lived is not None:
                self._register()
                log.info("run %s registered with the long-lived Prometheus at %s",
                         self.run_id, self.long_lived.status().url)
        except BaseException:
            self.stop()
            raise
        return self

    def _watch_processes(self, state: Any) -> None:
        from testbed.emu.fidelity_probe import watch_run_processes
        from testbed.emu.procstat import ProcSampler
        from testbed.metrics.hostload import HostLoad

        self.procs = ProcSampler().start()
        watch_run_processes(self.procs, state)
        self.host_load = HostLoad()
        self.host_load.start()

    def watch_workers(self, launcher: Any) -> None:
        """Read the CPU of the workers a launcher started (testbed.orchestrate.jobs)."""
        if self.procs is not None:
            from testbed.emu.fidelity_probe import watch_workers

            watch_workers(self.procs, launcher)

    def _start_in_home(self) -> None:
        self.exporter.start_serving()
        if self.prom is not None:
            self.prom.start()
            state = getattr(self._net, "state", None)
            if state is not None and self.prom.proc is not None:  # `lightpipe clean` kills it
                state.add_proc(self.prom.proc.pid, "prometheus", "prometheus")

    # ---- targets -----------------------------------------------------------------------
    def set_targets(self, group: str, targets: Iterable[tuple[str, Mapping[str, str]]]
                    ) -> None:
        """Add (replace) a target group, e.g. the workers' (PrometheusServer's API)."""
        self.groups[group] = [(addr, {**dict(lab), **self.labels,
                                      **scrape_labels(self.scrape_interval_s)})
                              for addr, lab in targets]
        if self.prom is not None:
            self.prom.set_targets(group, self.groups[group])
        if self.long_lived is not None:
            self._register()

    def _register(self) -> None:
        self.long_lived.register(self.run_id, [t for g in self.groups.values() for t in g])

    # ---- results -----------------------------------------------------------------------
    def record_jobs(self, result: Mapping[str, Any]) -> None:
        if self.exporter is not None:
            self.exporter.record_jobs(result, self.scenario)

    def record_network_event(self, event: int, kind: str, action: str, target: str,
                             step: int, unix_s: float) -> None:
        """A network event the fault injector applied (the run exporter's
        lightpipe_network_event_timestamp_seconds)."""
        if self.exporter is not None:
            self.exporter.record_network_event(event, kind, action, target, step, unix_s)

    def record_fidelity(self, verdict: Mapping[str, Any], timeout_s: float = 20.0) -> bool:
        """Export the run's fidelity verdict and wait until every Prometheus scraped it
        (the workload may have flushed already); False if one did not."""
        if self.exporter is None:
            return False
        self.exporter.record_fidelity(verdict)
        # lightpipe_run_faithful has no labels, so it is exported (0) from the first scrape:
        # wait for the invariants' own series instead (the monitor-demo run once ended
        # before its invariants were scraped, and the overview's table stayed empty).
        shown = sum(1 for i in verdict.get("invariants", [])
                    if i.get("measured") or not i.get("ok", True))
        q = (f'count(lightpipe_fidelity_invariant_ok{{run="{self.run_id}"}}) >= {shown}'
             if shown else f'lightpipe_run_faithful{{run="{self.run_id}"}}')
        return self._scraped(q, timeout_s)

    def flush(self, timeout_s: float = 20.0) -> bool:
        """Mark the run ended and wait until every Prometheus scraped that (at least five
        scrape intervals); False if not."""
        if self.exporter is None:
            return False
        self.exporter.finish()
        timeout_s = max(timeout_s, 5 * self.scrape_interval_s)
        q = f'lightpipe_run_end_time_seconds{{run="{self.run_id}"}} > 0'
        return self._scraped(q, timeout_s)

    def _scraped(self, query: str, timeout_s: float) -> bool:
        """Wait until every Prometheus of the run answers query; False if one did not."""
        from testbed.metrics.query import wait_for

        ok = True
        for url in self.urls():
            try:
                in_netns(self.home_fd, lambda u=url: wait_for(u, query, timeout_s=timeout_s))
            except RuntimeFailure as exc:
                log.warning("%s", exc)
                ok = False
        return ok

    def urls(self) -> list[str]:
        out = [self.prom.url] if self.prom is not None and self.prom.proc else []
        if self.long_lived is not None:
            st = self.long_lived.status()
            if st.url:
                out.append(st.url)
        return out

    def describe(self) -> dict[str, Any]:
        """network.json / summary record: where this run's data is."""
        run_url = self.prom.url if self.prom is not None and self.prom.proc else None
        ll = self.long_lived.status().url if self.long_lived is not None else None
        return {"run": self.run_id, "scenario": self.labels["scenario"],
                "url": ll or run_url, "run_url": run_url, "monitor_url": ll,
                "tsdb": str(self.final_dir / "prometheus" / "data") if self.prom else None,
                "serve": f"lightpipe monitor serve {self.final_dir}" if self.prom else None}

    # ---- faults (testbed.orchestrate.faults) -------------------------------------------
    def kill_prometheus(self) -> int | None:
        """SIGKILL this run's Prometheus by the PID it was started with (a fault); the
        PID, or None when none runs. restart_prometheus() starts it again."""
        if self.prom is None or self.prom.proc is None:
            return None
        proc, self.prom.proc = self.prom.proc, None
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.warning("run %s: prometheus (pid %d) killed", self.run_id, proc.pid)
        return proc.pid

    def restart_prometheus(self) -> int:
        """Start this run's Prometheus again with the same config and TSDB (and the same
        port where it is free); its new PID, registered for `lightpipe clean`."""
        if self.prom is None:
            raise RuntimeFailure("this run has no Prometheus to restart")
        in_netns(self.home_fd, self.prom.start)
        assert self.prom.proc is not None
        state = getattr(self._net, "state", None)
        if state is not None:
            state.add_proc(self.prom.proc.pid, "prometheus", "prometheus")
        log.info("run %s: prometheus restarted (pid %d) at %s", self.run_id,
                 self.prom.proc.pid, self.prom.url)
        return self.prom.proc.pid

    def last_scrape_time(self) -> float | None:
        """Unix time of the newest successful scrape of any of this run's targets in the
        run's Prometheus (None: not running, or nothing scraped yet)."""
        if self.prom is None or self.prom.proc is None:
            return None
        from testbed.metrics.query import query

        url = self.prom.url
        sel = f'up{{run="{self.run_id}"}}'
        # timestamp() of a bare selector is the sample's own time (of a comparison's
        # result it would be the evaluation time); x (up == 1) keeps successful scrapes.
        q = f"max(timestamp({sel}) * ({sel} == 1))"
        try:
            res = in_netns(self.home_fd, lambda: query(url, q, timeout_s=2.0))
        except RuntimeFailure:
            return None
        return float(res[0]["value"][1]) if res else None

    # ---- stop --------------------------------------------------------------------------
    def stop(self) -> None:
        """Unregister, stop the exporters and this run's Prometheus (by PID)."""
        if self.long_lived is not None:
            try:
                self.long_lived.unregister(self.run_id)
            except OSError as exc:
                log.warning("cannot unregister run %s: %s", self.run_id, exc)
            self.long_lived = None
        if self.prom is not None:
            self.prom.stop()
        if self.procs is not None:
            self.procs.stop()
        for part in (self.links, self.exporter):
            if part is not None:
                part.stop()
