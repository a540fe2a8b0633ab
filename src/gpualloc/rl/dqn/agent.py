"""The DQN agent: epsilon-greedy acting under action masks, the double-DQN update, checkpoints.

References:
    .. [1] Mnih, V. et al. (2015). "Human-level control through deep reinforcement learning."
       *Nature* 518: 529–533.
    .. [2] van Hasselt, H.; Guez, A.; Silver, D. (2016). "Deep reinforcement learning with double
       Q-learning." *AAAI* 30: 2094–2100.
"""

from __future__ import annotations

import copy
import os
import pickle
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from gpualloc.errors import AgentError
from gpualloc.rl.dqn.checkpoint import (FORMAT, VERSION, decode_value, encode_value, space_from_dict,
                                        space_to_dict)
from gpualloc.rl.dqn.config import DQNConfig
from gpualloc.rl.dqn.networks import TensorObs, build_qnet
from gpualloc.rl.dqn.replay import ReplayBatch

__all__ = ["DQNAgent"]

# Checkpoint fields besides format, version and extra, with the type each must have.
_FIELDS = {"config": dict, "observation_space": dict, "action_space": dict, "qnet": dict, "target_net": dict,
           "optimizer": dict, "num_timesteps": int, "num_updates": int, "rng_state": dict}


class DQNAgent:
    """A Q-network, its target copy and Adam, for a Box or Dict observation space and Discrete actions.

    Invalid actions are excluded everywhere a choice is made: exploration draws only among valid
    actions, the greedy choice sets invalid Q-values to -inf, and the TD target maximises over the
    actions valid in the next state.

    Args:
        observation_space: A Box (``"mlp"``, or a 2-D/3-D grid for ``"cnn"``) or a Dict with ``"grid"``
            and optional ``"features"`` Boxes (``"cnn"``).
        action_space: ``Discrete(n)`` starting at 0.
        config: Hyper-parameters; defaults to ``DQNConfig()``.

    Attributes:
        num_timesteps: Environment steps taken in training (drives the epsilon schedule).
        num_updates: Gradient steps taken (drives target-network copies).
        extra: Caller metadata saved with the checkpoint (normalisation statistics, plan metadata).
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Discrete,
                 config: DQNConfig | None = None) -> None:
        self.config = config if config is not None else DQNConfig()
        if not isinstance(action_space, spaces.Discrete) or int(action_space.start) != 0:
            raise AgentError(f"DQNAgent: action space must be Discrete(n) starting at 0, got {action_space}")
        if isinstance(observation_space, spaces.Dict):
            self._keys: tuple[str, ...] | None = tuple(observation_space.spaces)
        elif isinstance(observation_space, spaces.Box):
            self._keys = None
        else:
            raise AgentError(f"DQNAgent: observation space must be a Box or a Dict, got {observation_space}")
        self.observation_space = observation_space
        self.action_space = action_space
        self.n_actions = int(action_space.n)
        self.device = torch.device(self.config.device)

        # The seed is normalised once: one numpy Generator for exploration, and from it the seed of
        # network initialisation, applied inside a fork so the global torch RNG is left untouched.
        self._rng = np.random.default_rng(self.config.seed)
        init_seed = int(self._rng.integers(2**63 - 1))
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(init_seed)
            qnet = build_qnet(observation_space, self.n_actions, self.config)
        self.qnet: nn.Module = qnet.to(self.device)
        self.target_net: nn.Module = copy.deepcopy(self.qnet).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.qnet.parameters(), lr=self.config.lr)
        self.num_timesteps = 0
        self.num_updates = 0
        self.extra: dict = {}

    # ------------------------------------------------------------------------------------ acting
    @property
    def epsilon(self) -> float:
        """Current exploration rate (``config.epsilon(num_timesteps)``)."""
        return self.config.epsilon(self.num_timesteps)

    def act(self, obs, mask: np.ndarray | None = None, explore: bool = True) -> int:
        """Choose an action for one observation.

        Args:
            obs: One observation (array, or dict of arrays for Dict spaces).
            mask: Bool array ``(n_actions,)``, True where the action is valid; None means all valid.
            explore: Epsilon-greedy at the current epsilon if True, greedy if False.

        Raises:
            AgentError: The mask has the wrong shape or no valid action.
        """
        valid = None
        if mask is not None:
            valid = np.asarray(mask, dtype=bool)
            if valid.shape != (self.n_actions,):
                raise AgentError(f"act: mask shape {valid.shape} != ({self.n_actions},)")
            if not valid.any():
                raise AgentError("act: the action mask has no valid action")
        if explore and self._rng.random() < self.epsilon:
            if valid is None:
                return int(self._rng.integers(self.n_actions))
            return int(self._rng.choice(np.flatnonzero(valid)))
        q = self.q_values(obs)
        if valid is not None:
            q = np.where(valid, q, -np.inf)
        return int(q.argmax())

    def q_values(self, obs) -> np.ndarray:
        """Online-network Q-values ``(n_actions,)`` of one observation, as float32 numpy."""
        with torch.inference_mode():
            return self.qnet(self._batch_of_one(obs))[0].cpu().numpy()

    def _batch_of_one(self, obs) -> TensorObs:
        # float32 arrays pass through without a copy; unsqueeze is a view.
        if self._keys is None:
            return torch.as_tensor(np.asarray(obs, dtype=np.float32), device=self.device).unsqueeze(0)
        return {k: torch.as_tensor(np.asarray(obs[k], dtype=np.float32), device=self.device).unsqueeze(0)
                for k in self._keys}

    # ---------------------------------------------------------------------------------- learning
    @torch.no_grad()
    def td_target(self, batch: ReplayBatch) -> torch.Tensor:
        """``r + gamma * (1 - terminated) * Q_target(s', a*)`` with ``a*`` chosen among valid actions.

        Double DQN [2]: ``a* = argmax_{a' valid} Q_online(s', a')``; with ``config.double`` False,
        ``a* = argmax_{a' valid} Q_target(s', a')`` as in [1]. A next state with no valid action
        contributes 0.
        """
        valid = batch.next_masks
        q_next_target = self.target_net(batch.next_observations)
        chooser = self.qnet(batch.next_observations) if self.config.double else q_next_target
        a_star = chooser.masked_fill(~valid, -torch.inf).argmax(dim=1, keepdim=True)
        q_next = q_next_target.gather(1, a_star).squeeze(1)
        q_next = torch.where(valid.any(dim=1), q_next, 0.0)
        return batch.rewards + self.config.gamma * (1.0 - batch.terminated) * q_next

    def update(self, batch: ReplayBatch) -> dict[str, float]:
        """One gradient step on the TD error of ``batch``; copies the target every
        ``target_update_interval`` steps. Returns ``{"loss", "q_mean"}`` (mean Q of the taken actions).
        """
        target = self.td_target(batch)
        q = self.qnet(batch.observations).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, target) if self.config.huber else F.mse_loss(q, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.qnet.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.num_updates += 1
        if self.num_updates % self.config.target_update_interval == 0:
            self.sync_target()
        return {"loss": float(loss.item()), "q_mean": float(q.detach().mean().item())}

    def sync_target(self) -> None:
        """Hard copy of the online weights into the target network."""
        self.target_net.load_state_dict(self.qnet.state_dict())

    # ------------------------------------------------------------------------------- checkpoints
    def save(self, path: str | os.PathLike, *, extra: dict | None = None) -> Path:
        """Write a checkpoint (format in :mod:`gpualloc.rl.dqn.checkpoint`); returns the path.

        Args:
            path: Destination file; parent folders are created. Written atomically (a temporary file,
                then a rename), so a best-so-far checkpoint is never left half-written.
            extra: Metadata stored instead of ``self.extra`` when given.
        """
        path = Path(path)
        ckpt = {
            "format": FORMAT,
            "version": VERSION,
            "config": asdict(self.config),
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
            "qnet": self.qnet.state_dict(),
            "target_net": self.target_net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "num_timesteps": self.num_timesteps,
            "num_updates": self.num_updates,
            "rng_state": self._rng.bit_generator.state,
            "extra": encode_value(self.extra if extra is None else extra),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(ckpt, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: str | None = None) -> DQNAgent:
        """Rebuild an agent saved by :meth:`save`: config, spaces, weights, optimizer, counters,
        exploration RNG state and ``extra``.

        Args:
            path: Checkpoint file.
            device: Override ``config.device`` (e.g. load a GPU-trained agent on CPU).

        Raises:
            AgentError: One line naming ``path``: unreadable, not a DQN checkpoint, other version,
                or weights that do not fit the stored architecture.
        """
        path = Path(path)
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError as err:
            raise AgentError(f"{path}: no such DQN checkpoint file") from err
        except pickle.UnpicklingError as err:
            raise AgentError(f"{path}: not a DQN checkpoint (not a weights-only torch file; "
                             "pickled objects are refused)") from err
        except Exception as err:  # torch raises many types for a bad file; all mean "unreadable"
            raise AgentError(f"{path}: cannot read DQN checkpoint: {_one_line(err)}") from err
        if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
            raise AgentError(f"{path}: not a gpualloc DQN checkpoint")
        if ckpt.get("version") != VERSION:
            raise AgentError(f"{path}: DQN checkpoint version {ckpt.get('version')!r}, expected {VERSION}")
        for key, kind in _FIELDS.items():
            if not isinstance(ckpt.get(key), kind):
                raise AgentError(f"{path}: incompatible DQN checkpoint: field {key!r} missing or not "
                                 f"a {kind.__name__}")
        try:
            config = DQNConfig.from_dict(ckpt["config"])
            if device is not None:
                config = replace(config, device=device)
            agent = cls(space_from_dict(ckpt["observation_space"]), space_from_dict(ckpt["action_space"]), config)
            agent.qnet.load_state_dict(ckpt["qnet"])
            agent.target_net.load_state_dict(ckpt["target_net"])
            agent.optimizer.load_state_dict(ckpt["optimizer"])
            agent.num_timesteps = int(ckpt["num_timesteps"])
            agent.num_updates = int(ckpt["num_updates"])
            agent._rng.bit_generator.state = ckpt["rng_state"]
            agent.extra = decode_value(ckpt["extra"])
        except AgentError as err:
            raise AgentError(f"{path}: incompatible DQN checkpoint: {err}") from err
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as err:
            raise AgentError(f"{path}: incompatible DQN checkpoint: {_one_line(err)}") from err
        return agent


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
