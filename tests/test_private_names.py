"""Private names stay in their package: no module of testbed/, controllers/ or workloads/
takes a `_name` from another top-level subpackage (testbed.cluster from testbed.emu, say),
by `from X import _name` or by `module._name`. A name one package needs from another is
part of that package's interface and public. Read from the source (AST), as
tests/test_layers.py reads the imports; imports inside functions count too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_layers import ROOT, module_name, source_files

TREE = ("testbed", "controllers", "workloads")


def owner(module: str) -> str:
    """The top-level subpackage a module belongs to: testbed.X for testbed's, else the
    package (controllers, workloads)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "testbed" and len(parts) > 1 else parts[0]


def ours(module: str) -> bool:
    return module.split(".")[0] in TREE


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def foreign_private_names(root: Path, path: Path) -> Iterator[str]:
    """'file:line: module._name' for each private name of another subpackage that the
    file takes."""
    me = module_name(root, path)
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}  # local name -> the module of ours it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if ours(a.name):
                    bound[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and ours(node.module):
            for a in node.names:
                if private(a.name) and owner(node.module) != owner(me):
                    yield f"{path.relative_to(root)}:{node.lineno}: {node.module}.{a.name}"
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and private(node.attr)):
            continue
        chain: list[str] = []
        base: ast.expr = node.value
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in bound:
            target = ".".join([bound[base.id], *reversed(chain)])
            if owner(target) != owner(me):
                yield f"{path.relative_to(root)}:{node.lineno}: {target}.{node.attr}"


def test_no_private_name_is_taken_from_another_subpackage() -> None:
    found = [hit for path in source_files(ROOT) for hit in foreign_private_names(ROOT, path)]
    assert found == [], "make the name public in its owner's interface:\n" + "\n".join(found)


def test_the_scan_sees_both_ways_of_taking_a_private_name(tmp_path: Path) -> None:
    """A file written for the test: the scan names an import and an attribute of another
    subpackage's private name, and passes over its own package's and dunders."""
    pkg = tmp_path / "testbed" / "report"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text("from testbed.metrics.query import _get\n"
                   "from testbed.report.prom import _own\n"
                   "import testbed.emu.netns as ns\n"
                   "from testbed.metrics import query\n"
                   "ns._setns(3)\n"
                   "query.__name__\n"
                   "query._get('u', '/p', {}, 1.0)\n")
    assert list(foreign_private_names(tmp_path, src)) == [
        "testbed/report/x.py:1: testbed.metrics.query._get",
        "testbed/report/x.py:5: testbed.emu.netns._setns",
        "testbed/report/x.py:7: testbed.metrics.query._get"]
