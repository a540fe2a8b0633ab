"""Uniform experience replay (Lin 1992; Mnih et al. 2015) as a numpy ring buffer.

Observations are stored in the observation space's own dtype (a uint8 grid stays uint8) and become
float32 tensors only when sampled. Flat Box and Dict-of-Box spaces are supported. Each transition
also keeps the action mask of its next state, so the TD target can take its max over valid actions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from gymnasium import spaces

from gpualloc.errors import AgentError
from gpualloc.rl.dqn.networks import TensorObs
from gpualloc.seeding import seeded

__all__ = ["ReplayBatch", "ReplayBuffer"]


class ReplayBatch(NamedTuple):
    """A sampled batch, as torch tensors on the buffer's device (SB3's ``ReplayBufferSamples``).

    Attributes:
        observations: ``(B, *obs_shape)`` float32, or a dict of such tensors for Dict spaces.
        actions: ``(B,)`` int64.
        rewards: ``(B,)`` float32.
        next_observations: like ``observations``.
        terminated: ``(B,)`` float32, 1.0 where the next state is terminal (no bootstrap). Truncated
            episodes are not terminal: their next state is still bootstrapped.
        next_masks: ``(B, n_actions)`` bool, True for actions valid in the next state.
    """

    observations: TensorObs
    actions: torch.Tensor
    rewards: torch.Tensor
    next_observations: TensorObs
    terminated: torch.Tensor
    next_masks: torch.Tensor


def _storage_dtype(space: spaces.Box) -> np.dtype:
    return np.dtype(np.float32) if np.issubdtype(space.dtype, np.floating) else np.dtype(space.dtype)


class ReplayBuffer:
    """Fixed-capacity FIFO of transitions with uniform sampling.

    Args:
        capacity: Maximum number of transitions; the oldest are overwritten first.
        obs_space: A Box, or a Dict whose values are Boxes.
        n_actions: Size of the Discrete action space (width of the stored masks).
        seed: Seeds the sampling RNG (an int, a Generator to use, or None for fresh entropy).
        device: Torch device of sampled batches.
    """

    @seeded(error=AgentError)
    def __init__(self, capacity: int, obs_space: spaces.Space, n_actions: int, *,
                 seed: int | np.random.Generator | None = None, device: str | torch.device = "cpu") -> None:
        if capacity < 1:
            raise AgentError(f"ReplayBuffer: capacity {capacity} must be positive")
        self.capacity = int(capacity)
        self.n_actions = int(n_actions)
        self.device = torch.device(device)
        self._rng = np.random.default_rng(seed)  # a Generator passes through unchanged
        if isinstance(obs_space, spaces.Box):
            self._keys: tuple[str, ...] | None = None
            boxes = {"": obs_space}
        elif isinstance(obs_space, spaces.Dict) and all(isinstance(s, spaces.Box) for s in obs_space.spaces.values()):
            self._keys = tuple(obs_space.spaces)
            boxes = dict(obs_space.spaces)
        else:
            raise AgentError(f"ReplayBuffer: observation space must be a Box or a Dict of Boxes, got {obs_space}")
        self._obs = {k: np.zeros((capacity, *b.shape), _storage_dtype(b)) for k, b in boxes.items()}
        self._next_obs = {k: np.zeros_like(v) for k, v in self._obs.items()}
        self._actions = np.zeros(capacity, np.int64)
        self._rewards = np.zeros(capacity, np.float32)
        self._terminated = np.zeros(capacity, np.float32)
        self._next_masks = np.ones((capacity, n_actions), bool)
        self._pos = 0
        self._full = False

    def __len__(self) -> int:
        return self.capacity if self._full else self._pos

    def add(self, obs, action: int, reward: float, next_obs, terminated: bool,
            next_mask: np.ndarray | None = None) -> None:
        """Store one transition; ``next_mask`` None means every action is valid in ``next_obs``."""
        i = self._pos
        self._put(self._obs, i, obs)
        self._put(self._next_obs, i, next_obs)
        self._actions[i] = action
        self._rewards[i] = reward
        self._terminated[i] = float(terminated)
        self._next_masks[i] = True if next_mask is None else np.asarray(next_mask, bool)
        self._pos = (i + 1) % self.capacity
        self._full = self._full or self._pos == 0

    def extend(self, obs, actions: np.ndarray, rewards: np.ndarray, next_obs, terminated: np.ndarray,
               next_masks: np.ndarray) -> None:
        """Store ``len(actions)`` transitions at once, in order (``obs`` and ``next_obs``: arrays, or
        dicts of arrays, with the transitions along the first axis); the same as calling :meth:`add`
        for each, only vectorised."""
        n = len(actions)
        keep = np.arange(max(0, n - self.capacity), n)  # more than the capacity: the last ones win
        idx = (self._pos + keep) % self.capacity
        for store, batch in ((self._obs, obs), (self._next_obs, next_obs)):
            for k in store:
                store[k][idx] = (batch if self._keys is None else batch[k])[keep]
        self._actions[idx] = np.asarray(actions)[keep]
        self._rewards[idx] = np.asarray(rewards)[keep]
        self._terminated[idx] = np.asarray(terminated, np.float32)[keep]
        self._next_masks[idx] = np.asarray(next_masks, bool)[keep]
        self._full = self._full or self._pos + n >= self.capacity
        self._pos = (self._pos + n) % self.capacity

    def sample(self, batch_size: int) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly with replacement."""
        if len(self) == 0:
            raise AgentError("ReplayBuffer.sample: the buffer is empty")
        idx = self._rng.integers(0, len(self), size=batch_size)
        return ReplayBatch(
            observations=self._gather(self._obs, idx),
            actions=self._tensor(self._actions[idx]),
            rewards=self._tensor(self._rewards[idx]),
            next_observations=self._gather(self._next_obs, idx),
            terminated=self._tensor(self._terminated[idx]),
            next_masks=self._tensor(self._next_masks[idx]),
        )

    # ---------------------------------------------------------------------------------- private
    def _put(self, store: dict[str, np.ndarray], i: int, obs) -> None:
        if self._keys is None:
            store[""][i] = obs
        else:
            for k in self._keys:
                store[k][i] = obs[k]

    def _tensor(self, arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(arr).to(self.device)

    def _gather(self, store: dict[str, np.ndarray], idx: np.ndarray) -> TensorObs:
        if self._keys is None:
            return self._tensor(store[""][idx].astype(np.float32, copy=False))
        return {k: self._tensor(store[k][idx].astype(np.float32, copy=False)) for k in self._keys}
