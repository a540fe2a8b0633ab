"""``gpualloc launch``: run a plan under torchrun with the torch-native engine, and compare with the prediction.

The command checks that the plan is for this host (its devices' types and count), then starts
``python -m torch.distributed.run`` with ``-m gpualloc.execute.engine`` for this host's ranks. Afterwards (on
the node that holds rank 0) it reads the ranks' records, prints measured against predicted step time, compute
and peak memory per rank, and the engine's checks against the unsplit model; ``--calibration-out`` writes the
run as a calibration file for ``gpualloc place --calibration``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from gpualloc.cli.common import console, output_file, print_json
from gpualloc.cli.plan_inputs import is_cpu_type
from gpualloc.limits import MAX_SEED, MAX_STEPS

ENGINE_MODULE = "gpualloc.execute.engine"


@dataclass(frozen=True)
class HostShare:
    """This host's part of a plan: its ranks (global rank -> plan device index) and the torch devices they use."""

    ranks: tuple[int, ...]
    devices: tuple[int, ...]
    torch_devices: tuple[str, ...]
    world_size: int
    nodes: int


def plan_devices(saved) -> tuple[int, ...]:
    """The cluster device indices a plan file uses, sorted (the engine's rank order), read from the file."""
    doc = saved.doc
    if saved.version == 1:
        used = {int(v) for v in doc["assignment"].values()}
    else:
        used = {int(d) for s in doc["stages"] for r in s["replicas"] for d in r["devices"]}
    return tuple(sorted(used))


def host_share(where: str, saved, cluster, *, nnodes: int, node_rank: int, cuda_count: int,
               cuda_names: tuple[str, ...] = ()) -> HostShare:
    """The ranks this host runs, or one ``EngineError`` line when the plan asks for what the host cannot give.

    Ranks follow the sorted plan device indices (cluster devices are listed node by node); with ``nnodes`` > 1
    node ``node_rank`` runs the devices of the plan's ``node_rank``-th used cluster node. A CPU device type
    runs on ``cpu``; a GPU type needs one CUDA device of its own, of that type (``cuda_names``: what torch
    reports for each, checked against the catalog when given)."""
    from gpualloc.errors import EngineError

    used = plan_devices(saved)
    from gpualloc.cost.memory import precision as training_precision
    from gpualloc.errors import CostModelError

    try:  # the one rule the planner applies: a device type without a peak in this precision cannot train in it
        for d in used:
            training_precision(getattr(saved, "precision", "fp32")).check(cluster.devices[d].type)
    except CostModelError as e:
        raise EngineError(f"{where}: {e}") from None
    if saved.devices is not None and tuple(saved.devices) != tuple(d.label for d in cluster.devices):
        raise EngineError(f"{where}: devices: the plan was made for {len(saved.devices)} devices "
                          f"({', '.join(saved.devices[:4])}{', ...' if len(saved.devices) > 4 else ''}), cluster "
                          f"{cluster.name} has {len(cluster)} ({', '.join(d.label for d in cluster.devices[:4])}"
                          f"{', ...' if len(cluster) > 4 else ''}): launch it with the cluster it was made for")
    if any(not 0 <= d < len(cluster) for d in used):
        raise EngineError(f"{where}: the plan uses device {max(used)}, cluster {cluster.name} has {len(cluster)}")
    nodes = sorted({cluster.devices[d].node for d in used})
    if nnodes != len(nodes):
        raise EngineError(f"{where}: the plan runs on {len(nodes)} node(s) of {cluster.name} "
                          f"({', '.join(cluster.nodes[n].name for n in nodes)}), not {nnodes}: pass --nnodes "
                          f"{len(nodes)} and each node's --node-rank")
    if not 0 <= node_rank < nnodes:
        raise EngineError(f"--node-rank {node_rank}: expected 0..{nnodes - 1}")
    mine = tuple(d for d in used if cluster.devices[d].node == nodes[node_rank])
    gpus = [d for d in mine if not is_cpu_type(cluster.devices[d].type)]
    if gpus and len(gpus) < len(used):
        cpus = [d for d in used if is_cpu_type(cluster.devices[d].type)]
        raise EngineError(f"{where}: the plan mixes GPUs ({cluster.devices[gpus[0]].label}, ...) and CPUs "
                          f"({cluster.devices[cpus[0]].label}, ...): the engine runs every rank of a job on one "
                          "backend (NCCL on GPUs, gloo on CPUs); plan on the GPUs or on the CPUs")
    if gpus and cuda_count == 0:
        kinds = sorted({cluster.devices[d].type.name for d in gpus})
        raise EngineError(f"{where}: the plan puts ranks on {len(gpus)} {'/'.join(kinds)} GPU(s) "
                          f"({cluster.devices[gpus[0]].label}, ...), this host has no CUDA device: make a plan for "
                          "this host (e.g. `gpualloc place MODEL --cluster 2xcpu -o plan.json`)")
    if len(gpus) > cuda_count:
        node = cluster.nodes[nodes[node_rank]].name
        raise EngineError(f"{where}: the plan puts {len(gpus)} ranks on GPUs of node {node}, this host has "
                          f"{cuda_count} CUDA device(s)")
    torch_devices, g = [], 0
    for d in mine:
        dtype = cluster.devices[d].type
        if is_cpu_type(dtype):
            torch_devices.append("cpu")
            continue
        if cuda_names and g < len(cuda_names):
            from gpualloc.cost.microbench import catalog_type_named

            seen = catalog_type_named(cuda_names[g], 0.0, cluster.catalog)
            if seen is not None and seen.name != dtype.name:
                raise EngineError(f"{where}: device {cluster.devices[d].label} is a {dtype.name}, this host's "
                                  f"cuda:{g} is a {cuda_names[g]} ({seen.name})")
        torch_devices.append(f"cuda:{g}")
        g += 1
    return HostShare(tuple(used.index(d) for d in mine), mine, tuple(torch_devices), len(used), len(nodes))


def torchrun_command(plan: Path, model: str, share: HostShare, *, steps: int, warmup: int, seed: int,
                     optimizer: str, lr: float | None, out: Path, check: bool, node_rank: int,
                     master_addr: str | None, master_port: int | None, cluster: str | None = None) -> list[str]:
    """The torchrun command line that runs this host's ranks of ``plan`` (an argument list)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(len(share.ranks))]
    if share.nodes == 1 and master_addr is None:
        cmd += ["--standalone"]  # a free port of its own: no collision with another run on this host
    else:
        cmd += ["--nnodes", str(share.nodes), "--node-rank", str(node_rank),
                "--master-addr", master_addr or "127.0.0.1", "--master-port", str(master_port or 29500)]
    cmd += ["-m", ENGINE_MODULE, "--plan", str(plan.resolve()), "--model", model, "--steps", str(steps),
            "--warmup", str(warmup), "--seed", str(seed), "--optimizer", optimizer, "--out", str(out.resolve()),
            "--check" if check else "--no-check"]
    if lr is not None:
        cmd += ["--lr", repr(lr)]
    if cluster is not None:
        cmd += ["--cluster", cluster]
    return cmd


def run_torchrun(cmd: list[str], env: dict[str, str], *, quiet_stdout: bool = False) -> int:
    """Run ``cmd`` in a process group of its own; on an interrupt the whole group is ended (no orphans).
    ``quiet_stdout``: the ranks' stdout goes to stderr (``--json`` keeps stdout pure JSON)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=2 if quiet_stdout else None)

    def terminated(signum, frame):  # `timeout`, Slurm or kill: end the ranks too
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()  # signal handlers live in the main thread
    before = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        return proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)


def launch_cmd(
    plan: Path = typer.Argument(..., help="A plan JSON written by `gpualloc place -o` (either kind)."),
    model: str = typer.Option(None, "--model", "-m",
                              help="Zoo model name or package.module:factory (default: the plan's graph)."),
    steps: int = typer.Option(5, "--steps", max=MAX_STEPS, min=1, help="Timed training steps (median reported)."),
    warmup: int = typer.Option(1, "--warmup", max=MAX_STEPS, min=0, help="Untimed steps run first."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the weights and inputs."),
    optimizer: str = typer.Option(None, "--optimizer",
                                  help="sgd or adam (default: the one the plan was costed with, else sgd)."),
    lr: float = typer.Option(None, "--lr", min=0.0, max=1e3, help="Learning rate (default: the engine's)."),
    out: Path = typer.Option(Path("engine-run"), "--out", help="Folder the ranks write their records to."),
    cluster: str = typer.Option(None, "--cluster", "-c", help="Cluster (default: the plan's)."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, max=4096, help="Nodes the plan runs on (torchrun's)."),
    node_rank: int = typer.Option(0, "--node-rank", min=0, max=4095, help="This node's rank (torchrun's)."),
    master_addr: str = typer.Option(None, "--master-addr", help="Address of node 0 (torchrun's; multi-node)."),
    master_port: int = typer.Option(None, "--master-port", min=1, max=65535, help="Port on node 0 (torchrun's)."),
    threads: int = typer.Option(None, "--threads", min=1,
                                help="CPU threads split between this host's CPU ranks (default: all available)."),
    check: bool = typer.Option(True, "--check/--no-check",
                               help="Check loss, gradients and one step's weights against the unsplit model."),
    print_command: bool = typer.Option(False, "--print-command",
                                       help="Print the torchrun command for this node and exit (run it on each node)."),
    calibration: Path = typer.Option(None, "--calibration",
                                     help="Calibration to predict with (default: the one the plan was scored "
                                          "with, else a quick cached CPU calibration where the plan uses a CPU, "
                                          "else the shipped one)."),
    no_calibrate: bool = typer.Option(False, "--no-calibrate",
                                      help="Predict CPU devices with the shipped efficiency instead of calibrating."),
    calibration_out: Path = typer.Option(None, "--calibration-out", callback=output_file,
                                         help="Write the run as a calibration file (for `place --calibration`)."),
    collect: bool = typer.Option(False, "--collect",
                                 help="Run nothing: report the run whose records are in --out (e.g. after "
                                      "--print-command's command ran on every node)."),
    as_json: bool = typer.Option(False, "--json", help="Print the run against its prediction as JSON."),
) -> None:
    """Run PLAN under torchrun with the torch-native engine (gloo on CPU, NCCL on GPUs).

    Refuses a plan made for another cluster or host, or one the engine cannot run, in one line before starting anything. After the run, shows measured against predicted step time, compute and peak memory per rank, and the checks against the unsplit model."""  # noqa: E501
    from gpualloc.errors import EngineError
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.document import read_plan

    if optimizer is not None:
        from gpualloc.graph.recipe import OPTIMIZERS  # imports torch, as the run does anyway

        if optimizer not in OPTIMIZERS:
            raise EngineError(f"--optimizer {optimizer}: expected one of {', '.join(OPTIMIZERS)}")
    saved = read_plan(plan)
    from gpualloc.placement.hybrid.runnable import PRECISIONS_RUN

    if saved.precision not in PRECISIONS_RUN:
        raise EngineError(f"{plan}: precision: the plan trains in {saved.precision}; the engine trains in "
                          f"{', '.join(PRECISIONS_RUN)} only (re-plan with --precision bf16 or fp32)")
    if not (cluster or saved.cluster):
        raise EngineError(f"{plan}: the plan names no cluster: pass --cluster")
    clus = load_cluster(cluster or saved.cluster)
    name = model or saved.graph
    if not name:
        raise EngineError(f"{plan}: graph: the plan names no model: pass --model")
    share = host_share(str(plan), saved, clus, nnodes=nnodes, node_rank=node_rank, **_cuda_host())
    if nnodes > 1 and master_addr is None:
        raise EngineError("--master-addr: a run on several nodes needs node 0's address")
    opt = optimizer or saved.optimizer or "sgd"
    out_dir = out.resolve()
    cmd = torchrun_command(plan, name, share, steps=steps, warmup=warmup, seed=seed, optimizer=opt, lr=lr, out=out_dir,
                           check=check, node_rank=node_rank, master_addr=master_addr, master_port=master_port,
                           cluster=cluster)
    env_threads = _threads(share, threads)
    if print_command:
        console.print(f"OMP_NUM_THREADS={env_threads} {shlex.join(cmd)}", soft_wrap=True, markup=False,
                      highlight=False)
        return
    graph, the_plan = plan_on_graph(saved, clus, name)  # the engine's refusal, before anything starts
    if not collect:
        out_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(env_threads)}
        status = run_torchrun(cmd, env, quiet_stdout=as_json)
        if status != 0:
            raise EngineError(f"torchrun exited with status {status}: the ranks' output above says why "
                              f"(command: {shlex.join(cmd)})")
    if 0 not in share.ranks and not collect:
        console.print(f"this node's {len(share.ranks)} rank(s) finished; node 0 reports the run")
        return
    report = finish_run(out_dir, saved, clus, graph, the_plan, opt, calibration, no_calibrate, env_threads, seed,
                        calibration_out)
    if as_json:
        print_json(report)
        return
    from gpualloc.reports.engine import engine_run_view

    console.print(engine_run_view(report))
    if calibration_out is not None:
        console.print(f"wrote {calibration_out} (gpualloc place --calibration {calibration_out})")


