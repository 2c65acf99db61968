"""The import graph of the tessera.* tree: no cycle (function-level and TYPE_CHECKING imports count),
and torch only where it belongs.

The layer contracts themselves are import-linter's (pyproject.toml, run by scripts/test.sh); this
test adds what import-linter does not check: that no group of modules imports each other round in a
cycle. grimp (import-linter's graph) reads files, so it is pointed at a tree of symlinks laid out as
the installed packages (pyproject's package-dir), built here in tmp_path.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Module-level `import torch` is allowed in these folders only: the estimator's torch layer and the
# reference trainer (a torch program).
TORCH_FOLDERS = (REPO / "estimator" / "torch", REPO / "clients" / "trainer" / "reference")

_EDGES = """
import json, sys
import grimp
graph = grimp.build_graph("tessera", cache_dir=None)
edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
print(json.dumps(edges))
"""


def package_tree(root: Path) -> Path:
    """Symlinks in `root` that lay the repository out as the installed tessera.* packages."""
    dirs: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(dirs.items()):
        target = root.joinpath(*name.split("."))
        if name == "tessera":  # the root is a folder of its own: its subpackages come from elsewhere
            target.mkdir(parents=True)
            (target / "__init__.py").symlink_to(REPO / folder / "__init__.py")
        elif not target.exists():
            target.symlink_to(REPO / folder, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def import_graph(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    tree = package_tree(tmp_path_factory.mktemp("pkgtree"))
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _EDGES], capture_output=True, text=True, env=env, check=True,
                         timeout=120)
    graph: dict[str, list[str]] = json.loads(out.stdout)
    return graph


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself),
    Tarjan's algorithm, iterative (the graph is deep enough for Python's recursion limit to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, int]] = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succ = graph.get(node, [])
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1 or node in graph.get(node, []):
                    out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def test_the_cycle_finder_finds_cycles() -> None:
    g = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"], "f": ["d"]}
    assert sorted(cycles(g)) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_the_graph_is_the_whole_tree(import_graph: dict[str, list[str]]) -> None:
    # a wrong tree would give a tiny graph in which no cycle can hide
    for m in ("tessera.v1.common_pb2", "tessera.common.gpus", "tessera.controller.core.policy",
              "tessera.controller.engine", "tessera.nodeagent.inventory", "tessera.estimator.memory",
              "tessera.estimator.service.handlers", "tessera.estimator.torch.traced", "tessera.clients.tessctl"):
        assert m in import_graph
    assert "tessera.estimator.memory_terms" in import_graph["tessera.estimator.memory"]
    # a function-level import is an edge
    assert "tessera.estimator.memory_terms" in import_graph["tessera.estimator.cells"]


def test_no_import_cycle(import_graph: dict[str, list[str]]) -> None:
    found = cycles(import_graph)
    assert not found, "import cycles among tessera modules:\n" + "\n".join(
        " <-> ".join(c) for c in found)


def _module_level_torch(path: Path) -> bool:
    """Whether the file imports torch outside any function (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
            return True
        if isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            body += node.body + node.orelse
        elif isinstance(node, ast.Try):
            body += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.With | ast.ClassDef):
            body += node.body
    return False


def test_torch_is_imported_at_module_level_only_by_the_torch_code() -> None:
    pkgs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    files = sorted({f for folder in pkgs.values() for f in (REPO / folder).rglob("*.py")})
    assert REPO / "estimator" / "torch" / "torch_models.py" in files
    offenders = [str(f.relative_to(REPO)) for f in files
                 if _module_level_torch(f) and not any(f.is_relative_to(d) for d in TORCH_FOLDERS)]
    assert not offenders
    assert _module_level_torch(REPO / "estimator" / "torch" / "torch_models.py")


def _contract(contract_id: str) -> dict[str, list[str]]:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    found: list[dict[str, list[str]]] = [c for c in conf["contracts"] if c["id"] == contract_id]
    assert len(found) == 1
    return found[0]


def _children(folder: str, prefix: str, but: set[str]) -> set[str]:
    names = {p.stem for p in (REPO / folder).glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in (REPO / folder).glob("*/__init__.py")}
    return {f"{prefix}.{n}" for n in names - but}


def test_the_contracts_name_every_module_of_the_estimator_library() -> None:
    # a module added to estimator/ must be placed in a layer, not escape the contracts
    library = _children("estimator", "tessera.estimator", {"service", "torch"})
    assert "tessera.estimator.memory_terms" in library and "tessera.estimator.service" not in library
    assert set(_contract("estimator-library")["source_modules"]) == library
    assert library <= set(_contract("torch")["source_modules"])
