"""The DQN placement agent: train it on many (graph, cluster) problems, and place with it.

:func:`train_placer` trains the shared DQN (:mod:`gpualloc.rl.dqn`) on
:class:`~gpualloc.rl.envs.placement_env.PlacementEnv` over a set of problems; the checkpoint keeps the
env settings in ``extra`` so :func:`place_dqn` rebuilds the same observation. :func:`place_dqn` runs
the agent greedily on one problem and never returns a plan worse than the best heuristic's: when the
agent's plan simulates slower, the best heuristic's plan is returned, and the outcome's note says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from gpualloc.errors import AgentError
from gpualloc.placement.partition import Partitioned
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.outcome import Outcome
from gpualloc.placement.run import best, operator_plan
from gpualloc.rl.dqn import DQNAgent, DQNConfig, TrainLog, train
from gpualloc.rl.envs.placement_env import PlacementEnv
from gpualloc.seeding import seeded

BUNDLED_AGENT = "placer.pt"
"""File name of the bundled agent in ``gpualloc/rl/data``."""

DEFAULT_CONFIG = DQNConfig(gamma=0.99, lr=1e-4, batch_size=64, buffer_size=50_000, learning_starts=1_000,
                           train_freq=2, target_update_interval=500, eps_start=1.0, eps_end=0.05,
                           eps_decay_steps=15_000, hidden=(256, 256))
"""Settings of the bundled agent (Adam lr 1e-4 as the design asks)."""


def bundled_agent_path() -> Path:
    """Path of the agent that ships with the package."""
    return Path(str(resources.files("gpualloc.rl") / "data" / BUNDLED_AGENT))


@seeded(error=AgentError)
def train_placer(problems: Sequence[PlacementProblem], steps: int, out: str | Path, *, seed: int = 0,
                 eval_problems: Sequence[PlacementProblem] | None = None, eval_every: int | None = None,
                 config: DQNConfig | None = None, max_devices: int = 16, factor: int = 4,
                 callback: Callable[[int, TrainLog], bool | None] | None = None) -> tuple[DQNAgent, TrainLog]:
    """Train a placement agent and save the best checkpoint (by greedy return on ``eval_problems``).

    Args:
        problems: training problems; an episode draws one at random.
        steps: environment steps.
        out: checkpoint path.
        seed: seed of the agent, the episodes' draws and the heuristics' base plans.
        eval_problems: held-out problems for periodic greedy evaluation (default: the training ones).
        eval_every: steps between evaluations (default: ``steps // 10``).
        config: DQN settings (default :data:`DEFAULT_CONFIG` with ``seed``).
        max_devices, factor: env settings (device slots, subgraphs per device).
        callback: called every step with ``(step, log)``; returning False stops training.
    """
    env = PlacementEnv(problems, max_devices=max_devices, factor=factor, seed=seed)
    eval_env = PlacementEnv(eval_problems or problems, max_devices=max_devices, factor=factor, seed=seed)
    agent = DQNAgent(env.observation_space, env.action_space, replace(config or DEFAULT_CONFIG, seed=seed))
    meta = {"max_devices": max_devices, "factor": factor, "steps": steps, "seed": seed,
            "problems": [f"{p.graph.name}@{p.cluster.name}/M{p.microbatches}" for p in problems]}
    agent.extra = meta
    out = Path(out)
    log = train(env, agent, steps, seed=seed, callback=callback, eval_env=eval_env,
                eval_every=eval_every or max(1, steps // 10), eval_episodes=len(eval_env._episodes),
                checkpoint_path=out)
    return (DQNAgent.load(out) if out.exists() else agent), log


def load_placer(path: str | Path | None = None) -> DQNAgent:
    """The agent at ``path``, or the bundled one."""
    path = Path(path) if path is not None else bundled_agent_path()
    if not path.exists():
        raise AgentError(f"{path}: no such agent file (train one with `gpualloc train placer`)")
    agent = DQNAgent.load(path)
    if "max_devices" not in agent.extra:
        raise AgentError(f"{path}: not a placement agent (no max_devices in its metadata)")
    return agent


@seeded(error=AgentError)
def place_dqn(problem: PlacementProblem, agent: DQNAgent | str | Path | None = None, *, seed: int = 0) -> Outcome:
    """Place with the agent; fall back to the best heuristic's plan when that simulates faster."""
    start = time.perf_counter()
    agent = agent if isinstance(agent, DQNAgent) else load_placer(agent)
    env = PlacementEnv([problem], max_devices=int(agent.extra["max_devices"]), factor=int(agent.extra["factor"]),
                       seed=seed)
    obs, info = env.reset(seed=seed)
    done = False
    while not done:  # the agent's greedy plan, from the best heuristic's (env.base_outcome)
        obs, _, done, _, info = env.step(agent.act(obs, info["action_mask"], explore=False))
    mine, heuristic = operator_plan(problem, "dqn", env.assignment), env.base_outcome
    elapsed = time.perf_counter() - start
    if mine.result.feasible and mine.result.step_time_s <= heuristic.result.step_time_s:
        gain = 1 - mine.result.step_time_s / heuristic.result.step_time_s
        return replace(mine, partition_time_s=elapsed, note=f"agent plan, {gain:.1%} faster than best heuristic")
    return replace(heuristic, method="dqn", partition_time_s=elapsed,
                   note=f"agent plan slower; kept best heuristic ({heuristic.note})")


@seeded(error=AgentError)
def dqn_partition(problem: PlacementProblem, *, seed: int | np.random.Generator | None = 0,
                  agent: DQNAgent | str | Path | None = None) -> Partitioned:
    """The ``dqn`` entry of :data:`gpualloc.placement.partition.PARTITIONERS`: :func:`place_dqn`'s plan.

    A cluster with more devices than the agent has slots gets the best heuristic's plan, as when the
    agent's own plan is slower; the note says which plan was kept.
    """
    if not isinstance(seed, int):  # the agent's episode takes an int seed
        seed = int(np.random.default_rng(seed).integers(2**31))
    agent = agent if isinstance(agent, DQNAgent) else load_placer(agent)
    slots = int(agent.extra["max_devices"])
    if problem.k > slots:
        heuristic = best(problem, seed=seed)
        return Partitioned(heuristic.plan.assignment, f"{problem.k} devices > the agent's {slots} slots; kept best "
                                                 f"heuristic ({heuristic.note})")
    outcome = place_dqn(problem, agent, seed=seed)
    return Partitioned(outcome.plan.assignment, outcome.note)


__all__ = ["BUNDLED_AGENT", "DEFAULT_CONFIG", "bundled_agent_path", "dqn_partition", "dqn_planner",
           "load_placer", "place_dqn", "train_placer"]


@seeded(error=AgentError)
def dqn_planner(agent: DQNAgent, *, seed: int = 0, passes: int = 10):
    """Re-planning with the agent: the fastest of KL refinement of the current plan, the agent's plan
    (never worse than the best heuristic), and the agent's plan refined by KL."""
    from gpualloc.placement.partition.kernighan_lin import kl_refine
    from gpualloc.placement.simulate import simulate_step

    def plan(problem: PlacementProblem, assignment: np.ndarray) -> np.ndarray:
        mine = place_dqn(problem, agent, seed=seed).plan.assignment
        candidates = [kl_refine(problem, assignment, seed=seed, passes=passes), mine,
                      kl_refine(problem, mine, seed=seed, passes=passes)]
        results = [simulate_step(problem, c) for c in candidates]
        i = min(range(len(candidates)), key=lambda i: (not results[i].feasible, results[i].step_time_s, i))
        return candidates[i]

    return plan
