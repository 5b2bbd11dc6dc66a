"""The controller as seen from `lightpipe`: start its process, call its REST API, stop it.

`start_controller(...)` runs `python -m controllers.launcher` as a child process and
waits until the REST API answers (used by `lightpipe emu`, the tests and the benchmark).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ControllerProcess:
    """A running controller child process."""

    proc: subprocess.Popen[bytes]
    rest_url: str
    of_port: int
    token: str | None
    log_path: Path
    client_netns: str | None = None  # where REST calls must come from (if not here)
    # Default REST time-out; start_controller raises it to its start-up time-out (slow
    # machines, e.g. a software-emulated VM, need more than 10 s for a lightpath set-up).
    request_timeout_s: float = 10.0
    token_file: Path | None = None  # the controller's 0600 token file

    @property
    def openflow(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float | None = None) -> tuple[int, Any]:
        """One REST call; returns (status, decoded JSON or text)."""
        timeout_s = timeout_s or self.request_timeout_s
        if self.client_netns is None:
            return rest_call(self.rest_url, method, path, body, self.token, timeout_s)
        from testbed.emu.netns import in_netns

        with in_netns(self.client_netns):
            return rest_call(self.rest_url, method, path, body, self.token, timeout_s)

    def describe(self) -> dict[str, Any]:
        """What network.json records under `controller`."""
        return {"rest_url": self.rest_url, "token": self.token,
                "token_file": str(self.token_file) if self.token_file else None,
                "openflow": f"tcp:127.0.0.1:{self.of_port}", "pid": self.proc.pid,
                "log": str(self.log_path)}

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def rest_call(url: str, method: str, path: str, body: Any = None, token: str | None = None,
              timeout_s: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw, status, ctype = resp.read(), resp.status, resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def start_controller(spec: str | Path, db: str | Path, *, of_port: int | None = None,
                     rest_port: int | None = None, rest_host: str = "127.0.0.1",
                     layout: str | Path | None = None, token: str | None = None,
                     log_path: str | Path | None = None, timeout_s: float = 20.0,
                     verbose: int = 1, netns: str | None = None,
                     home_netns: str | None = None,
                     run_state: str | Path | None = None,
                     die_with_parent: bool = False) -> ControllerProcess:
    """Start the controller in a child process; return once GET /health answers.

    netns: namespace the OpenFlow listener goes to (the switches'); home_netns: the
    namespace the child starts in and REST clients use, if the caller's thread has
    moved elsewhere (as EmuNetwork's does). token: the REST bearer token (default: the
    controller generates one); either way it travels in a 0600 file next to `db`, never
    on the command line. of_port / rest_port None: the controller binds any free port
    itself and publishes it (never picked here and released). run_state: the emulation
    run's state directory, whose fibre controls are the only ones a layout may name.
    """
    log_path = Path(log_path or Path(db).with_suffix(".log"))
    address_file = Path(db).with_suffix(".rest.json")
    address_file.unlink(missing_ok=True)
    # REST: the controller binds it (rest_port None -> 0: any free port) and publishes it
    cmd = [sys.executable, "-m", "controllers.launcher", "--spec", str(spec), "--db", str(db),
           "--of-port", str(of_port or 0), "--rest", f"{rest_host}:{rest_port or 0}",
           "--address-file", str(address_file)]
    # A switch's replies come as slowly as everything else: wait in proportion to the
    # start-up time-out (5 s at the default 30 s; ~50 s in a software-emulated VM).
    cmd += ["--switch-timeout-s", f"{max(5.0, timeout_s / 6):.1f}"]
    cmd += ["-v"] * verbose
    if layout:
        cmd += ["--layout", str(layout)]
    if netns:
        cmd += ["--netns", netns]
    if run_state:
        cmd += ["--run-state", str(run_state)]
    env = dict(os.environ)
    if token:
        from controllers.tokenfile import write_secret

        tf = Path(db).with_suffix(".token")
        write_secret(tf, token)
        cmd += ["--token-file", str(tf)]
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    from testbed.metrics.process import for_life, pdeathsig_argv

    def spawn() -> subprocess.Popen[bytes]:
        # In the thread that forks (for_life's, with die_with_parent): a namespace is
        # entered by one thread, and the parent death signal follows the forking thread.
        argv = pdeathsig_argv() + cmd if die_with_parent else cmd
        with open(log_path, "ab") as logf, contextlib.ExitStack() as stack:
            if home_netns:
                from testbed.emu.netns import in_netns

                stack.enter_context(in_netns(home_netns))
            return subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                    cwd=root, start_new_session=True)
    proc = for_life(spawn) if die_with_parent else spawn()
    from testbed.emu.priority import raise_control_priority

    raise_control_priority(proc.pid)  # before it starts threads: they inherit it
    deadline = time.monotonic() + timeout_s
    while True:  # the addresses the controller bound (ports given, or any free ones)
        try:
            bound = json.loads(address_file.read_text())
            rest_port = int(bound["port"])
            of_port = int(bound["of_port"])
            token_file = Path(bound["token_file"])
            if not token:  # generated by the controller: its 0600 file
                token = token_file.read_text().strip()
            break
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited with {proc.returncode}: "
                               f"{log_path.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            _kill(proc)
            raise RuntimeError(f"controller did not bind its REST port within "
                               f"{timeout_s:.0f} s (see {log_path})")
        time.sleep(0.02)
    cp = ControllerProcess(proc, f"http://{rest_host}:{rest_port}", of_port, token, log_path,
                           home_netns, request_timeout_s=max(10.0, timeout_s),
                           token_file=token_file)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited with {proc.returncode}: "
                               f"{log_path.read_text()[-2000:]}")
        try:
            if cp.request("GET", "/health", timeout_s=1.0)[0] == 200:
                return cp
        except OSError:
            pass
        time.sleep(0.05)
    cp.stop(kill=True)
    raise RuntimeError(f"controller did not come up: no answer on {cp.rest_url} within "
                       f"{timeout_s:.0f} s (see {log_path}; emulation.startup_timeout_s "
                       "sets this)")

