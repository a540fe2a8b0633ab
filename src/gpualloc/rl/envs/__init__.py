"""Gymnasium environments; importing this package registers them.

* ``gpualloc/Placement-v0``: :class:`~gpualloc.rl.envs.placement_env.PlacementEnv`.
* ``gpualloc/Scheduling-v0``: :class:`~gpualloc.rl.envs.scheduling_env.SchedulingEnv`.
"""

from __future__ import annotations

import gymnasium

if "gpualloc/Placement-v0" not in gymnasium.registry:
    gymnasium.register("gpualloc/Placement-v0", entry_point="gpualloc.rl.envs.placement_env:PlacementEnv")
if "gpualloc/Scheduling-v0" not in gymnasium.registry:
    gymnasium.register("gpualloc/Scheduling-v0", entry_point="gpualloc.rl.envs.scheduling_env:SchedulingEnv")
