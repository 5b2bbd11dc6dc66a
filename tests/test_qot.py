"""optical.qot: gnpy: path GSNR from GNPy, the format it allows, the cache, the spec fields."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import norm

from testbed.errors import SpecError
from testbed.optical import NO_REACH, OpticalNetwork
from testbed.optical.modulation import DEFAULT_MODULATIONS, choose_modulation, modulation_table
from testbed.optical.qot import (
    CACHE_ENV,
    PRE_FEC_BER,
    REQUIRED_GSNR_DB,
    GnpyQoT,
    QotParams,
    link_spans,
)
from testbed.sim import simulate_lightpaths
from testbed.spec import OpticalSpec, parse_scenario
from testbed.topologies import Fibre, Topology
from tests.conftest import load_yaml


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never touch the user's ~/.cache: every test gets its own cache directory."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "qot-cache"))


def line(*lengths_km: float) -> Topology:
    nodes = tuple(str(i) for i in range(len(lengths_km) + 1))
    fibres = tuple(Fibre(nodes[i], nodes[i + 1], km) for i, km in enumerate(lengths_km))
    return Topology("line", nodes, fibres)


@pytest.fixture(scope="module")
def qot() -> GnpyQoT:
    """GNPy with the spec's defaults, in memory only (shared by the tests of this module)."""
    pytest.importorskip("gnpy")
    return GnpyQoT(QotParams(), cache_dir=None)


# ---- the required-GSNR table --------------------------------------------------------
def test_required_gsnr_table_is_the_textbook_formulas() -> None:
    """Every entry is the SNR at which the Gray-coded AWGN BER formula gives PRE_FEC_BER."""
    q = norm.isf  # inverse of Q(x)

    def db(x: float) -> float:
        return 10 * math.log10(x)

    want = {"BPSK": db(q(PRE_FEC_BER) ** 2 / 2), "QPSK": db(q(PRE_FEC_BER) ** 2)}
    for name, m in (("8QAM", 8), ("16QAM", 16), ("32QAM", 32), ("64QAM", 64)):
        factor = 4 / math.log2(m) * (1 - 1 / math.sqrt(m))
        want[name] = db(q(PRE_FEC_BER / factor) ** 2 * (m - 1) / 3)
    assert set(want) == set(REQUIRED_GSNR_DB)
    for name, value in want.items():
        assert REQUIRED_GSNR_DB[name] == pytest.approx(value, abs=0.006), name
    # more bits per symbol, more GSNR needed
    order = ["BPSK", "QPSK", "8QAM", "16QAM", "32QAM", "64QAM"]
    assert [REQUIRED_GSNR_DB[n] for n in order] == sorted(REQUIRED_GSNR_DB.values())


def test_link_spans() -> None:
    assert link_spans(80, 80) == (80.0,)
    assert link_spans(81, 80) == (40.5, 40.5)
    assert link_spans(10, 80) == (10.0,)
    assert link_spans(1050, 80) == (1050 / 14,) * 14


# ---- against GNPy's own path computation ---------------------------------------------
def _gnpy_network_json(links_km: list[float], span_km: float, amp_variety: str | None,
                       boosters: bool) -> dict[str, Any]:
    """The same spans as a GNPy topology file (GNPy's JSON format)."""
    elements: list[dict[str, Any]] = [{"uid": "Site-A", "type": "Transceiver"}]
    connections: list[dict[str, str]] = []

    def add(el: dict[str, Any]) -> None:
        connections.append({"from_node": elements[-1]["uid"], "to_node": el["uid"]})
        elements.append(el)

    def amp(uid: str) -> dict[str, Any]:
        el: dict[str, Any] = {"uid": uid, "type": "Edfa"}
        if amp_variety is not None:
            el["type_variety"] = amp_variety
        return el

    for i, length in enumerate(links_km):
        add({"uid": f"ROADM-{i}", "type": "Roadm"})
        if boosters:
            add(amp(f"Booster-{i}"))
        n = max(1, math.ceil(length / span_km - 1e-9))
        for j in range(n):
            add({"uid": f"Fiber-{i}.{j}", "type": "Fiber", "type_variety": "SSMF",
                 "params": {"length": length / n, "length_units": "km", "loss_coef": 0.2}})
            add(amp(f"Edfa-{i}.{j}"))
    add({"uid": f"ROADM-{len(links_km)}", "type": "Roadm"})
    add({"uid": "Site-B", "type": "Transceiver"})
    return {"network_name": "lightpipe-test", "elements": elements,
            "connections": connections}


