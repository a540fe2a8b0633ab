"""Helpers shared by the CLI sub-commands: consoles, JSON output."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from typer import Context
from typer.core import TyperGroup

from gpualloc.errors import CatalogError, OutputError


class _Console(Console):
    """The CLI's console. Not on a terminal (a file, a pipe, CI logs), lines are never cropped, so a table
    (:class:`gpualloc.reports.tables.Table`) keeps every column in full whatever the width; text wraps at
    ``COLUMNS`` when it is set, else at 160."""

    def print(self, *objects, crop: bool | None = None, **kwargs) -> None:
        super().print(*objects, crop=self.is_terminal if crop is None else crop, **kwargs)


console = _Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 400)


class _ImpliedContext(Context):
    """The context of an implied sub-command: it has no name of its own, so usage lines and errors
    name the group (``gpualloc place``), never the hidden ``run``."""

    @property
    def command_path(self) -> str:
        return super().command_path.rstrip()


class DefaultToRun(TyperGroup):
    """A command group whose ``run`` sub-command is implied: ``gpualloc place GRAPH ...`` runs
    ``place run GRAPH ...``, while its other sub-commands (``evaluate``, ``compare``) stay reachable.

    ``run`` is hidden; the group's help shows its arguments and options beside the sub-commands, and
    its usage errors speak as the group.
    """

    default = "run"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        run = self.commands[self.default]
        run.hidden = True
        run.context_class = _ImpliedContext

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default, *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        # No name for the implied command: its usage line and errors then read `gpualloc place ...`.
        return (None if name == self.default else name), cmd, rest

    def format_help(self, ctx, formatter):
        own = self.params
        self.params = [*self.commands[self.default].params, *own]
        try:
            super().format_help(ctx, formatter)
        finally:
            self.params = own

    def collect_usage_pieces(self, ctx):
        # `gpualloc place [OPTIONS] GRAPH | COMMAND [ARGS]...`: the implied form first, then the sub-commands.
        run = self.commands[self.default]
        args = [piece for p in run.params if p.param_type_name == "argument" for piece in p.get_usage_pieces(ctx)]
        return ["[OPTIONS]", *([*args, "|"] if args else []), "COMMAND", "[ARGS]..."]


class OrderedGroup(TyperGroup):
    """The root group: sub-commands in the order a user meets them (:data:`COMMAND_ORDER`), the rest after."""

    def list_commands(self, ctx):
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda n: rank.get(n, len(rank)))


COMMAND_ORDER = ("demo", "hw", "graph", "cost", "place", "simulate", "run", "calibrate", "launch", "export", "monitor",
                 "train", "reproduce", "serve", "user", "submit", "jobs", "logs", "cancel", "policy", "whoami")


def device_types(names: str) -> list:
    """Catalog device types from a comma-separated list (``A100,V100,T4``); unknown names raise CatalogError."""
    from gpualloc.hardware.catalog import default_catalog

    cat = default_catalog()
    types = [cat.device(name.strip()) for name in names.split(",") if name.strip()]
    if not types:
        raise CatalogError(f"devices: no device type in {names!r}; expected e.g. 'A100,V100,T4'")
    return types


LOG_EVERY_S = 10.0
"""Seconds between the progress lines printed when stderr is not a terminal."""


def progress_bar(*columns, unit: str = "", transient: bool = True, log_every_s: float = LOG_EVERY_S,
                 console: Any = None, get_time: Any = None):
    """THE progress display of every command that can run past a few seconds, on stderr (stdout stays clean
    for results and ``--json``): :class:`gpualloc.cli.progress.LoggedProgress`.

    On a terminal: a live Rich bar -- ``columns`` (default: the task's description and a bar), then done/total
    ``unit``, elapsed time and the estimated time left. Elsewhere (output redirected to a log, CI): one plain
    line every ``log_every_s`` seconds per task, ``simulate fcfs: 41,000/82,247 jobs (50%), 0:00:12 elapsed,
    about 0:00:11 left``, and a last line when it ends if it printed any (a short run stays silent).

    Use it as Rich's ``Progress``: ``add_task(description, total=...)`` (``total=None`` for work of unknown
    length: elapsed time only), ``update(task, completed=..., advance=..., description=..., note=...)``,
    ``advance(task)``; a task's ``note`` field (e.g. training statistics) follows its line. In the plain-line
    mode a background timer prints the lines, so a long step that reports nothing still shows it is alive.
    """
    from rich.progress import BarColumn, TextColumn

    from gpualloc.cli.progress import LoggedProgress  # here: Rich's progress module costs start-up time

    columns = columns or (TextColumn("{task.description}"), BarColumn())
    return LoggedProgress(*columns, unit=unit, console=console or err_console, transient=transient,
                          log_every_s=log_every_s, get_time=get_time)


def print_json(data: Any) -> None:
    """Plain JSON on stdout (no Rich markup), for scripts: an undefined number (NaN, infinity) is
    ``null``, never the ``NaN`` token that strict JSON parsers refuse."""
    sys.stdout.write(json.dumps(_finite(data), indent=1, allow_nan=False) + "\n")


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def ensure_output(path: Path | None, *, folder: bool = False, option: str = "") -> Path | None:
    """The one rule for every output path (``-o``, ``--out``, ``--plot``, ``--plots``): missing folders
    are created -- the parents of a file, or the folder itself when ``folder`` -- and the folder must take a
    new file, checked before any work is done. The writers then replace the file atomically
    (:func:`gpualloc.errors.atomic_output`), so a failed write keeps what was there.

    Raises:
        OutputError: the folder cannot be created or written in, or a file path names a folder (one line, naming
            ``option`` and the path).
    """
    if path is None:
        return None
    where = f"{option} {path}".strip()
    if not folder and path.is_dir():
        raise OutputError(f"{where}: is a folder, expected a file name")
    parent = path if folder else path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{where}: cannot create the folder: {err.strerror or err}") from err
    # Checked before the work, not after it: a file cannot be written where a scratch file cannot be made.
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".gpualloc-", suffix=".check")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputError(f"{where}: cannot write in {parent}: {err.strerror or err}") from err
    return path


def output_file(ctx, param, path: Path | None) -> Path | None:
    """Typer ``callback`` of an option naming an output file: :func:`ensure_output`."""
    return ensure_output(path, option=_option_name(param))


def output_folder(ctx, param, path: Path | None) -> Path | None:
    """Typer ``callback`` of an option naming an output folder: :func:`ensure_output` with ``folder``."""
    return ensure_output(path, folder=True, option=_option_name(param))


def _option_name(param) -> str:
    opts = getattr(param, "opts", None) or [""]
    return max(opts, key=len)


def load_graph(source: str, batch: int = 32):
    """A graph from a gpualloc-graph JSON file, a PipeDream profile (``.txt``), or a model to capture
    (a zoo name or ``package.module:factory``)."""
    from gpualloc.graph.ir import OpGraph

    path = Path(source)
    if path.suffix == ".txt" and path.is_file():
        from gpualloc.graph.importers import import_pipedream

        return import_pipedream(path)
    if path.suffix == ".json" or path.is_file():
        return OpGraph.load(path)
    from gpualloc.graph.cached import capture_cached

    with console.status(f"tracing {source} at batch {batch} (kept in the cache for the next call)..."):
        return capture_cached(source, batch=batch, cache=disk_cache())


_cache_enabled = True  # `gpualloc --no-cache` turns it off for the call


def set_cache(enabled: bool) -> None:
    """Turn the user's cache on or off for this process (the root option ``--no-cache``)."""
    global _cache_enabled
    _cache_enabled = enabled


def cache_folder() -> Path:
    """The user's cache folder: ``$GPUALLOC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpualloc`` (an absolute
    path, as the XDG spec asks), else ``~/.cache/gpualloc``."""
    if os.environ.get("GPUALLOC_CACHE_DIR"):
        return Path(os.environ["GPUALLOC_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "gpualloc"


def disk_cache():
    """The user's :class:`~gpualloc.cache.DiskCache` (captured zoo graphs, the dqn gate's verdicts), or None
    under ``gpualloc --no-cache`` (or ``GPUALLOC_NO_CACHE=1``)."""
    from gpualloc.cache import DiskCache

    if not _cache_enabled:
        return None
    return DiskCache(cache_folder())
