"""The one DQN agent shared by the placement and scheduling agents.

- ``config.py``: :class:`DQNConfig`, every hyper-parameter with its docstring.
- ``networks.py``: MLP and CNN Q-networks, chosen by ``config.backbone`` in :func:`build_qnet`.
- ``replay.py``: uniform replay ring buffer of flat or Dict observations with next-state masks.
- ``agent.py``: :class:`DQNAgent`: masked epsilon-greedy acting, the double-DQN update, checkpoints.
- ``checkpoint.py``: the checkpoint format (spaces and metadata as plain values).
- ``train.py``: :func:`train` and :func:`evaluate`, the loop of Mnih et al. (2015).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpualloc.rl.dqn.agent import DQNAgent
    from gpualloc.rl.dqn.config import DQNConfig
    from gpualloc.rl.dqn.train import EvalResult, TrainLog, evaluate, train

__all__ = ["DQNAgent", "DQNConfig", "EvalResult", "TrainLog", "evaluate", "train"]

_HOME = {"DQNAgent": "agent", "DQNConfig": "config", "EvalResult": "train", "TrainLog": "train", "evaluate": "train",
         "train": "train"}


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # Importing the submodule ``gpualloc.rl.dqn.train`` (as distributed.py does) would set the package's
        # ``train`` to that module; the package's ``train`` is the function.
        if not (name in _HOME and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    # Imported on first use (PEP 562): ``gpualloc.rl.dqn.config`` alone, which the scheduling features read,
    # then costs no torch import (seconds), and a policy whose agent is not needed never loads torch.
    if name in _HOME:
        value = getattr(importlib.import_module(f"gpualloc.rl.dqn.{_HOME[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
