"""Gymnasium environments; importing this package registers them.

* ``gpualloc/Placement-v0``: :class:`~gpualloc.rl.envs.placement_env.PlacementEnv`.
* ``gpualloc/Scheduling-v0``: :class:`~gpualloc.rl.envs.scheduling_env.SchedulingEnv`, the design's
  job -> GPU action space, for researchers who bring their own agent.
* ``gpualloc/ExpertChoice-v0``: :class:`~gpualloc.rl.envs.expert_env.ExpertChoiceEnv`, the environment of
  the bundled ``dqn`` scheduler (choose one expert heuristic's decision at each decision point).
"""

from __future__ import annotations

import gymnasium

_ENVS = {
    "gpualloc/Placement-v0": "gpualloc.rl.envs.placement_env:PlacementEnv",
    "gpualloc/Scheduling-v0": "gpualloc.rl.envs.scheduling_env:SchedulingEnv",
    "gpualloc/ExpertChoice-v0": "gpualloc.rl.envs.expert_env:ExpertChoiceEnv",
}
for _name, _entry in _ENVS.items():
    if _name not in gymnasium.registry:
        gymnasium.register(_name, entry_point=_entry)
