"""``gpualloc run``: apply a placement plan to a real model on real devices, and compare with the simulator."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpualloc.cli.common import cache_folder, console, print_json  # noqa: F401 - cache_folder: re-exported
from gpualloc.cli.plan_inputs import model_graph as _model_graph
from gpualloc.limits import MAX_BATCH, MAX_MICROBATCHES, MAX_SEED, MAX_STEPS

MODEL_HELP = ("A zoo model name, package.module:factory, or a gpualloc-graph JSON captured from one "
              "(its meta.model names the model).")


def run_cmd(
    model: str = typer.Argument(..., help=MODEL_HELP),
    plan: Path = typer.Option(..., "--plan", help="A plan JSON written by `gpualloc place -o` (op-level or hybrid), "
                                                  "run under torchrun by the engine as `gpualloc launch` runs it on "
                                                  "one host, trained with the optimizer it was costed with (SGD for "
                                                  "files that name none)."),
    steps: int = typer.Option(5, "--steps", max=MAX_STEPS, min=1,
                              help="Timed training steps (the median is reported)."),
    warmup: int = typer.Option(1, "--warmup", max=MAX_STEPS, min=0, help="Untimed training steps run first."),
    calibration: Path = typer.Option(None, "--calibration",
                                     help="A calibration file from `gpualloc calibrate` (default: the one the "
                                          "plan was scored with, else a quick CPU calibration, measured once and "
                                          "cached, where the plan uses a CPU; "
                                          "else the shipped one)."),
    no_calibrate: bool = typer.Option(False, "--no-calibrate",
                                      help="Predict CPU devices with the shipped, uncalibrated efficiency instead "
                                           "of calibrating them on the fly."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="Cluster (default: the plan's)."),
    devices: str = typer.Option(None, "--devices",
                                help="Torch device per cluster device, comma-separated: the engine places ranks "
                                     "on cpu for CPU types and cuda:0, cuda:1, ... for the others, and refuses "
                                     "another list (choose GPUs with CUDA_VISIBLE_DEVICES)."),
    threads: int = typer.Option(None, "--threads", min=1,
                                help="CPU threads split between the CPU ranks (default: all available)."),
    batch: int = typer.Option(None, "--batch", max=MAX_BATCH, min=1,
                              help="Batch size (default: the plan's, else 32; a graph JSON brings its own)."),
    microbatches: int = typer.Option(None, "--microbatches", max=MAX_MICROBATCHES, min=1,
                                     help="Microbatches (default: the plan's)."),
    schedule: str = typer.Option(None, "--schedule",
                                 help="Pipeline schedule of an op-level plan: 1f1b or gpipe (default: the plan's, "
                                      "else 1f1b)."),
    roofline: bool = typer.Option(False, "--roofline",
                                  help="Predict with the calibrated roofline even where the calibration has "
                                       "per-op profiles of this model."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the weights and inputs."),
    precision: str = typer.Option(None, "--precision",
                                  help="Training precision (default: the plan's): the engine trains in fp32, "
                                       "tf32 or bf16; another is refused in one line."),
    check: bool = typer.Option(True, "--check/--no-check",
                               help="Check loss, gradients and one step's weights against the unsplit model."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Run a placement plan on real devices and compare the measured step time with the prediction.

    Split MODEL by the plan, check it against the unsplit model, train N steps, and report the measured step
    time and peak memory beside the simulator's prediction. The plan runs on the torch-native engine under
    torchrun on this host (`gpualloc launch`'s path)."""
    from gpualloc.errors import ExecutionError
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import read_plan
    from gpualloc.placement.problem import PlacementProblem

    if precision is not None:
        _known_precision(precision)
    saved = read_plan(plan)
    if precision is not None and saved.precision != precision:
        raise ExecutionError(f"{plan}: precision: the plan trains in {saved.precision}, not {precision} "
                             f"(re-plan with --precision {precision})")
    if not (cluster or saved.cluster):
        raise ExecutionError(f"{plan}: the plan names no cluster: pass --cluster")
    clus = load_cluster(cluster or saved.cluster)
    model_name, graph = _model_graph(model, batch or saved.global_batch or 32, saved.node_ids)
    the_plan = saved.plan_for(PlacementProblem(graph, clus), microbatches=microbatches, schedule=schedule,
                              global_batch=batch)
    _run_on_engine(plan, saved, clus, model_name, graph, the_plan, cluster=cluster, steps=steps, warmup=warmup,
                   seed=seed, threads=threads, calibration=calibration, no_calibrate=no_calibrate, roofline=roofline,
                   as_json=as_json, devices=devices, check=check)


