"""Scenarios for the Gymnasium environments: load one, and give it the workload an env needs.

Every scenario is an environment: a scenario whose workload is of another kind gets a
default workload of the right kind on the same topology, DCs, optical layer, policy and
events (the rule is in docs/gym.md, "Any scenario is an environment").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from testbed.errors import InputError
from testbed.spec import (
    JobTemplate,
    LightpathRequestsWorkload,
    PPJobsWorkload,
    Scenario,
    load_scenario,
    parse_scenario,
)

ScenarioLike = str | os.PathLike[str] | Mapping[str, Any] | Scenario

# The pp_jobs workload a scenario without one gets (Placement-v0).
DEFAULT_JOB_MODEL = "gpt3-6.7b"
DEFAULT_JOB_STAGES = 4
DEFAULT_JOBS = 100
DEFAULT_JOB_ITERATIONS = 1000
DEFAULT_JOB_MICROBATCHES = 8
DEFAULT_JOB_INTERARRIVAL_S = 600.0
DEFAULT_MAX_GPUS_PER_STAGE = 8


DEFAULT_SCENARIO = "quickstart.yaml"  # bundled in the package (testbed/gym/data)


def default_scenario() -> Scenario:
    """The bundled quickstart scenario (a copy of scenarios/quickstart.yaml shipped as
    package data, so a wheel install has it too)."""
    with resources.as_file(resources.files("testbed.gym") / "data" / DEFAULT_SCENARIO) as p:
        return load_scenario(p)


def load(scenario: ScenarioLike | None) -> Scenario:
    """A validated Scenario from a file path, a decoded spec (dict) or a Scenario; None:
    the bundled quickstart scenario.

    Files are read by the project's bounded reader (`load_scenario`); relative paths
    inside a dict spec are taken from the current directory.
    """
    if scenario is None:
        return default_scenario()
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        return parse_scenario(dict(scenario), base_dir=Path.cwd(), source="<spec>")
    if isinstance(scenario, str | os.PathLike):
        return load_scenario(scenario)
    raise InputError("scenario", f"expected a file path, a dict or a Scenario, got "
                     f"{type(scenario).__name__}")


def check_count(field: str, value: object, low: int, high: int) -> int:
    """An integer keyword argument within low..high, or InputError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(field, f"must be an integer {low}..{high}, got {value!r}")
    return value


def workload_seed(scenario: Scenario) -> int:
    """The scenario's workload seed (every workload kind has one)."""
    return int(getattr(scenario.workload, "seed", 1))


def with_lightpath_requests(scenario: Scenario) -> Scenario:
    """The scenario itself when its workload is lightpath_requests; else the same scenario
    with the default LightpathRequestsWorkload (all nodes as endpoints) and its seed."""
    if isinstance(scenario.workload, LightpathRequestsWorkload):
        return scenario
    wl = LightpathRequestsWorkload(kind="lightpath_requests", seed=workload_seed(scenario))
    return scenario.model_copy(update={"workload": wl})


def with_pp_jobs(scenario: Scenario) -> Scenario:
    """The scenario itself when its workload is pp_jobs; else the same scenario with a
    default job mix sized to its DCs (docs/gym.md)."""
    if isinstance(scenario.workload, PPJobsWorkload):
        return scenario
    if not scenario.dcs:
        raise InputError("dcs", "Placement-v0 places jobs on DCs: the scenario has none")
    total = sum(dc.gpus for dc in scenario.dcs)
    stages = min(DEFAULT_JOB_STAGES, total)
    # at most 8 GPUs per stage and at most half the GPUs per job, so that two jobs fit
    per_stage = max(1, min(DEFAULT_MAX_GPUS_PER_STAGE, total // (2 * stages)))
    tmpl = JobTemplate(model=DEFAULT_JOB_MODEL, stages=stages, gpus_per_stage=per_stage,
                       microbatches=DEFAULT_JOB_MICROBATCHES,
                       iterations=DEFAULT_JOB_ITERATIONS)
    wl = PPJobsWorkload(kind="pp_jobs", jobs=DEFAULT_JOBS,
                        mean_interarrival_s=DEFAULT_JOB_INTERARRIVAL_S, mix=[tmpl],
                        seed=workload_seed(scenario))
    return scenario.model_copy(update={"workload": wl})
