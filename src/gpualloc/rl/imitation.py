"""Behaviour cloning of the teacher heuristic (DAgger) into a DQN agent, before DQN fine-tuning.

The labels are the teacher's choices (:meth:`ExpertChoiceEnv.teacher_action`) at the states the
rolled-out policy visits: round 0 rolls out the teacher itself, later rounds the agent being trained
(Ross, Gordon and Bagnell 2011), so the agent learns the teacher's action where its own mistakes take
it. The loss is that of DQfD (Hester et al. 2018): a large-margin classification term that puts the
teacher's Q-value at least ``margin`` above every other valid action, plus the one-step double-DQN
TD loss on the same transitions, so the Q-values that fine-tuning starts from already mean returns.

References:
    S. Ross, G. Gordon, D. Bagnell, "A reduction of imitation learning and structured prediction to
    no-regret online learning", AISTATS 2011.
    T. Hester et al., "Deep Q-learning from demonstrations", AAAI 2018.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from gpualloc.errors import AgentError
from gpualloc.rl.dqn import DQNAgent
from gpualloc.rl.dqn.replay import ReplayBuffer
from gpualloc.rl.envs.expert_env import ExpertChoiceEnv
from gpualloc.seeding import seeded

__all__ = ["CloneLog", "agreement", "clone_teacher", "margin_epoch", "margin_loss"]


@dataclass
class CloneLog:
    """What :func:`clone_teacher` did: per DAgger round, the transitions gathered and the share of
    states where the greedy agent picks the teacher's action (after training)."""

    transitions: list[int] = field(default_factory=list)
    agreement: list[float] = field(default_factory=list)


def margin_loss(q: torch.Tensor, expert: torch.Tensor, mask: torch.Tensor, margin: float) -> torch.Tensor:
    """DQfD's ``max_a [Q(s, a) + margin * (a != a_E)] - Q(s, a_E)`` over valid actions, averaged."""
    bonus = torch.full_like(q, margin).scatter(1, expert.unsqueeze(1), 0.0)
    top = (q + bonus).masked_fill(~mask, -torch.inf).max(dim=1).values
    return (top - q.gather(1, expert.unsqueeze(1)).squeeze(1)).mean()


def margin_epoch(agent: DQNAgent, obs: torch.Tensor, label: torch.Tensor, mask: torch.Tensor, *, batch_size: int,
                 margin: float, rng: np.random.Generator, buffer: ReplayBuffer | None = None,
                 td_weight: float = 0.0) -> None:
    """One pass of :func:`margin_loss` over the states ``obs`` (with their labels and masks) in a seeded
    random order, one Adam step (gradient norm clipped to 10) per ``batch_size`` states; with
    ``td_weight`` > 0, each step adds DQfD's TD term on a batch drawn from ``buffer``."""
    perm = rng.permutation(len(label))
    for start in range(0, len(label), batch_size):
        idx = torch.as_tensor(perm[start:start + batch_size], device=agent.device)
        loss = margin_loss(agent.qnet(obs[idx]), label[idx], mask[idx], margin)
        if td_weight > 0:
            batch = buffer.sample(batch_size)
            q = agent.qnet(batch.observations).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
            loss = loss + td_weight * F.smooth_l1_loss(q, agent.td_target(batch))
        agent.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(agent.qnet.parameters(), 10.0)
        agent.optimizer.step()


def agreement(agent: DQNAgent, obs: torch.Tensor, label: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the states where the greedy agent, among the valid actions, picks the label."""
    with torch.inference_mode():
        q = agent.qnet(obs).masked_fill(~mask, -torch.inf)
        return float((q.argmax(dim=1) == label).float().mean().item())


def _rollout(env: ExpertChoiceEnv, agent: DQNAgent, buffer: ReplayBuffer, store: dict, teacher_drives: bool,
             seed: int, options: dict | None = None) -> None:
    obs, info = env.reset(seed=seed, options=options)
    done = env.finished  # a trace with no choice at all is over at once
    while not done:
        label, mask = info["teacher_action"], info["action_mask"]
        action = label if teacher_drives else agent.act(obs, mask, explore=False)
        next_obs, reward, done, _, info = env.step(action)
        buffer.add(obs, action, reward, next_obs, done, info["action_mask"])
        store["obs"].append(obs)
        store["label"].append(label)
        store["mask"].append(mask)
        obs = next_obs


@seeded(error=AgentError)
def clone_teacher(agent: DQNAgent, env: ExpertChoiceEnv, *, rounds: int = 2, episodes: int | None = 2,
                  epochs: int = 4, batch_size: int = 64, margin: float = 0.5, td_weight: float = 1.0,
                  seed: int = 0) -> CloneLog:
    """DAgger rounds of behaviour cloning with DQfD's loss; the agent is trained in place.

    Args:
        agent: the agent (its network is updated; its counters are left as they were).
        env: the expert-choice environment (episodes drawn from its problems or generator).
        rounds: DAgger rounds; round 0 follows the teacher, later ones the agent.
        episodes: episodes rolled out per round; when the environment has a problem list, episodes
            go through it in a seeded order (None: each problem once per round).
        epochs: passes over the gathered states per round.
        batch_size: states per gradient step.
        margin: the large margin of the classification term.
        td_weight: weight of the TD term (0: pure behaviour cloning).
        seed: seeds the episodes and the minibatch order.
    """
    rng = np.random.default_rng(seed)
    buffer = ReplayBuffer(200_000, env.observation_space, agent.n_actions, seed=rng, device=agent.device)
    store: dict[str, list] = {"obs": [], "label": [], "mask": []}
    log = CloneLog()
    order = None if env.problems is None else rng.permutation(len(env.problems)).tolist()
    if episodes is None:
        if order is None:
            raise AgentError("clone_teacher: episodes=None needs an environment with a problem list")
        episodes = len(order)
    k = 0
    for r in range(rounds):
        for _ in range(episodes):
            options = None if order is None else {"index": order[k % len(order)]}
            k += 1
            _rollout(env, agent, buffer, store, teacher_drives=r == 0, seed=int(rng.integers(2**31 - 1)),
                     options=options)
        obs = torch.as_tensor(np.asarray(store["obs"], dtype=np.float32), device=agent.device)
        label = torch.as_tensor(np.asarray(store["label"], dtype=np.int64), device=agent.device)
        mask = torch.as_tensor(np.asarray(store["mask"], dtype=bool), device=agent.device)
        n = len(label)
        if n == 0:  # every expert proposed the same at every decision point: nothing to imitate
            raise AgentError("clone_teacher: the training traces offer no choice between the experts (every "
                             "expert decides the same everywhere): use more or longer traces or other experts")
        log.transitions.append(n)
        for _ in range(epochs):
            margin_epoch(agent, obs, label, mask, batch_size=batch_size, margin=margin, rng=rng, buffer=buffer,
                         td_weight=td_weight)
            agent.sync_target()
        log.agreement.append(agreement(agent, obs, label, mask))
    return log
