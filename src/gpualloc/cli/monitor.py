"""``gpualloc monitor``: live device telemetry (NVML, simulated or replayed), JSON, Prometheus, recording."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.text import Text

from gpualloc.cli.common import DefaultToRun, console, err_console, output_file, print_json, progress_bar
from gpualloc.limits import MAX_JOBS, MAX_SEED, MAX_STEPS
from gpualloc.reports.tables import Table
from gpualloc.reports.telemetry import records_table
from gpualloc.telemetry.backends import BACKENDS, open_backend
from gpualloc.telemetry.base import DeviceTelemetry, TelemetryError, TelemetryExhausted


class _DefaultToLive(DefaultToRun):
    """``gpualloc monitor [OPTIONS]`` runs ``monitor run``, bare ``gpualloc monitor`` included."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, args or ["run"])


app = typer.Typer(cls=_DefaultToLive, no_args_is_help=False,
                  help="Device telemetry: `monitor [--backend nvml|sim|replay] [--once --json] [--export :PORT]`, "
                       "`monitor record -o FILE`.")

_BACKEND = typer.Option("nvml", "--backend", "-b", help=f"Telemetry backend: {', '.join(BACKENDS)}.")
_FALLBACK = typer.Option(None, "--fallback",
                         help="Backend to use when --backend cannot start (e.g. `--fallback sim` without a GPU).")
_FILE = typer.Option(None, "--file", "-f", help="replay: the recording (.parquet, .pq or .csv).")
_LOOP = typer.Option(False, "--loop", help="replay: start over at the end of the recording.")
_CLUSTER = typer.Option("adlro16", "--cluster", "-c", help="sim: preset, shorthand or cluster file.")
_TRACE = typer.Option(None, "--trace", "-t", help="sim: trace file (default: synthetic jobs).")
_JOBS = typer.Option(200, "--jobs", max=MAX_JOBS, min=1, help="sim: synthetic jobs.")
_POLICY = typer.Option("fcfs", "--policy", "-p", help="sim: scheduling policy.")
_SEED = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="sim: seed of the trace, the run and the noise.")
_SIM_STEP = typer.Option(600.0, "--sim-step", min=1e-6, help="sim: simulated seconds per sample.")
_PCIE = typer.Option(False, "--pcie", help="nvml: read PCIe throughput (NVML blocks ~20 ms per reading).")
_ENERGY = typer.Option(False, "--energy", help="nvml: read the energy counter (3.1 ms a reading on an H100).")
_INTERVAL = typer.Option(1.0, "--interval", "-i", min=0.0, help="Wall seconds between samples.")


def _options(backend: str, o: dict[str, Any]) -> dict[str, Any]:
    """The CLI's options that ``backend``'s factory takes."""
    if backend == "replay" and o["file"] is None:
        raise TelemetryError("monitor: --backend replay needs --file PATH")
    per_backend = {
        "nvml": {"pcie": o["pcie"], "energy": o["energy"]},
        "sim": {"cluster": o["cluster"], "trace": o["trace"], "jobs": o["jobs"], "policy": o["policy"],
                "seed": o["seed"], "step_s": o["sim_step"]},
        "replay": {"path": o["file"], "loop": o["loop"]},
    }
    return per_backend.get(backend, {})


def _open(backend: str, fallback: str | None, options: dict[str, Any]) -> tuple[str, DeviceTelemetry]:
    """Open ``backend``; if it cannot start and a fallback was asked for, say so in one line and open that."""
    try:
        return backend, open_backend(backend, **_options(backend, options))
    except TelemetryError as err:
        if fallback is None or fallback == backend:
            raise
        err_console.print(Text.assemble(("warning: ", "bold yellow"), f"{err}; using --fallback {fallback}"),
                          soft_wrap=True)
        return fallback, open_backend(fallback, **_options(fallback, options))


def _parse_export(value: str) -> tuple[str, int]:
    """``":9400"`` / ``"9400"`` -> loopback; ``"0.0.0.0:9400"`` -> every interface."""
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise typer.BadParameter(f"expected [HOST]:PORT, got {value!r}", param_hint="--export")
    return host, int(port)


def _samples(source: DeviceTelemetry, count: int | None, interval_s: float, exporter=None):
    """Samples from ``source``, ``interval_s`` apart, until ``count`` or the source runs out; each is served by
    ``exporter`` (when given) as it is taken."""
    i = 0
    while count is None or i < count:
        start = time.perf_counter()
        try:
            records = source.sample()
        except TelemetryExhausted:
            return
        if exporter is not None:
            exporter.update(records)
        yield records
        i += 1
        wait = interval_s - (time.perf_counter() - start)
        if wait > 0 and (count is None or i < count):
            time.sleep(wait)


