"""Q-networks: an MLP for flat observations and a CNN for a grid plus flat features.

Both map a batch of observations to one Q-value per action. An observation batch is a tensor (flat
Box, or a grid Box for the CNN) or a mapping ``{"grid": ..., "features": ...}`` (Dict space).

The CNN is the scheduling design's "CNN over the GPU-utilisation matrix plus two fully connected
layers": 3x3 convolutions (padding 1, ReLU) over the grid, flattened, concatenated with the extra flat
features, then the fully connected head. By default the last convolution has stride 2: on a 16x32
grid that cuts the first fully connected layer from 4.2M to 1.0M weights (decisions about 4x and
gradient steps about 3.5x faster), while every cell still reaches the head through a 5x5 receptive field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from gpualloc.errors import AgentError
from gpualloc.rl.dqn.config import DQNConfig

__all__ = ["BACKBONES", "CNNQNet", "MLPQNet", "build_qnet"]

TensorObs = torch.Tensor | Mapping[str, torch.Tensor]


def _head(in_dim: int, hidden: Sequence[int], out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class MLPQNet(nn.Module):
    """Fully connected Q-network: ``obs_dim -> hidden... -> n_actions`` with ReLU.

    Args:
        obs_dim: Length of the flattened observation.
        n_actions: Number of discrete actions.
        hidden: Hidden layer widths.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.obs_dim = int(obs_dim)
        self.n_actions = int(n_actions)
        self.net = _head(self.obs_dim, hidden, self.n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values ``(batch, n_actions)`` of a batch ``(batch, *obs_shape)``."""
        return self.net(obs.reshape(obs.shape[0], self.obs_dim))


class CNNQNet(nn.Module):
    """Convolutional Q-network over a grid, with extra flat features joined before the head.

    Args:
        grid_shape: ``(C, H, W)`` or ``(H, W)`` (one channel) of one observation's grid.
        extra_dim: Length of the flat feature vector (0 for none).
        n_actions: Number of discrete actions.
        channels: Output channels of each 3x3 convolution.
        hidden: Widths of the fully connected layers after the convolutions.
        strides: Stride of each convolution (same length as ``channels``).
    """

    def __init__(self, grid_shape: Sequence[int], extra_dim: int, n_actions: int,
                 channels: Sequence[int] = (16, 32), hidden: Sequence[int] = (256, 256),
                 strides: Sequence[int] = (1, 2)) -> None:
        super().__init__()
        grid_shape = tuple(int(s) for s in grid_shape)
        if len(grid_shape) == 2:
            grid_shape = (1, *grid_shape)
        if len(grid_shape) != 3 or min(grid_shape) < 1:
            raise AgentError(f"CNNQNet: grid_shape {grid_shape} must be (C, H, W) or (H, W)")
        if len(strides) != len(channels):
            raise AgentError(f"CNNQNet: {len(strides)} strides for {len(channels)} convolutions")
        self.grid_shape = grid_shape
        self.extra_dim = int(extra_dim)
        self.n_actions = int(n_actions)
        convs: list[nn.Module] = []
        in_ch, height, width = grid_shape
        for out_ch, stride in zip(channels, strides, strict=False):
            convs += [nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1), nn.ReLU()]
            in_ch, height, width = out_ch, (height - 1) // stride + 1, (width - 1) // stride + 1
        self.conv = nn.Sequential(*convs, nn.Flatten())
        flat = in_ch * height * width
        self.head = _head(flat + self.extra_dim, hidden, self.n_actions)

    def forward(self, obs: TensorObs) -> torch.Tensor:
        """Q-values ``(batch, n_actions)`` of a grid batch or a ``{"grid", "features"}`` batch."""
        if isinstance(obs, Mapping):
            grid, extra = obs["grid"], obs.get("features")
        else:
            grid, extra = obs, None
        x = self.conv(grid.reshape(grid.shape[0], *self.grid_shape))
        if self.extra_dim:
            x = torch.cat([x, extra.reshape(extra.shape[0], self.extra_dim)], dim=1)
        return self.head(x)


# --------------------------------------------------------------------------------------- registry
def _flat_dim(space: spaces.Box) -> int:
    return int(np.prod(space.shape, dtype=np.int64))


def _build_mlp(space: spaces.Space, n_actions: int, config: DQNConfig) -> nn.Module:
    if not isinstance(space, spaces.Box):
        raise AgentError(f"backbone 'mlp' needs a Box observation space, got {space}")
    return MLPQNet(_flat_dim(space), n_actions, config.hidden)


def _build_cnn(space: spaces.Space, n_actions: int, config: DQNConfig) -> nn.Module:
    if isinstance(space, spaces.Dict):
        grid = space.spaces.get("grid")
        extra = space.spaces.get("features")
        unknown = sorted(set(space.spaces) - {"grid", "features"})
        if not isinstance(grid, spaces.Box) or unknown or not (extra is None or isinstance(extra, spaces.Box)):
            raise AgentError(f"backbone 'cnn' needs Dict(grid=Box, features=Box), got {space}")
        extra_dim = 0 if extra is None else _flat_dim(extra)
    elif isinstance(space, spaces.Box):
        grid, extra_dim = space, 0
    else:
        raise AgentError(f"backbone 'cnn' needs a Dict or Box observation space, got {space}")
    if len(grid.shape) not in (2, 3):
        raise AgentError(f"backbone 'cnn' needs a (H, W) or (C, H, W) grid, got shape {grid.shape}")
    return CNNQNet(grid.shape, extra_dim, n_actions, config.cnn_channels, config.hidden, config.cnn_strides)


BACKBONES: dict[str, Callable[[spaces.Space, int, DQNConfig], nn.Module]] = {
    "mlp": _build_mlp,
    "cnn": _build_cnn,
}
"""Backbone name -> ``(observation_space, n_actions, config) -> Q-network``."""


def build_qnet(observation_space: spaces.Space, n_actions: int, config: DQNConfig) -> nn.Module:
    """The Q-network named by ``config.backbone`` for this observation space.

    Uses the current torch RNG for initialisation; the agent seeds it inside a scoped fork.

    Raises:
        AgentError: Unknown backbone, or a space the backbone cannot read.
    """
    try:
        builder = BACKBONES[config.backbone]
    except KeyError:
        raise AgentError(f"unknown backbone {config.backbone!r}; known: {', '.join(BACKBONES)}") from None
    return builder(observation_space, n_actions, config)
