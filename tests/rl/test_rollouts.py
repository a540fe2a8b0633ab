"""Rollout labels (one step of policy iteration over the experts): known answers, determinism, training."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.dqn import DQNAgent, DQNConfig
from gpualloc.rl.envs.expert_env import ExpertChoiceEnv
from gpualloc.rl.rollouts import _forced, choice_points, improve_agent, label_points
from gpualloc.scheduling import metrics
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Job, JobType, Trace
from gpualloc.workload.traces import generate

ML = JobType.ML_TRAINING
PANEL = ("fcfs", "sjf")  # teacher fcfs (index 0)


def _long_first():
    """One GPU; at t=0 a long job (listed first) and two short ones: FCFS starts the long one, SJF a
    short one. Sum of JCTs in units of the short job: FCFS first 10+11+12 = 33, SJF first 1+2+12 = 15."""
    cluster = load_cluster("1xV100")
    trace = Trace.of([Job("long", 0, ML, 36_000, 1), Job("s1", 0, ML, 3_600, 1), Job("s2", 0, ML, 3_600, 1)],
                     source="hand")
    return cluster, trace


def _costs(problem, **kw) -> list[float]:
    """The rollout cost of forcing each expert at the only choice point of ``problem``."""
    assert choice_points(problem, PANEL) == 1
    return label_points([problem], PANEL, teacher=0, points=1, horizon_s=None, seed=0, **kw).costs[0].tolist()


def test_forced_decision_cost_is_the_known_answer():
    problem = _long_first()
    fcfs_first, sjf_first = _costs(problem, base=1)
    assert fcfs_first / sjf_first == pytest.approx(33 / 15)
    # forcing SJF's decision and following SJF is SJF's whole run: its cost is the sum of JCTs
    cluster, trace = problem
    whole = simulate(trace, cluster, make_policy("sjf"), drop_unplaceable=True, timeline=False)
    assert sjf_first == pytest.approx(metrics.avg_jct_s(whole) * 3)


def test_follow_keeps_the_forced_expert_deciding():
    """Forcing SJF once and then FCFS: 1+11+12 = 24; SJF kept deciding throughout: 1+2+12 = 15."""
    problem = _long_first()
    once = _costs(problem, base=0)[1]
    fcfs_kept, kept = _costs(problem, base=0, follow_s=1e9)
    assert once / kept == pytest.approx(24 / 15)
    assert fcfs_kept / kept == pytest.approx(33 / 15)


def test_labeller_picks_the_cheaper_forced_decision_and_keeps_the_teacher_on_ties():
    problem = _long_first()
    lab = label_points([problem], PANEL, teacher=0, points=1, base=1, horizon_s=None, seed=0)
    assert lab.teacher_action.tolist() == [0] and lab.label.tolist() == [1]
    assert lab.costs[0, 0] / lab.costs[0, 1] == pytest.approx(33 / 15)
    # a horizon shorter than any job: every job is in the system throughout, whatever is chosen
    short = label_points([problem], PANEL, teacher=0, points=1, base=1, horizon_s=1800.0, seed=0)
    assert short.costs[0].tolist() == pytest.approx([3 * 1800.0, 3 * 1800.0])
    assert short.label.tolist() == [0]


def test_labels_are_deterministic_per_seed():
    cluster = load_cluster("4xV100+2xT4+2xK80")
    problems = [(cluster, generate(30, cluster, 1.5, seed=s)) for s in (4, 5)]
    kw = dict(teacher=0, points=3, horizon_s=4 * 3600.0)
    a = label_points(problems, ("srtf", "sjf", "fcfs"), seed=7, **kw)
    b = label_points(problems, ("srtf", "sjf", "fcfs"), seed=7, **kw)
    for f in ("obs", "mask", "costs", "teacher_action", "label"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert len(a) == 6 and np.isfinite(a.costs[a.mask]).all()
    assert a.mask[np.arange(len(a)), a.label].all()


def test_improve_agent_learns_the_labels():
    problem = _long_first()
    lab = label_points([problem], PANEL, teacher=0, points=1, base=1, horizon_s=None, seed=0)
    env = ExpertChoiceEnv([problem], experts=PANEL)
    agent = DQNAgent(env.observation_space, env.action_space, DQNConfig(hidden=(16, 16), seed=0))
    assert improve_agent(agent, lab, epochs=60, seed=0) == 1.0


def test_bad_point_is_an_agent_error():
    with pytest.raises(AgentError, match="no choice point 99"):
        _forced(_long_first(), PANEL, 0, 99, 0, None, None, 0.0, None)


def test_training_with_rollout_labels_keeps_the_better_and_records_it(tmp_path):
    from gpualloc.rl.train_scheduler import train_expert_scheduler

    report = train_expert_scheduler(tmp_path / "a.pt", clusters=("4xV100+2xT4",), experts=("srtf", "sjf", "fcfs"),
                                    train_traces=2, num_jobs=(15, 20), val_loads=(0.9,), bc_rounds=1, bc_episodes=1,
                                    steps=0, rollout_points=3, rollout_horizon_s=0.0)
    assert report.kept in ("cloned", "rollout")
    agent = DQNAgent.load(report.out_path)
    assert agent.extra["config"]["rollout_points"] == 3 and agent.extra["validation"]["rollout_h"] is not None
    # kept only when better: the kept agent's validation JCT is the lowest of those tried
    v = agent.extra["validation"]
    assert report.gate.agent_jct_s / 3600 == pytest.approx(min(v["cloned_h"], v["rollout_h"]))
