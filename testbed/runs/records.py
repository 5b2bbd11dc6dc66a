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
from testbed.io.atomic import atomic_write_json
from testbed.io.bounded import check_regular
from testbed.spec import Scenario

MANIFEST_SCHEMA = 1


def spec_hash(scenario: Scenario) -> str:
    """sha256 of the canonical JSON of the validated scenario, where each referenced file
    (topology.file, workload.trace) stands for the sha256 of its contents, not its path:
    the same inputs elsewhere hash the same, an edited trace hashes differently."""
    spec = scenario.model_dump(mode="json")
    for section, key in (("topology", "file"), ("workload", "trace")):
        ref = (spec.get(section) or {}).get(key)
        if ref:
            spec[section][key] = {"sha256": file_sha256(ref)}
    canon = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a referenced input file (a regular file; read in blocks)."""
    check_regular(path, "spec")
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
