"""``gpualloc calibrate``: measure a device of this machine and write a calibration file for the cost model."""

from __future__ import annotations

from pathlib import Path

import typer

from gpualloc.cli.common import console, output_file, print_json, progress_bar
from gpualloc.reports.costs import device_calibration_view
from gpualloc.limits import MAX_DEVICES, MAX_SEED, MAX_STEPS

DEFAULT_MODELS = "resnet-tiny:4,bert-tiny:4"
"""What a CPU calibration times by default: small models a CPU runs in seconds."""
DEFAULT_GPU_MODELS = "resnet50:32,bert-base:8"
"""What a GPU calibration times by default: on a GPU the tiny models' ops are all launch overhead, so a fit on
them cannot tell compute from memory (on an H200: compute 0.04 and memory 1.68 of the peaks, docs/execution.md)."""


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
    models: str = typer.Option(None, "--models",
                               help="Models to time op by op, MODEL:BATCH comma-separated (zoo names or "
                                    f"package.module:factory; default: {DEFAULT_MODELS} on a CPU, "
                                    f"{DEFAULT_GPU_MODELS} on a GPU)."),
    precisions: str = typer.Option("fp32", "--precisions",
                                   help="Precisions to time the models in and fit, comma-separated: fp32 (always), "
                                        "tf32 (GPU), bf16 (the engine's recipe); a plan in one is predicted from "
                                        "its own profiles and efficiency."),
    optimizers: str = typer.Option("adam,sgd", "--optimizers",
                                   help="The engine's optimizers whose step is timed on synthetic parameter sets "
                                        "and fitted (cost per tensor and per byte), comma-separated; '' for none."),
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

    pairs = _models(models if models is not None else
                    DEFAULT_MODELS if device.strip().lower() == "cpu" else DEFAULT_GPU_MODELS)
    precs = [p.strip().lower() for p in precisions.split(",") if p.strip()]
    opts = [o.strip().lower() for o in optimizers.split(",") if o.strip()]
    base_cal = Calibration.load(base) if base is not None else None
    with progress_bar() as bar:  # on stderr: stdout stays pure JSON under --json
        steps = len({"fp32", *precs} - {"tf32"}) * len(opts)
        task = bar.add_task("calibrating", total=3 + len(pairs) * len({"fp32", *precs}) + steps)

        def progress(label: str) -> None:
            bar.update(task, description=label, advance=1)

        cal, rec = calibrate_device(device, threads=threads, models=pairs, repeats=repeats, base=base_cal,
                                    device_type=device_type, seed=seed, concurrent=concurrent,
                                    precisions=precs, optimizers=opts, progress=progress)
    cal.save(output)
    if as_json:
        print_json({"output": str(output), **rec})
        return
    name = next(k for k, v in cal.fit["measured"].items() if v is rec)
    console.print(device_calibration_view(name, rec, output))
