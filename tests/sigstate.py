"""What the kernel will do with SIGINT/SIGTERM, against what Python believes it will.

A C library may call signal()/sigaction() under Python's feet: OR-Tools' CP-SAT set SIGINT
back to SIG_DFL after each solve, so Python still reported its KeyboardInterrupt handler
while the next Ctrl-C killed the process without its clean-up (a held emulation's
`os.kill(os.getpid(), SIGINT)` ended the whole pytest run, no JUnit XML)."""

from __future__ import annotations

import signal
from collections.abc import Iterable

WATCHED = (signal.SIGINT, signal.SIGTERM)


class SignalDispositionWarning(UserWarning):
    """The kernel's disposition of a watched signal no longer matched Python's handler."""


def _masks() -> dict[str, int]:
    """SigCgt (caught) and SigIgn (ignored) of this process, from /proc/self/status."""
    found: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigCgt", "SigIgn"):
                found[key] = int(value.strip(), 16)
    return found


def os_disposition(sig: signal.Signals) -> str:
    """'caught', 'ignored' or 'default': the disposition the kernel holds for sig."""
    m = _masks()
    bit = 1 << (sig - 1)
    if m["SigCgt"] & bit:
        return "caught"
    return "ignored" if m["SigIgn"] & bit else "default"


def python_disposition(sig: signal.Signals) -> str:
    """The disposition Python's signal module believes is installed for sig."""
    handler = signal.getsignal(sig)
    if handler is signal.SIG_IGN:
        return "ignored"
    if handler in (signal.SIG_DFL, None):  # None: installed outside Python, unknown here
        return "default" if handler is signal.SIG_DFL else "unknown"
    return "caught"


def mismatches(sigs: Iterable[signal.Signals] = WATCHED) -> list[str]:
    """One line per signal whose kernel disposition is not what Python believes."""
    out = []
    for sig in sigs:
        py, osd = python_disposition(sig), os_disposition(sig)
        if py != "unknown" and py != osd:
            out.append(f"{sig.name}: Python's handler says {py}, the kernel's says {osd}")
    return out


def blocked(sigs: Iterable[signal.Signals] = WATCHED) -> list[str]:
    """One line per signal the calling thread blocks: the kernel then gives it to another
    thread, and a wait in this one (signal.pause()) never sees it."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    return [f"{sig.name}: blocked in the main thread" for sig in sigs if sig in mask]


def unblock(sigs: Iterable[signal.Signals] = WATCHED) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(sigs))


def resync(sigs: Iterable[signal.Signals] = WATCHED) -> None:
    """Install Python's own handler again in the kernel (main thread only)."""
    for sig in sigs:
        handler = signal.getsignal(sig)
        if handler is not None:
            signal.signal(sig, handler)
