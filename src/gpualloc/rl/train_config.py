"""The configuration of ``gpualloc train scheduler``: :class:`TrainConfig`, its defaults written once.

Light on purpose (no torch, no simulator): the CLI reads its options' defaults from it at import time.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpualloc.limits import MAX_SEED, MAX_STEPS
from gpualloc.options import OptionsError, check_options, option
from gpualloc.rl.dqn.config import DQNConfig

__all__ = ["DEFAULT_EXPERTS", "EXPERT_CONFIG", "LEVEL_ROUND_S", "TRAIN_CLUSTERS", "TrainConfig"]

DEFAULT_EXPERTS: tuple[str, ...] = ("gavel", "srtf", "tiresias", "sjf", "gavel-srtf")
"""The heuristics whose proposals the agent chooses among (registry names), under ``oracle``
(:mod:`gpualloc.rl.expert_choice` re-exports it)."""

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
class TrainConfig:
    """The whole configuration of :func:`train_expert_scheduler`, its defaults written here once.

    ``gpualloc train scheduler`` reads its options' defaults from these fields, ``--config run.toml``
    reads this dataclass (the DQN settings are the ``[dqn]`` table), and the checkpoint saves all of it
    (``extra["config"]``, :func:`gpualloc.options.options_dict`). Bad values raise one
    :class:`~gpualloc.options.OptionsError` line naming the field, before any simulation.
    """

    clusters: tuple[str, ...] = TRAIN_CLUSTERS
    """Clusters of the generated training and validation traces."""
    experts: tuple[str, ...] = DEFAULT_EXPERTS
    """The heuristics the agent chooses among (registry names)."""
    seed: int = option(0, min=0, max=MAX_SEED)
    """Seeds the agent (``dqn.seed`` is replaced by it), the traces and the episodes."""
    train_traces: int = option(12, min=1, max=1000)
    """Generated training traces (clusters in turn)."""
    num_jobs: tuple[int, int] = (40, 100)
    """``(low, high)`` job counts of generated training traces."""
    loads: tuple[float, float] = (0.5, 1.1)
    """``(low, high)`` loads of generated training traces."""
    val_loads: tuple[float, ...] = (0.6, 1.0)
    """Loads of the validation traces (one per cluster and load, 80 jobs, seeds 20,000+)."""
    guide: str = "teacher"
    """Whose choices cloning imitates: ``teacher`` (one expert everywhere) or ``best`` (on each
    training trace, the expert with the lowest average JCT on it: a per-workload oracle)."""
    bc_rounds: int = option(2, min=1, max=20)
    """DAgger rounds (round 0 follows the guide, later ones the agent)."""
    bc_episodes: int | None = option(None, min=1)
    """Episodes per DAgger round (None: every training problem once per round)."""
    bc_epochs: int = option(8, min=1, max=1000)
    """Passes over the gathered states per DAgger round."""
    bc_td_weight: float = option(0.0, min=0.0)
    """Weight of DQfD's TD term in cloning (0: pure large-margin classification; the rewards of a
    backlogged real-trace window are orders of magnitude above a synthetic trace's and would drown the
    classification term)."""
    steps: int = option(6_000, min=0, max=MAX_STEPS)
    """DQN fine-tuning environment steps (0: behaviour cloning only)."""
    dqn: DQNConfig = EXPERT_CONFIG
    """DQN settings (:data:`EXPERT_CONFIG`); its ``seed`` is replaced by :attr:`seed`."""
    hd_dim: int = option(0, min=0, max=1024)
    """Dimension of the hyperdimensional encoding appended to the observation (0: plain features)."""
    rollout_points: int = option(0, min=0, max=1000)
    """Choice points per training problem labelled by rollout (:func:`gpualloc.rl.rollouts.label_points`)
    and trained on after cloning (0: off); the result is kept only when it beats the clone on validation."""
    rollout_horizon_s: float = option(6 * 3600.0, min=0.0)
    """Simulated seconds of each rollout (0: to the end of the trace)."""
    rollout_base: str | None = None
    """Expert followed after the forced decision (default the teacher)."""
    rollout_follow_s: float = option(0.0, min=0.0)
    """Seconds the forced expert keeps deciding before the base takes over (0: one decision)."""
    rollout_min_gain: float = option(0.01, min=0.0)
    """Another expert replaces the teacher's label only when cheaper by more than this share."""
    knowledge: str = "oracle"
    """The information level the experts and the agent decide at (issue 36): below ``oracle`` the
    experts must be able to run there (``blind``: none that needs durations), prediction-driven experts
    (``srtf-pred``, ...) are allowed, the observation reads a duration predictor instead of remaining
    work, and the panel's round is fixed to :data:`LEVEL_ROUND_S`. The experts' and the agent's
    validation runs are at this level."""

    def __post_init__(self) -> None:
        check_options(self)
        _check_config(self)


def _check_config(run: TrainConfig) -> None:
    """One-line OptionsErrors (field first) for settings the ranges do not cover, before any simulation
    (training takes minutes)."""
    from gpualloc.scheduling.knowledge import KNOWLEDGE
    from gpualloc.scheduling.policies import POLICIES, needs_durations

    if not run.experts:
        raise OptionsError("experts: give at least one expert")
    if not run.clusters:
        raise OptionsError("clusters: give at least one cluster")
    if run.guide not in ("teacher", "best"):
        raise OptionsError(f"guide: expected 'teacher' or 'best', got {run.guide!r}")
    if not (1 <= run.num_jobs[0] <= run.num_jobs[1]):
        raise OptionsError(f"num_jobs: expected 1 <= low <= high, got {run.num_jobs}")
    if not (0 < run.loads[0] <= run.loads[1]) or not all(ld > 0 for ld in run.val_loads):
        raise OptionsError(f"loads: expected 0 < low <= high and positive val_loads, got {run.loads}, {run.val_loads}")
    if run.knowledge not in KNOWLEDGE:
        raise OptionsError(f"knowledge: unknown information level {run.knowledge!r} "
                           f"(expected one of {', '.join(KNOWLEDGE)})")
    heuristics = POLICIES.names("heuristic")
    if run.knowledge != "oracle":  # the prediction-driven policies (learned, but from the run's own jobs)
        heuristics = [*heuristics, *(n for n in POLICIES.names("learned") if n.endswith("-pred"))]
    for name in run.experts:
        if name not in heuristics:
            raise OptionsError(f"experts: {name!r} is not an expert of the panel; experts are heuristics "
                               f"({', '.join(heuristics)})")
        if run.knowledge == "blind" and needs_durations(name):
            raise OptionsError(f"experts: expert {name!r} needs durations, which knowledge 'blind' hides "
                               f"(use {name}-pred)")
    if run.rollout_base is not None and run.rollout_base not in run.experts:
        raise OptionsError(f"rollout_base: rollout base {run.rollout_base!r} is not one of the experts "
                           f"({', '.join(run.experts)})")
    if run.knowledge != "oracle" and run.rollout_points:
        raise OptionsError(f"rollout_points: rollout labels run at oracle only (knowledge {run.knowledge!r}: "
                           "use rollout_points 0)")


