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
from typing import Any

import numpy as np
import torch

from gpualloc.errors import AgentError, atomic_output
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.parallel import Executor, SerialExecutor
from gpualloc.rl.dqn import DQNAgent, DQNConfig, TrainLog, train
from gpualloc.rl.dqn.distributed import train_distributed
from gpualloc.rl.envs.scheduling_env import SchedulingEnv
from gpualloc.rl.expert_choice import DEFAULT_EXPERTS
from gpualloc.rl.features import FeatureLayout, FeatureScaler, JobRequests
from gpualloc.rl.sched_policy import DQNPolicy, scheduler_extra
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import POLICIES, make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate

__all__ = ["DEFAULT_CONFIG", "EXPERT_CONFIG", "EvalPoint", "EvalRun", "ExpertTrainReport", "ExpertTraining",
           "SchedulerTrainReport", "SchedulerTraining", "agent_jcts", "baseline_jcts", "expert_jcts",
           "train_expert_scheduler",
           "eval_one", "evaluate_policies", "fit_scaler", "held_out_traces", "train_scheduler"]

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


@dataclass(frozen=True)
class SchedulerTraining:
    """Settings of one :func:`train_scheduler` run (everything but the cluster, the output and the
    run-time services ``progress`` and ``executor``)."""

    steps: int = 80_000
    """Environment steps."""
    seed: int = 0
    """Seeds the agent (initialisation, exploration: ``config.seed`` is replaced by it), the training
    episodes and replay sampling."""
    traces: Sequence[Trace] | None = None
    """Training traces; None generates one per episode (``num_jobs``, ``loads``)."""
    num_jobs: tuple[int, int] = (100, 300)
    """``(low, high)`` job counts of the generated training traces."""
    loads: tuple[float, float] = (0.5, 1.0)
    """``(low, high)`` loads of the generated training traces."""
    eval_traces: Sequence[Trace] | None = None
    """Held-out traces; default one per ``eval_seeds`` seed, ``eval_jobs`` jobs at ``eval_load``."""
    eval_seeds: Sequence[int] = DEFAULT_EVAL_SEEDS
    """Seeds of the default held-out traces."""
    eval_jobs: int = 300
    """Jobs per default held-out trace."""
    eval_load: float = 0.8
    """Load of the default held-out traces."""
    eval_every: int = 5_000
    """Steps between evaluations (one more runs at the end)."""
    baselines: Sequence[str] = ("fcfs", "static-affinity", "sjf")
    """Registry names of the heuristics to compare with on the held-out traces."""
    config: DQNConfig | None = None
    """DQN hyper-parameters; default :data:`DEFAULT_CONFIG`."""
    layout: FeatureLayout | None = None
    """Tensor sizes; default :class:`FeatureLayout()`."""
    env_options: Mapping | None = None
    """Other :class:`SchedulingEnv` keyword arguments (``idle_weight``, ``slot_order``,
    ``work_conserving``, ``mix``, ``sim_options``, ...)."""
    plot_path: str | Path | None = None
    """Learning-curve PNG; default ``out_path`` with suffix ``.png``."""
    threads: int | None = 1
    """Torch intra-op threads while training (restored after); None leaves torch's setting. One thread
    is fastest for these small networks: more threads cost start-up and contend with the simulator."""
    actors: int = 1
    """1 collects experience in this process, step by step (:func:`~gpualloc.rl.dqn.train`); more runs
    that many rollout tasks per round on the executor
    (:func:`~gpualloc.rl.dqn.distributed.train_distributed`), each with its own simulator, and keeps
    gradient steps here. Evaluations then happen at the first round boundary past each multiple of
    ``eval_every``."""
    round_steps: int = 1_000
    """Environment steps per round, shared by the actors (``actors > 1`` only)."""

    def check(self) -> None:
        """Raises AgentError on non-positive ``steps``, ``eval_every`` or ``actors``."""
        if self.steps < 1 or self.eval_every < 1 or self.actors < 1:
            raise AgentError(f"train_scheduler: steps ({self.steps}), eval_every ({self.eval_every}) and actors "
                             f"({self.actors}) must be positive")


