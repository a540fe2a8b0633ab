"""``gpualloc simulate``: replay a trace (or a synthetic load) on a cluster under scheduling policies."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpualloc.cli.common import (DefaultToRun, console, disk_cache, output_file, output_folder,
                                 print_json, progress_bar)
from gpualloc.errors import UnplaceableJobs
from gpualloc.limits import MAX_JOBS, MAX_SEED

app = typer.Typer(cls=DefaultToRun, no_args_is_help=True,
                  help="Simulate a GPU cluster: `simulate --cluster C --trace T --policy P`, `simulate compare`.")

DEFAULT_POLICIES = "fcfs,static-affinity,sjf,srtf,easy-backfill,tiresias,gavel,gavel-srtf,dqn"
_CLUSTER = typer.Option(None, "--cluster", "-c",
                        help="Preset, shorthand or file; default adlro16, or the Alibaba node list of --nodes.")
_TRACE = typer.Option(None, "--trace", "-t", help="Trace file.")
_FORMAT = typer.Option(None, "--format", "-f",
                       help="native, gavel, philly, pollux, tiresias, alibaba (default: from the file).")
_GENERATE = typer.Option(None, "--generate", max=MAX_JOBS, min=1,
                         help="Generate this many synthetic jobs instead of a trace.")
_LOAD = typer.Option(0.8, "--load", min=0.01, help="Offered load of the synthetic jobs (1.0 = cluster capacity).")
_NODES = typer.Option(None, "--nodes", help="Alibaba node list (openb_node_list_gpu_node.csv) to use as the cluster.")
_HEAD = typer.Option(None, "--head", max=MAX_JOBS, min=1, help="Only the first N jobs of the trace.")
_SEED = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the generator and of the policies.")
_DROP = typer.Option(False, "--drop-unplaceable",
                     help="Reject jobs larger than any device type of the cluster instead of stopping.")
_AGENT = typer.Option(None, "--agent", help="Scheduling agent for the dqn policy (default: the bundled one).")
_KNOWLEDGE_HELP = ("What the policy knows of job durations (docs/knowledge.md): oracle (the truth), estimate (the "
                   "users' time limits) or blind (submit-time fields and service attained so far only).")
_MIGRATE = typer.Option(False, "--migrate/--no-migrate",
                        help="Move running jobs to other nodes to make room for a single-node gang that free GPUs "
                             "split across nodes keep waiting, when it pays (docs/scheduling-placement.md); adds "
                             "migrations and the fragmentation wait. Not with --quotas.")
_QUOTAS = typer.Option(None, "--quotas",
                       help="Team quotas per GPU type (TOML, docs/quotas.md): every policy runs under them, with "
                            "borrowing, reclaim, fair share and GPU-type preferences; adds per-team figures.")


def workload(cluster: str | None, trace: Path | None, fmt: str | None, generate: int | None, load: float,
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


def load_quotas(path: Path | None):
    """The quota file of ``--quotas`` (``None`` without one)."""
    if path is None:
        return None
    from gpualloc.scheduling.quotas import Quotas

    return Quotas.from_file(path)


def agent_options(name: str, agent: Path | None) -> dict:
    """The options ``--agent`` and the gate-verdict cache give policy ``name`` (those its factory takes)."""
    from gpualloc.scheduling.policies import policy_options

    options = policy_options(name)
    return {**({"agent": agent} if "agent" in options and agent else {}),
            **({"cache": disk_cache()} if "cache" in options else {})}


def require_runnable(plan: dict[str, list[str]], agent: Path | None) -> None:
    """Refuse, before any run, every (level, policy) of ``plan`` that cannot run at its level
    (:func:`~gpualloc.scheduling.knowledge.require_policy`: one line naming ``--knowledge``, the level
    and the policy)."""
    from gpualloc.scheduling.knowledge import require_policy

    for level, names in plan.items():
        for name in names:
            require_policy(name, level, agent_options(name, agent))


def run_policy(trace, cluster, policy_name: str, seed: int, drop: bool, agent: Path | None = None, quotas=None,
               knowledge: str = "oracle", migrate: bool = False):
    """Simulate one policy at information level ``knowledge`` (refused before it runs when it cannot run
    there: :func:`~gpualloc.scheduling.knowledge.require_policy`); with ``migrate``, running jobs move to
    make room for single-node gangs (docs/scheduling-placement.md)."""
    from rich.progress import BarColumn, TextColumn

    from gpualloc.scheduling.knowledge import require_policy
    from gpualloc.scheduling.policies import make_policy, require_knowledge
    from gpualloc.scheduling.simulator import simulate

    require_knowledge(policy_name, knowledge)
    options = agent_options(policy_name, agent)
    policy = make_policy(policy_name, **options)
    require_policy(policy_name, knowledge, options, policy=policy)
    try:
        with progress_bar(TextColumn("{task.description:<16}"), BarColumn(), unit="jobs") as bar:
            task = bar.add_task(policy_name, total=len(trace))
            return simulate(trace, cluster, policy, seed=seed, drop_unplaceable=drop, quotas=quotas,
                            knowledge=knowledge, migrate=migrate, fragmentation=migrate,
                            progress=lambda now, done, total: bar.update(task, completed=done))
    except UnplaceableJobs as err:
        raise UnplaceableJobs(f"{err}; --drop-unplaceable rejects such jobs instead") from err


@app.command("run")
def run_cmd(
    cluster: str = _CLUSTER, trace: Path = _TRACE, fmt: str = _FORMAT, generate: int = _GENERATE,
    load: float = _LOAD, nodes: Path = _NODES, head: int = _HEAD, seed: int = _SEED, drop: bool = _DROP,
    agent: Path = _AGENT, quotas: Path = _QUOTAS,
    policy: str = typer.Option("fcfs", "--policy", "-p",
                               help="Scheduling policy (see `simulate compare --help`), or package.module:factory "
                                    "for one of your own (run from the folder holding the package)."),
    as_json: bool = typer.Option(False, "--json", help="Print the metrics as one JSON object."),
    out: Path = typer.Option(None, "-o", "--out", callback=output_file,
                             help="Write the metrics and every job's record here (JSON)."),
    knowledge: str = typer.Option("oracle", "--knowledge", "-k", help=_KNOWLEDGE_HELP),
    migrate: bool = _MIGRATE,
) -> None:
    """Run one policy and print its metrics, with the lower bound beside them."""
    from gpualloc.scheduling.knowledge import check_knowledge, row_labels
    from gpualloc.scheduling.metrics import summary, team_summary, with_ratios

    check_knowledge(knowledge, "--knowledge")
    require_runnable({knowledge: [policy]}, agent)  # before reading a trace: one line at once
    team_quotas = load_quotas(quotas)
    spec, jobs = workload(cluster, trace, fmt, generate, load, nodes, head, seed)
    result = run_policy(jobs, spec, policy, seed, drop, agent, team_quotas, knowledge, migrate)
    row = summary(result) | _moves(result) | row_labels(policy, knowledge) | _where(trace, load)
    if team_quotas is not None:
        row["teams"] = team_summary(result)
    if out is not None:
        from gpualloc.errors import write_text

        write_text(out, json.dumps({**row, "jobs_records": _records(result)}, indent=1) + "\n")
    if as_json:
        print_json(row)
        return
    print_policies(with_ratios([row]), f"{policy} on {spec.name}: {_jobs(len(jobs), row)}"
                   + ("" if knowledge == "oracle" else f", knowledge {knowledge}"))
    print_teams([row])


@app.command("compare")
def compare_cmd(
    cluster: str = _CLUSTER, trace: Path = _TRACE, fmt: str = _FORMAT, generate: int = _GENERATE,
    load: float = _LOAD, nodes: Path = _NODES, head: int = _HEAD, seed: int = _SEED, drop: bool = _DROP,
    agent: Path = _AGENT, quotas: Path = _QUOTAS,
    policies: str = typer.Option(None, "--policies", show_default=DEFAULT_POLICIES,
                                 help="Comma-separated policy names (package.module:factory for your own). By "
                                      "default under blind, those that need durations give way to their -pred "
                                      "versions."),
    plots: Path = typer.Option(None, "--plots", callback=output_folder,
                               help="Folder for the JCT CDF, utilisation and queue plots."),
    as_json: bool = typer.Option(False, "--json", help="Print every policy's metrics as one JSON object."),
    knowledge: str = typer.Option("oracle", "--knowledge", "-k",
                                  help=_KNOWLEDGE_HELP + " Several, comma-separated, or all: side by side."),
    migrate: bool = _MIGRATE,
) -> None:
    """Run several policies on the same jobs and cluster, side by side with the lower bound (oracle-lb)."""
    from gpualloc.scheduling.knowledge import parse_levels, policies_at

    levels = parse_levels(knowledge)
    default = [name.strip() for name in DEFAULT_POLICIES.split(",")]
    names = None if policies is None else [name.strip() for name in policies.split(",") if name.strip()]
    plan = {level: list(policies_at(level, default)) if names is None else names for level in levels}
    require_runnable(plan, agent)  # refuse before any run
    team_quotas = load_quotas(quotas)
    spec, jobs = workload(cluster, trace, fmt, generate, load, nodes, head, seed)
    rows = []
    for level, level_names in plan.items():
        level_rows = compare_policies(jobs, spec, level_names, seed=seed, drop=drop, agent=agent,
                                      plots=plots if len(levels) == 1 else (plots and plots / level),
                                      quotas=team_quotas, knowledge=level, trace_path=trace, load=load,
                                      skip_unable=names is None, migrate=migrate)
        rows += [r for r in level_rows if r["policy"] != "oracle-lb" or not rows]  # the bound once: it is oracle
    if as_json:
        print_json({"cluster": spec.name, "trace": str(trace) if trace else f"synthetic {generate} jobs load {load}",
                    "seed": seed, "knowledge": list(levels), "results": rows})
        return
    for level in levels:
        mine = [r for r in rows if r["knowledge"] == level or (r["policy"] == "oracle-lb" and len(levels) == 1)]
        title = f"{_jobs(len(jobs), rows[0])} on {spec.name} ({len(spec)} GPUs)"
        print_policies(mine, title if levels == ("oracle",) else f"{title}, knowledge {level}")
    print_teams(rows)
    if plots is not None:
        where = f"{plots}/" if len(levels) == 1 else f"{plots}/{{{','.join(levels)}}}/"
        console.print(f"plots: {where}jct_cdf.png, utilization.png, queue.png")


def compare_policies(jobs, spec, names: list[str], *, seed: int, drop: bool = False, agent: Path | None = None,
                     plots: Path | None = None, quotas=None, knowledge: str = "oracle",
                     trace_path: Path | None = None, load: float | None = None,
                     skip_unable: bool = False, migrate: bool = False) -> list[dict]:
    """Each policy's summary on the same jobs, then the oracle-lb row, with x bound and vs fcfs; the
    JCT CDF, utilisation and queue plots go to ``plots`` when given. Under ``quotas`` (a
    :class:`~gpualloc.scheduling.quotas.Quotas`) every policy runs wrapped in its quota rules and
    each row gets ``teams``: :func:`~gpualloc.scheduling.metrics.team_summary`. Every row says what its
    policy knew (:func:`~gpualloc.scheduling.knowledge.row_labels`: ``knowledge``, ``needs_durations``,
    ``learned``; the oracle-lb row is ``oracle``) and what it ran on (``trace``: the file, or
    ``synthetic``; ``load``: the synthetic load, null for a trace). With ``skip_unable`` (a default list,
    not one the user wrote), a policy that reads what ``knowledge`` hides is left out with a warning
    instead of stopping the comparison. With ``migrate``, every policy runs with migration to make room
    for single-node gangs, and each row adds ``migrations`` and ``fragmentation_wait_gpu_s``."""
    from gpualloc.scheduling.knowledge import row_labels
    from gpualloc.scheduling.metrics import oracle_summary, summary, team_summary, with_ratios
    from gpualloc.scheduling.simulator import prepare

    work = prepare(jobs, spec)  # the speed matrix and job table, once for every policy
    results = [r for r in (_run_or_skip(work, spec, name, seed, drop, agent, quotas, knowledge, skip_unable, migrate)
                           for name in names) if r is not None]
    if plots is not None:
        from gpualloc.reports.sched_plots import plot_runs

        plot_runs(results, plots, title=f"({spec.name})")
    rows = [summary(r) | _moves(r) | ({"teams": team_summary(r)} if quotas is not None else {}) for r in results]
    rows = with_ratios(rows + [oracle_summary(results[0])])
    where = _where(trace_path, load)
    return [r | row_labels(r["policy"], knowledge) | where for r in rows]


def _run_or_skip(work, spec, name: str, seed: int, drop: bool, agent, quotas, knowledge: str, skip: bool,
                 migrate: bool = False):
    from gpualloc.scheduling.knowledge import InformationError

    try:
        return run_policy(work, spec, name, seed, drop, agent, quotas, knowledge, migrate)
    except InformationError as err:
        if not skip:
            raise
        import warnings

        from gpualloc.errors import GpuallocWarning

        warnings.warn(f"{name} left out at knowledge {knowledge}: {err}", GpuallocWarning, stacklevel=2)
        return None


def _moves(result) -> dict:
    """A run with migration: jobs moved, and GPU-seconds gangs waited for fragmentation; else nothing."""
    if result.migrations is None:
        return {}
    return {"migrations": int(result.migrations.sum()),
            "fragmentation_wait_gpu_s": float(result.fragmentation_wait_gpu_s)}


def _where(trace: Path | None, load: float | None) -> dict:
    """A row's ``trace`` (the file, or ``synthetic``) and ``load`` (the synthetic load; null for a trace)."""
    return {"trace": str(trace), "load": None} if trace is not None else {"trace": "synthetic", "load": load}


