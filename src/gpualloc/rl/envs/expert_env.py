"""``gpualloc/ExpertChoice-v0``: schedule by choosing, at each decision point, one expert's decision.

* **Episode**: one trace on one cluster, drawn from ``problems`` (any reader's output, any cluster)
  or generated (a cluster from ``clusters``, a job count and a load drawn per episode), run by
  :class:`~gpualloc.scheduling.simulator.Simulation` with the panel's preemption and rounds.
* **Action**: ``Discrete(len(experts))``: whose proposal to apply (:mod:`gpualloc.rl.expert_choice`).
  Decision points where every expert proposes the same decision are played without asking.
* **Mask**: ``info["action_mask"]``: the first of each group of identical proposals.
* **Observation**: :func:`gpualloc.rl.expert_choice.observe` (cluster-agnostic), plus the optional
  hyperdimensional encoding.
* **Reward**: as :mod:`gpualloc.rl.envs.scheduling_env`: ``-(job-seconds + idle_weight x idle
  GPU-seconds)`` accrued until the next asked decision point, with the same potential-based shaping
  (:func:`~gpualloc.rl.envs.scheduling_env.potential`), divided by ``3600 x GPUs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import ClusterSpec, load_cluster
from gpualloc.rl.envs.scheduling_env import DEFAULT_IDLE_WEIGHT, potential
from gpualloc.rl.expert_choice import (DEFAULT_EXPERTS, ExpertPanel, PredictedWork, action_of, distinct, obs_dim,
                                       observe)
from gpualloc.scheduling.knowledge import check_knowledge
from gpualloc.scheduling.simulator import Simulation
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import Trace
from gpualloc.workload.traces import generate

Problem = tuple[ClusterSpec, Trace]

Encoder = Callable[[object], np.ndarray]
"""Optional extra features of a view (the hyperdimensional encoding), appended to the observation."""


class ExpertChoiceEnv(gym.Env):
    """Choose among the experts' proposals; see the module docstring.

    Args:
        problems: ``(cluster, trace)`` pairs to draw episodes from; None generates them.
        clusters: clusters (specs or names) of generated episodes.
        num_jobs, loads: ``(low, high)`` job count and offered load of a generated trace.
        experts: registry names of the experts; ``teacher`` indexes them.
        guides: per problem, the expert whose choice :meth:`teacher_action` labels (the best expert
            on that trace, for cloning a per-workload oracle); default ``teacher`` everywhere.
        idle_weight: lambda of the reward.
        shaping: add the potential-based shaping term.
        encoder: optional ``(view) -> features`` appended to the observation, with ``encoder_dim``.
        sim_options: extra :class:`Simulation` options (``failures``, ``restart_penalty_s``, ...).
        knowledge: the information level of the runs (the experts' view and the observation: below
            ``oracle`` remaining work comes from a duration predictor, :class:`PredictedWork`). The
            reward is the simulator's own accounting, as at every level.
        round_s: the panel's round (default the teacher's; see :class:`ExpertPanel`).
        seed: the observation's own predictor's seed (when no expert has one).
    """

    metadata = {"render_modes": []}

    @seeded(error=AgentError)
    def __init__(self, problems: Sequence[Problem] | None = None, *,
                 clusters: Sequence[ClusterSpec | str] = ("adlro16",), num_jobs: tuple[int, int] = (60, 160),
                 loads: tuple[float, float] = (0.5, 1.0), experts: Sequence[str] = DEFAULT_EXPERTS,
                 teacher: int = 0, guides: Sequence[int] | None = None,
                 idle_weight: float = DEFAULT_IDLE_WEIGHT, shaping: bool = True,
                 encoder: Encoder | None = None, encoder_dim: int = 0, sim_options: dict | None = None,
                 knowledge: str = "oracle", round_s: float | None = None, seed: int = 0) -> None:
        super().__init__()
        self.problems = list(problems) if problems is not None else None
        if self.problems is not None and not self.problems:
            raise AgentError("ExpertChoiceEnv: problems is empty")
        self.clusters = [load_cluster(c) if isinstance(c, str) else c for c in clusters]
        if not (1 <= num_jobs[0] <= num_jobs[1]) or not (0 < loads[0] <= loads[1]):
            raise AgentError(f"ExpertChoiceEnv: bad num_jobs {num_jobs} or loads {loads}")
        self.num_jobs, self.loads = num_jobs, loads
        self.experts, self.teacher = tuple(experts), int(teacher)
        if guides is not None and (self.problems is None or len(guides) != len(self.problems)
                                   or not all(0 <= g < len(self.experts) for g in guides)):
            raise AgentError("ExpertChoiceEnv: guides needs one expert index per problem")
        self.guides = None if guides is None else [int(g) for g in guides]
        self._guide = self.teacher
        self.idle_weight, self.shaping = float(idle_weight), bool(shaping)
        self.encoder, self.encoder_dim = encoder, int(encoder_dim)
        self.sim_options = dict(sim_options or {})
        self.knowledge = check_knowledge(knowledge)
        self.round_s, self.seed = round_s, int(seed)
        self.sim_options.setdefault("knowledge", self.knowledge)
        dim = obs_dim(len(self.experts), self.encoder_dim, self.knowledge)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self.action_space = gym.spaces.Discrete(len(self.experts))
        self._sim: Simulation | None = None
        self.last_result = None

    @seeded(error=AgentError)
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode; ``options={"problem": (cluster, trace)}`` plays that one, ``{"index": k}``
        the ``k``-th of ``problems``."""
        super().reset(seed=seed)
        cluster, trace = self._draw(options or {})
        self.panel = ExpertPanel(self.experts, self.teacher, self.round_s)
        self._work = None if self.knowledge == "oracle" else PredictedWork(self.panel, self.seed)
        self._sim = Simulation(trace, cluster, name="dqn-experts", preemptive=self.panel.preemptive,
                               round_s=self.panel.round_s, drop_unplaceable=True, timeline=False, **self.sim_options)
        if self._sim.done:
            raise AgentError(f"ExpertChoiceEnv: trace {trace.source or '(unnamed)'} has no job {cluster.name} can run")
        best = self._sim.best_time_s
        self._best = np.where(np.isfinite(best), best, 0.0)
        self._scale = 3600.0 * len(cluster)
        self._phi = potential(self._sim, self._best)
        self._mask = np.ones(len(self.experts), dtype=bool)
        self._proposals: list = []
        self._obs = np.zeros(self.observation_space.shape, np.float32)  # an episode with no choice at all
        self._pending = self._settle()
        return self._obs, self._info()

    def step(self, action):
        if self._sim is None or self._sim.done:
            raise AgentError("ExpertChoiceEnv: step() before reset() or after the episode ended")
        a = int(action)
        if not (0 <= a < len(self.experts) and self._mask[a]):
            a = int(np.flatnonzero(self._mask)[0])
        self._sim.decide(self.panel.apply(a, self._proposals, self._sim.view))
        reward = self._pending + self._settle()
        terminated = self._sim.done
        if terminated:
            self.last_result = self._sim.result
            obs = np.zeros(self.observation_space.shape, np.float32)
        else:
            obs = self._obs
        return obs, float(reward), terminated, False, self._info()

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    # ----------------------------------------------------------------------------- internals
    def _draw(self, options: dict) -> Problem:
        self._guide = self.teacher
        if "problem" in options:
            return options["problem"]
        rng = self.np_random
        if self.problems is not None:
            k = int(options["index"]) if "index" in options else int(rng.integers(len(self.problems)))
            if not 0 <= k < len(self.problems):
                raise AgentError(f"ExpertChoiceEnv: problem index {k} out of range for {len(self.problems)}")
            if self.guides is not None:
                self._guide = self.guides[k]
            return self.problems[k]
        cluster = self.clusters[int(rng.integers(len(self.clusters)))]
        n = int(rng.integers(self.num_jobs[0], self.num_jobs[1] + 1))
        return cluster, generate(n, cluster, float(rng.uniform(*self.loads)), seed=int(rng.integers(2**31 - 1)))

    def _cost(self, jobs0: float, idle0: float) -> float:
        sim = self._sim
        cost = (sim.jobs_area_s - jobs0) + self.idle_weight * (sim.idle_area_gpu_s - idle0)
        if self.shaping:
            phi = potential(sim, self._best)
            cost += phi - self._phi
            self._phi = phi
        return cost

    def _settle(self) -> float:
        """Play decision points with nothing to choose until one with a choice (or the end); the
        reward accrued meanwhile (from the last asked decision's application on)."""
        sim = self._sim
        jobs0, idle0 = sim.jobs_area_s, sim.idle_area_gpu_s
        phi_from = self._phi
        while not sim.done:
            view = sim.view
            proposals = self.panel.propose(view)
            mask = distinct(proposals)
            if mask.sum() > 1:
                self._proposals, self._mask = proposals, mask
                self._obs = observe(view, proposals, self.teacher, self._work, self.encoder)
                break
            sim.decide(proposals[int(np.flatnonzero(mask)[0])])
        self._phi = phi_from
        return -self._cost(jobs0, idle0) / self._scale

    def _info(self) -> dict:
        return {"action_mask": self._mask.copy() if not self._sim.done else np.ones(len(self.experts), bool),
                "teacher_action": self.teacher_action()}

    @property
    def finished(self) -> bool:
        """Whether the episode is over: also right after :meth:`reset` when its trace offers no choice."""
        return self._sim is None or self._sim.done

    def teacher_action(self) -> int:
        """The action that applies the guide's proposal (the teacher's unless ``guides`` says
        otherwise for this episode's problem; the first expert proposing the same)."""
        if self._sim is None or self._sim.done:
            return self._guide
        return action_of(self._proposals, self._mask, self._guide)