def fit_scaler(spec: ClusterSpec, run: SchedulerTraining) -> FeatureScaler:
    """Normalisation statistics from the training traces (or, when generated, traces like them)."""
    if run.traces is not None:
        return FeatureScaler.fit(list(run.traces))
    mid = 0.5 * (run.loads[0] + run.loads[1])
    mix = dict(run.env_options or {}).get("mix")
    return FeatureScaler.fit([generate(run.num_jobs[1], spec, mid, seed=run.seed + k, mix=mix) for k in range(8)])


def baseline_jcts(spec: ClusterSpec, held_out: Sequence[Trace], names: Sequence[str],
                  executor: Executor) -> dict[str, float]:
    """Average JCT of each heuristic over the held-out traces (one executor item per trace and policy)."""
    per = executor.map(eval_one, [EvalRun(spec, t, name) for name in names for t in held_out])
    n = len(held_out)
    return {name: float(np.mean(per[k * n:(k + 1) * n])) for k, name in enumerate(names)}


class _Evaluator:
    """Periodic held-out evaluation during training: keeps the best checkpoint and the progress stats.

    The agent reaches the executor's workers as a checkpoint file (``eval_ckpt``), so results do not
    depend on where they run.
    """

    def __init__(self, agent: DQNAgent, spec: ClusterSpec, held_out: Sequence[Trace], executor: Executor,
                 out_path: Path, eval_every: int, total_steps: int, report_every_step: bool,
                 progress: Callable[[int, int, dict], None] | None) -> None:
        self.agent, self.spec, self.held_out, self.executor = agent, spec, list(held_out), executor
        self.out_path = out_path
        self.eval_ckpt = out_path.with_name(f"{out_path.stem}.eval.pt")
        self.eval_every, self.total_steps = eval_every, total_steps
        self.report_every_step = report_every_step
        self.progress = progress
        self.next_eval = eval_every
        self.evals: list[EvalPoint] = []
        self.best: EvalPoint | None = None
        self.stats: dict = {"episodes": 0, "epsilon": 1.0, "last_return": None, "eval_avg_jct_s": None,
                            "best_avg_jct_s": None}

    def evaluate(self, step: int) -> None:
        """Evaluate the greedy agent now; save it to ``out_path`` when it is the best so far."""
        self.agent.save(self.eval_ckpt)
        runs = [EvalRun(self.spec, t, "dqn", str(self.eval_ckpt)) for t in self.held_out]
        per = tuple(self.executor.map(eval_one, runs))
        point = EvalPoint(step, float(np.mean(per)), per)
        self.evals.append(point)
        if self.best is None or point.avg_jct_s < self.best.avg_jct_s:
            self.best = point
            self.agent.save(self.out_path)
        self.stats["eval_avg_jct_s"] = point.avg_jct_s
        self.stats["best_avg_jct_s"] = self.best.avg_jct_s

    def __call__(self, step: int, log: TrainLog) -> None:
        """The training loop's callback: evaluate past each multiple of ``eval_every``, report progress."""
        evaluated = step >= self.next_eval
        if evaluated:
            self.evaluate(step)
            self.next_eval = (step // self.eval_every + 1) * self.eval_every
        if step % 100 == 0 or evaluated or self.report_every_step:
            self.stats["episodes"] = len(log.episode_returns)
            self.stats["epsilon"] = self.agent.epsilon
            self.stats["last_return"] = log.episode_returns[-1] if log.episode_returns else None
            self._report(step)

    def finish(self, steps: int) -> None:
        """The last evaluation, at the final step, unless one just ran."""
        if not self.evals or self.evals[-1].step != steps:
            self.evaluate(steps)
            self._report(steps)

    def _report(self, step: int) -> None:
        if self.progress is not None:
            self.progress(step, self.total_steps, dict(self.stats))


def train_scheduler(cluster: ClusterSpec | str, out_path: str | Path, training: SchedulerTraining | None = None, *,
                    progress: Callable[[int, int, dict], None] | None = None, executor: Executor | None = None,
                    **overrides: Any) -> SchedulerTrainReport:
    """Train a scheduling agent on ``cluster`` and keep the best checkpoint at ``out_path``.

    Args:
        cluster: cluster spec or name.
        out_path: where the best checkpoint goes (``.pt``).
        training: the run's settings (:class:`SchedulerTraining`); default its defaults.
        progress: called as ``progress(step, steps, stats)`` every 100 steps and after each
            evaluation; ``stats`` has ``episodes``, ``epsilon``, ``last_return``, ``eval_avg_jct_s``
            and ``best_avg_jct_s`` (None until known).
        executor: where the held-out runs go (baselines once, the agent at every evaluation: one
            item per trace and policy) and, with ``actors > 1``, the rollouts; default in this
            process. The agent reaches the workers as a checkpoint written next to ``out_path``
            (``<stem>.eval.pt``, removed at the end), so on a multi-node Ray cluster ``out_path`` must
            be on storage every node reads. Results do not depend on the executor.
        **overrides: fields of :class:`SchedulerTraining` replacing those of ``training``.

    Returns:
        The :class:`SchedulerTrainReport`.

    Raises:
        AgentError: bad settings (an unknown one, or a non-positive count).
    """
    t0 = time.perf_counter()
    try:
        run = replace(training or SchedulerTraining(), **overrides)
    except TypeError as err:
        raise AgentError(f"train_scheduler: {err}") from err
    run.check()
    spec = load_cluster(cluster) if isinstance(cluster, str) else cluster
    out_path = Path(out_path)
    plot_path = out_path.with_suffix(".png") if run.plot_path is None else Path(run.plot_path)
    layout = run.layout or FeatureLayout()
    options = dict(run.env_options or {})
    scaler = fit_scaler(spec, run)
    env_fn = partial(SchedulingEnv, spec, run.traces, num_jobs=run.num_jobs, loads=run.loads, layout=layout,
                     scaler=scaler, **options)
    env = env_fn()
    agent = DQNAgent(env.observation_space, env.action_space, replace(run.config or DEFAULT_CONFIG, seed=run.seed))
    agent.extra = scheduler_extra(layout, scaler, slot_order=env.slot_order, work_conserving=env.work_conserving,
                                  idle_weight=env.idle_weight, cluster=spec.name, trained_steps=run.steps,
                                  seed=run.seed)

    held_out = list(run.eval_traces) if run.eval_traces is not None else held_out_traces(
        spec, run.eval_seeds, num_jobs=run.eval_jobs, load=run.eval_load)
    executor = executor or SerialExecutor()
    base_avg = baseline_jcts(spec, held_out, run.baselines, executor)
    evaluator = _Evaluator(agent, spec, held_out, executor, out_path, run.eval_every, run.steps,
                           report_every_step=run.actors > 1, progress=progress)

    before = torch.get_num_threads()
    if run.threads is not None:
        torch.set_num_threads(run.threads)
    try:
        if run.actors == 1:
            log = train(env, agent, run.steps, seed=run.seed, callback=evaluator)
        else:
            log = train_distributed(env_fn, agent, run.steps, seed=run.seed, executor=executor, actors=run.actors,
                                    round_steps=run.round_steps, callback=evaluator)
        evaluator.finish(log.steps)
    finally:
        torch.set_num_threads(before)
        evaluator.eval_ckpt.unlink(missing_ok=True)
    assert evaluator.best is not None  # finish() evaluated at least once
    report = SchedulerTrainReport(
        out_path=out_path, plot_path=plot_path, cluster=spec.name, steps=log.steps,
        episodes=len(log.episode_returns), wall_s=0.0, evals=tuple(evaluator.evals), best=evaluator.best,
        baselines=base_avg, losses=tuple(log.losses), episode_returns=tuple(log.episode_returns))
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
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=90)
    plt.close(fig)
    return path




