"""``gpualloc reproduce``: regenerate the results tables (Markdown, JSON, plots) from scratch."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpualloc.cli.common import console, disk_cache, output_folder, print_json, progress_bar
from gpualloc.errors import write_text
from gpualloc.limits import MAX_JOBS, MAX_MICROBATCHES, MAX_STEPS

app = typer.Typer(no_args_is_help=True,
                  help="Regenerate the results tables: `reproduce placement`, `reproduce scheduling`.")


@app.command("placement")
def placement_cmd(
    quick: bool = typer.Option(False, "--quick", help="One seed, 2,000 iterations: the CI smoke version."),
    seeds: int = typer.Option(None, "--seeds", max=MAX_STEPS, min=1,
                              help="Seeds (drift schedules) per model and cluster."),
    iterations: int = typer.Option(None, "--iterations", max=MAX_STEPS, min=1, help="Training iterations per run."),
    microbatches: int = typer.Option(4, "--microbatches", max=MAX_MICROBATCHES, min=1,
                                     help="Pipeline microbatches per step."),
    agent: Path = typer.Option(None, "--agent", help="Placement agent (default: the bundled one)."),
    out: Path = typer.Option(Path("out/reproduce-placement"), "--out", callback=output_folder,
                          help="Folder for table.md, results.json, plots."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
) -> None:
    """The placement table: ResNet-50, BERT-base and GPT-2 small on 8xA100 and hetero8.

    Over a training run with drift: every method's training time, utilisation, MFU, communication,
    energy and re-plans."""
    from dataclasses import replace

    from gpualloc.experiments.placement_table import TableSpec, run_table, total_runs
    from gpualloc.reports.tables import placement_hybrid_markdown, placement_markdown, plot_bars
    from gpualloc.rl.placer import load_placer

    spec = TableSpec.quick() if quick else TableSpec()
    spec = replace(spec, microbatches=microbatches, **{k: v for k, v in (("seeds", seeds), ("iterations", iterations))
                                                        if v is not None})
    from rich.progress import BarColumn, TextColumn

    with progress_bar(TextColumn("{task.description:<40}"), BarColumn(), unit="runs") as bar:
        task = bar.add_task("placement table", total=total_runs(spec))
        result = run_table(spec, load_placer(agent),
                           progress=lambda what: bar.update(task, advance=1, description=what), cache=disk_cache())
    out.mkdir(parents=True, exist_ok=True)
    command = "gpualloc reproduce placement" + (" --quick" if quick else "") + \
        (f" --seeds {seeds}" if seeds else "") + (f" --iterations {iterations}" if iterations else "")
    result["command"] = command
    write_text(out / "results.json", json.dumps(result, indent=1) + "\n")
    table = placement_markdown(result["rows"]) + "\n" + placement_hybrid_markdown(result["hybrid_rows"])
    write_text(out / "table.md", f"<!-- {command} -->\n" + table)
    plot_bars(result["rows"], ("model", "cluster"), "method", "training_time_s", out / "training_time.png",
              ylabel="training time (s)",
              title=f"training time of {spec.iterations:,} iterations with drift")
    plot_bars(result["rows"], ("model", "cluster"), "method", "energy_j", out / "energy.png", ylabel="energy (MJ)",
              scale=1e-6, title=f"energy of {spec.iterations:,} iterations with drift")
    if as_json:
        print_json(result)
        return
    console.print(table)
    console.print(f"{result['wall_s']:.0f} s; wrote {out}/table.md, results.json, training_time.png, energy.png")


DEFAULT_DATA = Path("../shared/data")


def _real_trace_root(data: Path | None, with_real: bool) -> tuple[Path | None, str]:
    """The folder of the real traces for the table (``None``: synthetic rows only) and what
    ``results.json`` says of them. A ``--data`` folder given on purpose must hold some of them
    (:func:`~gpualloc.experiments.scheduling_table.require_real_traces`: one line, exit status 2); the
    default folder is skipped when they are not there."""
    from gpualloc.errors import TraceError
    from gpualloc.experiments.scheduling_table import require_real_traces

    if not with_real:
        return None, "skipped: --no-real-traces"
    if data is not None:
        found = require_real_traces(data)
    else:
        try:
            found, data = require_real_traces(DEFAULT_DATA), DEFAULT_DATA
        except TraceError:
            return None, f"skipped: none under {DEFAULT_DATA}"
    return data, "included: " + ", ".join(label for label, _, _ in found)


@app.command("scheduling")
def scheduling_cmd(
    quick: bool = typer.Option(False, "--quick", help="Load 0.8 only, 2 seeds, 120 jobs (60 of each real "
                                                      "trace), no HD ablation: the CI smoke version."),
    seeds: int = typer.Option(None, "--seeds", max=MAX_STEPS, min=2, help="Seeds (synthetic traces) per load."),
    data: Path = typer.Option(None, "--data",
                              help="Folder with the real traces (gavel/, philly/, alibaba-gpu-v2023/); a folder "
                                   "given must hold them. Default: ../shared/data, skipped if absent."),
    with_real: bool = typer.Option(True, "--real-traces/--no-real-traces",
                              help="Add the windows of the real traces (part 2) to the table."),
    agent: Path = typer.Option(None, "--agent", help="Scheduling agent (default: the bundled expert-choice one)."),
    out: Path = typer.Option(Path("out/reproduce-scheduling"), "--out", callback=output_folder,
                          help="Folder for table.md, results.json, plots."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as one JSON object."),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Run the simulations as Ray tasks (local Ray unless "
                                 "--ray-address)."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster to join (implies --ray), e.g. 'auto'."),
    workers: int = typer.Option(1, "--workers", min=1, help="Parallel simulations: local processes without --ray, "
                                "CPUs of a local Ray with it."),
    loads: str = typer.Option(None, "--loads", hidden=True, help="Comma-separated loads (tests)."),
    jobs: int = typer.Option(None, "--jobs", max=MAX_JOBS, min=1,
                             help="Jobs per synthetic trace and per real-trace window (default 300; quick 120/60)."),
    knowledge: str = typer.Option("all", "--knowledge", "-k",
                                  help="Information levels, side by side (docs/knowledge.md): comma-separated "
                                       "oracle, estimate, blind, or all."),
    migrate: bool = typer.Option(False, "--migrate/--no-migrate",
                                 help="Every policy moves running jobs to other nodes to make room for a "
                                      "single-node gang that free GPUs split across nodes keep waiting, when it "
                                      "pays (docs/scheduling-placement.md); rows add migrations and the "
                                      "fragmentation wait."),
) -> None:
    """The scheduling table: every policy, the DQN agent and the lower bound, synthetic and real traces.

    adlro16 (and the unseen 16xV100+8xT4+8xA100) with synthetic simulation / ML / data-processing jobs at
    several loads, then real-trace windows scaled to each cluster."""
    from gpualloc.scheduling.knowledge import KNOWLEDGE, parse_levels

    levels = parse_levels(knowledge)  # before any slow import: a typo is one line at once
    from dataclasses import replace

    from gpualloc.parallel import make_executor
    from gpualloc.experiments.scheduling_table import SchedTableSpec, run_table, total_runs
    from gpualloc.reports.tables import (plot_bars, scheduling_levels_markdown, scheduling_markdown,
                                         scheduling_summary_markdown)

    spec = SchedTableSpec.quick() if quick else SchedTableSpec.full()
    spec = replace(spec, knowledge=levels, migrate=migrate)
    if seeds:
        spec = replace(spec, seeds=seeds)
    if loads:
        spec = replace(spec, loads=tuple(float(x) for x in loads.split(",")))
    if jobs:
        spec = replace(spec, jobs=jobs, real_jobs=jobs)
    from gpualloc.cli.simulate import require_runnable
    from gpualloc.experiments.scheduling_table import VARIANTS
    from gpualloc.scheduling.knowledge import policies_at

    # before any run: a policy of the table that cannot run at a level (dqn whose agent, given or bundled,
    # or fallback reads durations under blind) is one line; policies_at leaves the variants (dqn-hd, an
    # oracle agent) out of blind
    require_runnable({level: [n for n in policies_at(level, spec.policies) if n not in VARIANTS]
                      for level in levels}, agent)
    root, real_note = _real_trace_root(data, with_real)
    from rich.progress import BarColumn, TextColumn

    cache = disk_cache()
    cache_dir = None if cache is None else str(cache.folder)
    with progress_bar(TextColumn("{task.description:<32}"), BarColumn(), unit="runs") as bar, \
            make_executor(use_ray, ray_address, workers) as executor:
        task = bar.add_task("scheduling table", total=total_runs(spec, root is not None))
        result = run_table(spec, root, agent=agent, executor=executor,
                           cache_dir=cache_dir,
                           progress=lambda what: bar.update(task, advance=1, description=what))
    out.mkdir(parents=True, exist_ok=True)
    command = "gpualloc reproduce scheduling" + (" --quick" if quick else "") + (f" --seeds {seeds}" if seeds else "") \
        + (f" --loads {loads}" if loads else "") + (f" --jobs {jobs}" if jobs else "") \
        + ("" if with_real else " --no-real-traces") \
        + ("" if levels == KNOWLEDGE else f" --knowledge {','.join(levels)}") + (" --migrate" if migrate else "")
    result["command"] = command
    result["real_traces"] = real_note
    write_text(out / "results.json", json.dumps(result, indent=1) + "\n")
    table = scheduling_markdown(result["rows"])
    write_text(out / "table.md", f"<!-- {command} -->\n" + table)
    notes = "".join(f"- `{name}`: {note}\n" for name, note in result["agents"].items())
    notes += "".join(f"- `{what}` not run: {why}\n" for what, why in result["not_run"].items())
    notes = "\n" + notes if notes else ""
    summary = scheduling_summary_markdown(result["rows"])
    if summary:
        write_text(out / "summary.md", f"<!-- {command} -->\n" + summary + notes)
    side_by_side = scheduling_levels_markdown(result["rows"])
    if side_by_side:
        write_text(out / "levels.md", f"<!-- {command} -->\n" + side_by_side)
    bars = result["rows"] if len(levels) == 1 else [  # one bar per policy and level
        r | {"policy": f"{r['policy']} ({r['knowledge']})"} for r in result["rows"]]
    synthetic = [r for r in bars if r["part"] == "synthetic" and r["cluster"] == spec.cluster]
    plot_bars(synthetic, ("load",), "policy", "avg_jct_s", out / "avg_jct.png", ylabel="average JCT (h)",
              scale=1 / 3600,
              title=f"{spec.cluster}: average JCT by load")
    real = [r for r in bars if r["part"] == "real"]
    if real:  # no real traces found: nothing to plot
        plot_bars(real, ("trace", "cluster"), "policy", "avg_jct_s", out / "real_traces.png",
                  ylabel="average JCT (h, log scale)", scale=1 / 3600, log=True,
                  title=f"real-trace windows scaled to load {spec.real_load:g} on each cluster")
    if as_json:
        print_json(result)
        return
    console.print(table + notes)
    console.print(f"{result['wall_s']:.0f} s; wrote {out}/table.md, {'summary.md, ' if summary else ''}"
                  f"{'levels.md, ' if side_by_side else ''}results.json, "
                  "avg_jct.png"
                  + (", real_traces.png" if real else ""))
