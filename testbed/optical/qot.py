"""Lightpath QoT from GNPy: each path's GSNR (ASE + NLI) and the modulation format it allows.

Under `optical.qot: gnpy` a candidate path's modulation format comes from its generalized
SNR (GSNR), computed by GNPy (Telecom Infra Project, `gnpy`, used as a library) instead of
the reach table. The physics is GNPy's: every fibre link becomes a GNPy chain
`Transceiver -> Roadm -> Edfa (booster) -> [Fiber span -> Edfa] x n -> Roadm -> Transceiver`
with spans of at most `span_length_km`, designed by GNPy (`add_missing_elements_in_network`,
`design_network`: amplifier types, gains, per-span launch powers, ROADM targets) with
equipment from GNPy's bundled example `eqpt_config.json`, and a full C-band spectral
information (its `SI`: 32 GBd channels on a 50 GHz grid) is propagated through it
(`gnpy.topology.request.propagate`); the GSNR is read at the receiver.

A path is a chain of such links joined at ROADMs, which equalize the total per-channel
power (signal + noise) to the same target at every degree. So each link adds the same ASE
and NLI relative to the total power whatever came before, and per channel the path obeys
    1 + NSR_path = prod over links (1 + NSR_link)       (NSR = 1 / SNR, linear)
before the transceiver and ROADM add/drop/express contributions are added as GNPy's
`Transceiver.update_snr` adds them. GNPy is therefore run once per distinct link (cached
in memory and on disk), and a path's GSNR is cheap arithmetic on those results;
tests/test_qot.py checks it against GNPy's own propagation over the whole path
(`gnpy.tools.worker_utils`) on the same spans. The path GSNR is the mean over channels of
the per-channel GSNR in dB, GNPy's `SNR-bandwidth` path metric.

The on-disk cache (one JSON file per parameter set, keyed by a hash of the parameters and
the GNPy version) lives in `$LIGHTPIPE_QOT_CACHE`, else `$XDG_CACHE_HOME/lightpipe/qot`,
else `~/.cache/lightpipe/qot`; `LIGHTPIPE_QOT_CACHE=off` turns it off. When every link is
in it, GNPy is not even imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# The format tables live in the catalogue (the spec checks names against them).
from testbed.catalog import PRE_FEC_BER as PRE_FEC_BER
from testbed.catalog import REQUIRED_GSNR_DB
from testbed.errors import InputError

if TYPE_CHECKING:
    from testbed.spec.models import OpticalSpec

log = logging.getLogger(__name__)

CACHE_ENV = "LIGHTPIPE_QOT_CACHE"
CACHE_MAX_BYTES = 16 * 1024 * 1024
CACHE_FORMAT = 1
# Bumped whenever the GNPy network built per link changes (the cache key includes it).
MODEL_VERSION = 1
_FIXED_NF_AMP = "lightpipe_fixed_nf"


def required_gsnr_db(name: str, given: float | None = None) -> float:
    """The GSNR a format needs: `given` (the spec's required_gsnr_db) or the built-in table."""
    if given is not None:
        return given
    try:
        return REQUIRED_GSNR_DB[name]
    except KeyError:
        raise InputError("optical.modulations", f"format {name!r} needs required_gsnr_db "
                         "under qot: gnpy") from None


def link_spans(length_km: float, span_length_km: float) -> tuple[float, ...]:
    """A link cut into the fewest equal spans of at most span_length_km."""
    n = max(1, math.ceil(length_km / span_length_km - 1e-9))
    return (length_km / n,) * n


@dataclass(frozen=True)
class QotParams:
    """What a link's GNPy result depends on (besides its length)."""

    span_length_km: float = 80.0
    fiber_type: str = "SSMF"
    fiber_loss_db_per_km: float = 0.2
    edfa_noise_figure_db: float | None = None
    launch_power_dbm: float | None = None

    @classmethod
    def of(cls, optical: OpticalSpec) -> QotParams:
        return cls(optical.span_length_km, optical.fiber_type, optical.fiber_loss_db_per_km,
                   optical.edfa_noise_figure_db, optical.launch_power_dbm)

    def key(self) -> str:
        """Hash of the parameters, the GNPy version and MODEL_VERSION (the cache file name)."""
        blob = json.dumps({"params": asdict(self), "gnpy": gnpy_version(),
                           "model": MODEL_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


def gnpy_version() -> str:
    """The installed GNPy's version (without importing it), or 'none'."""
    from importlib import metadata

    try:
        return metadata.version("gnpy")
    except metadata.PackageNotFoundError:
        return "none"


def _lin(db: np.ndarray | float) -> np.ndarray:
    return np.power(10.0, np.asarray(db, dtype=float) / 10.0)


@contextlib.contextmanager
def _quiet_gnpy() -> Iterator[None]:
    """GNPy logs design notes (defaults it fills in, e.g. the example's ROADM without a
    type_variety) at WARNING: keep them at debug level here, not on the user's screen."""
    logger = logging.getLogger("gnpy")
    before = logger.level
    logger.setLevel(logging.ERROR if not log.isEnabledFor(logging.DEBUG) else before)
    try:
        yield
    finally:
        logger.setLevel(before)


class GnpyEngine:
    """GNPy itself: equipment, the chain for a run of links, design and propagation."""

    def __init__(self, params: QotParams) -> None:
        try:
            from gnpy.tools.default_edfa_config import DEFAULT_EQPT_CONFIG, DEFAULT_EXTRA_CONFIG
            from gnpy.tools.json_io import load_equipment, merge_equipment
        except ImportError as exc:
            raise InputError("optical.qot", f"gnpy is not installed ({exc}); install it "
                             "with pip install 'lightpipe[qot]' or use qot: reach") from None
        self.params = params
        with _quiet_gnpy():
            eqpt = load_equipment(DEFAULT_EQPT_CONFIG)
        si = eqpt["SI"]["default"]
        if params.launch_power_dbm is not None:
            si.power_dbm = params.launch_power_dbm
        si.power_range_db = [0, 0, 1]  # no power sweep: one design at power_dbm
        if params.edfa_noise_figure_db is not None:
            # A fixed-NF EDFA (GNPy's fixed_gain NF model) with gain and power limits as wide
            # as the example's amplifiers together; design still sets each gain and power.
            amp = {"type_variety": _FIXED_NF_AMP, "type_def": "fixed_gain",
                   "gain_flatmax": 40, "gain_min": 0, "p_max": 23,
                   "nf0": params.edfa_noise_figure_db, "allowed_for_design": False}
            with _quiet_gnpy():
                merge_equipment(eqpt, {"lightpipe": {"Edfa": [amp]}}, DEFAULT_EXTRA_CONFIG)
        self.equipment = eqpt

    def _network(self, links_km: Sequence[float]) -> Any:
        from gnpy.tools.json_io import network_from_json

        p = self.params
        amp = {"type": "Edfa"}
        if p.edfa_noise_figure_db is not None:
            amp["type_variety"] = _FIXED_NF_AMP
        elements: list[dict[str, Any]] = [{"uid": "trx-a", "type": "Transceiver"}]
        for i, length in enumerate(links_km):
            elements.append({"uid": f"roadm-{i}", "type": "Roadm"})
            elements.append({**amp, "uid": f"booster-{i}"})
            for j, span in enumerate(link_spans(length, p.span_length_km)):
                elements.append({"uid": f"span-{i}-{j}", "type": "Fiber",
                                 "type_variety": p.fiber_type,
                                 "params": {"length": span, "length_units": "km",
                                            "loss_coef": p.fiber_loss_db_per_km}})
                elements.append({**amp, "uid": f"amp-{i}-{j}"})
        elements.append({"uid": f"roadm-{len(links_km)}", "type": "Roadm"})
        elements.append({"uid": "trx-b", "type": "Transceiver"})
        connections = [{"from_node": a["uid"], "to_node": b["uid"]}
                       for a, b in pairwise(elements)]
        return network_from_json({"elements": elements, "connections": connections},
                                 self.equipment)

    def _request(self) -> Any:
        from gnpy.core.equipment import trx_mode_params
        from gnpy.core.utils import automatic_nch, dbm2watt
        from gnpy.topology.request import PathRequest

        si = self.equipment["SI"]["default"]
        params: dict[str, Any] = {
            "request_id": "lightpipe", "trx_type": "", "trx_mode": "", "source": "trx-a",
            "destination": "trx-b", "bidir": False, "nodes_list": ["trx-b"],
            "loose_list": ["STRICT"], "format": "", "path_bandwidth": 0,
            "effective_freq_slot": None,
            "nb_channel": (automatic_nch(si.f_min, si.f_max, si.spacing)
                           if si.use_si_channel_count_for_design else None),
            "power": dbm2watt(si.power_dbm),
            "tx_power": dbm2watt(si.tx_power_dbm if si.tx_power_dbm is not None
                                 else si.power_dbm),
        }
        params.update(trx_mode_params(self.equipment))
        return PathRequest(**params)

    def propagate(self, links_km: Sequence[float]) -> tuple[list[Any], Any]:
        """Design the chain for links_km and propagate GNPy's SI through it: (path, si)."""
        from gnpy.core.network import add_missing_elements_in_network, design_network
        from gnpy.topology.request import compute_constrained_path, propagate

        with _quiet_gnpy():
            net = self._network(links_km)
            add_missing_elements_in_network(net, self.equipment)
            req = self._request()
            design_network(req, net, self.equipment, set_connector_losses=True, verbose=False)
            path = compute_constrained_path(net, req)
            si = propagate(path, req, self.equipment)
        return path, si

    def path_channel_gsnr_db(self, links_km: Sequence[float]) -> np.ndarray:
        """GNPy's per-channel GSNR at the receiver over the whole path in one propagation
        (slow; for checks: GnpyQoT composes the same from per-link results)."""
        path, _ = self.propagate(links_km)
        return np.asarray(path[-1].snr, dtype=float)

    def link_record(self, length_km: float) -> list[float]:
        """Per channel, the link's own ASE + NLI noise-to-signal ratio (linear, in the
        signal bandwidth): GNPy's raw receiver SNR over a one-link chain."""
        path, _ = self.propagate([length_km])
        return [float(x) for x in 1.0 / _lin(path[-1].raw_snr)]

    def terms_record(self) -> dict[str, list[float]]:
        """Per channel: baud rate, and the transceiver + add + drop and the express ROADM
        noise-to-signal ratios (linear, 0.1 nm reference bandwidth), as GNPy's propagate
        collects them, from a two-link chain."""
        from gnpy.core.elements import Roadm

        span = self.params.span_length_km
        path, si = self.propagate([span, span])
        roadm_osnr: list[Any] = []
        for prev, el, nxt in zip(path[:-2], path[1:-1], path[2:], strict=True):
            if isinstance(el, Roadm):
                roadm_osnr.append(el.get_impairment("roadm-osnr", si.frequency,
                                                    from_degree=prev.uid, degree=nxt.uid))
        n = len(si.frequency)
        if len(roadm_osnr) != 3:
            raise RuntimeError(f"expected 3 ROADMs on the reference chain, got {len(roadm_osnr)}")

        def nsr(values: Any) -> np.ndarray:
            return np.zeros(n) if values is None else 1.0 / _lin(values)

        add, express, drop = roadm_osnr
        end = nsr(add) + nsr(drop) + nsr(si.tx_osnr)
        return {"baud_rate": [float(x) for x in np.asarray(si.baud_rate, dtype=float)],
                "end_nsr_01nm": [float(x) for x in end],
                "express_nsr_01nm": [float(x) for x in nsr(express)]}


class GnpyQoT:
    """Path GSNR under one QotParams: GNPy per link (cached in memory and on disk), composed."""

    def __init__(self, params: QotParams, cache_dir: Path | None = None) -> None:
        self.params = params
        self.key = params.key()
        self.cache_path = None if cache_dir is None else Path(cache_dir) / f"{self.key}.json"
        self._engine: GnpyEngine | None = None
        self._links: dict[str, np.ndarray] = {}
        self._terms: dict[str, np.ndarray] | None = None
        self._paths: dict[tuple[float, ...], float] = {}
        self.gnpy_runs = 0
        self._load()

    # ---- public -------------------------------------------------------------------
    def gsnr_db(self, links_km: Sequence[float]) -> float:
        """GSNR (dB, mean over channels as GNPy's SNR-bandwidth) of a path over these links.

        Cached per link sequence; the composition does not depend on the order, so the key
        is the sorted sequence (a path and its reverse share it)."""
        key = tuple(sorted(float(x) for x in links_km))
        got = self._paths.get(key)
        if got is None:
            got = float(np.mean(self.channel_gsnr_db(key)))
            self._paths[key] = got
        return got

    def channel_gsnr_db(self, links_km: Sequence[float]) -> np.ndarray:
        """Per-channel GSNR (dB) of a path over these links."""
        if not links_km:
            raise ValueError("a path needs at least one link")
        terms = self._get_terms()
        prod = np.ones_like(terms["baud_rate"])
        for length in links_km:
            prod = prod * (1.0 + self._get_link(float(length)))
        added_01nm = terms["end_nsr_01nm"] + (len(links_km) - 1) * terms["express_nsr_01nm"]
        nsr = (prod - 1.0) + added_01nm * terms["baud_rate"] / 12.5e9
        return -10.0 * np.log10(nsr)

    def engine(self) -> GnpyEngine:
        if self._engine is None:
            self._engine = GnpyEngine(self.params)
        return self._engine

    # ---- per-link results and their cache --------------------------------------------
    def _get_terms(self) -> dict[str, np.ndarray]:
        if self._terms is None:
            rec = self.engine().terms_record()
            self.gnpy_runs += 1
            self._terms = {k: np.asarray(v, dtype=float) for k, v in rec.items()}
            self._save()
        return self._terms

    def _get_link(self, length_km: float) -> np.ndarray:
        name = repr(length_km)
        got = self._links.get(name)
        if got is None:
            log.info("qot: GNPy computes a %g km link (spans of at most %g km)", length_km,
                     self.params.span_length_km)
            got = np.asarray(self.engine().link_record(length_km), dtype=float)
            if self._terms is not None and got.shape != self._terms["baud_rate"].shape:
                raise RuntimeError(f"GNPy propagated {got.size} channels over a {length_km:g} km "
                                   f"link but {self._terms['baud_rate'].size} over the "
                                   "reference chain (amplifier bands differ)")
            self.gnpy_runs += 1
            self._links[name] = got
            self._save()
        return got

    def _read(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
        """The cache file's terms and links; None (with a warning if it exists but does not
        check out: a link, another owner, too large, damaged, another key)."""
        if self.cache_path is None or not os.path.lexists(self.cache_path):
            return None
        from testbed.io.bounded import read_owned_nofollow_bytes

        try:
            raw = read_owned_nofollow_bytes(self.cache_path, CACHE_ENV, CACHE_MAX_BYTES)
            return _checked_cache(json.loads(raw), self.key)
        except (InputError, ValueError, TypeError, KeyError) as exc:
            log.warning("qot: cache %s not used (%s); GNPy recomputes", self.cache_path, exc)
            return None

    def _load(self) -> None:
        got = self._read()
        if got is not None:
            self._terms, self._links = got

    def _save(self) -> None:
        if self.cache_path is None or self._terms is None:
            return
        from testbed.io.atomic import atomic_write_json
        from testbed.io.trusted import make_private_dir

        on_disk = self._read()  # another process (a sweep worker) may have added links
        if on_disk is not None:
            for name, value in on_disk[1].items():
                self._links.setdefault(name, value)
        data = {"format": CACHE_FORMAT, "key": self.key, "gnpy": gnpy_version(),
                "params": asdict(self.params),
                "terms": {k: v.tolist() for k, v in self._terms.items()},
                "links": {k: v.tolist() for k, v in self._links.items()}}
        try:
            make_private_dir(self.cache_path.parent, CACHE_ENV)
            atomic_write_json(self.cache_path, data)
        except (InputError, OSError) as exc:
            log.warning("qot: cache %s not written (%s)", self.cache_path, exc)


def _checked_cache(data: Any, key: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The terms and links of a cache file, ValueError if anything is off."""
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("key") != key:
        raise ValueError("another format or key")

    def vector(value: Any, n: int | None) -> np.ndarray:
        if not isinstance(value, list) or not value or (n is not None and len(value) != n):
            raise ValueError("bad vector length")
        if not all(isinstance(x, float | int) and not isinstance(x, bool) for x in value):
            raise ValueError("non-numbers in a vector")
        arr = np.asarray(value, dtype=float)
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError("values out of range")
        return arr

    t = data["terms"]
    if not isinstance(t, dict) or set(t) != {"baud_rate", "end_nsr_01nm", "express_nsr_01nm"}:
        raise ValueError("bad terms")
    baud = vector(t["baud_rate"], None)
    n = len(baud)
    terms = {"baud_rate": baud, "end_nsr_01nm": vector(t["end_nsr_01nm"], n),
             "express_nsr_01nm": vector(t["express_nsr_01nm"], n)}
    links_raw = data["links"]
    if not isinstance(links_raw, dict):
        raise ValueError("bad links")
    links: dict[str, np.ndarray] = {}
    for name, value in links_raw.items():
        length = float(name)  # ValueError if not a number
        if not (math.isfinite(length) and length > 0) or repr(length) != name:
            raise ValueError(f"bad link name {name!r}")
        links[name] = vector(value, n)
    return terms, links


def default_cache_dir() -> Path | None:
    """$LIGHTPIPE_QOT_CACHE (off: none), else $XDG_CACHE_HOME or ~/.cache, /lightpipe/qot."""
    given = os.environ.get(CACHE_ENV)
    if given is not None:
        return None if given.strip() in ("", "off") else Path(given)
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError:  # no home directory: memory only
            return None
    return Path(base) / "lightpipe" / "qot"


_MODELS: dict[tuple[str, str | None], GnpyQoT] = {}


def qot_model(optical: OpticalSpec) -> GnpyQoT:
    """The process-wide GnpyQoT of the spec's QoT parameters (shared by every network)."""
    params = QotParams.of(optical)
    cache_dir = default_cache_dir()
    key = (params.key(), None if cache_dir is None else str(cache_dir))
    model = _MODELS.get(key)
    if model is None:
        model = _MODELS[key] = GnpyQoT(params, cache_dir)
    return model