# ------------------------------------------------------------------------------ expert-choice agent

EXPERT_CONFIG = DQNConfig(
    backbone="mlp", hidden=(64, 64), lr=1e-4, gamma=0.99, batch_size=64, buffer_size=50_000, learning_starts=500,
    train_freq=4, gradient_steps=1, target_update_interval=500, eps_start=0.1, eps_end=0.02, eps_decay_steps=5_000,
    seed=0,
)
"""The expert-choice agent: a small MLP (the observation has ~50 numbers; a decision takes well under
1 ms), double DQN with a target network copied every 500 gradient steps. Exploration starts at 0.1,
not 1: fine-tuning begins from the cloned teacher and must not forget it at once."""

LEVEL_ROUND_S = 360.0
"""The panel's round below ``oracle`` (Gavel's): the default ``dqn`` policy is created before the run's
level is known, so its round must be the same at every level (the oracle agent's teacher, ``gavel-srtf``,
has this one)."""

TRAIN_CLUSTERS = ("adlro16", "8xV100+4xP100+4xK80", "4xA100+4xV100+8xT4")
"""Clusters the bundled agent trains on; ``16xV100+8xT4+8xA100`` is kept unseen for evaluation."""


@dataclass(frozen=True)
class ExpertTraining:
    """Settings of :func:`train_expert_scheduler`."""

    clusters: tuple[str, ...] = TRAIN_CLUSTERS
    """Clusters of the generated training and validation traces."""
    experts: tuple[str, ...] = DEFAULT_EXPERTS
    """The heuristics the agent chooses among (registry names)."""
    seed: int = 0
    """Seeds the agent, the traces and the episodes."""
    train_traces: int = 12
    """Generated training traces (clusters in turn)."""
    num_jobs: tuple[int, int] = (40, 100)
    """``(low, high)`` job counts of generated traces."""
    loads: tuple[float, float] = (0.5, 1.1)
    """``(low, high)`` loads of generated training traces."""
    val_loads: tuple[float, ...] = (0.6, 1.0)
    """Loads of the validation traces (one per cluster and load, 80 jobs, seeds 20,000+)."""
    extra_problems: tuple = ()
    """More ``(cluster spec, trace)`` training problems (real-trace windows)."""
    val_problems: tuple = ()
    """More ``(cluster spec, trace)`` validation problems (held-out real-trace windows)."""
    guide: str = "teacher"
    """Whose choices cloning imitates: ``teacher`` (one expert everywhere) or ``best`` (on each
    training trace, the expert with the lowest average JCT on it: a per-workload oracle)."""
    bc_rounds: int = 2
    """DAgger rounds (round 0 follows the teacher)."""
    bc_episodes: int | None = None
    """Episodes per DAgger round (None: every training problem once per round)."""
    bc_epochs: int = 8
    """Passes over the gathered states per DAgger round."""
    bc_td_weight: float = 0.0
    """Weight of DQfD's TD term in cloning (0: pure large-margin classification; the rewards of a
    backlogged real-trace window are orders of magnitude above a synthetic trace's and would drown the
    classification term)."""
    steps: int = 6_000
    """DQN fine-tuning environment steps (0: behaviour cloning only)."""
    config: DQNConfig | None = None
    """DQN settings; default :data:`EXPERT_CONFIG`."""
    hd_dim: int = 0
    """Dimension of the hyperdimensional encoding appended to the observation (0: plain features)."""
    rollout_points: int = 0
    """Choice points per training problem labelled by rollout (:func:`gpualloc.rl.rollouts.label_points`)
    and trained on after cloning (0: off); the result is kept only when it beats the clone on validation."""
    rollout_horizon_s: float | None = 6 * 3600.0
    """Simulated seconds of each rollout (None: to the end of the trace)."""
    rollout_base: str | None = None
    """Expert followed after the forced decision (default the teacher)."""
    rollout_follow_s: float = 0.0
    """Seconds the forced expert keeps deciding before the base takes over (0: one decision)."""
    rollout_min_gain: float = 0.01
    """Another expert replaces the teacher's label only when cheaper by more than this share."""
    knowledge: str = "oracle"
    """The information level the experts and the agent decide at (issue 36): below ``oracle`` the
    experts must be able to run there (``blind``: none that needs durations), prediction-driven experts
    (``srtf-pred``, ...) are allowed, the observation reads a duration predictor instead of remaining
    work, and the panel's round is fixed to :data:`LEVEL_ROUND_S`. The experts' and the agent's
    validation runs are at this level."""