def _run_on_engine(plan: Path, saved, clus, model_name: str, graph, the_plan, *, cluster: str | None, steps: int,
                   warmup: int, seed: int, threads: int | None, calibration: Path | None, no_calibrate: bool,
                   roofline: bool, as_json: bool, devices: str | None = None, check: bool = True) -> None:
    """A plan through the torch-native engine, as ``gpualloc launch`` runs it on one host (its functions: one code
    path): refused in one line before anything starts where the engine or this host cannot run it, else torchrun
    on this host's devices, then measured against predicted step time, compute and peak memory per rank, and the
    checks against the unsplit model (output, loss, gradients, one step's weights). An operator plan whose
    microbatches, schedule or batch were overridden runs as written here (the ranks read the plan file)."""
    import tempfile

    from gpualloc.placement.document import write_plan
    from gpualloc.placement.problem import PlacementProblem

    from gpualloc.cli.launch import _cuda_host, _threads, finish_run, host_share, run_torchrun, torchrun_command
    from gpualloc.errors import EngineError
    from gpualloc.execute.engine.rank import EngineArgs, _load

    shown = plan
    nodes = {clus.devices[d].node for d in the_plan.devices}
    if len(nodes) > 1:
        raise EngineError(f"{plan}: the plan runs on {len(nodes)} nodes of {clus.name}: `gpualloc run` runs one "
                          "host; start it on each node with `gpualloc launch PLAN --nnodes ... --node-rank ...`")
    share = host_share(str(plan), saved, clus, nnodes=1, node_rank=0, **_cuda_host())
    if devices is not None:
        _same_devices(devices, share, len(clus))
    optimizer = saved.optimizer or "sgd"
    with tempfile.TemporaryDirectory(prefix="gpualloc-run-") as tmp:
        out = Path(tmp)
        graph_file = out / "graph.json"  # traced once here, not again on every rank
        graph.save(graph_file)
        if the_plan.kind != "hybrid":  # with --microbatches/--schedule/--batch as given, on this graph
            plan = out / "plan.json"
            write_plan(plan, PlacementProblem(graph, clus), the_plan, saved.cluster or clus.name,
                       {"optimizer": optimizer} if saved.optimizer else None)
        # the ranks' own checks (stage layout, TP divisibility), here, before anything is spawned
        _, _, top, _ = _load(EngineArgs(plan=str(plan), model=model_name, cluster=cluster, graph=str(graph_file),
                                         seed=seed))
        top.stage_assignment(graph)  # the plan's layers are the model's (a one-stage plan's ranks do not cut it)
        cmd = torchrun_command(plan, model_name, share, steps=steps, warmup=warmup, seed=seed, optimizer=optimizer,
                               lr=None, out=out / "ranks", check=check, node_rank=0, master_addr=None,
                               master_port=None, cluster=cluster) + ["--graph", str(graph_file)]
        per_rank = _threads(share, threads)
        (out / "ranks").mkdir()
        status = run_torchrun(cmd, {**os.environ, "OMP_NUM_THREADS": str(per_rank)}, quiet_stdout=as_json)
        if status != 0:
            raise EngineError(f"{plan}: the engine's torchrun exited with status {status}: the ranks' output above "
                              "says why")
        report = finish_run(out / "ranks", saved, clus, graph, the_plan, optimizer, calibration, no_calibrate,
                            per_rank, seed, None, use_profiles=not roofline)
    report = {**report, "folder": None, "plan": str(shown), "plan_version": saved.version, "runner": "engine"}
    if as_json:
        print_json(report)
        return
    from gpualloc.reports.engine import engine_run_view

    console.print(engine_run_view(report))


def _same_devices(devices: str, share, n_devices: int) -> None:
    """``--devices`` of a hybrid plan: the engine places its ranks itself (CPU types on ``cpu``, GPU types on
    ``cuda:0``, ``cuda:1``, ... in plan order, one each); a list that says the same is accepted, another is one
    line."""
    from gpualloc.errors import ExecutionError

    given = [d.strip() for d in devices.split(",")]
    want = {d: t for d, t in zip(share.devices, share.torch_devices, strict=True)}
    if len(given) != n_devices or any(given[d] != t for d, t in want.items()):
        placed = ", ".join(f"device {d} on {t}" for d, t in want.items())
        raise ExecutionError(f"--devices {devices}: the engine places its ranks "
                             f"itself ({placed}; one CUDA device per GPU rank): choose the GPUs with "
                             "CUDA_VISIBLE_DEVICES")


def _known_precision(precision: str) -> None:
    """One line naming the choices when ``precision`` is no precision gpualloc knows."""
    from gpualloc.cost.memory import precision as known

    known(precision)
