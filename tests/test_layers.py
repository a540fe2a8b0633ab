"""The layer order of ``src/gpualloc`` (docs/architecture.md): a package imports only from its own
layer and the layers below it. Every import counts: module level, inside functions, under
``TYPE_CHECKING``. The registries' lazy ``"module:factory"`` strings are not imports; they are how a
higher layer plugs an entry into a lower one (``dqn`` into the partitioners and the policies).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import networkx as nx
import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpualloc"

LAYERS: tuple[tuple[str, ...], ...] = (
    # utilities: import nothing above them
    ("__init__", "errors", "_extras", "limits", "options", "seeding", "native", "registry", "parallel", "cache"),
    ("hardware",),
    ("graph",),
    ("cost",),
    ("workload",),
    ("telemetry",),
    ("placement",),
    ("scheduling",),
    ("rl",),
    ("execute",),
    ("export",),
    ("experiments",),
    ("service",),
    ("reports",),
    ("cli",),
)
"""Bottom to top. docs/architecture.md mirrors this list; change both together."""

RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def unit(module: str) -> str:
    """``gpualloc.placement.run`` -> ``placement``; ``gpualloc.errors`` -> ``errors``; ``gpualloc`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = SRC) -> list[tuple[int, str]]:
    """``(line, module)`` of every gpualloc module ``path`` imports, relative imports resolved."""
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            if base == "gpualloc":  # `from gpualloc import errors`: each name is a module
                out += [(node.lineno, f"gpualloc.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, base))
    return [(line, m) for line, m in out if m == "gpualloc" or m.startswith("gpualloc.")]


def violations(root: Path = SRC) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        me = unit(module_name(path, root))
        for line, target in imported(path, root):
            them = unit(target)
            if RANK.get(them, -1) > RANK[me]:
                found.append(f"{path.relative_to(root.parent)}:{line}: {me} imports {target} ({them} is above it)")
    return found


def test_every_package_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if (p.is_file() and p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert units - set(RANK) == set(), "place new packages in LAYERS (and docs/architecture.md)"


def test_no_package_imports_a_layer_above_it():
    assert violations() == []


def present(name: str) -> bool:
    return (SRC / f"{name}.py").exists() or (SRC / name / "__init__.py").exists()


def test_the_doc_lists_the_same_order():
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    rows = [line.split("`")[1] for line in doc.splitlines() if line.startswith("| `")]
    order = [n.removesuffix(".py").rstrip("/") for n in rows]
    assert [n for n in order if present(n)] == [n for names in LAYERS for n in names if n != "__init__" and present(n)]


@pytest.mark.parametrize(("source", "expected"), [
    ("from gpualloc.rl.dqn import DQNAgent\n", ["hardware imports gpualloc.rl.dqn"]),
    ("def f():\n    from ..scheduling import base\n", ["hardware imports gpualloc.scheduling"]),
    ("import gpualloc.cli.main\n", ["hardware imports gpualloc.cli.main"]),
    ("from gpualloc import service\n", ["hardware imports gpualloc.service"]),
    ("from gpualloc.errors import CatalogError\nfrom . import catalog\n", []),
])
def test_the_checker_catches_upward_imports(tmp_path, source, expected):
    pkg = tmp_path / "gpualloc" / "hardware"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(source)
    found = violations(tmp_path / "gpualloc")
    assert [f.split(": ", 1)[1].split(" (")[0] for f in found] == expected


# Import cycles. Every import counts here too: a function-level ("lazy") import or one under TYPE_CHECKING
# that closes a loop still ties the two modules together (neither can be read, tested or moved without
# the other); it only hides the loop from the interpreter. Lazy imports themselves stay welcome where they
# keep start-up light or an optional extra optional; they just must not point back at an importer.

@functools.cache
def module_imports(root: Path = SRC) -> dict[str, list[tuple[str, int, str]]]:
    """``{module: [(path, line, imported module), ...]}`` inside ``root``; ``from pkg import name`` counts as
    importing ``pkg.name`` when that is a module, else ``pkg`` (whose ``__init__`` then holds ``name``)."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    out: dict[str, list[tuple[str, int, str]]] = {}
    for me, path in paths.items():
        package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
        found = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
                found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base)
                          for a in node.names]
        where = str(path.relative_to(root.parent))
        out[me] = sorted({(where, line, m) for line, m in found if m in paths and m != me})
    return out


def import_cycles(root: Path = SRC) -> dict[frozenset[str], list[str]]:
    """Each set of modules that import one another in a loop (a strongly connected component of the
    import graph), with the imports that close it as ``"path:line: a imports b"``."""
    imports = module_imports(root)
    graph = nx.DiGraph([(m, t) for m, rows in imports.items() for _, _, t in rows])
    return {frozenset(c): [f"{where}:{line}: {m} imports {t}" for m in sorted(c) for where, line, t in imports[m]
                           if t in c]
            for c in sorted(nx.strongly_connected_components(graph), key=sorted) if len(c) > 1}


def test_no_import_cycles_inside_a_package():
    assert import_cycles() == {}, "break these cycles (move what both need into a module both import)"


@pytest.mark.parametrize(("files", "expected"), [
    ({"a.py": "from . import b\n", "b.py": "def f():\n    from gpualloc.pkg.a import x\n"},
     [{"gpualloc.pkg.a", "gpualloc.pkg.b"}]),
    ({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
      "b.py": "from . import a\n"},
     [{"gpualloc.pkg.a", "gpualloc.pkg.b"}]),
    ({"a.py": "from .b import f\n", "b.py": "from .c import g\n", "c.py": "import gpualloc.pkg.a\n"},
     [{"gpualloc.pkg.a", "gpualloc.pkg.b", "gpualloc.pkg.c"}]),
    ({"__init__.py": "from .a import f\n", "a.py": "from gpualloc.pkg import b\n", "b.py": "import os\n"}, []),
    ({"__init__.py": "from .a import f\n", "a.py": "from gpualloc.pkg import g\n"},
     [{"gpualloc.pkg", "gpualloc.pkg.a"}]),
    ({"a.py": "from . import b\n", "b.py": "from . import c\n", "c.py": ""}, []),
])
def test_the_checker_finds_cycles(tmp_path, files, expected):
    pkg = tmp_path / "gpualloc" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "gpualloc" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert [set(c) for c in import_cycles(tmp_path / "gpualloc")] == expected
