"""The DQN training loop (Mnih et al. 2015, Algorithm 1) with double-DQN targets (van Hasselt et al.
2016) and action masks, plus greedy evaluation.

Action masks are read, in order of preference, from ``info["action_mask"]`` (returned by ``reset``
and ``step``), from the environment's ``action_masks()`` method (found through wrappers), or else
every action is valid.

References:
    .. [1] Mnih, V. et al. (2015). "Human-level control through deep reinforcement learning."
       *Nature* 518: 529–533.
    .. [2] van Hasselt, H.; Guez, A.; Silver, D. (2016). "Deep reinforcement learning with double
       Q-learning." *AAAI* 30: 2094–2100.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from gpualloc.errors import AgentError
from gpualloc.rl.dqn.agent import DQNAgent
from gpualloc.rl.dqn.replay import ReplayBuffer
from gpualloc.seeding import seeded

__all__ = ["EvalResult", "TrainLog", "action_mask", "evaluate", "train"]

_SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class EvalResult:
    """Greedy returns of ``len(returns)`` episodes, measured after ``step`` training steps."""

    step: int
    returns: list[float]

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))


@dataclass
class TrainLog:
    """What one :func:`train` call did; filled in as it runs, so a callback can read it live.

    Attributes:
        steps: Environment steps taken so far.
        episode_returns: Undiscounted return of each finished episode.
        episode_lengths: Length of each finished episode.
        episode_epsilons: Exploration rate when each episode finished.
        losses: TD loss of each gradient step.
        q_means: Mean Q of the taken actions of each gradient step.
        evals: Greedy evaluations, in order.
        best_eval: Best mean evaluation return so far (None before the first evaluation).
    """

    steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_epsilons: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    q_means: list[float] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)
    best_eval: float | None = None


def action_mask(env: gym.Env, info: dict) -> np.ndarray | None:
    """Valid actions of the current state: ``info["action_mask"]``, else ``env.action_masks()``,
    else None (all valid)."""
    if "action_mask" in info:
        return np.asarray(info["action_mask"], dtype=bool)
    try:
        masks = env.get_wrapper_attr("action_masks")
    except AttributeError:
        return None
    return np.asarray(masks(), dtype=bool)


@seeded(error=AgentError)
def train(
    env: gym.Env,
    agent: DQNAgent,
    total_steps: int,
    *,
    seed: int | np.random.Generator | None,
    callback: Callable[[int, TrainLog], bool | None] | None = None,
    eval_env: gym.Env | None = None,
    eval_every: int | None = None,
    eval_episodes: int = 5,
    checkpoint_path: str | os.PathLike | None = None,
) -> TrainLog:
    """Train ``agent`` on ``env`` for ``total_steps`` environment steps.

    Each step: act epsilon-greedily among the valid actions, store the transition (with the next
    state's mask) in a fresh replay buffer; every ``train_freq`` steps, once the buffer holds
    ``learning_starts`` transitions and one batch, take ``gradient_steps`` gradient steps on uniform
    minibatches. Truncated episodes are bootstrapped, terminated ones are not.

    Args:
        env: Gymnasium environment with a Discrete action space.
        agent: The agent to train (its counters and epsilon schedule carry over between calls).
        total_steps: Environment steps to take.
        seed: Seeds environment resets and replay sampling (the agent's own seed, in its config,
            drives initialisation and exploration).
        callback: Called as ``callback(step, log)`` after every step; returning False stops early.
        eval_env: A separate environment for greedy evaluation.
        eval_every: Evaluate every this many steps (needs ``eval_env``); None for never. Every
            evaluation replays the same episode seeds, so evaluations are comparable.
        eval_episodes: Episodes per evaluation.
        checkpoint_path: Keep the best checkpoint by mean evaluation return here; without
            evaluation, the final agent is saved here.

    Returns:
        The :class:`TrainLog`.

    Raises:
        AgentError: ``eval_every`` without a separate ``eval_env``, or a bad argument.
    """
    cfg = agent.config
    if total_steps < 0:
        raise AgentError(f"train: total_steps {total_steps} must be >= 0")
    if eval_every is not None and (eval_env is None or eval_env is env or eval_every < 1):
        raise AgentError("train: eval_every needs a positive interval and an eval_env separate from env")
    rng = np.random.default_rng(seed)  # a Generator passes through unchanged
    buffer = ReplayBuffer(cfg.buffer_size, env.observation_space, agent.n_actions, seed=rng, device=agent.device)
    eval_seed = int(rng.integers(_SEED_MAX))
    log = TrainLog()

    obs, info = env.reset(seed=int(rng.integers(_SEED_MAX)))
    mask = action_mask(env, info)
    episode_return, episode_length = 0.0, 0
    for step in range(1, total_steps + 1):
        # Act epsilon-greedily among the valid actions; store the transition.
        action = agent.act(obs, mask, explore=True)
        next_obs, reward, terminated, truncated, info = env.step(action)
        next_mask = action_mask(env, info)
        buffer.add(obs, action, float(reward), next_obs, terminated, next_mask)
        agent.num_timesteps += 1
        episode_return += float(reward)
        episode_length += 1
        if terminated or truncated:
            log.episode_returns.append(episode_return)
            log.episode_lengths.append(episode_length)
            log.episode_epsilons.append(agent.epsilon)
            episode_return, episode_length = 0.0, 0
            obs, info = env.reset()
            mask = action_mask(env, info)
        else:
            obs, mask = next_obs, next_mask

        # Learn: gradient steps on uniform minibatches (the agent copies its target network).
        if len(buffer) >= max(cfg.learning_starts, cfg.batch_size) and step % cfg.train_freq == 0:
            for _ in range(cfg.gradient_steps):
                stats = agent.update(buffer.sample(cfg.batch_size))
                log.losses.append(stats["loss"])
                log.q_means.append(stats["q_mean"])

        # Evaluate greedily; keep the best checkpoint.
        if eval_every is not None and step % eval_every == 0:
            result = EvalResult(step, evaluate(eval_env, agent, eval_episodes, seed=eval_seed))
            log.evals.append(result)
            if log.best_eval is None or result.mean > log.best_eval:
                log.best_eval = result.mean
                if checkpoint_path is not None:
                    agent.save(checkpoint_path)

        log.steps = step
        if callback is not None and callback(step, log) is False:
            break

    if checkpoint_path is not None and not log.evals:
        agent.save(checkpoint_path)
    return log


@seeded(error=AgentError)
def evaluate(env: gym.Env, agent: DQNAgent, episodes: int,
             seed: int | np.random.Generator | None = None) -> list[float]:
    """Undiscounted returns of ``episodes`` greedy episodes (the env must end its episodes, e.g. by
    a time limit). Does not touch the agent's exploration RNG."""
    rng = np.random.default_rng(seed)  # a Generator passes through unchanged
    returns = []
    for _ in range(episodes):
        obs, info = env.reset(seed=int(rng.integers(_SEED_MAX)))
        mask = action_mask(env, info)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(agent.act(obs, mask, explore=False))
            mask = action_mask(env, info)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns
