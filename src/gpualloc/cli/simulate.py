"""``gpualloc simulate``: replay a trace (or a synthetic load) on a cluster under scheduling policies."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpualloc.cli.common import DefaultToRun, console, err_console, print_json

app = typer.Typer(cls=DefaultToRun, no_args_is_help=True,
                  help="Simulate a GPU cluster: `simulate --cluster C --trace T --policy P`, `simulate compare`.")

DEFAULT_POLICIES = "fcfs,static-affinity,sjf,srtf,easy-backfill,tiresias,gavel,dqn"
_CLUSTER = typer.Option(None, "--cluster", "-c",
                        help="Preset, shorthand or file; default adlro16, or the Alibaba node list of --nodes.")
_TRACE = typer.Option(None, "--trace", "-t", help="Trace file.")
_FORMAT = typer.Option(None, "--format", "-f",
                       help="native, gavel, philly, pollux, tiresias, alibaba (default: from the file).")
_GENERATE = typer.Option(None, "--generate", min=1, help="Generate this many synthetic jobs instead of a trace.")
_LOAD = typer.Option(0.8, "--load", min=0.01, help="Offered load of the synthetic jobs (1.0 = cluster capacity).")
_NODES = typer.Option(None, "--nodes", help="Alibaba node list (openb_node_list_gpu_node.csv) to use as the cluster.")
_HEAD = typer.Option(None, "--head", min=1, help="Only the first N jobs of the trace.")
_SEED = typer.Option(0, "--seed", help="Seed of the generator and of the policies.")
_DROP = typer.Option(False, "--drop-unplaceable",
                     help="Reject jobs larger than any device type of the cluster instead of stopping.")
_AGENT = typer.Option(None, "--agent", help="Scheduling agent for the dqn policy (default: the bundled adlro16 one).")


def _workload(cluster: str | None, trace: Path | None, fmt: str | None, generate: int | None, load: float,
              nodes: Path | None, head: int | None, seed: int):
    from gpualloc.errors import TraceError
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.workload.traces import alibaba_cluster, generate as gen, read_trace

    if (trace is None) == (generate is None):
        raise TraceError("give exactly one of --trace FILE and --generate JOBS")
    spec = alibaba_cluster(nodes) if cluster is None and nodes is not None else load_cluster(cluster or "adlro16")
    jobs = read_trace(trace, fmt) if trace is not None else gen(generate, spec, load, seed=seed)
    if head is not None:
        jobs = jobs.head(head)
    return spec, jobs


def _run(trace, cluster, policy_name: str, seed: int, drop: bool, agent: Path | None = None):
    from gpualloc.scheduling.policies import make_policy
    from gpualloc.scheduling.simulator import simulate

    policy = make_policy(policy_name, **({"agent": agent} if policy_name == "dqn" and agent else {}))
    with Progress(TextColumn(f"{policy_name:<16}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} jobs"),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("jobs", total=len(trace))
        result = simulate(trace, cluster, policy, seed=seed, drop_unplaceable=drop,
                          progress=lambda now, done, total: bar.update(task, completed=done))
    return result


@app.command("run")
def run_cmd(
    cluster: str = _CLUSTER, trace: Path = _TRACE, fmt: str = _FORMAT, generate: int = _GENERATE,
    load: float = _LOAD, nodes: Path = _NODES, head: int = _HEAD, seed: int = _SEED, drop: bool = _DROP,
    agent: Path = _AGENT,
    policy: str = typer.Option("fcfs", "--policy", "-p", help="Scheduling policy (see `simulate compare --help`)."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
    out: Path = typer.Option(None, "-o", "--out", help="Write the metrics and every job's record here (JSON)."),
) -> None:
    """Run one policy and print its metrics, with the lower bound beside them."""
    from gpualloc.scheduling.metrics import summary

    spec, jobs = _workload(cluster, trace, fmt, generate, load, nodes, head, seed)
    result = _run(jobs, spec, policy, seed, drop, agent)
    row = summary(result)
    if out is not None:
        out.write_text(json.dumps({**row, "jobs_records": _records(result)}, indent=1) + "\n")
    if as_json:
        print_json(row)
        return
    _table([row], f"{policy} on {spec.name}: {len(jobs):,} jobs")


@app.command("compare")
def compare_cmd(
    cluster: str = _CLUSTER, trace: Path = _TRACE, fmt: str = _FORMAT, generate: int = _GENERATE,
    load: float = _LOAD, nodes: Path = _NODES, head: int = _HEAD, seed: int = _SEED, drop: bool = _DROP,
    agent: Path = _AGENT,
    policies: str = typer.Option(DEFAULT_POLICIES, "--policies", help="Comma-separated policy names."),
    plots: Path = typer.Option(None, "--plots", help="Folder for the JCT CDF, utilisation and queue plots."),
    as_json: bool = typer.Option(False, "--json", help="Print every policy's metrics as one JSON object."),
) -> None:
    """Run several policies on the same jobs and cluster, side by side with the lower bound (oracle-lb)."""
    from gpualloc.scheduling.metrics import oracle_summary, summary

    spec, jobs = _workload(cluster, trace, fmt, generate, load, nodes, head, seed)
    results = [_run(jobs, spec, name.strip(), seed, drop, agent) for name in policies.split(",") if name.strip()]
    rows = [summary(r) for r in results] + [oracle_summary(results[0])]
    if plots is not None:
        from gpualloc.reports.sched_plots import plot_runs

        plot_runs(results, plots, title=f"({spec.name})")
    if as_json:
        print_json({"cluster": spec.name, "trace": str(trace) if trace else f"synthetic {generate} jobs load {load}",
                    "seed": seed, "results": rows})
        return
    _table(rows, f"{len(jobs):,} jobs on {spec.name} ({len(spec)} GPUs)")
    if plots is not None:
        console.print(f"plots: {plots}/jct_cdf.png, utilization.png, queue.png")


def _table(rows: list[dict], title: str) -> None:
    lb = rows[0]["lower_bound_avg_jct_s"]
    fcfs = next((r["avg_jct_s"] for r in rows if r["policy"] == "fcfs"), None)
    table = Table(title=title)
    for col in ("policy", "avg JCT", "p50", "p99", "avg queue", "jobs/h", "util", "eff. util", "sat. util", "makespan",
                "slowdown", "x bound", "vs fcfs", "HyperScore", "preempt", "wall"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in sorted(rows, key=lambda r: r["avg_jct_s"]):
        def pct(x):
            return "-" if x != x else f"{x:.0%}"
        table.add_row(
            r["policy"], _h(r["avg_jct_s"]), _h(r["p50_jct_s"]), _h(r["p99_jct_s"]), _h(r["avg_queue_s"]),
            f"{r['throughput_jobs_per_h']:.3f}", pct(r["utilization"]), pct(r["effective_utilization"]),
            pct(r.get("saturated_utilization", float("nan"))),
            _h(r["makespan_s"]), f"{r['avg_slowdown']:.2f}", f"{r['avg_jct_s'] / lb:.2f}" if lb else "-",
            f"{1 - r['avg_jct_s'] / fcfs:+.0%}" if fcfs else "-", f"{r['hyperscore']:.3f}",
            str(r["preemptions"]), f"{r['sim_wall_s']:.2f} s")
    console.print(table)
    console.print("times in hours; x bound = avg JCT / oracle-lb avg JCT (each job alone on its fastest GPU type); "
                  "vs fcfs = avg JCT reduction")


def _h(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds / 3600:.2f} h"


def _records(result) -> list[dict]:
    keys = ("arrival_s", "start_s", "finish_s", "num_gpus", "work_s", "best_time_s", "preemptions", "lost_s")
    types = list(result.type_names)
    rows = []
    for i, job_id in enumerate(result.job_ids):
        row = {"id": job_id, **{k: _plain(getattr(result, k)[i]) for k in keys}}
        t = int(result.run_type[i])
        row["device_type"] = types[t] if t >= 0 else None
        rows.append(row)
    return rows


def _plain(x):
    x = x.item() if hasattr(x, "item") else x
    return None if isinstance(x, float) and x != x else x
