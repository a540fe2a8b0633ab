"""PlacementEnv: assign a job's subgraphs to devices one at a time (ATCRAD-RL's agent view).

The graph is first coarsened into ``factor x k`` subgraphs: contiguous runs of the topological order
with equal mean compute time (so a subgraph is a pipeline-stage-sized piece). An episode visits them
in topological order; the action puts the current subgraph on a device.

Observation (fixed size for any graph and any cluster of up to ``max_devices`` devices, so one agent
serves many): for every device slot, [present, relative speed, load so far, free memory, time of the
current subgraph there, time of the next subgraph there, time to bring the current subgraph's inputs
there from what is already placed, whether the base plan puts the current subgraph there]; then
[progress, current subgraph's share of nodes, of FLOPs, of work left, microbatches / 16]. Times are
divided by the base plan's simulated step time; memory by each device's capacity.

Reward: the base plan is the best heuristic's (``gpualloc.placement.run.best``). After each action the
subgraphs not yet placed follow the base plan, and the whole graph is simulated. The step's reward is
the drop in simulated step time (over the base step time) plus ``energy_weight`` times the drop in
energy per sample (over the base). The shaping telescopes: an episode's return is exactly the final
plan's relative gain in throughput and energy efficiency over the best heuristic, so a return above
zero means the agent beat it.

Actions that would overflow a device's memory, and empty device slots, are masked
(``info["action_mask"]`` and :meth:`PlacementEnv.action_masks`). An agent that ignores the mask (as
Stable-Baselines3's DQN does) still gets a valid plan: a masked action is replaced by the base plan's
device and costs ``INVALID_PENALTY``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from gpualloc.errors import AgentError
from gpualloc.placement.partition.baselines import contiguous_chunks
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.outcome import Outcome
from gpualloc.placement.run import best
from gpualloc.placement.simulate import simulate_step
from gpualloc.seeding import seeded

DEVICE_FEATURES = 8
GLOBAL_FEATURES = 5
OBS_CLIP = 10.0
INVALID_PENALTY = 0.1
"""Reward lost by a masked action (which is replaced by the base plan's device)."""


@dataclass
class _Episode:
    """Per-problem data computed once: subgraphs, their costs, the base plan."""

    problem: PlacementProblem
    group: np.ndarray  # subgraph index per node
    sub_time: np.ndarray  # (m, k) compute time of each subgraph on each device
    sub_mem: np.ndarray  # (m,) training memory
    sub_nodes: np.ndarray  # (m,) node counts
    sub_flops: np.ndarray  # (m,)
    sub_edges: tuple[np.ndarray, np.ndarray, np.ndarray]  # (src group, dst group, bytes) across groups
    base: Outcome  # the best heuristic's plan
    base_sub: np.ndarray  # (m,) base plan's device per subgraph (majority of its nodes)
    base_step_s: float
    base_energy_j: float

    @property
    def m(self) -> int:
        return len(self.sub_nodes)


def coarsen(problem: PlacementProblem, parts: int) -> np.ndarray:
    """Subgraph index per node: ``parts`` contiguous topological runs of equal mean compute time."""
    order = problem.graph.topo_order
    group = np.empty(problem.n, dtype=np.int64)
    group[order] = contiguous_chunks(problem.compute_s.mean(axis=1)[order], max(1, min(parts, problem.n)))
    _, group = np.unique(group, return_inverse=True)  # drop empty chunks
    return group.astype(np.int64)


def _prepare(problem: PlacementProblem, factor: int, seed: int) -> _Episode:
    group = coarsen(problem, factor * problem.k)
    m = int(group.max()) + 1 if problem.n else 0
    sub_time = np.zeros((m, problem.k))
    np.add.at(sub_time, group, problem.compute_s)
    g = problem.graph
    gs, gd = group[g.edge_src], group[g.edge_dst]
    cross = gs != gd
    base = best(problem, seed=seed)
    base_sub = np.array([np.bincount(base.plan.assignment[group == s], minlength=problem.k).argmax() for s in range(m)])
    base_result = simulate_step(problem, base_sub[group])
    return _Episode(
        problem=problem,
        group=group,
        sub_time=sub_time,
        sub_mem=np.bincount(group, weights=problem.mem_bytes, minlength=m),
        sub_nodes=np.bincount(group, minlength=m).astype(np.float64),
        sub_flops=np.bincount(group, weights=g.flops, minlength=m),
        sub_edges=(gs[cross], gd[cross], g.edge_bytes[cross]),
        base=base,
        base_sub=base_sub,
        base_step_s=max(base_result.step_time_s, 1e-12),
        base_energy_j=max(base_result.energy_per_step_j, 1e-12),
    )


class PlacementEnv(gym.Env):
    """Assign subgraphs of one training job to devices; see the module docstring.

    Args:
        problems: placement problems to draw from at each reset (uniformly, seeded). Default: the
            tiny zoo ResNet on a 2 A100 + 2 V100 cluster, so ``gym.make("gpualloc/Placement-v0")``
            works without arguments.
        max_devices: device slots in the observation and action space.
        factor: subgraphs per device.
        energy_weight: weight of the energy-efficiency term in the reward.
        seed: seed of the base plans' heuristics.
    """

    metadata = {"render_modes": []}

    @seeded(error=AgentError)
    def __init__(self, problems: Sequence[PlacementProblem] | None = None, *, max_devices: int = 16,
                 factor: int = 4, energy_weight: float = 0.1, seed: int = 0) -> None:
        super().__init__()
        if problems is None:
            problems = [default_problem()]
        if not problems:
            raise AgentError("PlacementEnv: problems is empty")
        too_big = [p for p in problems if p.k > max_devices]
        if too_big:
            raise AgentError(f"PlacementEnv: cluster {too_big[0].cluster.name!r} has {too_big[0].k} devices; "
                             f"max_devices is {max_devices}")
        self.max_devices = max_devices
        self.energy_weight = energy_weight
        self._episodes = [_prepare(p, factor, seed) for p in problems]
        dim = max_devices * DEVICE_FEATURES + GLOBAL_FEATURES
        self.observation_space = spaces.Box(-OBS_CLIP, OBS_CLIP, shape=(dim,), dtype=np.float32)
        self.action_space = spaces.Discrete(max_devices)
        self._ep: _Episode | None = None

    # ------------------------------------------------------------------ gymnasium API
    @seeded(error=AgentError)
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        index = (options or {}).get("problem")
        if index is None:
            index = int(self.np_random.integers(len(self._episodes)))
        self._ep = ep = self._episodes[index]
        self._cursor = 0
        self._sub = ep.base_sub.copy()  # unplaced subgraphs follow the base plan
        self._load = np.zeros(ep.problem.k)
        self._mem = np.zeros(ep.problem.k)
        self._step_s, self._energy_j = ep.base_step_s, ep.base_energy_j
        return self._observe(), self._info()

    def step(self, action: int):
        ep = self._ep
        if ep is None:
            raise AgentError("PlacementEnv: step() before reset()")
        mask = self.action_masks()
        action = int(action)
        invalid = not (0 <= action < self.max_devices and mask[action])
        s = self._cursor
        if invalid:  # agents without masking (SB3): the base plan's device, and a penalty
            base = int(ep.base_sub[s])
            action = base if mask[base] else int(np.flatnonzero(mask)[0])
        self._sub[s] = action
        self._load[action] += ep.sub_time[s, action]
        self._mem[action] += ep.sub_mem[s]
        result = simulate_step(ep.problem, self._sub[ep.group])
        step_s, energy_j = result.step_time_s, result.energy_per_step_j
        reward = (self._step_s - step_s) / ep.base_step_s \
            + self.energy_weight * (self._energy_j - energy_j) / ep.base_energy_j - INVALID_PENALTY * invalid
        self._step_s, self._energy_j = step_s, energy_j
        self._cursor += 1
        terminated = self._cursor >= ep.m
        return self._observe(), float(reward), terminated, False, self._info()

    def action_masks(self) -> np.ndarray:
        """Valid actions now: present devices with room for the current subgraph."""
        ep = self._ep
        mask = np.zeros(self.max_devices, dtype=bool)
        if ep is None:
            return mask
        k = ep.problem.k
        if self._cursor >= ep.m:
            mask[:k] = True
            return mask
        fits = self._mem + ep.sub_mem[self._cursor] <= ep.problem.usable_mem_bytes
        mask[:k] = fits if fits.any() else True  # nothing fits: let the simulator report the excess
        return mask

    # ------------------------------------------------------------------ results
    @property
    def assignment(self) -> np.ndarray:
        """The current plan, node -> device (unplaced subgraphs on the base plan's devices)."""
        return self._sub[self._ep.group]

    @property
    def base_outcome(self) -> Outcome:
        """The best heuristic's outcome (node-level; the env's base is its per-subgraph majority)."""
        return self._ep.base

    # ------------------------------------------------------------------ internals
    def _info(self) -> dict:
        return {"action_mask": self.action_masks(), "step_time_s": self._step_s}

    def _observe(self) -> np.ndarray:
        ep = self._ep
        p = ep.problem
        k, K = p.k, self.max_devices
        ref = ep.base_step_s
        s = min(self._cursor, ep.m - 1)
        nxt = min(s + 1, ep.m - 1)
        dev = np.zeros((K, DEVICE_FEATURES))
        dev[:k, 0] = 1.0
        dev[:k, 1] = p.speed / p.speed.max()
        dev[:k, 2] = self._load / ref
        dev[:k, 3] = 1.0 - self._mem / p.mem_cap_bytes
        dev[:k, 4] = ep.sub_time[s] / ref
        dev[:k, 5] = ep.sub_time[nxt] / ref
        dev[:k, 6] = self._input_cost(s) / ref
        dev[:k, 7] = (np.arange(k) == ep.base_sub[s])
        glob = np.array([
            self._cursor / ep.m,
            ep.sub_nodes[s] / ep.sub_nodes.sum(),
            ep.sub_flops[s] / max(ep.sub_flops.sum(), 1e-30),
            ep.sub_time[s:].mean(axis=1).sum() / max(ep.sub_time.mean(axis=1).sum(), 1e-30),
            p.microbatches / 16.0,
        ])
        obs = np.concatenate([dev.ravel(), glob]).astype(np.float32)
        return np.clip(obs, -OBS_CLIP, OBS_CLIP)

    def _input_cost(self, s: int) -> np.ndarray:
        """Time to bring subgraph ``s``'s inputs from placed subgraphs to each device (fwd + bwd)."""
        ep = self._ep
        p = ep.problem
        src, dst, nbytes = ep.sub_edges
        sel = (dst == s) & (src < self._cursor)
        cost = np.zeros(p.k)
        for u, b in zip(src[sel].tolist(), nbytes[sel].tolist(), strict=False):
            d = self._sub[u]
            cost += 2 * p.transfer_s(b, d, np.arange(p.k))
        return cost


def default_problem() -> PlacementProblem:
    """The tiny zoo ResNet (batch 8) on 2 A100 + 2 V100: a seconds-fast default for smoke use."""
    from gpualloc.graph.capture import capture
    from gpualloc.hardware.cluster import load_cluster

    return PlacementProblem(capture("resnet-tiny", batch=8), load_cluster("2xA100+2xV100"))