@dataclass(frozen=True)
class ExpertTrainReport:
    """What :func:`train_expert_scheduler` did (JCTs are means over the validation traces)."""

    out_path: Path
    teacher: str
    expert_jct_s: dict[str, float]
    """Each expert's mean average JCT on the validation traces."""
    scores: dict[str, float]
    """Mean per-validation-trace ratio of average JCT to the best expert's on that trace, for each
    expert and for ``cloned``, ``rollout``, ``fine-tuned`` when run (1.0 = the per-trace best)."""
    bc_jct_s: float
    tuned_jct_s: float | None
    kept: str
    gate: Any
    wall_s: float
    agreement: tuple[float, ...]


def _problems(run: ExpertTraining) -> tuple[list, list]:
    """Training and validation ``(cluster, trace)`` pairs (validation seeds never used in training)."""
    specs = [load_cluster(c) for c in run.clusters]
    rng = np.random.default_rng(run.seed)
    train_p = []
    for k in range(run.train_traces):
        spec = specs[k % len(specs)]
        n = int(rng.integers(run.num_jobs[0], run.num_jobs[1] + 1))
        train_p.append((spec, generate(n, spec, float(rng.uniform(*run.loads)), seed=int(rng.integers(10_000)))))
    val = [(spec, generate(80, spec, load, seed=20_000 + i)) for i, (spec, load) in
           enumerate((s, ld) for s in specs for ld in run.val_loads)]
    return train_p + list(run.extra_problems), val + list(run.val_problems)


