"""The workers' fault-tolerance options as their command line carries them (torch-free:
the launcher, the cluster agent and the worker's parser share it)."""

from __future__ import annotations

ON_FAULT = ("fail", "retry")
"""What a worker does when a collective times out or its peer goes away
(workloads.faulttol): fail fast, or re-form the group and redo the iteration."""


def fault_argv(collective_timeout_s: float | None, on_fault: str, max_restarts: int,
               restart_s: float) -> list[str]:
    """workloads.worker's options for a fault policy in wall seconds (no time-out given:
    the worker keeps its start-up time-out)."""
    out = ["--on-fault", on_fault, "--max-restarts", str(max_restarts),
           "--restart-s", f"{restart_s:.6g}"]
    if collective_timeout_s is not None:
        out += ["--collective-timeout-s", f"{collective_timeout_s:.6g}"]
    return out
