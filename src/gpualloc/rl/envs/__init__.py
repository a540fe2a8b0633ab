"""Gymnasium environments; importing this package registers them.

* ``gpualloc/Placement-v0``: :class:`~gpualloc.rl.envs.placement_env.PlacementEnv`.
"""

from __future__ import annotations

import gymnasium

if "gpualloc/Placement-v0" not in gymnasium.registry:
    gymnasium.register("gpualloc/Placement-v0", entry_point="gpualloc.rl.envs.placement_env:PlacementEnv")
