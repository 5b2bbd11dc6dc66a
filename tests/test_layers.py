"""Layer test: no import cycles, and no import from a higher layer into a lower one.

Every import in testbed/, controllers/ and workloads/ is read from the source (AST, also
imports inside functions; not those under `if TYPE_CHECKING:`). A module belongs to the
first layer whose prefix matches its name; it may import its own layer and the layers
below, never one above. Packages of one layer may import each other but not in a cycle;
modules never import in a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("testbed", "controllers", "workloads")

# Lowest first; a layer is a tuple of module-name prefixes (docs/architecture.md draws it).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("testbed.errors", "testbed.io", "testbed.names", "testbed.progress", "testbed.catalog",
     "testbed.envprobe", "testbed.topologies", "testbed.analysis"),
    ("testbed.spec",),
    ("testbed.optical", "testbed.schedule", "testbed.traces", "testbed.runs", "testbed.routing"),
    ("testbed.jobs",),
    ("testbed.sim", "testbed.traceimport"),
    ("testbed.gym",),
    ("testbed.emu", "testbed.metrics", "testbed.monitor", "controllers", "workloads"),
    ("testbed.orchestrate", "testbed.cluster"),
    ("testbed.backends",),
    ("testbed.experiments", "testbed.report", "testbed.doctor"),
    ("testbed.cli",),
)
PACKAGE_ROOT = "testbed"  # testbed/__init__.py (the version) sits below every layer
# What the package's init runs before anything else loads (NumPy's CPU work-around): with
# it, below every layer, so it may import nothing of the tree.
ROOT_LAYER = (PACKAGE_ROOT, "testbed.cpuquirks")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path) -> Iterator[Path]:
    for top in SOURCES:
        if (root / top).is_dir():
            yield from sorted((root / top).rglob("*.py"))


def imports_of(root: Path, path: Path) -> set[str]:
    """Project modules that `path` imports (absolute names, relative imports resolved)."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(_without_type_checking(ast.parse(path.read_text(), str(path)))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in out if m.split(".")[0] in SOURCES}


def _without_type_checking(tree: ast.Module) -> ast.Module:
    """The module without `if TYPE_CHECKING:` blocks (imports for annotations only)."""
    for node in ast.walk(tree):
        for name in ("body", "orelse"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list):
                setattr(node, name, [s for s in stmts if not (
                    isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test))])
    return tree


def import_graph(root: Path) -> nx.DiGraph:
    """Module -> imported project module (only names that are modules of the tree)."""
    files = {module_name(root, p): p for p in source_files(root)}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for name, path in files.items():
        for target in imports_of(root, path):
            if target in files and target != name:
                g.add_edge(name, target)
    return g


def layer_of(module: str) -> int | None:
    if module in ROOT_LAYER:
        return -1
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def package_of(module: str) -> str:
    for prefixes in LAYERS:
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                return p
    return module


def violations(root: Path) -> list[str]:
    """Every broken rule, one line each (empty when the tree keeps its layers)."""
    g = import_graph(root)
    out = [f"{m}: in no layer (add it to LAYERS in tests/test_layers.py)"
           for m in g if layer_of(m) is None]
    for a, b in g.edges:
        la, lb = layer_of(a), layer_of(b)
        if la is not None and lb is not None and lb > la:
            out.append(f"{a} imports {b}: a higher layer ({package_of(b)} above "
                       f"{package_of(a)})")
    for cycle in nx.simple_cycles(g, length_bound=8):
        out.append("module cycle: " + " -> ".join([*cycle, cycle[0]]))
    pk = nx.DiGraph((package_of(a), package_of(b)) for a, b in g.edges
                    if package_of(a) != package_of(b) and a != PACKAGE_ROOT)
    for cycle in nx.simple_cycles(pk, length_bound=8):
        out.append("package cycle: " + " -> ".join([*cycle, cycle[0]]))
    return out


def test_the_tree_keeps_its_layers() -> None:
    assert violations(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"testbed/__init__.py": "", "testbed/spec/__init__.py": "",
                      "testbed/cli/__init__.py": "", "testbed/cli/main.py": "",
                      **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize(("files", "expected"), [
    ({"testbed/spec/models.py": "def f():\n    from testbed.cli import main\n"},
     "testbed.spec.models imports testbed.cli.main: a higher layer"),
    ({"testbed/spec/a.py": "from testbed.spec import b\n",
      "testbed/spec/b.py": "from . import a\n"}, "module cycle"),
    ({"workloads/__init__.py": "", "controllers/__init__.py": "",
      "workloads/w.py": "import controllers.c\n",
      "controllers/c.py": "from workloads import w2\n", "workloads/w2.py": ""},
     "package cycle"),
    ({"testbed/newpkg/__init__.py": ""}, "testbed.newpkg: in no layer"),
    ({"testbed/spec/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
      "    from testbed.spec import b\nfrom testbed.cli import main\n",
      "testbed/spec/b.py": "from testbed.spec import a\n"},
     "testbed.spec.a imports testbed.cli.main"),
])
def test_the_checker_catches_a_planted_violation(tmp_path: Path, files: dict[str, str],
                                                  expected: str) -> None:
    root = _tree(tmp_path, files)
    assert any(expected in v for v in violations(root)), violations(root)
    assert violations(_tree(tmp_path / "clean", {})) == []


def test_the_architecture_doc_draws_the_enforced_layers() -> None:
    """docs/architecture.md's layer map is the one scripts/layers_doc.py draws from LAYERS."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("layers_doc", ROOT / "scripts" / "layers_doc.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = mod.doc_block((ROOT / "docs" / "architecture.md").read_text())
    assert doc == mod.drawing(LAYERS), "run: python scripts/layers_doc.py --write"
    for layer in LAYERS:  # every enforced prefix is on the map
        for name in layer:
            src = mod.source_of(name)
            where = (f"{src.parent.relative_to(ROOT)}/" if src.name == "__init__.py"
                     else str(src.relative_to(ROOT)))
            assert f"  {where} " in doc, name
