"""Hyper-parameters of the DQN agent, one frozen dataclass with a docstring per field."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from gpualloc.errors import AgentError


@dataclass(frozen=True)
class DQNConfig:
    """Everything that shapes one DQN agent: network, optimiser, replay, exploration, target.

    The defaults follow the placement and scheduling designs (Adam at 1e-4, double DQN, Huber loss);
    the rest are the usual values of Mnih et al. (2015) scaled to small environments.
    """

    gamma: float = 0.99
    """Discount factor of future rewards, in [0, 1]."""

    lr: float = 1e-4
    """Adam learning rate."""

    batch_size: int = 32
    """Transitions per gradient step."""

    buffer_size: int = 100_000
    """Replay capacity in transitions; the oldest are overwritten first."""

    learning_starts: int = 1_000
    """Transitions collected (acting epsilon-greedily) before the first gradient step. Learning also
    waits until the buffer holds at least one batch."""

    train_freq: int = 4
    """Environment steps between training rounds."""

    gradient_steps: int = 1
    """Gradient steps per training round."""

    target_update_interval: int = 1_000
    """Gradient steps between hard copies of the online network into the target network (the ``C``
    of Mnih et al. 2015). We use hard updates only, no Polyak averaging: one mechanism, one knob,
    and the target stays exactly fixed between copies, which is what the analysis of the method
    assumes."""

    eps_start: float = 1.0
    """Exploration rate at environment step 0."""

    eps_end: float = 0.05
    """Exploration rate once the linear decay is over."""

    eps_decay_steps: int = 10_000
    """Environment steps over which epsilon falls linearly from ``eps_start`` to ``eps_end``."""

    max_grad_norm: float | None = 10.0
    """Clip the global gradient norm to this value before each Adam step; None disables clipping."""

    huber: bool = True
    """Huber (smooth L1) TD loss, as Mnih et al.'s error clipping; False for mean squared error."""

    double: bool = True
    """Double DQN (van Hasselt et al. 2016): the online network picks the next action, the target
    network values it. False gives the original max over the target network."""

    hidden: tuple[int, ...] = (256, 256)
    """Widths of the fully connected hidden layers (of the MLP, or of the CNN's head)."""

    backbone: str = "mlp"
    """``"mlp"`` for flat Box observations, ``"cnn"`` for a grid (a Dict with ``"grid"`` and
    optional ``"features"``, or a 2-D/3-D Box). See :data:`gpualloc.rl.dqn.networks.BACKBONES`."""

    cnn_channels: tuple[int, ...] = (16, 32)
    """Output channels of each 3x3 convolution (padding 1) of the CNN backbone."""

    cnn_strides: tuple[int, ...] = (1, 2)
    """Stride of each convolution, one per entry of ``cnn_channels``. The final stride 2 halves the
    grid before the head, so the first fully connected layer is 4x smaller (see ``networks.py``)."""

    seed: int | None = 0
    """Seeds network initialisation and exploration; None draws fresh entropy."""

    device: str = "cpu"
    """Torch device of the networks and of sampled batches."""

    def __post_init__(self) -> None:
        # Checkpoints store tuples as lists in some paths; normalise so equality holds after loading.
        object.__setattr__(self, "hidden", tuple(self.hidden))
        object.__setattr__(self, "cnn_channels", tuple(self.cnn_channels))
        object.__setattr__(self, "cnn_strides", tuple(self.cnn_strides))
        checks = [
            ("gamma", 0.0 <= self.gamma <= 1.0, "must be in [0, 1]"),
            ("lr", self.lr > 0 and math.isfinite(self.lr), "must be positive"),
            ("batch_size", _pos_int(self.batch_size), "must be a positive int"),
            ("buffer_size", _pos_int(self.buffer_size), "must be a positive int"),
            ("learning_starts", _int(self.learning_starts) and self.learning_starts >= 0, "must be an int >= 0"),
            ("train_freq", _pos_int(self.train_freq), "must be a positive int"),
            ("gradient_steps", _pos_int(self.gradient_steps), "must be a positive int"),
            ("target_update_interval", _pos_int(self.target_update_interval), "must be a positive int"),
            ("eps_start", 0.0 <= self.eps_start <= 1.0, "must be in [0, 1]"),
            ("eps_end", 0.0 <= self.eps_end <= 1.0, "must be in [0, 1]"),
            ("eps_decay_steps", _int(self.eps_decay_steps) and self.eps_decay_steps >= 0, "must be an int >= 0"),
            ("max_grad_norm", self.max_grad_norm is None or self.max_grad_norm > 0, "must be positive or None"),
            ("hidden", all(_pos_int(h) for h in self.hidden), "must be positive ints"),
            ("backbone", isinstance(self.backbone, str), "must be a string"),
            ("cnn_channels", len(self.cnn_channels) > 0 and all(_pos_int(c) for c in self.cnn_channels),
             "must be one or more positive ints"),
            ("cnn_strides", len(self.cnn_strides) == len(self.cnn_channels)
             and all(_pos_int(s) for s in self.cnn_strides), "must be positive ints, one per cnn_channels entry"),
            ("seed", self.seed is None or (_int(self.seed) and self.seed >= 0), "must be an int >= 0 or None"),
            ("device", isinstance(self.device, str), "must be a string"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise AgentError(f"DQNConfig.{name}={getattr(self, name)!r} {why}")

    def epsilon(self, step: int) -> float:
        """Exploration rate after ``step`` environment steps (linear decay, then constant)."""
        if step >= self.eps_decay_steps:
            return self.eps_end
        return self.eps_start + (self.eps_end - self.eps_start) * step / self.eps_decay_steps

    @classmethod
    def from_dict(cls, data: dict) -> DQNConfig:
        """Rebuild from :func:`dataclasses.asdict` output; unknown keys raise :class:`AgentError`."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise AgentError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _pos_int(x: object) -> bool:
    return _int(x) and x > 0