def _gnpy_flow_gsnr_db(tmp_path: Path, links_km: list[float], span_km: float = 80.0,
                       nf_db: float | None = None, power_dbm: float | None = None) -> float:
    """GSNR from GNPy's transmission flow (what gnpy-transmission-example runs): topology
    and equipment files loaded by gnpy.tools.json_io, designed_network, then
    transmission_simulation; the mean receiver SNR over channels."""
    from gnpy.tools.default_edfa_config import DEFAULT_EQPT_CONFIG
    from gnpy.tools.json_io import load_equipments_and_configs, load_network
    from gnpy.tools.worker_utils import designed_network, transmission_simulation

    extra = []
    variety = None
    if nf_db is not None:
        variety = "test_fixed_nf"
        extra_file = tmp_path / "extra_eqpt.json"
        extra_file.write_text(json.dumps({"Edfa": [{
            "type_variety": variety, "type_def": "fixed_gain", "gain_flatmax": 40,
            "gain_min": 0, "p_max": 23, "nf0": nf_db, "allowed_for_design": False}]}))
        extra = [extra_file]
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(_gnpy_network_json(links_km, span_km, variety,
                                                  boosters=nf_db is not None)))
    equipment = load_equipments_and_configs(DEFAULT_EQPT_CONFIG, extra, [])
    network = load_network(topo, equipment)
    network, req, ref = designed_network(equipment, network, source="Site-A",
                                         destination="Site-B", args_power=power_dbm)
    path, _, _, _ = transmission_simulation(equipment, network, req, ref)
    return float(np.mean(path[-1].snr))


@pytest.mark.parametrize("links_km", [[80.0], [800.0], [1000.0, 1200.0],
                                      [2100.0, 1500.0, 600.0, 700.0], [300.0, 300.0, 150.0]],
                         ids=lambda v: "-".join(f"{x:g}" for x in v))
def test_gsnr_equals_gnpy_transmission_flow(qot: GnpyQoT, tmp_path: Path,
                                            links_km: list[float]) -> None:
    got = qot.gsnr_db(links_km)
    want = _gnpy_flow_gsnr_db(tmp_path, links_km)
    assert got == pytest.approx(want, abs=0.01)
    # and GNPy over the whole path in one propagation, per channel
    whole = qot.engine().path_channel_gsnr_db(links_km)
    assert np.allclose(qot.channel_gsnr_db(links_km), whole, atol=0.01)


def test_gsnr_equals_gnpy_with_fixed_nf_and_launch_power(tmp_path: Path) -> None:
    pytest.importorskip("gnpy")
    params = QotParams(span_length_km=70.0, edfa_noise_figure_db=5.0, launch_power_dbm=1.0)
    mine = GnpyQoT(params, cache_dir=None)
    links = [900.0, 400.0]
    got = mine.gsnr_db(links)
    want = _gnpy_flow_gsnr_db(tmp_path, links, span_km=70.0, nf_db=5.0, power_dbm=1.0)
    assert got == pytest.approx(want, abs=0.01)
    # a noisier amplifier costs GSNR
    noisy = GnpyQoT(QotParams(span_length_km=70.0, edfa_noise_figure_db=7.0,
                              launch_power_dbm=1.0), cache_dir=None)
    assert noisy.gsnr_db(links) < got - 1.0


# ---- the format from the GSNR -------------------------------------------------------
def _gnpy_net(topology: Topology, **optical: Any) -> OpticalNetwork:
    return OpticalNetwork(topology, OpticalSpec(qot="gnpy", **optical))


def test_format_monotone_in_length(qot: GnpyQoT) -> None:
    lengths = [100.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0]
    gsnr = [qot.gsnr_db([x]) for x in lengths]
    assert gsnr == sorted(gsnr, reverse=True) and len(set(gsnr)) == len(gsnr)
    rates = []
    for x in lengths:
        net = _gnpy_net(line(x))
        p = net.path_info(["0", "1"])
        assert p.gsnr_db == pytest.approx(qot.gsnr_db([x]))
        rates.append(p.gbps_per_slot)
    assert rates == sorted(rates, reverse=True)
    assert rates[0] == 50.0 and rates[-2] > 0.0  # 16QAM on 100 km; 3200 km still usable
    # hops of 400 km: the longer the path, the lower the GSNR and never a better format
    net = _gnpy_net(line(*([400.0] * 30)))
    chain = [net.path_info([str(i) for i in range(n + 1)]) for n in range(1, 31)]
    gs = [p.gsnr_db for p in chain]
    assert all(a > b for a, b in pairwise(gs))  # type: ignore[operator]
    per_slot = [p.gbps_per_slot for p in chain]
    assert per_slot == sorted(per_slot, reverse=True)
    assert per_slot[0] == 50.0 and per_slot[-1] == 0.0  # 12,000 km: out of reach
    assert chain[-1].modulation is None


