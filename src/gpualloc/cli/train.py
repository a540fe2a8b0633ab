"""``gpualloc train``: train the learning agents (placement now; scheduling alongside)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpualloc.cli.common import console, load_graph, output_file, progress_bar
from gpualloc.reports.learning import placer_learning_curve
from gpualloc.limits import MAX_BATCH, MAX_SEED, MAX_STEPS

app = typer.Typer(no_args_is_help=True, help="Train the DQN agents: `train placer`, `train scheduler`.")


def _bar(unit: str = "steps"):
    """The training progress on stderr (:func:`~gpualloc.cli.common.progress_bar`): steps, statistics, ETA."""
    from rich.progress import BarColumn, TextColumn

    return progress_bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"), unit=unit)


def _stats(log) -> str:
    recent = log.episode_returns[-50:]
    mean = sum(recent) / len(recent) if recent else float("nan")
    eps = log.episode_epsilons[-1] if log.episode_epsilons else 1.0
    best = "-" if log.best_eval is None else f"{log.best_eval:+.4f}"
    return f"episodes {len(log.episode_returns):,}  return {mean:+.4f}  eps {eps:.2f}  best eval {best}"


def _progress_callback(bar, task, total: int):
    def callback(step: int, log) -> None:
        if step % 50 == 0 or step == total:
            bar.update(task, completed=step, note=_stats(log))
    return callback


@app.command("placer")
def placer_cmd(
    graphs: str = typer.Option("resnet18,vgg16,alexnet,inception_v3,gnmt,densenet121,resnet-tiny,bert-tiny,gpt-tiny",
                               "--graphs",
                               help="Comma-separated training graphs "
                                    "(files, PipeDream names under --data, zoo names)."),
    eval_graphs: str = typer.Option("resnet50,resnext50,squeezenet1_0,nasnetamobile", "--eval-graphs",
                                    help="Held-out graphs for periodic evaluation."),
    clusters: str = typer.Option("hetero8,2xA100+2xV100+2xT4", "--clusters", help="Comma-separated clusters."),
    microbatches: str = typer.Option("1,4", "--microbatches", help="Comma-separated microbatch counts."),
    data: Path = typer.Option(Path("../shared/data/pipedream-profiles"), "--data",
                              help="Folder of PipeDream profiles (NAME.txt) for bare graph names."),
    steps: int = typer.Option(30_000, "--steps", max=MAX_STEPS, min=100, help="Environment steps."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the agent and the episodes."),
    out: Path = typer.Option(Path("placer.pt"), "-o", "--out", callback=output_file,
                             help="Checkpoint to write (the best by held-out return)."),
    batch: int = typer.Option(32, "--batch", max=MAX_BATCH, min=1, help="Batch size of captured zoo models."),
) -> None:
    """Train the placement agent on graphs x clusters x microbatches; keep the best checkpoint."""
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.problem import PlacementProblem
    from gpualloc.rl.placer import train_placer

    def problems(names: str):
        out_ = []
        for name in filter(None, (x.strip() for x in names.split(","))):
            path = data / f"{name}.txt"
            graph = load_graph(str(path) if path.is_file() else name, batch)
            for c in filter(None, (x.strip() for x in clusters.split(","))):
                for mb in (int(x) for x in microbatches.split(",")):
                    out_.append(PlacementProblem(graph, load_cluster(c), microbatches=mb))
        return out_

    with console.status("building problems and their best-heuristic base plans..."):
        train_p, eval_p = problems(graphs), problems(eval_graphs)
    with _bar() as bar:
        task = bar.add_task("train placer", total=steps)
        agent, log = train_placer(train_p, steps, out, seed=seed, eval_problems=eval_p,
                                  callback=_progress_callback(bar, task, steps))
    curve = out.with_suffix(".png")
    placer_learning_curve(log, curve, f"placement agent ({len(train_p)} training problems)")
    best = "-" if log.best_eval is None else f"{log.best_eval:+.4f}"
    console.print(f"wrote {out} (best held-out return {best}: mean gain over the best heuristic) and {curve}")


def _windows(data: Path | None, clusters: str) -> tuple[list, list]:
    """Training and validation windows of the real traces under ``data`` (none without it)."""
    if data is None:
        return [], []
    from gpualloc.experiments.scheduling_table import VAL_WINDOWS, training_windows

    names = [c.strip() for c in clusters.split(",") if c.strip()]
    return training_windows(data, names), training_windows(data, names, starts=VAL_WINDOWS)


def _knowledge_option(knowledge: str, experts: bool) -> dict:
    """``--knowledge`` as a training setting (``{"knowledge": level}``) for the training code that has one;
    ``{}`` for ``oracle`` where it has none (what it always trained on); otherwise one line: training at
    that level is not there."""
    from dataclasses import fields

    from gpualloc.rl.train_scheduler import ExpertTraining, SchedulerTraining
    from gpualloc.scheduling.knowledge import check_knowledge

    check_knowledge(knowledge, "--knowledge")
    settings = ExpertTraining if experts else SchedulerTraining
    if "knowledge" in {f.name for f in fields(settings)}:
        return {"knowledge": knowledge}
    if knowledge == "oracle":
        return {}
    from gpualloc.errors import AgentError

    raise AgentError(f"--knowledge {knowledge}: this training reads true durations; it trains at oracle only")


@app.command("scheduler")
def scheduler_cmd(
    cluster: str = typer.Option("adlro16", "--cluster", "-c", help="Cluster preset, shorthand or file."),
    trace: list[Path] = typer.Option(None, "--trace", help="Training trace file(s); default: the synthetic generator."),
    fmt: str = typer.Option(None, "--format", "-f", help="Trace format (default: from the file)."),
    generator: bool = typer.Option(True, "--generator/--no-generator",
                                   help="Train on synthetic traces (ignored when --trace is given)."),
    steps: int = typer.Option(80_000, "--steps", max=MAX_STEPS, min=0,
                              help="Environment steps (scheduling decisions; at least 100; with --experts the "
                              "DQN fine-tuning steps, 0: none)."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED, help="Seed of the agent and the generated traces."),
    out: Path = typer.Option(Path("sched.pt"), "-o", "--out", callback=output_file,
                             help="Checkpoint (the best by held-out avg JCT)."),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Run the rollouts and held-out evaluations as Ray "
                                 "tasks (local Ray unless --ray-address)."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster to join (implies --ray), e.g. 'auto'."),
    workers: int = typer.Option(1, "--workers", min=1, help="Parallel runs: local processes without --ray, "
                                "CPUs of a local Ray with it."),
    actors: int = typer.Option(1, "--actors", min=1, help="Rollout tasks per round, each with its own simulator "
                               "(1: experience collected step by step in this process)."),
    round_steps: int = typer.Option(1_000, "--round-steps", max=MAX_STEPS, min=1,
                                    help="Environment steps per round, shared by "
                                    "the actors (with --actors > 1)."),
    experts: str = typer.Option(None, "--experts", help="Train the expert-choice agent over these heuristics "
                                "(e.g. gavel,srtf,tiresias,sjf,gavel-srtf) on the comma-separated --cluster "
                                "list; --steps are its DQN fine-tuning steps."),
    hd_dim: int = typer.Option(0, "--hd-dim", min=0, max=1024,
                               help="Hyperdimensional features (expert choice; 0: off)."),
    rollout_points: int = typer.Option(0, "--rollout-points", min=0, max=1000,
                                       help="Expert choice: choice points per training trace labelled by "
                                       "rollout with the cheapest expert, trained on after cloning (0: off)."),
    rollout_horizon_h: float = typer.Option(6.0, "--rollout-horizon-h", min=0.0, max=10_000.0,
                                            help="Simulated hours of each rollout (0: to the end of the trace)."),
    rollout_follow_h: float = typer.Option(0.0, "--rollout-follow-h", min=0.0, max=10_000.0,
                                           help="Hours the forced expert keeps deciding before the base "
                                           "(0: one decision)."),
    rollout_base: str = typer.Option(None, "--rollout-base", help="Expert followed after the forced decision "
                                     "(default the teacher)."),
    windows: Path = typer.Option(None, "--train-windows", help="Data folder of the real traces: also train and "
                                 "validate on 150-job windows of them past the first 300 jobs (which the "
                                 "results table evaluates)."),
    bc_rounds: int = typer.Option(2, "--bc-rounds", min=1, max=20, help="Expert choice: DAgger rounds of "
                                  "behaviour cloning (round 0 follows the guide, later ones the agent)."),
    train_traces: int = typer.Option(12, "--train-traces", min=1, max=1000,
                                     help="Expert choice: generated training traces (clusters in turn)."),
    guide: str = typer.Option("teacher", "--guide", help="Expert choice: clone the teacher everywhere "
                              "('teacher') or each training trace's best expert ('best')."),
    knowledge: str = typer.Option("oracle", "--knowledge", "-k",
                                  help="What the agent and its experts know of job durations while they train and "
                                       "decide (docs/knowledge.md): oracle, estimate or blind; stored with the "
                                       "agent."),
) -> None:
    """Train the DQN scheduler; evaluates on held-out seeds against FCFS, static affinity and SJF."""
    level = _knowledge_option(knowledge, experts is not None)
    if experts:
        from gpualloc.rl.train_scheduler import train_expert_scheduler

        train_w, val_w = _windows(windows, cluster)
        with _bar("stages") as bar:  # stages of very different lengths: elapsed time, no estimate
            task = bar.add_task("train scheduler (expert choice)", total=None)

            def say(message: str) -> None:
                console.print(message, highlight=False)
                bar.update(task, advance=1, note=message)

            report = train_expert_scheduler(
                out, clusters=tuple(c.strip() for c in cluster.split(",") if c.strip()),
                experts=tuple(e.strip() for e in experts.split(",") if e.strip()),
                steps=steps, seed=seed, hd_dim=hd_dim, progress=say,
                rollout_points=rollout_points, rollout_base=rollout_base,
                rollout_horizon_s=rollout_horizon_h * 3600 or None, rollout_follow_s=rollout_follow_h * 3600,
                guide=guide, bc_rounds=bc_rounds, train_traces=train_traces,
                extra_problems=tuple(train_w), val_problems=tuple(val_w), **level)
        console.print(f"wrote {report.out_path} in {report.wall_s:.0f} s; {report.gate.note()}")
        return
    from gpualloc.parallel import make_executor
    from gpualloc.rl.train_scheduler import train_scheduler

    if steps < 100:
        from gpualloc.errors import AgentError

        raise AgentError(f"--steps {steps}: the per-slot agent needs at least 100")
    from gpualloc.workload.traces import read_trace

    if not trace and not generator:
        from gpualloc.errors import TraceError

        raise TraceError("give --trace FILE (one or more) or --generator")
    traces = [read_trace(p, fmt) for p in trace] if trace else None
    with _bar() as bar, make_executor(use_ray, ray_address, workers) as executor:
        task = bar.add_task("train scheduler", total=steps)

        def progress(step: int, total: int, stats: dict) -> None:
            best = stats.get("best_avg_jct_s")
            bar.update(task, completed=step, note=f"episodes {stats.get('episodes', 0):,}  "
                       f"eps {stats.get('epsilon', 1.0):.2f}  best eval avg JCT "
                       f"{'-' if best is None else f'{best / 3600:.1f} h'}")

        report = train_scheduler(cluster, out, steps=steps, seed=seed, traces=traces, progress=progress,
                                 executor=executor, actors=actors, round_steps=round_steps, **level)
    console.print(f"wrote {report.out_path} and {report.plot_path} in {report.wall_s:.0f} s")
    for name in report.baselines:
        console.print(f"  best checkpoint vs {name}: {report.improvement(name):+.1%} avg JCT")
