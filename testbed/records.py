"""Run records shared by all backends: the manifest, spec hash and summary writing."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from testbed import __version__
from testbed.atomicio import atomic_write_json
from testbed.spec import Scenario

MANIFEST_SCHEMA = 1


def spec_hash(scenario: Scenario) -> str:
    """sha256 of the canonical JSON of the validated scenario."""
    canon = json.dumps(scenario.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def manifest(scenario: Scenario, backend: str, **extra: Any) -> dict[str, Any]:
    """The manifest every run writes: what ran, with which spec, version and features."""
    seed = getattr(scenario.workload, "seed", None)
    return {
        "schema": MANIFEST_SCHEMA,
        "lightpipe_version": __version__,
        "scenario": scenario.name,
        "spec_sha256": spec_hash(scenario),
        "backend": backend,
        "seed": seed,
        "started_unix_s": round(time.time(), 3),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "argv": sys.argv,
        "spec": scenario.model_dump(mode="json"),
        **extra,
    }


def write_manifest(out_dir: Path, scenario: Scenario, backend: str, **extra: Any) -> Path:
    return atomic_write_json(out_dir / "manifest.json", manifest(scenario, backend, **extra))
