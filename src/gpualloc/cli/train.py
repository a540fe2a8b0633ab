"""``gpualloc train``: train the learning agents (placement now; scheduling alongside)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpualloc.cli.common import console, load_graph, output_file, progress_bar
from gpualloc.limits import MAX_BATCH, MAX_SEED, MAX_STEPS
from gpualloc.options import bounds_of, default_of
from gpualloc.reports.learning import placer_learning_curve
from gpualloc.rl.train_config import TrainConfig

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


def _windows(data: Path | None, clusters: tuple[str, ...]) -> tuple[list, list]:
    """Training and validation windows of the real traces under ``data`` (none without it)."""
    if data is None:
        return [], []
    from gpualloc.experiments.scheduling_table import VAL_WINDOWS, training_windows

    return training_windows(data, clusters), training_windows(data, clusters, starts=VAL_WINDOWS)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@app.command("scheduler")
def scheduler_cmd(
    ctx: typer.Context,
    config: Path = typer.Option(None, "--config", help="TOML file of TrainConfig's fields (the DQN settings in its "
                                "dqn table); options given here override it."),
    cluster: str = typer.Option(",".join(default_of(TrainConfig, "clusters")), "--cluster", "-c",
                                help="Comma-separated clusters of the generated traces (presets, shorthands, files)."),
    experts: str = typer.Option(",".join(default_of(TrainConfig, "experts")), "--experts",
                                help="The heuristics the agent chooses among, comma-separated."),
    steps: int = typer.Option(default_of(TrainConfig, "steps"), "--steps", **bounds_of(TrainConfig, "steps"),
                              help="DQN fine-tuning environment steps (0: behaviour cloning only)."),
    seed: int = typer.Option(default_of(TrainConfig, "seed"), "--seed", **bounds_of(TrainConfig, "seed"),
                             help="Seed of the agent and the generated traces."),
    out: Path = typer.Option(Path("sched.pt"), "-o", "--out", callback=output_file,
                             help="Checkpoint to write (it saves the whole configuration)."),
    hd_dim: int = typer.Option(default_of(TrainConfig, "hd_dim"), "--hd-dim", **bounds_of(TrainConfig, "hd_dim"),
                               help="Hyperdimensional features (0: off)."),
    rollout_points: int = typer.Option(default_of(TrainConfig, "rollout_points"), "--rollout-points",
                                       **bounds_of(TrainConfig, "rollout_points"),
                                       help="Choice points per training trace labelled by rollout with the "
                                       "cheapest expert, trained on after cloning (0: off)."),
    rollout_horizon_h: float = typer.Option(default_of(TrainConfig, "rollout_horizon_s") / 3600, "--rollout-horizon-h",
                                            min=0.0, max=10_000.0,
                                            help="Simulated hours of each rollout (0: to the end of the trace)."),
    rollout_follow_h: float = typer.Option(default_of(TrainConfig, "rollout_follow_s") / 3600, "--rollout-follow-h",
                                           min=0.0, max=10_000.0,
                                           help="Hours the forced expert keeps deciding before the base "
                                           "(0: one decision)."),
    rollout_base: str = typer.Option(default_of(TrainConfig, "rollout_base"), "--rollout-base",
                                     help="Expert followed after the forced decision (default the teacher)."),
    windows: Path = typer.Option(None, "--train-windows", help="Data folder of the real traces: also train and "
                                 "validate on 150-job windows of them past the first 300 jobs (which the "
                                 "results table evaluates)."),
    bc_rounds: int = typer.Option(default_of(TrainConfig, "bc_rounds"), "--bc-rounds",
                                  **bounds_of(TrainConfig, "bc_rounds"), help="DAgger rounds of behaviour "
                                  "cloning (round 0 follows the guide, later ones the agent)."),
    train_traces: int = typer.Option(default_of(TrainConfig, "train_traces"), "--train-traces",
                                     **bounds_of(TrainConfig, "train_traces"),
                                     help="Generated training traces (clusters in turn)."),
    guide: str = typer.Option(default_of(TrainConfig, "guide"), "--guide", help="Clone the teacher everywhere "
                              "('teacher') or each training trace's best expert ('best')."),
    knowledge: str = typer.Option(default_of(TrainConfig, "knowledge"), "--knowledge", "-k",
                                  help="What the agent and its experts know of job durations while they train and "
                                       "decide (docs/knowledge.md): oracle, estimate or blind; stored with the "
                                       "agent."),
) -> None:
    """Train the DQN scheduler (expert choice): pick a teacher among the experts, clone it, improve, gate."""
    from gpualloc.options import given, load_options, with_overrides
    from gpualloc.rl.train_scheduler import train_expert_scheduler

    run = TrainConfig() if config is None else load_options(TrainConfig, config, base=TrainConfig())
    flags = given(ctx, cluster=cluster, experts=experts, steps=steps, seed=seed, hd_dim=hd_dim,
                  rollout_points=rollout_points, rollout_horizon_h=rollout_horizon_h,
                  rollout_follow_h=rollout_follow_h, rollout_base=rollout_base, bc_rounds=bc_rounds,
                  train_traces=train_traces, guide=guide, knowledge=knowledge)
    for name, field in (("cluster", "clusters"), ("experts", "experts")):
        if name in flags:
            flags[field] = _names(flags.pop(name))
    for name in ("rollout_horizon_h", "rollout_follow_h"):
        if name in flags:
            flags[name[:-1] + "s"] = flags.pop(name) * 3600
    run = with_overrides(run, **flags)
    train_w, val_w = _windows(windows, run.clusters)
    with _bar("stages") as bar:  # stages of very different lengths: elapsed time, no estimate
        task = bar.add_task("train scheduler (expert choice)", total=None)

        def say(message: str) -> None:
            console.print(message, highlight=False)
            bar.update(task, advance=1, note=message)

        report = train_expert_scheduler(out, run, extra_problems=train_w, val_problems=val_w, progress=say)
    console.print(f"wrote {report.out_path} in {report.wall_s:.0f} s; {report.gate.note()}")