def _jct(problem, policy, knowledge: str = "oracle") -> float:
    spec, trace = problem
    return metrics.avg_jct_s(simulate(trace, spec, policy, drop_unplaceable=True, timeline=False,
                                      knowledge=knowledge))


def expert_jcts(problems: Sequence, experts: Sequence[str], knowledge: str = "oracle") -> dict[str, list[float]]:
    """Average JCT of each expert heuristic alone on each problem, deciding at ``knowledge``."""
    return {name: [_jct(p, make_policy(name), knowledge) for p in problems] for name in experts}


def agent_jcts(agent: DQNAgent, problems: Sequence, experts: Sequence[str], teacher: int, encoder=None,
               knowledge: str = "oracle", round_s: float | None = None, seed: int = 0) -> list[float]:
    """Average JCT of the greedy expert-choice agent (no gate) on each problem."""
    from gpualloc.rl.sched_policy import ExpertChoicePolicy

    return [_jct(p, ExpertChoicePolicy(agent, experts, teacher, encoder=encoder, knowledge=knowledge,
                                       round_s=round_s, seed=seed), knowledge) for p in problems]


def _guide(jcts: np.ndarray, teacher: int, min_gain: float) -> int:
    """The expert to imitate on one trace: the one with the lowest average JCT there, or the teacher
    unless that one is better by more than ``min_gain`` of the teacher's JCT."""
    best = int(np.argmin(jcts))
    return best if jcts[teacher] - jcts[best] > min_gain * jcts[teacher] else teacher


def _check_training(run: ExpertTraining) -> None:
    """One-line AgentErrors for bad settings, before any simulation (training takes minutes)."""
    from gpualloc.scheduling.knowledge import check_knowledge
    from gpualloc.scheduling.policies import needs_durations

    if (run.steps < 0 or run.bc_rounds < 1 or (run.bc_episodes is not None and run.bc_episodes < 1)
            or not run.experts or run.guide not in ("teacher", "best")):
        raise AgentError("train_expert_scheduler: steps must be >= 0, bc_rounds, bc_episodes and experts positive, "
                         "guide 'teacher' or 'best'")
    check_knowledge(run.knowledge, "train_expert_scheduler: knowledge")
    heuristics = POLICIES.names("heuristic")
    if run.knowledge != "oracle":  # the prediction-driven policies (learned, but from the run's own jobs)
        heuristics = [*heuristics, *(n for n in POLICIES.names("learned") if n.endswith("-pred"))]
    for name in (*run.experts, *([] if run.rollout_base is None else [run.rollout_base])):
        if name not in heuristics:  # checked before any simulation: training takes minutes
            raise AgentError(f"train_expert_scheduler: {name!r} is not an expert of the panel; experts are "
                             f"heuristics ({', '.join(heuristics)}) and the rollout base one of --experts")
        if run.knowledge == "blind" and needs_durations(name):
            raise AgentError(f"train_expert_scheduler: expert {name!r} needs durations, which knowledge 'blind' "
                             f"hides (use {name}-pred)")
    if run.knowledge != "oracle" and run.rollout_points:
        raise AgentError("train_expert_scheduler: rollout labels run at oracle only (knowledge "
                         f"{run.knowledge!r}: use rollout_points 0)")


