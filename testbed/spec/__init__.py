"""Scenario spec: typed frozen objects, YAML loading and validation with field paths."""

from testbed.spec.check import check_scenario, topology_of
from testbed.spec.load import load_scenario, parse_scenario, parse_yaml, scenario_json_schema
from testbed.spec.models import (
    DCSpec,
    EmulationSpec,
    EventSpec,
    JobTemplate,
    LightpathRequestsWorkload,
    ModelSpec,
    ModulationSpec,
    OpticalSpec,
    PolicySpec,
    PPJobsWorkload,
    Scenario,
    TopologySpec,
)

__all__ = [
    "DCSpec", "EmulationSpec", "EventSpec", "JobTemplate", "LightpathRequestsWorkload",
    "ModelSpec", "ModulationSpec", "OpticalSpec", "PPJobsWorkload", "PolicySpec", "Scenario",
    "TopologySpec", "check_scenario", "load_scenario", "parse_scenario", "parse_yaml",
    "scenario_json_schema", "topology_of",
]
