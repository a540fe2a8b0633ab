"""Helpers shared by the CLI sub-commands: consoles, number formatting, JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from typer.core import TyperGroup

# Piped output (logs, CI) is not cut to 80 columns: tables keep their full width.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 400)


class DefaultToRun(TyperGroup):
    """A command group whose ``run`` sub-command is implied: ``gpualloc place GRAPH ...`` runs
    ``place run GRAPH ...``, while its other sub-commands (``evaluate``, ``compare``) stay reachable."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


def print_json(data: Any) -> None:
    """Plain JSON on stdout (no Rich markup), for scripts."""
    sys.stdout.write(json.dumps(data, indent=1) + "\n")


def si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """Human-readable SI number: 8.21e9 -> '8.21 G'."""
    if value is None:
        return "-"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".rstrip()


def gib(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def num(value: float | None, scale: float = 1.0) -> str:
    """``value / scale`` in %g form, or '-' when unknown."""
    return "-" if value is None else f"{value / scale:g}"


def load_graph(source: str, batch: int = 32):
    """A graph from a gpualloc-graph JSON file, a PipeDream profile (``.txt``), or a model to capture
    (a zoo name or ``package.module:factory``)."""
    from pathlib import Path

    from gpualloc.graph.ir import OpGraph

    path = Path(source)
    if path.suffix == ".txt" and path.is_file():
        from gpualloc.graph.importers import import_pipedream

        return import_pipedream(path)
    if path.suffix == ".json" or path.is_file():
        return OpGraph.load(path)
    from gpualloc.graph.capture import capture

    with console.status(f"tracing {source} at batch {batch}..."):
        return capture(source, batch=batch)
