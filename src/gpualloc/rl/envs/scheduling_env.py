"""``gpualloc/Scheduling-v0``: start queued jobs one at a time at each decision point of the cluster simulator.

The design's own job -> GPU action space, a Gymnasium environment for researchers who bring their own agent
(the bundled ``dqn`` scheduler chooses among expert heuristics instead: ``gpualloc/ExpertChoice-v0``,
:mod:`gpualloc.rl.envs.expert_env`). It is checked with Gymnasium's ``check_env`` and trained by
Stable-Baselines3's DQN in the tests. The environment drives
:class:`gpualloc.scheduling.simulator.Simulation`, the engine behind ``simulate()``, so the agent meets
exactly the events, validation and results every policy does.
Observations, masks and action decoding come from :class:`gpualloc.rl.features.DecisionPoint`.

* **Episode**: one trace: drawn from ``traces``, or generated (:func:`gpualloc.workload.traces.generate`,
  a job count and a load drawn uniformly from ``num_jobs`` and ``loads``). It ends when every job has
  finished (``terminated``), or after ``max_steps`` steps (``truncated``).
* **Step**: one action at the current decision point. ``slot * max_types + type`` starts the job in
  that slot on that device type (consolidated best fit, as the heuristics place); the env stays at
  the decision point, and the slots refill. ``wait`` (the last action) ends the decision point: the
  simulator runs to the next one. When no start is possible, the env moves on by itself, so every
  observation has at least one start to choose from (until the end).
* **Observation**: ``{"grid": (channels, max_gpus, window), "features": (feature_dim,)}``
  (:class:`~gpualloc.rl.features.FeatureLayout`).
* **Mask**: ``info["action_mask"]`` and :meth:`SchedulingEnv.action_masks`: a start is valid when its
  slot holds a job that may run on that type and enough GPUs of it are free (on one node for
  single-node jobs). Wait is valid unless nothing runs, nothing was started and some job could start
  (``work_conserving``; with it off, only when nothing could ever happen while waiting).
* **Reward**: the design's ``R = -(sum of JCT + lambda * idle GPU time)``, paid as it accrues. A step
  that lets simulated time pass from ``t0`` to ``t1`` costs

      c = integral_{t0}^{t1} jobs_in_system(t) dt + idle_weight * integral_{t0}^{t1} idle_gpus(t) dt

  and a start (no time passes) costs 0. Each job adds 1 to ``jobs_in_system`` from its arrival to its
  finish, so the first integral summed over an episode is exactly the sum of the JCTs; the second
  is the GPU-seconds no job used between the first arrival and the last finish
  (``metrics.idle_gpu_s``). Without shaping, ``r = -c / reward_scale_s`` and an episode's return
  telescopes to ``-(sum JCT + idle_weight * idle GPU-s) / reward_scale_s``.

  **Shaping** (``shaping=True``, the default) adds the potential-based term of Ng, Harada and
  Russell (1999): ``r = -(c + phi(s') - phi(s)) / reward_scale_s`` with ``phi`` the job-seconds
  still certain to come: a running job's time to its finish, a queued job's remaining work on its
  fastest type, a job yet to arrive its whole best time (``SimResult.best_time_s``). The pay-off is
  immediate credit: a wait costs the *queued* jobs' waiting time (plus the idle term) as it accrues,
  a start costs at once the time the chosen type loses against the job's fastest type, and a
  running job's time is no longer charged step by step. Since ``phi`` is the sum of all best times
  at the start and 0 at the end, the return telescopes to

      -(sum over jobs of (JCT - best time) + idle_weight * idle GPU-s) / reward_scale_s,

  the design's ``R`` up to the trace's constant ``sum of best times``: the same optimal schedules,
  and a return of 0 would mean every job ran as if alone on its fastest type (``oracle-lb``).
An agent that ignores the mask (as Stable-Baselines3's DQN does) still drives a valid schedule: a
masked action becomes wait (or, where wait is invalid, the first valid start) and costs
``INVALID_PENALTY``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import gymnasium as gym
import numpy as np

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.scheduling.base import PENDING, QUEUED, RUNNING, Decision
from gpualloc.rl.features import (SLOT_ORDERS, DecisionPoint, FeatureLayout, FeatureScaler, GridHistory,
                                          JobRequests, MetricsSource, simulated_metrics)
from gpualloc.scheduling.simulator import SimResult, Simulation
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate

INVALID_PENALTY = 0.1
"""Reward lost by a masked action."""

DEFAULT_IDLE_WEIGHT = 0.1
"""The design's lambda: weight of idle GPU time against job completion time."""


def potential(sim: Simulation, best_time: np.ndarray) -> float:
    """phi of the shaping term: job-seconds still certain to come (running: to the finish; queued: the
    remaining work on the fastest type; not yet arrived: the best time); 0 once every job is done.

    Args:
        sim: the paused simulation.
        best_time: each job's best time (``Simulation.best_time_s`` with NaN as 0).
    """
    if sim.done:
        return 0.0
    view = sim.view
    # the reward is the environment's accounting, not the agent's state: it reads the simulator's own
    # table (the truth), whatever the information level the policy's view is at (issue 36)
    jobs = sim._engine.table  # noqa: SLF001
    status = jobs.status
    running = status == RUNNING
    queued = status == QUEUED
    work = jobs.work_s
    return float((jobs.expected_finish_s[running] - view.now_s).sum()
                 + (best_time[queued] * jobs.remaining_s[queued] / work[queued]).sum()
                 + best_time[status == PENDING].sum())


