"""The controller core's contract, read from the source: its modules import neither os-ken nor
the emulator (only controllers.channels knows testbed.emu), no controller module imports
the simulator, and the ring routing both share lives in testbed.routing.paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import networkx as nx

from tests.test_layers import ROOT, imports_of

# The core and its parts (controllers/core.py's docstring lists them).
CORE = ("controllers.core", "controllers.errors", "controllers.lightpaths",
        "controllers.backups", "controllers.restoration", "controllers.caps",
        "controllers.traffic")
# Pure helpers of the app, beside the core: the OpenFlow wire encoding.
PURE = (*CORE, "controllers.ofwire")
CHANNELS = "controllers.channels"
FORBIDDEN = ("os_ken", "ryu", "testbed.emu", "mininet", "torch")


def _path(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def _all_imports(module: str) -> set[str]:
    """Every module `module` names in an import (any package; inside functions too)."""
    import ast

    out: set[str] = set()
    for node in ast.walk(ast.parse(_path(module).read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def _hits(names: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes)}


def test_core_modules_import_neither_os_ken_nor_the_emulator() -> None:
    for module in PURE:
        assert _path(module).is_file(), module
        assert not _hits(_all_imports(module), FORBIDDEN), module
    # the data-plane channels are the core's one door to testbed.emu (inside functions)
    assert _hits(_all_imports(CHANNELS), ("testbed.emu",))
    assert not _hits(_all_imports(CHANNELS), ("os_ken", "ryu"))


def test_importing_the_core_loads_no_os_ken_and_no_emulator() -> None:
    """What the core modules import at module level, transitively, at run time."""
    code = ("import sys\n"
            f"for m in {(*PURE, CHANNELS)!r}:\n"
            "    __import__(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} "
            "or m.startswith('testbed.emu')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_controller_module_imports_the_simulator() -> None:
    for path in sorted((ROOT / "controllers").glob("*.py")):
        module = f"controllers.{path.stem}"
        assert not _hits(imports_of(ROOT, path), ("testbed.sim",)), module


def test_the_core_imports_no_app_module() -> None:
    """Within controllers, the core's import closure stays clear of the os-ken app."""
    g = nx.DiGraph()
    for path in sorted((ROOT / "controllers").glob("*.py")):
        name = f"controllers.{path.stem}"
        g.add_edges_from((name, t) for t in imports_of(ROOT, path)
                         if t.startswith("controllers."))
    reach = set().union(*(nx.descendants(g, m) for m in CORE if m in g))
    assert not reach & {"controllers.compat", "controllers.lightpath_app",
                        "controllers.launcher", "controllers.api", CHANNELS}


def test_ring_routing_is_one_function_shared_by_sim_and_controller() -> None:
    from testbed.routing import paths
    from testbed.routing.maxmin import max_min_rates
    from testbed.routing.topology import clos
    from testbed.sim import allreduce

    for name in ("route_paths", "ring_keys", "ring_flow_bytes", "flow_id"):
        assert getattr(allreduce, name) is getattr(paths, name)
    keys = paths.ring_keys(["h0", "h1", "h2"], 4)
    assert keys == [(4, "h0", "h1"), (4, "h1", "h2"), (4, "h2", "h0")]
    assert paths.ring_flow_bytes(["h0", "h1", "h2"], 300) == 400.0
    assert paths.flow_id(keys[0]) == "4/h0->h1"
    g = clos(spines=2, leaves=3, hosts_per_leaf=1)  # h0..h2, one per leaf
    got, rates, wall_s = paths.route_paths("greedy", g, keys, {4: 400.0}, seed=1)
    assert set(got) == set(keys) and all(p[0] == k[1] and p[-1] == k[2]
                                         for k, p in got.items())
    by_id = {paths.flow_id(k): k for k in keys}
    assert rates == {by_id[i]: r for i, r in max_min_rates(
        g, {paths.flow_id(k): got[k] for k in keys}).items()}
    assert wall_s >= 0.0
    again, _, _ = paths.route_paths("greedy", g, keys, {4: 400.0}, seed=1, current=got)
    assert again == got
