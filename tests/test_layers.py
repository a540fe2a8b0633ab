"""The layer order of ``src/gpualloc`` (docs/architecture.md): a package imports only from its own
layer and the layers below it. Every import counts: module level, inside functions, under
``TYPE_CHECKING``. The registries' lazy ``"module:factory"`` strings are not imports; they are how a
higher layer plugs an entry into a lower one (``dqn`` into the partitioners and the policies).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "gpualloc"

LAYERS: tuple[tuple[str, ...], ...] = (
    # utilities: import nothing above them
    ("__init__", "errors", "limits", "options", "native", "registry", "parallel", "cache"),
    ("hardware",),
    ("graph",),
    ("cost",),
    ("workload",),
    ("telemetry",),
    ("placement",),
    ("scheduling",),
    ("rl",),
    ("execute",),
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
