"""DQN with experience collected by several actors in parallel (synchronous Ape-X, Horgan et al. 2018).

Training runs in rounds. Each round the learner sends its current Q-network weights to ``actors``
rollout tasks; each task builds its own environment (in whatever process or Ray worker the
:class:`~gpualloc.parallel.Executor` puts it), plays whole episodes epsilon-greedily
until it has taken at least its share of steps, and returns the transitions. The learner appends
them to its replay buffer in actor order and then takes as many gradient steps as the single-process
loop would have taken for that many environment steps (``train_freq``, ``gradient_steps``), so the
replay ratio is unchanged; the actors act with weights at most one round old.

Every task is a pure function of its arguments (weights, step counter, seed), so the result does not
depend on the executor: serial, local processes and Ray give the same agent, bit for bit.

References:
    .. [1] Horgan, D. et al. (2018). "Distributed prioritized experience replay." *ICLR*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import gymnasium as gym
import numpy as np
import torch

from gpualloc.errors import AgentError
from gpualloc.rl.dqn.agent import DQNAgent
from gpualloc.rl.dqn.config import DQNConfig
from gpualloc.rl.dqn.replay import ReplayBuffer
from gpualloc.rl.dqn.train import _SEED_MAX, TrainLog, action_mask
from gpualloc.seeding import seeded

__all__ = ["Rollout", "RolloutTask", "collect", "train_distributed"]


@dataclass(frozen=True)
class RolloutTask:
    """One actor's share of a round.

    Attributes:
        env_fn: builds the environment; must pickle (a top-level function or class, or a
            ``functools.partial`` of one, with picklable arguments).
        config: the learner's hyper-parameters (network shape, epsilon schedule).
        weights: the learner's Q-network ``state_dict`` (CPU tensors).
        start_step: the learner's step counter at the start of the round.
        actor: this actor's index; with ``actors`` it places the actor's steps on the global clock of
            the epsilon schedule (step ``i`` of actor ``k`` acts at ``start_step + i * actors + k``).
        actors: how many actors share the round.
        steps: take at least this many steps; the episode in progress is played to its end.
        seed: seeds episode resets and exploration.
    """

    env_fn: Callable[[], gym.Env]
    config: DQNConfig
    weights: dict[str, torch.Tensor]
    start_step: int
    actor: int
    actors: int
    steps: int
    seed: int


@dataclass(frozen=True)
class Rollout:
    """Transitions of one task, in the order they were taken, and the episodes it finished.

    Each episode's states are sent once: ``states`` stacks them (per key; ``""`` for a Box
    observation space), and transition ``i`` goes from ``states[obs_index[i]]`` to
    ``states[obs_index[i] + 1]`` (an episode of ``n`` steps has ``n + 1`` states), which halves what
    travels back to the learner."""

    states: dict[str, np.ndarray]
    obs_index: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    next_masks: np.ndarray
    episode_returns: tuple[float, ...]
    episode_lengths: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.actions)

    def add_to(self, buffer: ReplayBuffer) -> None:
        """Append every transition to ``buffer``."""
        obs = {k: v[self.obs_index] for k, v in self.states.items()}
        nxt = {k: v[self.obs_index + 1] for k, v in self.states.items()}
        if list(obs) == [""]:
            obs, nxt = obs[""], nxt[""]
        buffer.extend(obs, self.actions, self.rewards, nxt, self.terminated, self.next_masks)


def _stack(observations: list) -> dict[str, np.ndarray]:
    if isinstance(observations[0], dict):
        return {k: np.stack([o[k] for o in observations]) for k in observations[0]}
    return {"": np.stack(observations)}


def collect(task: RolloutTask) -> Rollout:
    """Play ``task``: epsilon-greedy episodes with the task's weights until ``task.steps`` steps are
    taken and the last episode has ended. Uses one torch thread (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        env = task.env_fn()
        agent = DQNAgent(env.observation_space, env.action_space, replace(task.config, seed=task.seed))
        agent.qnet.load_state_dict(task.weights)
        rng = np.random.default_rng(task.seed)
        states, index, act_l, rew_l, term_l, mask_l = [], [], [], [], [], []
        returns, lengths = [], []
        i = 0
        while i < task.steps:
            obs, info = env.reset(seed=int(rng.integers(_SEED_MAX)))
            mask = action_mask(env, info)
            states.append(obs)
            total, length, done = 0.0, 0, False
            while not done:
                agent.num_timesteps = task.start_step + i * task.actors + task.actor
                action = agent.act(obs, mask, explore=True)
                obs, reward, terminated, truncated, info = env.step(action)
                mask = action_mask(env, info)
                index.append(len(states) - 1)
                states.append(obs)
                act_l.append(action)
                rew_l.append(float(reward))
                term_l.append(bool(terminated))
                mask_l.append(np.ones(agent.n_actions, bool) if mask is None else mask)
                total += float(reward)
                length += 1
                i += 1
                done = terminated or truncated
            returns.append(total)
            lengths.append(length)
        env.close()
    finally:
        torch.set_num_threads(threads)
    return Rollout(_stack(states), np.asarray(index, np.int64), np.asarray(act_l, np.int64),
                   np.asarray(rew_l, np.float32), np.asarray(term_l, bool), np.stack(mask_l), tuple(returns),
                   tuple(lengths))


@seeded(error=AgentError)
def train_distributed(
    env_fn: Callable[[], gym.Env],
    agent: DQNAgent,
    total_steps: int,
    *,
    seed: int | np.random.Generator | None,
    executor,
    actors: int = 2,
    round_steps: int = 1_000,
    callback: Callable[[int, TrainLog], bool | None] | None = None,
) -> TrainLog:
    """Train ``agent`` for about ``total_steps`` environment steps collected by ``actors`` parallel
    rollout tasks per round (see the module docstring).

    Args:
        env_fn: builds an environment (picklable; every actor builds its own).
        agent: the learner (its step counter and epsilon schedule carry over between calls).
        total_steps: environment steps to take; the last round's episodes are played to their end,
            so a few more may be taken.
        seed: seeds the actors' tasks and replay sampling.
        executor: runs the rollout tasks (``map(fn, items)``; serial, processes or Ray).
        actors: rollout tasks per round.
        round_steps: environment steps per round, shared between the actors.
        callback: called as ``callback(steps, log)`` after each round; returning False stops.

    Returns:
        The :class:`TrainLog` (``steps`` counts every transition collected).

    Raises:
        AgentError: a bad argument.
    """
    if total_steps < 0 or actors < 1 or round_steps < actors:
        raise AgentError(f"train_distributed: need total_steps >= 0, actors >= 1 and round_steps >= actors "
                         f"(got {total_steps}, {actors}, {round_steps})")
    cfg = agent.config
    rng = np.random.default_rng(seed)  # a Generator passes through unchanged
    buffer = ReplayBuffer(cfg.buffer_size, agent.observation_space, agent.n_actions, seed=rng, device=agent.device)
    log = TrainLog()
    owed = 0.0  # gradient steps earned by collected steps and not yet taken
    while log.steps < total_steps:
        share = -(-min(round_steps, total_steps - log.steps) // actors)
        weights = {k: v.detach().cpu().clone() for k, v in agent.qnet.state_dict().items()}
        tasks = [RolloutTask(env_fn, cfg, weights, agent.num_timesteps, k, actors, share,
                             int(rng.integers(_SEED_MAX))) for k in range(actors)]
        for rollout in executor.map(collect, tasks):
            rollout.add_to(buffer)
            log.episode_returns.extend(rollout.episode_returns)
            log.episode_lengths.extend(rollout.episode_lengths)
            new = len(rollout)
            log.steps += new
            agent.num_timesteps += new
            log.episode_epsilons.extend([agent.epsilon] * len(rollout.episode_returns))
            # transitions from the one that brings the buffer to ``learning_starts`` on earn updates
            earning = min(new, len(buffer) - max(cfg.learning_starts, cfg.batch_size) + 1)
            owed += max(0, earning) / cfg.train_freq * cfg.gradient_steps
        while owed >= 1:
            stats = agent.update(buffer.sample(cfg.batch_size))
            log.losses.append(stats["loss"])
            log.q_means.append(stats["q_mean"])
            owed -= 1
        if callback is not None and callback(log.steps, log) is False:
            break
    return log
