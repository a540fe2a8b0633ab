"""A model of one's own for ``gpualloc graph capture examples.mymodel:build`` (run from the checkout's
root; any ``package.module:function`` on the import path works, the current folder included).

The factory takes no arguments and returns an ``nn.Module``. The traced inputs come from the module's
``example_inputs(batch)`` method, as here; or from a module-level ``example_inputs(batch)`` function;
or, for a model with neither, from ``--input-shape`` (``build_plain`` below:
``gpualloc graph capture examples.mymodel:build_plain --input-shape 64 -o m.json``).
"""

from __future__ import annotations

import torch
from torch import nn


class TinyClassifier(nn.Module):
    """A two-layer MLP over 64 features, 10 classes."""

    def __init__(self, features: int = 64, hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.features = features
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def example_inputs(self, batch: int) -> tuple[torch.Tensor]:
        return (torch.randn(batch, self.features),)


def build() -> TinyClassifier:
    return TinyClassifier()


def build_plain() -> nn.Module:
    """The same network without ``example_inputs``: capture it with ``--input-shape 64``."""
    return TinyClassifier().net
