"""Worker records across machines on one clock: each machine's offset, and records shifted.

A one-machine run measures a job's iteration from the start of stage 0's first op to the
end of the last op on any stage, on the machine-wide monotonic clock every worker writes
(testbed.orchestrate.results). Stages on several machines write several clocks, so the
driver estimates each machine's offset (its monotonic clock minus the driver's) by a
round-trip exchange over the worker agent's session, as NTP does with one server: the
sample with the shortest round trip, its error at most half that round trip. Records are
then shifted onto the driver's clock before anything reads them. Pure code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The time fields (monotonic s) of a worker's records (workloads.worker, .executor).
SCALAR_FIELDS = ("import_start_s", "imported_s", "ready_s", "start_s", "end_s")
SPAN_FIELDS = ("ops", "waits")  # lists of [name, start_s, end_s]


@dataclass(frozen=True)
class ClockOffset:
    """A machine's monotonic clock minus the driver's, from the best round trip."""

    offset_s: float
    error_s: float     # at most this far off: half the best sample's round trip
    rtt_s: float
    samples: int

    def as_dict(self) -> dict[str, float | int]:
        return {"offset_s": round(self.offset_s, 6), "error_ms": round(self.error_s * 1e3, 4),
                "rtt_ms": round(self.rtt_s * 1e3, 4), "samples": self.samples}


def estimate_offset(samples: Iterable[tuple[float, float, float]]) -> ClockOffset:
    """From (driver time sent, remote time, driver time received) samples: the remote
    clock minus the driver's, taken from the sample with the shortest round trip (the
    remote reading lies within it; its middle is off by at most half of it)."""
    rows = [(float(a), float(r), float(b)) for a, r, b in samples]
    good = [s for s in rows if all(math.isfinite(x) for x in s) and s[2] >= s[0]]
    if not good:
        raise ValueError("no clock sample with a non-negative round trip")
    sent, remote, back = min(good, key=lambda s: s[2] - s[0])
    rtt = back - sent
    return ClockOffset(remote - (sent + back) / 2, rtt / 2, rtt, len(good))


def shift_record(rec: Mapping[str, Any], offset_s: float) -> dict[str, Any]:
    """A worker record with its times moved onto the driver's clock (remote - offset).
    Fields that are not numbers are left as they are."""
    out = dict(rec)
    if offset_s == 0.0:
        return out
    for k in SCALAR_FIELDS:
        v = out.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v - offset_s
    for k in SPAN_FIELDS:
        spans = out.get(k)
        if isinstance(spans, list):
            out[k] = [_shift_span(s, offset_s) for s in spans]
    return out


def _shift_span(span: Any, offset_s: float) -> Any:
    if (isinstance(span, (list, tuple)) and len(span) >= 3
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in span[1:3])):
        return [span[0], span[1] - offset_s, span[2] - offset_s, *span[3:]]
    return span
