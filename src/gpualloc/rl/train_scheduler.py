"""Train the DQN scheduling agent: the entry point behind ``gpualloc train scheduler``.

Episodes are traces on one cluster: generated ones (a job count and a load drawn per episode, so
episodes are short and varied) or a given list (any trace reader's output). Every ``eval_every``
steps the greedy agent schedules held-out traces through the ``dqn`` policy and ``simulate()`` (the
path it is used by), its average JCT is compared with the heuristics on the same traces, and the
checkpoint with the lowest average JCT is kept. A learning-curve PNG is written at the end.

The agent is the shared DQN (:mod:`gpualloc.rl.dqn`) with the design's network: a CNN over the
GPU-utilisation grid plus two fully connected layers, Adam at 1e-4, epsilon-greedy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from gpualloc.errors import AgentError
from gpualloc.parallel import Executor, SerialExecutor
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.rl.dqn import DQNAgent, DQNConfig, TrainLog, train
from gpualloc.rl.dqn.distributed import train_distributed
from gpualloc.rl.envs.scheduling_env import SchedulingEnv
from gpualloc.scheduling import metrics
from gpualloc.rl.features import FeatureLayout, FeatureScaler, JobRequests
from gpualloc.scheduling.policies import make_policy
from gpualloc.rl.sched_policy import DQNPolicy, scheduler_extra
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate

__all__ = ["DEFAULT_CONFIG", "EvalPoint", "EvalRun", "eval_one", "SchedulerTrainReport", "evaluate_policies", "held_out_traces",
           "train_scheduler"]

DEFAULT_CONFIG = DQNConfig(
    backbone="cnn", lr=1e-4, gamma=0.99, batch_size=64, buffer_size=50_000, learning_starts=2_000,
    train_freq=2, gradient_steps=1, target_update_interval=250, eps_start=1.0, eps_end=0.05,
    eps_decay_steps=20_000, hidden=(128, 128), cnn_channels=(16, 16), cnn_strides=(1, 2), seed=0,
)
"""The bundled agent's hyper-parameters: the design's CNN (two 3x3 convolutions, the second with
stride 2) plus two fully connected layers of 128, Adam at 1e-4, epsilon-greedy from 1 to 0.05 over
20k steps. The target network is copied every 250 gradient steps (not 1,000): with rewards that
arrive every step, values must propagate over ~100 steps within a training budget of 10^5 steps."""

DEFAULT_EVAL_SEEDS = (1000, 1001, 1002, 1003, 1004)
"""Seeds of the held-out evaluation traces (training traces draw 31-bit seeds from the run's seed)."""


@dataclass(frozen=True)
class EvalPoint:
    """One periodic evaluation: the greedy agent's average JCT over the held-out traces."""

    step: int
    avg_jct_s: float
    per_trace_s: tuple[float, ...]


@dataclass(frozen=True)
class SchedulerTrainReport:
    """What :func:`train_scheduler` did.

    Attributes:
        out_path: the best checkpoint (lowest held-out average JCT).
        plot_path: the learning-curve PNG (None when not written).
        cluster: cluster name.
        steps: environment steps taken.
        episodes: training episodes finished.
        wall_s: wall time of the whole call (evaluations included).
        evals: the periodic evaluations, in order.
        best: the evaluation whose checkpoint was kept.
        baselines: heuristic name -> average JCT over the same held-out traces.
        losses: TD losses (one per gradient step).
        episode_returns: return of each training episode.
    """

    out_path: Path
    plot_path: Path | None
    cluster: str
    steps: int
    episodes: int
    wall_s: float
    evals: tuple[EvalPoint, ...]
    best: EvalPoint
    baselines: dict[str, float]
    losses: tuple[float, ...] = field(repr=False, default=())
    episode_returns: tuple[float, ...] = field(repr=False, default=())

    def improvement(self, baseline: str) -> float:
        """Relative reduction of average JCT of the kept agent against ``baseline`` (0.3 = 30% lower)."""
        return 1.0 - self.best.avg_jct_s / self.baselines[baseline]


def held_out_traces(cluster: ClusterSpec, seeds: Sequence[int] = DEFAULT_EVAL_SEEDS, *, num_jobs: int = 300,
                    load: float = 0.8) -> list[Trace]:
    """The evaluation traces: one generated trace per seed."""
    return [generate(num_jobs, cluster, load, seed=s) for s in seeds]


def evaluate_policies(cluster: ClusterSpec, traces: Sequence[Trace], policies: Mapping[str, Callable[[Trace], object]]
                      ) -> dict[str, tuple[float, ...]]:
    """Average JCT of each policy on each trace (``policies``: name -> factory given the trace)."""
    out = {}
    for name, factory in policies.items():
        out[name] = tuple(metrics.avg_jct_s(simulate(t, cluster, factory(t), drop_unplaceable=True,
                                                     timeline=False)) for t in traces)
    return out


@dataclass(frozen=True)
class EvalRun:
    """One held-out evaluation: ``policy`` (a registry name; ``dqn`` loads the checkpoint ``agent``)
    on ``trace``. Small and picklable, so any :class:`~gpualloc.parallel.Executor` runs it."""

    cluster: ClusterSpec
    trace: Trace
    policy: str
    agent: str | None = None


def eval_one(run: EvalRun) -> float:
    """Average JCT of ``run`` (what :func:`evaluate_policies` computes, for one policy and trace)."""
    if run.policy == "dqn":
        policy = DQNPolicy(run.agent, requests=JobRequests.from_trace(run.trace))
    else:
        policy = make_policy(run.policy)
    return metrics.avg_jct_s(simulate(run.trace, run.cluster, policy, drop_unplaceable=True, timeline=False))


def train_scheduler(
    cluster: ClusterSpec | str,
    out_path: str | Path,
    *,
    steps: int = 80_000,
    seed: int = 0,
    traces: Sequence[Trace] | None = None,
    num_jobs: tuple[int, int] = (100, 300),
    loads: tuple[float, float] = (0.5, 1.0),
    eval_traces: Sequence[Trace] | None = None,
    eval_seeds: Sequence[int] = DEFAULT_EVAL_SEEDS,
    eval_jobs: int = 300,
    eval_load: float = 0.8,
    eval_every: int = 5_000,
    baselines: Sequence[str] = ("fcfs", "static-affinity", "sjf"),
    config: DQNConfig | None = None,
    layout: FeatureLayout | None = None,
    env_options: Mapping | None = None,
    plot_path: str | Path | None = None,
    progress: Callable[[int, int, dict], None] | None = None,
    threads: int | None = 1,
    executor: Executor | None = None,
    actors: int = 1,
    round_steps: int = 1_000,
) -> SchedulerTrainReport:
    """Train a scheduling agent on ``cluster`` and keep the best checkpoint at ``out_path``.

    Args:
        cluster: cluster spec or name.
        out_path: where the best checkpoint goes (``.pt``).
        steps: environment steps.
        seed: seeds the agent (initialisation, exploration: ``config.seed`` is replaced by it) and the
            training episodes and replay sampling.
        traces: training traces; None generates one per episode (``num_jobs``, ``loads``).
        num_jobs, loads: ``(low, high)`` ranges of the generated training traces.
        eval_traces: held-out traces; default one per ``eval_seeds`` seed, ``eval_jobs`` jobs at
            ``eval_load``.
        eval_every: steps between evaluations (one more runs at the end).
        baselines: registry names of the heuristics to compare with on the held-out traces.
        config: DQN hyper-parameters; default :data:`DEFAULT_CONFIG`.
        layout: tensor sizes; default :class:`FeatureLayout()`.
        env_options: other :class:`SchedulingEnv` keyword arguments (``idle_weight``,
            ``slot_order``, ``work_conserving``, ``mix``, ``sim_options``, ...).
        plot_path: learning-curve PNG; default ``out_path`` with suffix ``.png``.
        progress: called as ``progress(step, steps, stats)`` every 100 steps and after each
            evaluation; ``stats`` has ``episodes``, ``epsilon``, ``last_return``, ``eval_avg_jct_s``
            and ``best_avg_jct_s`` (None until known).
        threads: torch intra-op threads while training (restored after); None leaves torch's
            setting. One thread is fastest for these small networks: more threads cost start-up
            and contend with the simulator.
        executor: where the held-out runs go (baselines once, the agent at every evaluation: one
            item per trace and policy); default in this process. The agent reaches the workers as a
            checkpoint written next to ``out_path`` (``<stem>.eval.pt``, removed at the end), so on a
            multi-node Ray cluster ``out_path`` must be on storage every node reads. Results do not
            depend on the executor.
        actors: 1 collects experience in this process, step by step (:func:`~gpualloc.rl.dqn.train`);
            more runs that many rollout tasks per round on ``executor``
            (:func:`~gpualloc.rl.dqn.distributed.train_distributed`), each with its own simulator,
            and keeps gradient steps here. Evaluations then happen at the first round boundary
            past each multiple of ``eval_every``.
        round_steps: environment steps per round, shared by the actors (``actors > 1`` only).

    Returns:
        The :class:`SchedulerTrainReport`.

    Raises:
        AgentError: bad arguments.
    """
    t0 = time.perf_counter()
    spec = load_cluster(cluster) if isinstance(cluster, str) else cluster
    if steps < 1 or eval_every < 1 or actors < 1:
        raise AgentError(f"train_scheduler: steps ({steps}), eval_every ({eval_every}) and actors ({actors}) "
                         "must be positive")
    out_path = Path(out_path)
    plot_path = out_path.with_suffix(".png") if plot_path is None else Path(plot_path)
    config = replace(config or DEFAULT_CONFIG, seed=seed)
    layout = layout or FeatureLayout()
    options = dict(env_options or {})

    # the normalisation statistics come from the training traces (or traces like them)
    if traces is not None:
        fit_on = list(traces)
    else:
        mid = 0.5 * (loads[0] + loads[1])
        fit_on = [generate(num_jobs[1], spec, mid, seed=seed + k, mix=options.get("mix")) for k in range(8)]
    scaler = FeatureScaler.fit(fit_on)
    env = SchedulingEnv(spec, traces, num_jobs=num_jobs, loads=loads, layout=layout, scaler=scaler, **options)
    agent = DQNAgent(env.observation_space, env.action_space, config)
    agent.extra = scheduler_extra(layout, scaler, slot_order=env.slot_order, work_conserving=env.work_conserving,
                                  idle_weight=env.idle_weight, cluster=spec.name, trained_steps=steps, seed=seed)

    held_out = list(eval_traces) if eval_traces is not None else held_out_traces(
        spec, eval_seeds, num_jobs=eval_jobs, load=eval_load)
    executor = executor or SerialExecutor()
    eval_ckpt = out_path.with_name(f"{out_path.stem}.eval.pt")
    base = executor.map(eval_one, [EvalRun(spec, t, name) for name in baselines for t in held_out])
    base_avg = {name: float(np.mean(base[k * len(held_out):(k + 1) * len(held_out)]))
                for k, name in enumerate(baselines)}

    evals: list[EvalPoint] = []
    best: list[EvalPoint] = []
    stats = {"episodes": 0, "epsilon": 1.0, "last_return": None, "eval_avg_jct_s": None, "best_avg_jct_s": None}

    def evaluate_now(step: int) -> None:
        agent.save(eval_ckpt)
        per = tuple(executor.map(eval_one, [EvalRun(spec, t, "dqn", str(eval_ckpt)) for t in held_out]))
        point = EvalPoint(step, float(np.mean(per)), per)
        evals.append(point)
        if not best or point.avg_jct_s < best[0].avg_jct_s:
            best[:] = [point]
            agent.save(out_path)
        stats["eval_avg_jct_s"] = point.avg_jct_s
        stats["best_avg_jct_s"] = best[0].avg_jct_s

    next_eval = [eval_every]

    def callback(step: int, log: TrainLog) -> None:
        evaluated = step >= next_eval[0]
        if evaluated:
            evaluate_now(step)
            next_eval[0] = (step // eval_every + 1) * eval_every
        if step % 100 == 0 or evaluated or actors > 1:
            stats["episodes"] = len(log.episode_returns)
            stats["epsilon"] = agent.epsilon
            stats["last_return"] = log.episode_returns[-1] if log.episode_returns else None
            if progress is not None:
                progress(step, steps, dict(stats))

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        if actors == 1:
            log = train(env, agent, steps, seed=seed, callback=callback)
        else:
            env_fn = partial(SchedulingEnv, spec, traces, num_jobs=num_jobs, loads=loads, layout=layout,
                             scaler=scaler, **options)
            log = train_distributed(env_fn, agent, steps, seed=seed, executor=executor, actors=actors,
                                    round_steps=round_steps, callback=callback)
        if not evals or evals[-1].step != log.steps:
            evaluate_now(log.steps)
            if progress is not None:
                progress(log.steps, steps, dict(stats))
    finally:
        torch.set_num_threads(before)
        eval_ckpt.unlink(missing_ok=True)
    report = SchedulerTrainReport(
        out_path=out_path, plot_path=plot_path, cluster=spec.name, steps=log.steps,
        episodes=len(log.episode_returns), wall_s=0.0, evals=tuple(evals), best=best[0], baselines=base_avg,
        losses=tuple(log.losses), episode_returns=tuple(log.episode_returns))
    if plot_path is not None:
        plot_learning_curve(report, log, plot_path)
    return replace(report, wall_s=time.perf_counter() - t0)


def plot_learning_curve(report: SchedulerTrainReport, log: TrainLog, path: str | Path) -> Path:
    """Two panels: training episode returns (and their moving average) against steps; held-out
    average JCT of the agent at each evaluation, with the heuristics as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ends = np.cumsum(log.episode_lengths)
    returns = np.asarray(log.episode_returns, dtype=float)
    if len(returns):
        ax1.plot(ends, returns, ".", alpha=0.3, label="episode")
        k = max(1, len(returns) // 20)
        smooth = np.convolve(returns, np.ones(k) / k, mode="valid")
        ax1.plot(ends[k - 1:], smooth, "-", label=f"moving mean ({k})")
        ax1.legend()
    ax1.set_xlabel("environment step")
    ax1.set_ylabel("episode return")
    ax1.set_title("training episodes")
    steps = [e.step for e in report.evals]
    values = [e.avg_jct_s / 3600 for e in report.evals]
    ax2.plot(steps, values, "o-", label="dqn (greedy)")
    for k, (name, v) in enumerate(report.baselines.items()):
        ax2.axhline(v / 3600, linestyle="--", color=f"C{k + 1}", label=name)
        values.append(v / 3600)
    ax2.set_xlabel("environment step")
    ax2.set_ylabel("average JCT, h (held-out traces)")
    if values and min(values) > 0 and max(values) / min(values) > 10:
        ax2.set_yscale("log")
    ax2.set_title(f"held-out evaluation on {report.cluster}")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