def _cuda_host() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"cuda_count": 0, "cuda_names": ()}
    n = torch.cuda.device_count()
    return {"cuda_count": n, "cuda_names": tuple(torch.cuda.get_device_name(i) for i in range(n))}


def _threads(share: HostShare, threads: int | None) -> int:
    """Torch threads of each rank of this host: the host's CPUs split between its CPU ranks (1 per GPU rank)."""
    cpu = sum(1 for t in share.torch_devices if t == "cpu")
    if cpu == 0:
        return 1
    total = threads or len(os.sched_getaffinity(0))
    return max(1, total // cpu)


def plan_on_graph(saved, cluster, model: str):
    """The model's graph at the plan's batch and the plan on it, checked by the engine's topology (a plan the
    engine cannot run is one ``EngineError`` line), before anything starts."""
    from gpualloc.cli.plan_inputs import model_graph as _model_graph
    from gpualloc.execute.engine.topology import topology
    from gpualloc.placement.problem import PlacementProblem

    _, graph = _model_graph(model, saved.global_batch or 32, saved.node_ids)
    the_plan = saved.plan_for(PlacementProblem(graph, cluster))
    topology(the_plan, graph)
    return graph, the_plan


def finish_run(out_dir: Path, saved, cluster, graph, the_plan, optimizer: str, calibration: Path | None,
               no_calibrate: bool, threads: int, seed: int, calibration_out: Path | None, *,
               use_profiles: bool = True) -> dict[str, Any]:
    """Read the run in ``out_dir``, predict the plan, compare, and (given ``calibration_out``) write the fit.
    ``use_profiles=False`` predicts with the calibrated roofline even where the calibration profiles the model."""
    from gpualloc.cli.plan_inputs import prediction_calibration as _calibration
    from gpualloc.execute.engine.record import compare_run, fit_run, predict_run, read_run, run_summary

    run = read_run(out_dir)
    used = plan_devices(saved)
    scored_with = Path(saved.calibration) if saved.calibration and Path(saved.calibration).is_file() else None
    cal, cal_info = _calibration(calibration or scored_with, no_calibrate, cluster, list(used), threads, seed)
    prediction = predict_run(the_plan, graph, cluster, cal, optimizer=optimizer, use_profiles=use_profiles)
    rows = compare_run(run, prediction, cluster)
    if calibration_out is not None:
        fitted = fit_run(run, rows, prediction, cal, cluster, source=str(out_dir))
        fitted.save(calibration_out)
        summary = dict(fitted.fit["engine_run"])
    else:
        summary = run_summary(run, rows, prediction)
    return {**summary, "plan_description": the_plan.describe(), "calibration": cal_info,
            "calibration_out": str(calibration_out) if calibration_out is not None else None}
