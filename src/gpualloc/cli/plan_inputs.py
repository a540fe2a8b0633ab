"""What ``gpualloc run`` and ``gpualloc launch`` both need before a plan runs: the model's graph at the plan's
granularity, and the calibration the run is predicted with (its own module, so that neither command imports
the other's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text

from gpualloc.cli.common import cache_folder, console, disk_cache, err_console, progress_bar


def model_graph(model: str, batch: int, node_ids) -> tuple[str, Any]:
    """The model's name and graph: a captured graph JSON (its meta.model names the model), else ``model``
    traced at ``batch`` at the granularity of ``node_ids`` (an operator plan's; op level for a hybrid one)."""
    from gpualloc.errors import ExecutionError
    from gpualloc.graph.ir import OpGraph

    path = Path(model)
    if path.suffix == ".json" and path.is_file():
        graph = OpGraph.load(path)
        name = graph.meta.get("model")
        if not isinstance(name, str):
            raise ExecutionError(f"{path}: meta.model: the graph does not say which model it was captured from")
        return name, graph
    return model, capture_for_plan(model, batch, set(node_ids))


def prediction_calibration(given: Path | None, no_calibrate: bool, cluster, devices, threads_per_rank: int,
                           seed: int) -> tuple[Any, dict[str, Any]]:
    """The calibration to predict a run on ``devices`` (cluster indices) with, and where it came from: ``{"path",
    "source"}`` with source ``given``, ``cached``, ``fresh`` (a quick CPU calibration measured now, at the
    threads of one CPU rank, as many running at once as the run has CPU ranks) or ``shipped``."""
    from gpualloc.cost.microbench import QUICK_STEPS, cached_cpu_calibration
    from gpualloc.cost.model import Calibration

    if given is not None:
        return Calibration.load(given), {"path": str(given), "source": "given"}
    cpu = [d for d in dict.fromkeys(int(d) for d in devices) if is_cpu_type(cluster.devices[d].type)]
    if not cpu:
        return None, {"path": None, "source": "shipped"}
    if no_calibrate:
        err_console.print(Text.assemble(("warning: ", "bold yellow"), "--no-calibrate: CPU predictions use the "
                                        "shipped, uncalibrated efficiency and may be off by an order of magnitude"),
                          soft_wrap=True)
        return None, {"path": None, "source": "shipped"}
    with progress_bar() as bar:
        task = bar.add_task("calibrating the CPU (once; cached)", total=QUICK_STEPS)
        cal, path, fresh = cached_cpu_calibration(
            cache_folder(), threads=threads_per_rank, concurrent=len(cpu), seed=seed,
            progress=lambda label: bar.update(task, description=f"calibrating the CPU: {label}", advance=1))
    return cal, {"path": str(path), "source": "fresh" if fresh else "cached"}


def capture_for_plan(model: str, batch: int, ids: set[str]):
    """The model's graph at ``batch``, at the granularity the plan's node ids are in."""
    from gpualloc.graph.cached import capture_cached

    cache = disk_cache()
    with console.status(f"tracing {model} at batch {batch}..."):
        graph = capture_cached(model, batch=batch, cache=cache)
        if not ids <= set(graph.index):
            layer = capture_cached(model, batch=batch, granularity="layer", cache=cache)
            if ids <= set(layer.index):
                return layer
    return graph


def is_cpu_type(dtype) -> bool:
    """A device type that runs on the host's CPU (the engine places its rank on ``cpu``)."""
    return dtype.vendor == "cpu" or dtype.name == "cpu"
