"""Lightpath request streams: seeded Poisson generator and the request trace CSV reader.

A request is a tuple (id, arrival_s, holding_s, src, dst, bitrate_gbps); streams are
iterators so nothing per request is kept in memory.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

import numpy as np

from testbed.errors import InputError
from testbed.io.bounded import TRACE_MAX_BYTES, check_regular
from testbed.spec.models import LightpathRequestsWorkload

Request = tuple[int, float, float, str, str, float]

TRACE_COLUMNS = ("arrival_s", "holding_s", "src", "dst", "bitrate_gbps")  # + optional id


BATCH_REQUESTS = 4096  # requests drawn per numpy batch by poisson_requests
DRAWS = 5  # uniform draws per request: gap, src, dst, holding, bitrate (in that order)


def poisson_requests(workload: LightpathRequestsWorkload, endpoints: list[str],
                     rng: random.Random | None = None) -> Iterator[Request]:
    """workload.requests Poisson arrivals (rate load/holding), exponential holding times,
    uniform ordered endpoint pair (src != dst), uniform bitrate from the list.

    Per request, in order: arrival gap rng.expovariate(rate), src int(random() x n), dst
    int(random() x (n - 1)) skipping src, holding rng.expovariate(1 / mean), bitrate
    index int(random() x len), with rng = random.Random(workload.seed) unless given.
    Without an rng (the simulator's case) the draws are made in batches by numpy's MT19937
    started from random.Random(workload.seed)'s state: the same Mersenne Twister and the
    same 53-bit doubles, so the stream equals the one-request-at-a-time draws bit for bit
    (tests/test_rmsa_speed_equal.py), about twice as fast. A given rng may be shared with
    other draws between requests, so it is drawn from one request at a time, as before.
    """
    if rng is not None:
        return _poisson_scalar(workload, endpoints, rng)
    return chain.from_iterable(_poisson_batches(workload, endpoints,
                                                random.Random(workload.seed)))


def _poisson_scalar(workload: LightpathRequestsWorkload, endpoints: list[str],
                    rng: random.Random) -> Iterator[Request]:
    hold = workload.mean_holding_s
    rate = workload.load_erlang / hold
    n = len(endpoints)
    bitrates = list(workload.bitrate_gbps)
    nb = len(bitrates)
    expo = rng.expovariate
    rnd = rng.random
    t = 0.0
    for rid in range(workload.requests):
        t += expo(rate)
        i = int(rnd() * n)
        j = int(rnd() * (n - 1))
        if j >= i:
            j += 1
        yield (rid, t, expo(1.0 / hold), endpoints[i], endpoints[j], bitrates[int(rnd() * nb)])


def _poisson_batches(workload: LightpathRequestsWorkload, endpoints: list[str],
                     rng: random.Random) -> Iterator[Iterator[Request]]:
    """Batches of the stream (zips of columns: the requests are built in C), drawn from
    rng's state onwards (rng is this stream's own: it is not advanced)."""
    ends = np.empty(len(endpoints), dtype=object)
    ends[:] = endpoints
    bitrates = np.empty(len(workload.bitrate_gbps), dtype=object)
    bitrates[:] = list(workload.bitrate_gbps)
    for first, arrivals, holds, src, dst, pick in poisson_columns(workload, len(endpoints),
                                                                  rng):
        m = len(arrivals)
        yield zip(range(first, first + m), arrivals.tolist(), holds.tolist(),
                  ends[src].tolist(), ends[dst].tolist(), bitrates[pick].tolist(), strict=True)


PoissonColumns = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _neg_log1m(u: np.ndarray) -> np.ndarray:
    return -np.fromiter(map(math.log, (1.0 - u).tolist()), float, len(u))


def poisson_columns(workload: LightpathRequestsWorkload, n: int, rng: random.Random,
                    neg_log1m: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> Iterator[PoissonColumns]:
    """poisson_requests' stream as numpy columns, BATCH_REQUESTS requests at a time:
    (first id, arrival_s, holding_s, src index, dst index, bitrate index) into the n
    endpoints and workload.bitrate_gbps, drawn from rng's state onwards (not advanced).
    neg_log1m(u) = -log(1 - u) elementwise, with libm's log (math.log by default; the
    compiled one of testbed.sim.rmsa_kernel gives the same bits, faster)."""
    nl = neg_log1m or _neg_log1m
    hold = workload.mean_holding_s
    rate = workload.load_erlang / hold
    lam_hold = 1.0 / hold  # expovariate(1.0 / hold) divides by this float
    nb = len(workload.bitrate_gbps)
    words = rng.getstate()[1]  # 624 state words and the position, as numpy's MT19937 has
    bitgen = np.random.MT19937(0)
    bitgen.state = {"bit_generator": "MT19937",
                    "state": {"key": np.array(words[:-1], dtype=np.uint32), "pos": words[-1]}}
    uniform = np.random.Generator(bitgen).random
    t = 0.0
    total = workload.requests
    for first in range(0, total, BATCH_REQUESTS):
        m = min(BATCH_REQUESTS, total - first)
        u = uniform(DRAWS * m).reshape(m, DRAWS).T
        # -log(1 - u) / lambd, as random.expovariate: libm's log (as random uses), the
        # exact IEEE subtraction, negation and division.
        gaps = nl(u[0]) / rate
        holds = nl(u[3]) / lam_hold
        gaps[0] += t
        arrivals = np.cumsum(gaps)  # sequential sums: t += gap, request by request
        src = (u[1] * n).astype(np.intp)
        dst = (u[2] * (n - 1)).astype(np.intp)
        dst += dst >= src
        pick = (u[4] * nb).astype(np.intp)
        t = float(arrivals[-1])
        yield first, arrivals, holds, src, dst, pick


def check_trace_file(path: str | Path) -> None:
    """A request trace must be a regular file within the trace size limit (before reading)."""
    p = check_regular(path, "workload.trace")
    size = p.stat().st_size
    if size > TRACE_MAX_BYTES:
        raise InputError("workload.trace", f"{str(p)!r} is too large ({size} bytes; the "
                         f"limit is {TRACE_MAX_BYTES} bytes)")


def count_trace_rows(path: str | Path) -> int:
    """Number of data rows of a trace (a cheap first pass, for batch sizes and progress)."""
    check_trace_file(path)
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return max(0, sum(1 for line in fh if line.strip()) - 1)
    except UnicodeDecodeError:
        raise InputError("workload.trace", f"{str(path)!r} is not UTF-8 text") from None
    except OSError as exc:
        raise InputError("workload.trace", f"cannot read {str(path)!r}: {exc.strerror}") \
            from None


def read_request_trace(path: str | Path, nodes: set[str]) -> Iterator[Request]:
    """Stream a request trace CSV: arrival_s,holding_s,src,dst,bitrate_gbps[,id].

    Rows must be in non-decreasing arrival order; errors name the row and column.
    """
    try:
        yield from _read_request_trace(path, nodes)
    except UnicodeDecodeError:
        raise InputError("workload.trace", f"{str(path)!r} is not UTF-8 text") from None
    except csv.Error as exc:
        raise InputError("workload.trace", f"{str(path)!r}: bad CSV: {exc}") from None


def _read_request_trace(path: str | Path, nodes: set[str]) -> Iterator[Request]:
    where = "workload.trace"
    check_trace_file(path)
    try:
        fh = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise InputError(where, f"cannot read {str(path)!r}: {exc.strerror}") from None
    with fh:
        reader = csv.DictReader(fh)
        cols = set(reader.fieldnames or [])
        missing = [c for c in TRACE_COLUMNS if c not in cols]
        if missing:
            raise InputError(where, f"{path}: missing column(s) {', '.join(missing)} "
                             f"(need {','.join(TRACE_COLUMNS)}[,id])")
        last_t = -math.inf
        for rowno, row in enumerate(reader):
            line = rowno + 2
            try:
                arrival = float(row["arrival_s"])
                holding = float(row["holding_s"])
                bitrate = float(row["bitrate_gbps"])
                for col in ("arrival_s", "holding_s", "bitrate_gbps", "id"):
                    if not (row.get(col) or "").isascii() or len(row.get(col) or "") > 40:
                        raise ValueError(col)
                rid = int(row["id"]) if "id" in cols and row["id"] not in (None, "") \
                    else rowno
            except (TypeError, ValueError):
                raise InputError(where, f"{path}: row {line}: arrival_s, holding_s, "
                                 "bitrate_gbps must be numbers and id an integer") from None
            src, dst = (row["src"] or "").strip(), (row["dst"] or "").strip()
            if not (math.isfinite(arrival) and arrival >= 0):
                raise InputError(where, f"{path}: row {line}: arrival_s must be >= 0")
            if arrival < last_t:
                raise InputError(where, f"{path}: row {line}: arrival_s {arrival} is before "
                                 f"the previous row's {last_t} (sort by arrival)")
            if not (math.isfinite(holding) and holding > 0):
                raise InputError(where, f"{path}: row {line}: holding_s must be > 0")
            if not (math.isfinite(bitrate) and bitrate > 0):
                raise InputError(where, f"{path}: row {line}: bitrate_gbps must be > 0")
            for name, node in (("src", src), ("dst", dst)):
                if node not in nodes:
                    raise InputError(where, f"{path}: row {line}: {name} {node!r} is not a "
                                     "node of the topology")
            if src == dst:
                raise InputError(where, f"{path}: row {line}: src and dst are the same")
            last_t = arrival
            yield (rid, arrival, holding, src, dst, bitrate)
