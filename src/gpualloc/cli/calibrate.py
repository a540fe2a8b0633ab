"""``gpualloc calibrate``: measure a device of this machine and write a calibration file for the cost model."""

from __future__ import annotations

from pathlib import Path

import typer

from gpualloc.cli.common import console, output_file, print_json, progress_bar
from gpualloc.reports.costs import device_calibration_view
from gpualloc.limits import MAX_DEVICES, MAX_SEED, MAX_STEPS

DEFAULT_MODELS = "resnet-tiny:4,bert-tiny:4"


def _models(text: str) -> list[tuple[str, int]]:
    from gpualloc.errors import CostModelError

    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, batch = item.rpartition(":") if item.rsplit(":", 1)[-1].isdigit() else (item, "", "")
        try:
            out.append((name, int(batch) if batch else 2))
        except ValueError as err:
            raise CostModelError(f"--models: {item!r}: expected MODEL or MODEL:BATCH") from err
    return out


def calibrate_cmd(
    device: str = typer.Option("cpu", "--device", "-d", help="Torch device to measure: cpu or cuda:i."),
    threads: int = typer.Option(None, "--threads", min=1,
                                help="CPU threads to measure with (default: torch's; use what each CPU "
                                     "worker of `gpualloc run` will get)."),
    models: str = typer.Option(DEFAULT_MODELS, "--models",
                               help="Models to time op by op, MODEL:BATCH comma-separated (zoo names or "
                                    "package.module:factory)."),
    concurrent: int = typer.Option(1, "--concurrent", max=MAX_DEVICES, min=1,
                                   help="CPU workers that will share the CPU (e.g. 2 for a 2xcpu plan): the "
                                        "others' load runs beside the per-op timings."),
    repeats: int = typer.Option(3, "--repeats", max=MAX_STEPS, min=1,
                                help="Timed passes per measurement (median kept)."),
    device_type: str = typer.Option(None, "--as", help="Catalog device type measured (default: guessed)."),
    base: Path = typer.Option(None, "--base", help="Calibration to update (default: the shipped one)."),
    output: Path = typer.Option(Path("calibration.json"), "-o", "--output", callback=output_file,
                                help="Calibration file to write."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the timed models' weights and inputs."),
    as_json: bool = typer.Option(False, "--json", help="Print the device's calibration record as JSON."),
) -> None:
    """Measure a device of this machine and write a calibration file for `run --calibration` and the cost model.

    Times matmuls, copies and the ops of captured models on DEVICE and fits the cost model's
    efficiencies for its device type (`gpualloc cost fit` fits published data instead)."""
    from gpualloc.cost.microbench import calibrate_device
    from gpualloc.cost.model import Calibration

    pairs = _models(models)
    base_cal = Calibration.load(base) if base is not None else None
    with progress_bar() as bar:  # on stderr: stdout stays pure JSON under --json
        task = bar.add_task("calibrating", total=3 + len(pairs))

        def progress(label: str) -> None:
            bar.update(task, description=label, advance=1)

        cal, rec = calibrate_device(device, threads=threads, models=pairs, repeats=repeats, base=base_cal,
                                    device_type=device_type, seed=seed, concurrent=concurrent,
                                    progress=progress)
    cal.save(output)
    if as_json:
        print_json({"output": str(output), **rec})
        return
    name = next(k for k, v in cal.fit["measured"].items() if v is rec)
    console.print(device_calibration_view(name, rec, output))