@app.command("run")
def run_cmd(
    backend: str = _BACKEND, fallback: str = _FALLBACK, file: Path = _FILE, loop: bool = _LOOP,
    cluster: str = _CLUSTER, trace: Path = _TRACE, jobs: int = _JOBS, policy: str = _POLICY, seed: int = _SEED,
    sim_step: float = _SIM_STEP, pcie: bool = _PCIE, energy: bool = _ENERGY, interval: float = _INTERVAL,
    count: int = typer.Option(None, "--count", "-n", max=MAX_STEPS, min=1,
                              help="Stop after this many samples (default: Ctrl-C)."),
    once: bool = typer.Option(False, "--once", help="One sample, then exit (same as --count 1)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="JSON instead of a table: with --once one list of per-device records, "
                                      "otherwise one such list per line."),
    export: str = typer.Option(None, "--export", help="Also serve DCGM-named Prometheus metrics on [HOST]:PORT "
                                                      "(host defaults to 127.0.0.1; 0.0.0.0 for remote scrapers)."),
) -> None:
    """Show the devices live (a table refreshed every --interval), print JSON, or export to Prometheus."""
    options = dict(file=file, loop=loop, cluster=cluster, trace=trace, jobs=jobs, policy=policy, seed=seed,
                   sim_step=sim_step, pcie=pcie, energy=energy)
    name, source = _open(backend, fallback, options)
    exporter = None
    try:
        if export is not None:
            from gpualloc.telemetry.exporter import start_exporter

            addr, port = _parse_export(export)
            try:
                exporter = start_exporter(None, port, addr)
            except OSError as err:
                raise TelemetryError(f"monitor: cannot serve metrics on {addr}:{port}: {err.strerror or err}") from err
            err_console.print(f"exporting DCGM metrics at {exporter.url}")
        n = 1 if once else count
        samples = _samples(source, n, interval, exporter)
        if as_json and once:
            print_json([r.to_dict() for r in next(samples, [])])
        elif as_json:
            for records in samples:
                sys.stdout.write(json.dumps([r.to_dict() for r in records]) + "\n")
                sys.stdout.flush()
        else:
            _live(samples, name)
    except KeyboardInterrupt:
        pass
    finally:
        if exporter is not None:
            exporter.close()
        source.close()


def _live(samples, name: str) -> None:
    title = f"gpualloc monitor ({name})"
    with Live(Table(title=title), console=console, auto_refresh=False) as live:
        for i, records in enumerate(samples):
            t = records[0].time_s if records else None
            clock = "" if t is None else f", t = {t:,.1f} s"
            live.update(records_table(records, f"{title}: sample {i + 1}{clock}"), refresh=True)


def _counted(samples, bar, task):
    """``samples``, advancing ``task`` of ``bar`` by one for each."""
    for records in samples:
        yield records
        bar.advance(task)


@app.command("record")
def record_cmd(
    out: Path = typer.Option(..., "-o", "--out", callback=output_file,
                             help="Recording to write: .parquet, .pq or .csv."),
    samples: int = typer.Option(60, "--samples", "-n", max=MAX_STEPS, min=1, help="Samples to record."),
    backend: str = _BACKEND, fallback: str = _FALLBACK, file: Path = _FILE, loop: bool = _LOOP,
    cluster: str = _CLUSTER, trace: Path = _TRACE, jobs: int = _JOBS, policy: str = _POLICY, seed: int = _SEED,
    sim_step: float = _SIM_STEP, pcie: bool = _PCIE, energy: bool = _ENERGY, interval: float = _INTERVAL,
) -> None:
    """Record samples from a backend to Parquet or CSV, for `monitor --backend replay --file FILE`."""
    from gpualloc.telemetry.replay import write_records

    options = dict(file=file, loop=loop, cluster=cluster, trace=trace, jobs=jobs, policy=policy, seed=seed,
                   sim_step=sim_step, pcie=pcie, energy=energy)
    name, source = _open(backend, fallback, options)
    devices = len(source.devices())
    try:
        with progress_bar() as bar:
            task = bar.add_task(f"recording {name} to {out.name}", total=samples)
            written = write_records(_counted(_samples(source, samples, interval), bar, task), out)
    finally:
        source.close()
    console.print(f"recorded {written} samples x {devices} devices from {name} to {out}")
