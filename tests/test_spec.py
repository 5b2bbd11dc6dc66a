"""Scenario spec validation: bundled scenarios pass; broken specs fail with the right path."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from testbed.errors import SpecError
from testbed.spec import load_scenario, parse_scenario, topology_of

from .conftest import SCENARIOS, load_yaml

Mutator = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutator:
    def mutate(d: dict[str, Any]) -> None:
        node: Any = d
        parts = path.split(".")
        for p in parts[:-1]:
            node = node[int(p)] if p.isdigit() else node[p]
        last = parts[-1]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _pop(path: str) -> Mutator:
    def mutate(d: dict[str, Any]) -> None:
        node: Any = d
        parts = path.split(".")
        for p in parts[:-1]:
            node = node[int(p)] if p.isdigit() else node[p]
        node.pop(parts[-1])

    return mutate


LINKS = [{"u": "a", "v": "b", "length_km": 100}, {"u": "c", "v": "d", "length_km": 50}]

# (case id, base scenario, mutation, expected field path, fragment of the message)
BROKEN: list[tuple[str, str, Mutator, str, str]] = [
    ("unknown-top-key", "q", _set("colour", "blue"), "colour", "unknown key"),
    ("unknown-dc-key", "q", _set("dcs.0.colour", 1), "dcs[0].colour", "unknown key"),
    ("unknown-optical-key", "q", _set("optical.slotz", 80), "optical.slotz", "unknown key"),
    ("unknown-workload-key", "q", _set("workload.foo", 1), "workload.foo", "unknown key"),
    ("missing-name", "q", _pop("name"), "name", "required"),
    ("missing-topology", "q", _pop("topology"), "topology", "required"),
    ("missing-workload", "q", _pop("workload"), "workload", "required"),
    ("missing-kind", "q", _pop("workload.kind"), "workload.kind", "required"),
    ("unknown-kind", "q", _set("workload.kind", "batch"), "workload.kind", "unknown kind"),
    ("bad-version", "q", _set("version", 2), "version", "1"),
    ("gpus-wrong-type", "q", _set("dcs.0.gpus", "many"), "dcs[0].gpus", "integer"),
    ("gpus-negative", "q", _set("dcs.0.gpus", -3), "dcs[0].gpus", ">= 1"),
    ("gpus-float", "q", _set("dcs.0.gpus", 2.5), "dcs[0].gpus", "integer"),
    ("load-negative", "q", _set("workload.load_erlang", -1), "workload.load_erlang", "> 0"),
    ("load-nan", "q", _set("workload.load_erlang", float("nan")), "workload.load_erlang",
     "finite"),
    ("requests-zero", "q", _set("workload.requests", 0), "workload.requests", ">= 1"),
    ("bitrate-negative", "q", _set("workload.bitrate_gbps", [100, -1]),
     "workload.bitrate_gbps[1]", "> 0"),
    ("bitrate-empty", "q", _set("workload.bitrate_gbps", []), "workload.bitrate_gbps",
     "at least one"),
    ("slots-zero", "q", _set("optical.slots", 0), "optical.slots", ">= 1"),
    ("k-paths-zero", "q", _set("optical.k_paths", 0), "optical.k_paths", ">= 1"),
    ("grid-unknown", "q", _set("optical.grid", "mixed"), "optical.grid", "flex"),
    ("fixed-grid-incomplete", "q", _set("optical.grid", "fixed"), "optical", "wavelengths"),
    ("guard-too-big", "q", lambda d: d["optical"].update(slots=8, guard_slots=8),
     "optical.guard_slots",
     "smaller than optical.slots"),
    ("modulation-bad-reach", "q", _set("optical.modulations",
     [{"name": "x", "reach_km": -1, "gbps_per_slot": 1}]), "optical.modulations[0].reach_km",
     "> 0"),
    ("modulation-dup", "q", _set("optical.modulations",
     [{"name": "x", "reach_km": 1, "gbps_per_slot": 1}] * 2), "optical", "duplicate"),
    ("dc-unknown-node", "q", _set("dcs.1.node", "x"), "dcs[1].node",
     "unknown node 'x' (topology nsfnet has 1..14)"),
    ("dc-duplicate-name", "q", _set("dcs.1.name", "dc-a"), "dcs[1].name", "duplicate"),
    ("dc-duplicate-node", "q", _set("dcs.1.node", "1"), "dcs[1].node", "already hosts"),
    ("dc-unsafe-shell", "q", _set("dcs.1.name", "dc;rm -rf /"), "dcs[1].name", "unsafe"),
    ("dc-unsafe-ifname", "q", _set("dcs.1.name", "a-very-long-dc-name-x"), "dcs[1].name",
     "15"),
    ("dc-unsafe-upper", "q", _set("dcs.1.name", "DC-B"), "dcs[1].name", "unsafe"),
    ("dc-unknown-gpu", "q", _set("dcs.0.gpu", "tpu9"), "dcs[0].gpu", "unknown GPU"),
    ("price-negative", "q", _set("dcs.0.price_usd_per_kwh", -0.1), "dcs[0].price_usd_per_kwh",
     ">= 0"),
    ("price-curve-short", "q", _set("dcs.0.price_curve_usd_per_kwh", [0.1] * 23),
     "dcs[0].price_curve_usd_per_kwh", "24"),
    ("scenario-name-unsafe", "q", _set("name", "../../etc"), "name", "unsafe"),
    ("topology-unknown-library", "q", _set("topology", {"library": "arpanet"}),
     "topology.library", "unknown topology"),
    ("topology-two-sources", "q", _set("topology", {"library": "nsfnet", "links": LINKS}),
     "topology", "exactly one"),
    ("topology-empty", "q", _set("topology", {"links": []}), "topology", "empty"),
    ("link-negative-length", "q", _set("topology", {"links": [{"u": 1, "v": 2,
     "length_km": -5}]}), "topology.links[0].length_km", "> 0"),
    ("link-self-loop", "q", _set("topology", {"links": [{"u": 1, "v": 1, "length_km": 5}]}),
     "topology.links[0]", "self-loop"),
    ("link-unsafe-node", "q", _set("topology", {"links": [{"u": "a b", "v": "c",
     "length_km": 5}]}), "topology.links[0].u", "unsafe"),
    ("link-duplicate", "q", _set("topology", {"links": [LINKS[0], LINKS[0]]}),
     "topology.links[1]", "duplicate"),
    ("link-node-not-listed", "q", _set("topology", {"nodes": ["a"], "links": LINKS[:1]}),
     "topology.links[0].v", "not in topology.nodes"),
    ("disconnected", "q", lambda d: d.update(topology={"links": LINKS}, dcs=[]), "topology",
     "disconnected"),
    ("event-unknown-link", "q", _set("events", [{"at_s": 1, "kind": "fiber_cut",
     "link": ["1", "5"]}]), "events[0].link", "no fibre 1-5"),
    ("event-negative-time", "q", _set("events", [{"at_s": -1, "kind": "fiber_cut",
     "link": ["1", "2"]}]), "events[0].at_s", ">= 0"),
    ("event-slots-missing", "q", _set("events", [{"at_s": 1, "kind": "wavelength_loss",
     "link": ["1", "2"]}]), "events[0]", "first_slot"),
    ("event-slots-outside", "q", _set("events", [{"at_s": 1, "kind": "wavelength_loss",
     "link": ["1", "2"], "first_slot": 78, "slots": 4}]), "events[0].slots", "exceed"),
    ("policy-unknown", "q", _set("policy.spectrum", "worst_fit"), "policy.spectrum",
     "first_fit"),
    ("emulation-divisor", "q", _set("emulation.bandwidth_divisor", 0),
     "emulation.bandwidth_divisor", ">= 1"),
    ("emulation-mode", "q", _set("emulation.link_mode", "magic"), "emulation.link_mode",
     "netem"),
    ("jobs-unknown-model", "p", _set("workload.mix.0.model", "gpt-9"), "workload.mix[0].model",
     "unknown model"),
    ("jobs-too-big", "p", _set("workload.mix.0.stages", 100), "workload.mix[0]",
     "GPUs"),
    ("jobs-no-mix", "p", _set("workload.mix", []), "workload", "job mix"),
    ("jobs-no-dcs", "p", _set("dcs", []), "dcs", "at least one DC"),
    ("jobs-disconnected", "p", lambda d: d.update(
        topology={"links": LINKS}, events=[],
        dcs=[{"name": "a", "node": "a", "gpus": 64}, {"name": "c", "node": "c", "gpus": 64}]),
     "topology", "disconnected"),
    ("jobs-model-dup", "p", _set("workload.models", [{"name": "gpt3-6.7b", "layers": 1,
     "hidden": 1, "seq_len": 1}]), "workload.models", "already in the catalogue"),
    ("jobs-admission", "p", _set("policy.admission", "maybe"), "policy.admission", "block"),
]


@pytest.mark.parametrize("case,base,mutate,path,fragment", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_names_field(case: str, base: str, mutate: Mutator, path: str,
                                 fragment: str) -> None:
    data = load_yaml("quickstart.yaml" if base == "q" else "pp-jobs.yaml")
    mutate(data)
    with pytest.raises(SpecError) as info:
        parse_scenario(data)
    assert info.value.path == path, info.value.line()
    assert fragment in info.value.message, info.value.line()
    assert "\n" not in info.value.line()


def test_at_least_thirty_broken_cases() -> None:
    assert len(BROKEN) >= 30


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_scenarios_validate(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.name
    assert topology_of(sc).fibres


def test_spec_objects_are_frozen(quickstart: dict[str, Any]) -> None:
    sc = parse_scenario(quickstart)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        sc.name = "other"  # type: ignore[misc]
    assert sc.name == parse_scenario(quickstart).name


def test_defaults_and_node_ids_as_ints(quickstart: dict[str, Any]) -> None:
    data = copy.deepcopy(quickstart)
    data["dcs"][0]["node"] = 1
    data.pop("optical")
    sc = parse_scenario(data)
    assert sc.dcs[0].node == "1"
    assert sc.optical.slots == 80 and sc.optical.k_paths == 3
    assert sc.optical.spectrum_sharing == "shared"


def test_explicit_topology_and_file(tmp_path: Path, quickstart: dict[str, Any]) -> None:
    csv_text = "# tiny\nu,v,length_km\nA,B,100\nB,C,250.5\n"
    (tmp_path / "tiny.csv").write_text(csv_text)
    data = dict(quickstart, topology={"file": "tiny.csv"}, dcs=[])
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(data))
    sc = load_scenario(spec)
    topo = topology_of(sc)
    assert topo.nodes == ("A", "B", "C")
    assert [f.length_km for f in topo.fibres] == [100.0, 250.5]


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntopology: {library: nsfnet\n")
    with pytest.raises(SpecError) as info:
        load_scenario(spec)
    assert "invalid YAML" in info.value.message and "line" in info.value.message


def test_top_level_must_be_mapping() -> None:
    with pytest.raises(SpecError) as info:
        parse_scenario([1, 2, 3])
    assert info.value.path == "(root)"
