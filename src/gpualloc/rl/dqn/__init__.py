"""The one DQN agent shared by the placement and scheduling agents.

- ``config.py``: :class:`DQNConfig`, every hyper-parameter with its docstring.
- ``networks.py``: MLP and CNN Q-networks, chosen by ``config.backbone`` in :func:`build_qnet`.
- ``replay.py``: uniform replay ring buffer of flat or Dict observations with next-state masks.
- ``agent.py``: :class:`DQNAgent`: masked epsilon-greedy acting, the double-DQN update, checkpoints.
- ``checkpoint.py``: the checkpoint format (spaces and metadata as plain values).
- ``train.py``: :func:`train` and :func:`evaluate`, the loop of Mnih et al. (2015).
"""

from gpualloc.rl.dqn.agent import DQNAgent
from gpualloc.rl.dqn.config import DQNConfig
from gpualloc.rl.dqn.train import EvalResult, TrainLog, evaluate, train

__all__ = ["DQNAgent", "DQNConfig", "EvalResult", "TrainLog", "evaluate", "train"]