def train_expert_scheduler(out_path: str | Path, training: ExpertTraining | None = None, *,
                           progress: Callable[[str], None] | None = None, **overrides: Any) -> ExpertTrainReport:
    """Train the expert-choice agent: pick the teacher, clone it (DAgger), fine-tune with DQN, gate.

    1. Teacher: the expert with the lowest mean ratio of average JCT to the per-trace best expert's
       on the validation traces (:func:`~gpualloc.rl.expert_choice.mean_ratio`); it replaces invalid
       choices and is the fallback of a failed gate.
    2. Behaviour cloning (:func:`gpualloc.rl.imitation.clone_teacher`) of the teacher, or with
       ``guide="best"`` of each training trace's best expert (so the agent learns which expert
       suits which workload).
    3. Optionally, rollout labels (:mod:`gpualloc.rl.rollouts`, ``rollout_points > 0``) and DQN
       fine-tuning (double DQN, target network, ``steps > 0``); each result is kept only when it
       scores better on the validation traces than what it started from.
    4. Gate (:func:`gpualloc.rl.expert_choice.gate`): agent vs teacher on the validation traces; the
       verdict is saved with the agent, and a failed gate makes the ``dqn`` policy run the teacher.

    Raises:
        AgentError: bad settings.
    """
    from gpualloc.rl.envs.expert_env import ExpertChoiceEnv
    from gpualloc.rl.expert_choice import gate, mean_ratio
    from gpualloc.rl.imitation import clone_teacher
    from gpualloc.rl.sched_policy import expert_extra

    t0 = time.perf_counter()
    try:
        run = replace(training or ExpertTraining(), **overrides)
    except TypeError as err:
        raise AgentError(f"train_expert_scheduler: {err}") from err
    _check_training(run)
    level = {"knowledge": run.knowledge, "round_s": None if run.knowledge == "oracle" else LEVEL_ROUND_S,
             "seed": run.seed}
    if run.rollout_base is not None and run.rollout_base not in run.experts:
        raise AgentError(f"train_expert_scheduler: rollout base {run.rollout_base!r} is not one of the experts "
                         f"({', '.join(run.experts)})")
    say = progress or (lambda _msg: None)
    out_path = Path(out_path)
    train_p, val = _problems(run)
    say(f"{len(train_p)} training and {len(val)} validation traces; running the experts on validation")
    per_expert = expert_jcts(val, run.experts, run.knowledge)
    oracle = np.min(np.array([per_expert[e] for e in run.experts]), axis=0)

    def score(jcts: Sequence[float]) -> float:
        return mean_ratio(jcts, oracle)

    scores = {e: score(per_expert[e]) for e in run.experts}
    means = {k: float(np.mean(v)) for k, v in per_expert.items()}
    teacher = min(range(len(run.experts)), key=lambda i: (scores[run.experts[i]], i))
    say(f"teacher: {run.experts[teacher]} ({scores[run.experts[teacher]]:.3f} x the per-trace best expert)")
    guides = None
    if run.guide == "best":
        on_train = np.array([v for v in expert_jcts(train_p, run.experts, run.knowledge).values()])
        guides = [_guide(col, teacher, run.rollout_min_gain) for col in on_train.T]
        say("guides: " + ", ".join(f"{run.experts[g]} {guides.count(g)}" for g in sorted(set(guides))))
    encoder, hd = None, None
    if run.hd_dim:
        from gpualloc.rl.expert_choice import HDFeatures

        encoder = HDFeatures(out_dim=run.hd_dim, seed=run.seed)
        hd = encoder.to_dict()
    env = ExpertChoiceEnv(train_p, experts=run.experts, teacher=teacher, guides=guides, encoder=encoder,
                          encoder_dim=run.hd_dim, **level)
    env.reset(seed=run.seed)
    config = replace(run.config or EXPERT_CONFIG, seed=run.seed)
    agent = DQNAgent(env.observation_space, env.action_space, config)
    clone = clone_teacher(agent, env, rounds=run.bc_rounds, episodes=run.bc_episodes, epochs=run.bc_epochs,
                          td_weight=run.bc_td_weight, seed=run.seed)
    bc = agent_jcts(agent, val, run.experts, teacher, encoder, **level)
    scores["cloned"] = score(bc)
    say(f"cloned: agreement {clone.agreement[-1]:.1%}, validation {scores['cloned']:.3f} x the per-trace best")
    kept, mine, tuned = "cloned", bc, None
    rolled = None
    if run.rollout_points:
        from gpualloc.rl.rollouts import RolloutLabels, improve_agent, label_points

        base = None if run.rollout_base is None else run.experts.index(run.rollout_base)
        by_guide = guides or [teacher] * len(train_p)
        labels = RolloutLabels.concat([
            label_points([p for p, g in zip(train_p, by_guide, strict=True) if g == guide], run.experts, teacher=guide,
                         points=run.rollout_points, base=base, horizon_s=run.rollout_horizon_s,
                         min_gain=run.rollout_min_gain, seed=run.seed, follow_s=run.rollout_follow_s,
                         encoder=encoder)
            for guide in sorted(set(by_guide))])
        changed = float(np.mean(labels.label != labels.teacher_action))
        cloned_state = {k: v.clone() for k, v in agent.qnet.state_dict().items()}
        fit = improve_agent(agent, labels, seed=run.seed)
        rolled = agent_jcts(agent, val, run.experts, teacher, encoder, **level)
        scores["rollout"] = score(rolled)
        say(f"rollout labels: {len(labels)} points, {changed:.1%} not the guide's; fit {fit:.1%}; "
            f"validation {scores['rollout']:.3f}")
        if score(rolled) < score(mine):
            kept, mine = "rollout", rolled
        else:
            agent.qnet.load_state_dict(cloned_state)
            agent.sync_target()
    if run.steps:
        cloned_state = {k: v.clone() for k, v in agent.qnet.state_dict().items()}
        agent.sync_target()
        train(env, agent, run.steps, seed=run.seed)
        tuned = agent_jcts(agent, val, run.experts, teacher, encoder, **level)
        scores["fine-tuned"] = score(tuned)
        say(f"fine-tuned: validation {scores['fine-tuned']:.3f}")
        if score(tuned) < score(mine):
            kept, mine = "fine-tuned", tuned
        else:
            agent.qnet.load_state_dict(cloned_state)
            agent.sync_target()
    verdict = gate(mine, per_expert[run.experts[teacher]], run.experts[teacher])
    say(verdict.note())
    wall = time.perf_counter() - t0
    agent.extra = expert_extra(run.experts, teacher, verdict, hd=hd, kept=kept, seed=run.seed,
                               clusters=list(run.clusters), steps=run.steps, bc_rounds=run.bc_rounds,
                               bc_episodes=run.bc_episodes, bc_epochs=run.bc_epochs, bc_td_weight=run.bc_td_weight,
                               train_problems=len(train_p), wall_s=round(wall, 1),
                               guide=run.guide, guides=None if guides is None else
                               {e: guides.count(i) for i, e in enumerate(run.experts)},
                               validation={"experts_h": {k: v / 3600 for k, v in means.items()},
                                           "traces": len(val), "scores": scores,
                                           "cloned_h": float(np.mean(bc)) / 3600,
                                           "tuned_h": None if tuned is None else float(np.mean(tuned)) / 3600,
                                           "rollout_h": None if rolled is None else float(np.mean(rolled)) / 3600},
                               rollout_points=run.rollout_points, rollout_horizon_s=run.rollout_horizon_s,
                               rollout_follow_s=run.rollout_follow_s, knowledge=run.knowledge,
                               round_s=level["round_s"])
    agent.save(out_path)
    return ExpertTrainReport(out_path, run.experts[teacher], means, scores, float(np.mean(bc)),
                             None if tuned is None else float(np.mean(tuned)), kept, verdict, wall,
                             tuple(clone.agreement))