def test_out_of_reach_path_is_refused(qot: GnpyQoT) -> None:
    net = _gnpy_net(line(*([400.0] * 30)))
    assert net.allocate_or_reason("0", "30", bitrate_gbps=100) == NO_REACH
    assert net.allocate("0", "1", bitrate_gbps=100) is not None


def test_margin_moves_the_boundary(qot: GnpyQoT) -> None:
    topo = line(1200.0)
    gsnr = qot.gsnr_db([1200.0])
    no_margin = _gnpy_net(topo, gsnr_margin_db=0.0).path_info(["0", "1"])
    need = REQUIRED_GSNR_DB[no_margin.modulation]  # type: ignore[index]
    assert need <= gsnr
    just_fits = gsnr - need - 0.01
    assert _gnpy_net(topo, gsnr_margin_db=just_fits).path_info(
        ["0", "1"]).modulation == no_margin.modulation
    lower = _gnpy_net(topo, gsnr_margin_db=just_fits + 0.02).path_info(["0", "1"])
    assert lower.gbps_per_slot < no_margin.gbps_per_slot
    # a margin no format can carry: unusable
    assert _gnpy_net(topo, gsnr_margin_db=gsnr).path_info(["0", "1"]).modulation is None


def test_custom_formats_with_required_gsnr(qot: GnpyQoT) -> None:
    gsnr = qot.gsnr_db([800.0])
    mods = [{"name": "lo", "reach_km": 1.0, "gbps_per_slot": 10.0,
             "required_gsnr_db": gsnr - 1.0},
            {"name": "hi", "reach_km": 1.0, "gbps_per_slot": 60.0,
             "required_gsnr_db": gsnr + 1.0},
            {"name": "QPSK", "reach_km": 1.0, "gbps_per_slot": 25.0}]  # built-in 8.53 dB
    opt = OpticalSpec.model_validate({"qot": "gnpy", "gsnr_margin_db": 0.0,
                                      "modulations": mods})
    table = modulation_table(opt)
    assert {m.name: m.required_gsnr_db for m in table}["QPSK"] == REQUIRED_GSNR_DB["QPSK"]
    p = OpticalNetwork(line(800.0), opt).path_info(["0", "1"])
    assert p.modulation == "QPSK" and p.gbps_per_slot == 25.0  # reach_km plays no part


# ---- the cache ----------------------------------------------------------------------
def test_disk_cache_is_reused_and_checked(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                          ) -> None:
    pytest.importorskip("gnpy")
    cache = tmp_path / "cache"
    first = GnpyQoT(QotParams(), cache)
    value = first.gsnr_db([600.0, 750.0])
    assert first.gnpy_runs == 3  # the two-link reference (terms) and two links
    files = list(cache.iterdir())
    assert len(files) == 1 and files[0].name == f"{first.key}.json"
    assert (cache.stat().st_mode & 0o077) == 0  # private directory
    second = GnpyQoT(QotParams(), cache)
    assert second.gsnr_db([750.0, 600.0]) == value  # order does not matter
    assert second.gnpy_runs == 0
    # other parameters: another file
    other = GnpyQoT(QotParams(span_length_km=60.0), cache)
    assert other.key != first.key and other.gnpy_runs == 0
    # a damaged file is ignored with a warning, then rewritten whole
    files[0].write_text('{"format": 1, "key": "' + first.key + '", "terms": 3}')
    with caplog.at_level(logging.WARNING, logger="testbed.optical.qot"):
        third = GnpyQoT(QotParams(), cache)
    assert "not used" in caplog.text
    assert third.gsnr_db([600.0, 750.0]) == pytest.approx(value)
    assert third.gnpy_runs == 3
    assert json.loads(files[0].read_text())["key"] == first.key


