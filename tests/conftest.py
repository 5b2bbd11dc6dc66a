"""Shared pytest fixtures: bundled scenarios as dicts and an in-process CLI runner."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run `lightpipe ARGS...` in-process and capture its exit code and output."""

    def run(*argv: str) -> CliResult:
        code = main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def load_yaml(name: str) -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load((SCENARIOS / name).read_text()))


@pytest.fixture
def quickstart() -> dict[str, Any]:
    return load_yaml("quickstart.yaml")


@pytest.fixture
def ppjobs() -> dict[str, Any]:
    return load_yaml("pp-jobs.yaml")