def _jobs(n: int, row: dict) -> str:
    """``n`` jobs for a table's title, with how many ``--drop-unplaceable`` rejected."""
    rejected = row.get("rejected") or 0
    return f"{n:,} jobs" + (f" ({rejected:,} rejected: no device type can run them)" if rejected else "")


def print_policies(rows: list[dict], title: str) -> None:
    """The policies' rows as a table (ratios already in the rows, rendering from reports)."""
    from gpualloc.reports.scheduling import policies_table

    console.print(policies_table(rows, title, more="--json"))


def print_teams(rows: list[dict]) -> None:
    """Per-team figures of the rows that have them (runs under ``--quotas``)."""
    if any("teams" in r for r in rows):
        from gpualloc.reports.scheduling import teams_table

        console.print(teams_table(rows, more="--json"))


def _records(result) -> list[dict]:
    keys = ("arrival_s", "start_s", "finish_s", "num_gpus", "work_s", "best_time_s", "preemptions", "lost_s")
    types = list(result.type_names)
    rows = []
    for i, job_id in enumerate(result.job_ids):
        row = {"id": job_id, **{k: _plain(getattr(result, k)[i]) for k in keys}}
        t = int(result.run_type[i])
        row["device_type"] = types[t] if t >= 0 else None
        row["team"] = result.team_names[int(result.team_code[i])] if result.team_code is not None else ""
        rows.append(row)
    return rows


def _plain(x):
    x = x.item() if hasattr(x, "item") else x
    return None if isinstance(x, float) and x != x else x
