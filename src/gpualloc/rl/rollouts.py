"""Labels from rollouts: one step of approximate policy iteration over the experts.

Behaviour cloning can only reproduce its teacher. To improve on it, each sampled decision point of a
training trace is labelled with the expert whose decision, applied *there* and followed by a base
policy, costs least (Bertsekas' rollout algorithm; Lagoudakis and Parr's classification-based
policy iteration):

1. follow the teacher (every expert asked, so stateful experts follow the run) up to the ``k``-th
   decision point with a choice (the points :class:`~gpualloc.rl.envs.expert_env.ExpertChoiceEnv`
   asks about);
2. apply expert ``e``'s proposal there (checked by :meth:`ExpertPanel.apply`);
3. follow the base expert for ``horizon_s`` simulated seconds (None: to the end of the trace);
4. cost = job-seconds accrued from the point to the horizon (the point's share of the sum of JCTs),
   plus ``idle_weight`` times the idle GPU-seconds.

:class:`~gpualloc.scheduling.simulator.Simulation` runs a generator and cannot be copied, so each
rollout re-simulates the trace from the start; the simulator is deterministic, so the prefix is the
same in every rollout of a point. Identical proposals share one rollout.

References:
    D. Bertsekas, J. Tsitsiklis, C. Wu, "Rollout algorithms for combinatorial optimization",
    Journal of Heuristics 3, 1997.
    M. Lagoudakis, R. Parr, "Reinforcement learning as classification: leveraging modern classifiers",
    ICML 2003.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.rl.expert_choice import ExpertPanel, action_of, distinct, observe
from gpualloc.scheduling.simulator import Simulation
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import Trace

__all__ = ["RolloutLabels", "choice_points", "improve_agent", "label_points"]

Problem = tuple[ClusterSpec, Trace]


@dataclass(frozen=True)
class RolloutLabels:
    """Labelled decision points.

    Attributes:
        obs: ``(N, D)`` observations (:func:`~gpualloc.rl.expert_choice.observe`, plus the encoder's).
        mask: ``(N, E)`` distinct proposals (as the environment's action mask).
        costs: ``(N, E)`` rollout cost of each expert's decision (an expert proposing the same as an
            earlier one gets its cost).
        teacher_action: ``(N,)`` the action applying the teacher's proposal.
        label: ``(N,)`` the cheapest action; the teacher's unless another is cheaper by more than
            ``min_gain`` of the teacher's cost.
    """

    obs: np.ndarray
    mask: np.ndarray
    costs: np.ndarray
    teacher_action: np.ndarray
    label: np.ndarray

    def __len__(self) -> int:
        return len(self.label)

    @classmethod
    def concat(cls, parts: Sequence[RolloutLabels]) -> RolloutLabels:
        """One set of labels from several."""
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                     ("obs", "mask", "costs", "teacher_action", "label")))


def _start(problem: Problem, panel: ExpertPanel, sim_options: dict | None) -> Simulation:
    cluster, trace = problem
    return Simulation(trace, cluster, name="rollout", preemptive=panel.preemptive, round_s=panel.round_s,
                      drop_unplaceable=True, timeline=False, **dict(sim_options or {}))


def _to_point(sim: Simulation, panel: ExpertPanel, k: int | None):
    """Follow the teacher up to the ``k``-th point with a choice (None: to the end); returns its
    proposals and mask, or None when the run ends first. Returns the number of points passed when
    ``k`` is None."""
    seen = 0
    while not sim.done:
        proposals = panel.propose(sim.view)
        mask = distinct(proposals)
        if mask.sum() > 1:
            if seen == k:
                return proposals, mask
            seen += 1
        sim.decide(proposals[panel.teacher])
    return seen if k is None else None


def choice_points(problem: Problem, experts: Sequence[str], teacher: int = 0, sim_options: dict | None = None) -> int:
    """How many decision points with a choice the teacher's run of ``problem`` has."""
    panel = ExpertPanel(experts, teacher)
    return int(_to_point(_start(problem, panel, sim_options), panel, None))


def _cost_from(sim: Simulation, first, chosen, follow, follow_s: float, horizon_s: float | None,
               idle_weight: float) -> float:
    """Apply ``first`` now, then ``chosen``'s decisions for ``follow_s`` seconds (``follow`` is asked
    too, so its state follows the run), then ``follow``'s until ``horizon_s`` after now (None: the
    end); the cost accrued from now, cut at the horizon (the areas grow linearly between points)."""
    t0, j0, i0 = sim.now_s, sim.jobs_area_s, sim.idle_area_gpu_s
    end = np.inf if horizon_s is None else t0 + float(horizon_s)
    prev = (t0, j0, i0)
    sim.decide(first)
    while not sim.done and sim.now_s < end:
        prev = (sim.now_s, sim.jobs_area_s, sim.idle_area_gpu_s)
        base = follow.decide(sim.view)
        sim.decide(chosen.decide(sim.view) if sim.now_s < t0 + follow_s and chosen is not follow else base)
    t, j, i = sim.now_s, sim.jobs_area_s, sim.idle_area_gpu_s
    if t > end and t > prev[0]:
        w = (end - prev[0]) / (t - prev[0])
        j, i = prev[1] + w * (j - prev[1]), prev[2] + w * (i - prev[2])
    return (j - j0) + idle_weight * (i - i0)


def _forced(problem: Problem, experts: Sequence[str], teacher: int, point: int, choice: int, base: int | None,
            horizon_s: float | None, idle_weight: float, sim_options: dict | None, encoder=None,
            follow_s: float = 0.0):
    """One rollout; returns ``(cost, proposals, mask, observation)`` (the last three of the point)."""
    panel = ExpertPanel(experts, teacher)
    sim = _start(problem, panel, sim_options)
    found = _to_point(sim, panel, point)
    if found is None:
        raise AgentError(f"rollouts: the teacher's run has no choice point {point}")
    proposals, mask = found
    obs = observe(sim.view, proposals, teacher, encoder=encoder)
    first = panel.apply(choice, proposals, sim.view)
    follow = panel.policies[teacher if base is None else base]
    cost = _cost_from(sim, first, panel.policies[choice], follow, follow_s, horizon_s, idle_weight)
    return cost, proposals, mask, obs


@seeded(error=AgentError)
def label_points(problems: Sequence[Problem], experts: Sequence[str], *, teacher: int = 0, points: int = 8,
                 base: int | None = None, horizon_s: float | None = 6 * 3600.0, idle_weight: float = 0.0,
                 min_gain: float = 0.01, follow_s: float = 0.0, seed: int | np.random.Generator | None = 0,
                 sim_options: dict | None = None, encoder=None) -> RolloutLabels:
    """Label up to ``points`` choice points per problem (drawn uniformly without replacement) with
    the cheapest expert by rollout (see the module docstring).

    Args:
        problems: ``(cluster, trace)`` pairs.
        experts, teacher: the panel (registry names) and the teacher's index.
        points: choice points sampled per problem.
        base: expert followed after the forced decision (default the teacher).
        horizon_s: simulated seconds of each rollout (None: to the end of the trace).
        idle_weight: weight of idle GPU-seconds in the cost.
        follow_s: seconds the chosen expert keeps deciding before ``base`` takes over (a regime switch,
            not one deviation: one round of a time-sharing teacher is undone at the next).
        min_gain: another expert replaces the teacher's label only when cheaper by more than this
            share of the teacher's cost (rollout noise must not undo the clone).
        seed: draws the points.
        sim_options: extra :class:`Simulation` options.
        encoder: optional extra features (the HD encoding), as in the environment.
    """
    rng = np.random.default_rng(seed)
    n_e = len(experts)
    obs, masks, costs, tacts, labels = [], [], [], [], []
    for problem in problems:
        n = choice_points(problem, experts, teacher, sim_options)
        for k in np.sort(rng.choice(n, size=min(points, n), replace=False)).tolist() if n else []:
            cost = np.full(n_e, np.inf)
            proposals, mask, o = None, None, None
            for e in range(n_e):
                if proposals is not None and not mask[e]:
                    continue
                c, proposals, mask, o = _forced(problem, experts, teacher, k, e, base, horizon_s, idle_weight,
                                                sim_options, encoder, follow_s)
                cost[e] = c
            for e in range(n_e):  # an expert proposing an earlier one's decision shares its cost
                if not mask[e]:
                    cost[e] = cost[action_of(proposals, mask, e)]
            ta = action_of(proposals, mask, teacher)
            best = int(np.argmin(np.where(mask, cost, np.inf)))
            gain = cost[ta] - cost[best]
            label = best if gain > min_gain * max(abs(cost[ta]), 1e-9) else ta
            obs.append(o)
            masks.append(mask)
            costs.append(cost)
            tacts.append(ta)
            labels.append(label)
    if not labels:
        raise AgentError("label_points: no choice point in the problems")
    return RolloutLabels(np.asarray(obs, np.float32), np.asarray(masks, bool), np.asarray(costs, float),
                         np.asarray(tacts, np.int64), np.asarray(labels, np.int64))


@seeded(error=AgentError)
def improve_agent(agent, labels: RolloutLabels, *, epochs: int = 20, batch_size: int = 64, margin: float = 0.5,
                  seed: int = 0) -> float:
    """Train ``agent``'s Q-network in place on rollout labels with DQfD's large-margin loss
    (:func:`gpualloc.rl.imitation.margin_loss`), the loss that cloned it; returns the share of
    points where the greedy agent now picks the label."""
    from gpualloc.rl.imitation import agreement, margin_epoch

    rng = np.random.default_rng(seed)
    dev = agent.device
    obs = torch.as_tensor(labels.obs, device=dev)
    label = torch.as_tensor(labels.label, device=dev)
    mask = torch.as_tensor(labels.mask, device=dev)
    for _ in range(epochs):
        margin_epoch(agent, obs, label, mask, batch_size=batch_size, margin=margin, rng=rng)
    agent.sync_target()
    return agreement(agent, obs, label, mask)