class SchedulingEnv(gym.Env):
    """Schedule one trace on one cluster, one start at a time; see the module docstring.

    Args:
        cluster: cluster spec or name (preset, shorthand or file).
        traces: traces to draw episodes from (any reader's output); None generates them.
        num_jobs: ``(low, high)`` jobs of a generated trace, inclusive.
        loads: ``(low, high)`` offered load of a generated trace.
        mix: job-type mix of generated traces (see :func:`~gpualloc.workload.traces.generate`).
        layout: tensor sizes; default :class:`FeatureLayout()`.
        scaler: normalisation statistics; default fitted on ``traces`` or on generated traces.
        idle_weight: lambda in (0, 1), the weight of idle GPU time in the reward.
        reward_scale_s: divides every reward; default ``scaler.time_scale_s x GPUs``.
        shaping: add the potential-based shaping term (see the module docstring).
        slot_order: ``"shortest"`` or ``"arrival"`` (:data:`~gpualloc.rl.features.SLOT_ORDERS`).
        work_conserving: wait is invalid while the cluster runs nothing and a job could start.
        max_steps: truncate an episode after this many steps (None: never).
        metrics: source of live GPU metrics (the simulator's by default).
        sim_options: extra keyword arguments of :class:`~gpualloc.scheduling.simulator.Simulation`
            (``failures``, ``restart_penalty_s``, ...). Unplaceable jobs are always dropped.
    """

    metadata = {"render_modes": []}

    def __init__(self, cluster: ClusterSpec | str = "adlro16", traces: Sequence[Trace] | None = None, *,
                 num_jobs: tuple[int, int] = (100, 300), loads: tuple[float, float] = (0.5, 1.0),
                 mix: Mapping[str, float] | None = None, layout: FeatureLayout | None = None,
                 scaler: FeatureScaler | None = None, idle_weight: float = DEFAULT_IDLE_WEIGHT,
                 reward_scale_s: float | None = None, shaping: bool = True, slot_order: str = "shortest",
                 work_conserving: bool = True, max_steps: int | None = None,
                 metrics: MetricsSource = simulated_metrics, sim_options: Mapping | None = None) -> None:
        super().__init__()
        self.cluster = load_cluster(cluster) if isinstance(cluster, str) else cluster
        self.traces = list(traces) if traces is not None else None
        if self.traces is not None and not self.traces:
            raise AgentError("SchedulingEnv: traces is empty")
        if not 0 < idle_weight < 1:
            raise AgentError(f"SchedulingEnv: idle_weight {idle_weight} must be in (0, 1)")
        if slot_order not in SLOT_ORDERS:
            raise AgentError(f"SchedulingEnv: slot_order {slot_order!r}: expected one of {', '.join(SLOT_ORDERS)}")
        if not (1 <= num_jobs[0] <= num_jobs[1]) or not (0 < loads[0] <= loads[1]):
            raise AgentError(f"SchedulingEnv: bad num_jobs {num_jobs} or loads {loads}")
        if max_steps is not None and max_steps < 1:
            raise AgentError(f"SchedulingEnv: max_steps {max_steps} must be positive")
        self.layout = layout or FeatureLayout()
        n_gpus, n_types = len(self.cluster.devices), len(self.cluster.type_names)
        if n_gpus > self.layout.max_gpus or n_types > self.layout.max_types:
            raise AgentError(f"SchedulingEnv: cluster {self.cluster.name} ({n_gpus} GPUs, {n_types} types) "
                             f"exceeds the layout ({self.layout.max_gpus} GPUs, {self.layout.max_types} types)")
        if scaler is None:  # fitted on the traces, or on 8 generated ones (300 jobs at load 0.8, seeds 0 to 7)
            scaler = FeatureScaler.fit(self.traces or [generate(300, self.cluster, 0.8, seed=k) for k in range(8)])
        self.scaler = scaler
        self.reward_scale_s = float(reward_scale_s or scaler.time_scale_s * n_gpus)
        if not self.reward_scale_s > 0:
            raise AgentError(f"SchedulingEnv: reward_scale_s {reward_scale_s} must be positive")
        self.idle_weight = float(idle_weight)
        self.shaping = bool(shaping)
        self.num_jobs, self.loads, self.mix = num_jobs, loads, mix
        self.slot_order, self.work_conserving = slot_order, work_conserving
        self.max_steps = max_steps
        self.metrics = metrics
        self.sim_options = dict(sim_options or {})
        self.observation_space = self.layout.observation_space()
        self.action_space = self.layout.action_space()
        self._sim: Simulation | None = None
        self._point: DecisionPoint | None = None
        self.trace: Trace | None = None
        self.last_result: SimResult | None = None

    # ------------------------------------------------------------------------ gymnasium API
    @seeded(error=AgentError)
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode. ``options``: ``{"trace": Trace}`` to play a given trace, or
        ``{"trace_index": i}`` to pick one of ``traces``."""
        super().reset(seed=seed)
        options = options or {}
        self.trace = trace = self._draw(options)
        self._requests = JobRequests.from_trace(trace)
        self._sim = Simulation(trace, self.cluster, name="dqn-env", drop_unplaceable=True, timeline=False,
                               **self.sim_options)
        self._history: GridHistory | None = None
        self._steps = 0
        best = self._sim.best_time_s
        self._best_time = np.where(np.isfinite(best), best, 0.0)
        self._settle()
        self._phi = potential(self._sim, self._best_time)
        if self._sim.done:
            raise AgentError(f"SchedulingEnv: trace {trace.source or '(unnamed)'} has no job this cluster can run")
        return self._point.observe(), self._info()

    def step(self, action):
        if self._sim is None or self._point is None:
            raise AgentError("SchedulingEnv: step() before reset() or after the episode ended")
        point, wait = self._point, self.layout.wait_action
        mask = point.action_mask()
        action = int(action)
        penalty = 0.0
        if not (0 <= action < self.layout.n_actions and mask[action]):
            action = wait if mask[wait] else int(np.flatnonzero(mask)[0])
            penalty = INVALID_PENALTY
        reward = -penalty
        if action != wait:
            job, gpus = point.start(action)
            if self.shaping:
                reward -= self._start_cost(job, gpus) / self.reward_scale_s
        if action == wait or not point.action_mask()[:wait].any():
            reward += self._advance(point)
        self._steps += 1
        terminated = self._sim.done
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        obs = self._terminal_observation() if terminated else self._point.observe()
        info = self._info()
        if terminated:
            self.last_result = info["result"] = self._sim.result
            self._point = None
        return obs, float(reward), terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Valid actions now (only wait once the episode is over)."""
        if self._point is None:
            mask = np.zeros(self.layout.n_actions, dtype=bool)
            mask[self.layout.wait_action] = True
            return mask
        return self._point.action_mask()

    # ----------------------------------------------------------------------------- internals
    def _draw(self, options: dict) -> Trace:
        if "trace" in options:
            return options["trace"]
        if self.traces is not None:
            index = options.get("trace_index")
            if index is None:
                index = int(self.np_random.integers(len(self.traces)))
            return self.traces[index]
        rng = self.np_random
        n = int(rng.integers(self.num_jobs[0], self.num_jobs[1] + 1))
        load = float(rng.uniform(*self.loads))
        return generate(n, self.cluster, load, seed=int(rng.integers(2**31 - 1)), mix=self.mix)

    def _new_point(self) -> DecisionPoint:
        sim = self._sim
        view = sim.view
        if self._history is None:
            self._history = GridHistory(view, self.layout)
        return DecisionPoint(view, self._history, self.scaler, self.metrics(view), self._requests,
                             slot_order=self.slot_order, work_conserving=self.work_conserving,
                             can_change=sim.can_change)

    def _settle(self) -> None:
        """Run on to the next decision point that has a start to choose (or to the end)."""
        sim = self._sim
        while not sim.done:
            point = self._new_point()
            if point.action_mask()[:self.layout.wait_action].any():
                self._point = point
                return
            point.commit()
            sim.decide(Decision())
        self._point = None

    def _advance(self, point: DecisionPoint) -> float:
        """Apply the decision point's starts, run to the next decision point worth asking about, and
        return the reward for the simulated time that passed."""
        sim = self._sim
        jobs0, idle0 = sim.jobs_area_s, sim.idle_area_gpu_s
        point.commit()
        sim.decide(point.decision())
        self._settle()
        cost = (sim.jobs_area_s - jobs0) + self.idle_weight * (sim.idle_area_gpu_s - idle0)
        if self.shaping:
            phi = potential(sim, self._best_time)
            cost += phi - self._phi
            self._phi = phi
        return -cost / self.reward_scale_s

    def _start_cost(self, job: int, gpus: tuple[int, ...]) -> float:
        """phi(after) - phi(before) of a start: its run time there less its queued estimate."""
        view = self._sim.view
        jobs = view.jobs
        t = int(view.gpu_type[gpus[0]])
        penalty = view.restart_penalty_s if not np.isnan(jobs.start_s[job]) else 0.0
        remaining = float(jobs.remaining_s[job])
        queued_estimate = self._best_time[job] * remaining / float(jobs.work_s[job])
        cost = penalty + remaining / float(jobs.speed[job, t]) - queued_estimate
        self._phi += cost
        return cost

    def _terminal_observation(self) -> dict[str, np.ndarray]:
        return {k: np.zeros(s.shape, dtype=np.float32) for k, s in self.observation_space.spaces.items()}

    def _info(self) -> dict:
        sim = self._sim
        return {"action_mask": self.action_masks(), "now_s": sim.now_s}