def test_two_processes_sharing_a_cache_keep_both_links(tmp_path: Path) -> None:
    pytest.importorskip("gnpy")
    cache = tmp_path / "cache"
    a = GnpyQoT(QotParams(), cache)
    a.gsnr_db([300.0])
    b = GnpyQoT(QotParams(), cache)  # as a second sweep worker would, from the same file
    a.gsnr_db([150.0])
    b.gsnr_db([450.0])  # b saves after a: a's 150 km link must survive
    data = json.loads((cache / f"{a.key}.json").read_text())
    assert set(data["links"]) == {"300.0", "150.0", "450.0"}
    c = GnpyQoT(QotParams(), cache)
    assert c.gsnr_db([150.0, 300.0, 450.0]) == pytest.approx(a.gsnr_db([150.0, 300.0, 450.0]))
    assert c.gnpy_runs == 0


def test_symlinked_cache_file_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                         ) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    key = QotParams().key()
    os.symlink(target, cache / f"{key}.json")
    with caplog.at_level(logging.WARNING, logger="testbed.optical.qot"):
        model = GnpyQoT(QotParams(), cache)
    assert "symbolic link" in caplog.text
    assert model._terms is None and not model._links


def test_path_cache_holds_per_link_sequence(qot: GnpyQoT) -> None:
    qot.gsnr_db([300.0, 150.0])
    runs = qot.gnpy_runs
    assert qot.gsnr_db([150.0, 300.0]) == qot.gsnr_db([300.0, 150.0])
    assert qot.gnpy_runs == runs


# ---- the spec -----------------------------------------------------------------------
BAD = [
    ({"qot": "osnr"}, "optical.qot", "reach"),
    ({"qot": "gnpy", "grid": "fixed", "wavelengths": 40, "gbps_per_wavelength": 100.0},
     "optical.qot", "grid: flex"),
    ({"span_length_km": 5}, "optical.span_length_km", ">= 10"),
    ({"span_length_km": 200}, "optical.span_length_km", "<= 150"),
    ({"fiber_type": "G.652"}, "optical.fiber_type", "SSMF"),
    ({"fiber_loss_db_per_km": -0.2}, "optical.fiber_loss_db_per_km", "> 0"),
    ({"edfa_noise_figure_db": 1}, "optical.edfa_noise_figure_db", ">= 3"),
    ({"launch_power_dbm": 40}, "optical.launch_power_dbm", "<= 20"),
    ({"launch_power_dbm": "high"}, "optical.launch_power_dbm", "number"),
    ({"gsnr_margin_db": -1}, "optical.gsnr_margin_db", ">= 0"),
    ({"qot": "gnpy", "modulations": [{"name": "PS-64QAM", "reach_km": 900,
                                      "gbps_per_slot": 60}]},
     "optical", "'PS-64QAM' needs required_gsnr_db"),
    ({"modulations": [{"name": "x", "reach_km": 900, "gbps_per_slot": 60,
                       "required_gsnr_db": 99}]},
     "optical.modulations[0].required_gsnr_db", "<= 50"),
]


@pytest.mark.parametrize("fields,path,fragment", BAD, ids=[b[1] + ":" + str(i)
                                                             for i, b in enumerate(BAD)])
def test_spec_rejects_bad_qot_fields(fields: dict[str, Any], path: str, fragment: str) -> None:
    data = load_yaml("quickstart.yaml")
    data["optical"].update(fields)
    with pytest.raises(SpecError) as info:
        parse_scenario(data)
    assert info.value.path == path, info.value.line()
    assert fragment in info.value.message, info.value.line()
    assert "\n" not in info.value.line()


def test_spec_defaults() -> None:
    opt = parse_scenario(load_yaml("quickstart.yaml")).optical
    assert (opt.qot, opt.span_length_km, opt.fiber_type, opt.fiber_loss_db_per_km,
            opt.edfa_noise_figure_db, opt.launch_power_dbm, opt.gsnr_margin_db) == \
        ("reach", 80.0, "SSMF", 0.2, None, None, 2.0)
    data = load_yaml("quickstart.yaml")
    data["optical"].update(qot="gnpy", span_length_km=100, edfa_noise_figure_db=5.5,
                           launch_power_dbm=1, gsnr_margin_db=3)
    opt = parse_scenario(data).optical
    assert QotParams.of(opt) == QotParams(100.0, "SSMF", 0.2, 5.5, 1.0)


# ---- reach mode unchanged -----------------------------------------------------------
# sha256 of requests.csv written by the code before optical.qot existed (git HEAD at the
# time, run from a `git archive` copy) for the same scenarios.
REACH_GOLDEN = {
    "quickstart": "7563fd0f4e61104b8e9925df80f567201aa2b4d502a2aab1203b77a84476bf26",
    "short-reach": "104feebdd4cb974b333e403237807c2913de49f5643273ca0a1937e2f0ed7808",
}


def _reach_scenario(name: str) -> dict[str, Any]:
    data = load_yaml("quickstart.yaml")
    if name == "quickstart":
        data["workload"].update(requests=4000, load_erlang=30)
    else:
        data["workload"].update(requests=3000, load_erlang=20)
        data["optical"].update(guard_slots=1, modulations=[
            {"name": "QPSK", "reach_km": 2500.0, "gbps_per_slot": 25.0},
            {"name": "16QAM", "reach_km": 800.0, "gbps_per_slot": 50.0}])
        data["policy"]["spectrum"] = "best_fit"
    return data


@pytest.mark.parametrize("name", sorted(REACH_GOLDEN))
def test_reach_mode_is_unchanged(tmp_path: Path, name: str) -> None:
    data = _reach_scenario(name)
    out = tmp_path / "requests.csv"
    simulate_lightpaths(parse_scenario(data), requests_csv=out)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == REACH_GOLDEN[name]
    # qot: reach said explicitly is the default; no GSNR anywhere; never a cache file
    data["optical"]["qot"] = "reach"
    again = tmp_path / "again.csv"
    simulate_lightpaths(parse_scenario(data), requests_csv=again)
    assert again.read_bytes() == out.read_bytes()
    assert not (tmp_path / "qot-cache").exists()
    net = OpticalNetwork.from_scenario(parse_scenario(data))
    assert net.qot is None
    for p in net.candidate_paths("1", "13"):
        assert p.gsnr_db is None
        mod = choose_modulation(p.length_km, net.modulations)
        assert p.modulation == (mod.name if mod else None)
    assert modulation_table(OpticalSpec()) == tuple(
        sorted(DEFAULT_MODULATIONS, key=lambda m: (-m.gbps_per_slot, m.reach_km)))


def test_gnpy_mode_simulates(qot: GnpyQoT) -> None:
    """The whole simulator under qot: gnpy: formats from GSNR, the cache file written."""
    data = _reach_scenario("quickstart")
    data["optical"]["qot"] = "gnpy"
    sc = parse_scenario(data)
    summary = simulate_lightpaths(sc)
    assert summary["requests"] == 4000 and summary["accepted"] > 0
    net = OpticalNetwork.from_scenario(sc)
    for p in net.candidate_paths("1", "13"):
        assert p.gsnr_db is not None
        expect = max((m for m in net.modulations
                      if m.required_gsnr_db + 2.0 <= p.gsnr_db),  # type: ignore[operator]
                     key=lambda m: m.gbps_per_slot, default=None)
        assert p.modulation == (expect.name if expect else None)
    cache = Path(os.environ[CACHE_ENV])
    assert len(list(cache.glob("*.json"))) == 1


def test_emulation_plan_takes_formats_from_gnpy_under_qot_gnpy() -> None:
    """The emulated fibres' and lightpaths' rates follow the GSNR formats, not the reach
    table, under qot: gnpy (the same choice the simulator makes); reach mode unchanged."""
    pytest.importorskip("gnpy")
    from testbed.emu.plan import build_plan
    from testbed.optical.modulation import choose_modulation_by_gsnr
    from testbed.optical.qot import qot_model

    raw = load_yaml("quickstart.yaml")
    reach = build_plan(parse_scenario(raw))
    raw["optical"] = {**raw.get("optical", {}), "qot": "gnpy"}
    sc = parse_scenario(raw)
    plan = build_plan(sc)
    model, table = qot_model(sc.optical), modulation_table(sc.optical)
    for f, r in zip(plan.fibres, reach.fibres, strict=True):
        want = choose_modulation_by_gsnr(model.gsnr_db([f.length_km]), table,
                                         sc.optical.gsnr_margin_db)
        assert want is not None and f.modulation == want.name, (f.u, f.v)
        assert f.real_gbps == pytest.approx(sc.optical.slots * want.gbps_per_slot)
        assert r.modulation == choose_modulation(r.length_km, table).name  # type: ignore[union-attr]
    assert any(f.modulation != r.modulation for f, r in zip(plan.fibres, reach.fibres,
                                                            strict=True))
