"""The expert-choice scheduler: safe allocation, cluster-agnostic observation, cloning, the gate, the CLI."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.cli.main import main
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.dqn import DQNAgent, DQNConfig
from gpualloc.rl.envs.expert_env import ExpertChoiceEnv
from gpualloc.errors import AgentError
from gpualloc.options import OptionsError, options_dict, parse_options
from gpualloc.rl.train_config import TrainConfig
from gpualloc.rl.expert_choice import (ExpertPanel, GateResult, HDFeatures, distinct, gate, mean_ratio, obs_dim,
                                       observe)
from gpualloc.rl.imitation import clone_teacher
from gpualloc.rl.sched_policy import AgentFallbackWarning, ExpertChoicePolicy, expert_extra, learned_policy
from gpualloc.rl.train_scheduler import _guide, agent_jcts, expert_jcts, train_expert_scheduler
from gpualloc.scheduling import metrics
from gpualloc.scheduling.base import GPU_DOWN, GPU_FREE
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.rules import validate_decision
from gpualloc.scheduling.simulator import Simulation, random_failures, simulate
from gpualloc.workload.traces import generate

FAST = ("srtf", "sjf", "fcfs")  # cheap experts for tests that train


def _agent(env: ExpertChoiceEnv, seed: int = 0) -> DQNAgent:
    return DQNAgent(env.observation_space, env.action_space, DQNConfig(hidden=(32, 32), seed=seed))


def _biased(env: ExpertChoiceEnv, action: int) -> DQNAgent:
    """A deliberately fixed agent: Q is a constant vector whose maximum is ``action``."""
    agent = _agent(env)
    with torch.no_grad():
        for p in agent.qnet.parameters():
            p.zero_()
        last = [m for m in agent.qnet.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.bias[action] = 10.0
    return agent


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), load=st.floats(0.5, 1.5), mtbf_h=st.floats(2.0, 50.0),
       choices=st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_allocator_never_over_allocates(seed, load, mtbf_h, choices):
    """Any sequence of choices, with preemption and whole-node failures: every applied decision
    passes the rules, no GPU is held twice or while down, and every job finishes."""
    cluster = load_cluster("4xV100+2xT4+2xK80")
    trace = generate(15, cluster, load, seed=seed)
    failures = random_failures(cluster, 20 * 3600, mtbf_h * 3600, 1800, seed=seed)
    panel = ExpertPanel(("srtf", "sjf", "fcfs", "easy-backfill"), teacher=0)
    sim = Simulation(trace, cluster, preemptive=True, round_s=panel.round_s, failures=failures,
                     drop_unplaceable=True, timeline=False, check=True)
    k = 0
    while not sim.done:
        view = sim.view
        proposals = panel.propose(view)
        decision = panel.apply(choices[k % len(choices)], proposals, view)
        k += 1
        assert validate_decision(decision, view) == []
        started = [g for _, gpus in decision.starts for g in gpus]
        assert len(started) == len(set(started))
        freed = {g for j in decision.preempt for g in view.gpus_of(j)}
        for g in started:
            assert view.gpu_job[g] == GPU_FREE or g in freed
            assert view.gpu_job[g] != GPU_DOWN
        sim.decide(decision)
    result = sim.result
    assert int(np.isfinite(result.finish_s).sum()) + len(result.rejected) == len(trace)


def test_observation_shape_does_not_depend_on_the_cluster():
    shapes = set()
    for name in ("2xV100", "adlro16", "16xV100+8xT4+8xA100", "gavel108", "2xV100+2xT4+2xK80+2xP100+2xA100"):
        cluster = load_cluster(name)
        trace = generate(30, cluster, 1.0, seed=1)
        sim = Simulation(trace, cluster, preemptive=True, drop_unplaceable=True, timeline=False)
        panel = ExpertPanel(FAST)
        for _ in range(5):
            if sim.done:
                break
            proposals = panel.propose(sim.view)
            obs = observe(sim.view, proposals)
            assert np.all(np.isfinite(obs))
            shapes.add(obs.shape)
            sim.decide(proposals[0])
        env = ExpertChoiceEnv(clusters=(cluster,), experts=FAST)
        shapes.add(env.observation_space.shape)
    assert shapes == {(obs_dim(len(FAST)),)}


def test_distinct_keeps_the_first_of_equal_proposals():
    cluster = load_cluster("adlro16")
    sim = Simulation(generate(20, cluster, 0.8, seed=3), cluster, preemptive=True, timeline=False)
    proposals = ExpertPanel(("srtf", "srtf", "sjf")).propose(sim.view)
    mask = distinct(proposals)
    assert mask[0] and not mask[1]


def test_always_choosing_the_teacher_replays_it_exactly():
    cluster = load_cluster("adlro16")
    trace = generate(40, cluster, 0.9, seed=5)
    env = ExpertChoiceEnv(experts=("gavel", "srtf", "sjf"), teacher=0)
    obs, info = env.reset(seed=0, options={"problem": (cluster, trace)})
    done = False
    while not done:
        obs, _, done, _, info = env.step(info["teacher_action"])
    alone = simulate(trace, cluster, make_policy("gavel"), drop_unplaceable=True, timeline=False)
    np.testing.assert_array_equal(env.last_result.finish_s, alone.finish_s)


@pytest.mark.slow
def test_behaviour_cloning_reproduces_its_teacher_exactly():
    cluster = load_cluster("4xV100+2xT4+2xK80")
    trace = generate(20, cluster, 1.0, seed=11)
    env = ExpertChoiceEnv([(cluster, trace)], experts=FAST, teacher=0)
    agent = _agent(env)
    log = clone_teacher(agent, env, rounds=3, episodes=1, epochs=20, td_weight=0.0, seed=0)
    assert log.agreement[-1] == 1.0
    cloned = simulate(trace, cluster, ExpertChoicePolicy(agent, FAST, 0), drop_unplaceable=True, timeline=False)
    teacher = simulate(trace, cluster, make_policy("srtf"), drop_unplaceable=True, timeline=False)
    np.testing.assert_array_equal(cloned.finish_s, teacher.finish_s)
    np.testing.assert_array_equal(cloned.start_s, teacher.start_s)


def test_gate_falls_back_to_the_teacher_when_the_agent_is_worse(tmp_path):
    cluster = load_cluster("adlro16")
    problems = [(cluster, generate(40, cluster, 1.0, seed=s)) for s in (21, 22)]
    env = ExpertChoiceEnv(problems, experts=FAST, teacher=0)
    bad = _biased(env, FAST.index("fcfs"))  # always FCFS's proposal: head-of-line blocking
    mine = agent_jcts(bad, problems, FAST, 0)
    theirs = expert_jcts(problems, ["srtf"])["srtf"]
    verdict = gate(mine, theirs, "srtf")
    assert not verdict.passed and "falling back to srtf" in verdict.note()
    bad.extra = expert_extra(FAST, 0, verdict)
    path = tmp_path / "bad.pt"
    bad.save(path)
    with pytest.warns(AgentFallbackWarning, match="falling back to srtf"):
        policy = make_policy("dqn", agent=str(path))
    assert isinstance(policy, ExpertChoicePolicy) and policy.fallback and policy.agent is None
    assert policy.learned is not None  # kept, so its decisions can still be timed
    fell = simulate(problems[0][1], cluster, policy, drop_unplaceable=True, timeline=False)
    srtf = simulate(problems[0][1], cluster, make_policy("srtf"), drop_unplaceable=True, timeline=False)
    np.testing.assert_array_equal(fell.finish_s, srtf.finish_s)
    # the same agent with a passing verdict runs itself, and is worse
    bad.extra = expert_extra(FAST, 0, GateResult(True, 1.0, 1.0, "srtf", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        own = learned_policy(bad)
    assert metrics.avg_jct_s(simulate(problems[0][1], cluster, own, drop_unplaceable=True, timeline=False)) > \
        metrics.avg_jct_s(srtf)


def test_train_expert_scheduler_gates_and_saves(tmp_path):
    report = train_expert_scheduler(tmp_path / "a.pt", clusters=("4xV100+2xT4",), experts=FAST, train_traces=1,
                                    num_jobs=(15, 20), val_loads=(0.9,), bc_rounds=1, bc_episodes=1, steps=200)
    assert report.teacher in FAST and report.gate.teacher == report.teacher
    policy = make_policy("dqn", agent=str(report.out_path))
    assert isinstance(policy, ExpertChoicePolicy) and policy.experts == FAST
    assert policy.fallback == (not report.gate.passed)


def test_hd_features_are_deterministic_and_feed_the_agent():
    cluster = load_cluster("adlro16")
    a, b = HDFeatures(out_dim=8, dim=256, seed=3), HDFeatures(out_dim=8, dim=256, seed=3)
    env = ExpertChoiceEnv(clusters=(cluster,), experts=FAST, encoder=a, encoder_dim=8, num_jobs=(20, 20))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (obs_dim(len(FAST), 8),)
    np.testing.assert_array_equal(a(env._sim.view), b(env._sim.view))
    again = HDFeatures.from_dict(a.to_dict())
    np.testing.assert_array_equal(again(env._sim.view), a(env._sim.view))


@pytest.mark.parametrize("fmt, message", [("gpualloc.scheduler", "the per-slot agent was retired in issue 37"),
                                          (None, "not a scheduling agent")])
def test_a_per_slot_or_foreign_agent_file_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, fmt, message):
    import gymnasium as gym

    agent = DQNAgent(gym.spaces.Box(-1.0, 1.0, (3,)), gym.spaces.Discrete(2), DQNConfig(hidden=(4,)))
    path = agent.save(tmp_path / "old.pt", extra={} if fmt is None else {"format": fmt})
    with pytest.raises(AgentError, match=message):
        make_policy("dqn", agent=str(path))
    monkeypatch.setattr(sys, "argv", ["gpualloc", "simulate", "run", "-c", "2xV100", "--generate", "5",
                                      "--policy", "dqn", "--agent", str(path)])
    with pytest.raises(SystemExit) as exc:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and message in lines[0] and str(path) in lines[0], lines


def test_simulate_dqn_on_an_unseen_cluster_through_main(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpualloc", "simulate", "run", "-c", "16xV100+8xT4+8xA100", "--generate", "40",
                                      "--load", "0.8", "--policy", "dqn", "--json"])
    with pytest.raises(SystemExit) as exc:
        main()
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    row = json.loads(out)
    assert row["jobs"] == 40 and np.isfinite(row["avg_jct_s"]) and row["avg_jct_s"] > 0


def test_guided_episodes_replay_each_problems_own_expert():
    """With per-problem guides, following ``teacher_action`` replays that problem's guide exactly."""
    cluster = load_cluster("4xV100+2xT4+2xK80")
    problems = [(cluster, generate(20, cluster, 1.0, seed=s)) for s in (31, 32)]
    env = ExpertChoiceEnv(problems, experts=FAST, teacher=0, guides=[1, 2])
    for k, guide in enumerate((1, 2)):
        _, info = env.reset(seed=0, options={"index": k})
        done = False
        while not done:
            _, _, done, _, info = env.step(info["teacher_action"])
        alone = simulate(problems[k][1], cluster, make_policy(FAST[guide]), drop_unplaceable=True, timeline=False)
        np.testing.assert_array_equal(env.last_result.finish_s, alone.finish_s)
    with pytest.raises(AgentError, match="one expert index per problem"):
        ExpertChoiceEnv(problems, experts=FAST, guides=[0])
    with pytest.raises(AgentError, match="out of range"):
        env.reset(options={"index": 5})


def test_guide_is_the_best_expert_only_when_clearly_better():
    assert _guide(np.array([10.0, 9.0, 12.0]), teacher=0, min_gain=0.01) == 1
    assert _guide(np.array([10.0, 9.95, 12.0]), teacher=0, min_gain=0.01) == 0  # 0.5%: noise, keep the teacher
    assert _guide(np.array([10.0, 11.0]), teacher=0, min_gain=0.01) == 0


def test_gate_scores_per_trace_ratios_so_a_long_window_cannot_hide_a_loss():
    # sums: the agent wins (310 vs 315); per trace it doubles the first trace's JCT and saves 3% on the second
    verdict = gate([10.0, 300.0], [5.0, 310.0], "gavel")
    assert not verdict.passed and verdict.ratio == pytest.approx((2.0 + 300 / 310) / 2)
    assert "falling back to gavel" in verdict.note()
    assert gate([5.0, 300.0], [5.0, 310.0], "gavel").passed
    assert mean_ratio([0.0, 1.0], [0.0, 2.0]) == pytest.approx(0.75)  # 0/0 counts 1
    assert GateResult.from_dict(verdict.to_dict()) == verdict
    old = {k: v for k, v in verdict.to_dict().items() if k != "ratio"}  # checkpoints before the ratio
    assert GateResult.from_dict(old).ratio is None
    with pytest.raises(AgentError):
        mean_ratio([1.0], [1.0, 2.0])


def test_train_expert_scheduler_with_per_trace_guides(tmp_path):
    report = train_expert_scheduler(tmp_path / "g.pt", clusters=("4xV100+2xT4",), experts=FAST, train_traces=2,
                                    num_jobs=(15, 20), val_loads=(0.9,), bc_rounds=1, steps=0, guide="best")
    assert set(report.scores) >= set(FAST) | {"cloned"} and min(report.scores[e] for e in FAST) == 1.0
    extra = DQNAgent.load(report.out_path).extra
    assert extra["config"]["guide"] == "best" and sum(extra["guides"].values()) == 2
    # the checkpoint saves the whole configuration, and it reads back to the same value
    run = TrainConfig(clusters=("4xV100+2xT4",), experts=FAST, train_traces=2, num_jobs=(15, 20), val_loads=(0.9,),
                      bc_rounds=1, steps=0, guide="best")
    assert extra["config"] == options_dict(run) and parse_options(TrainConfig, extra["config"], "checkpoint") == run
    assert extra["problems"] == {"train": [], "validation": []}
    with pytest.raises(OptionsError, match="guide"):
        train_expert_scheduler(tmp_path / "x.pt", guide="oracle")


@pytest.mark.parametrize(("options", "message"), [
    ({"experts": ("srtf", "nope")}, "'nope' is not an expert"),
    ({"experts": ("srtf", "dqn")}, "'dqn' is not an expert"),
    ({"experts": ("srtf", "sjf"), "rollout_base": "fcfs"}, "rollout base 'fcfs' is not one of the experts"),
])
def test_train_expert_scheduler_rejects_unknown_experts_before_simulating(tmp_path, monkeypatch, options, message):
    from gpualloc.rl import train_scheduler as ts

    monkeypatch.setattr(ts, "_problems", lambda *a: pytest.fail("simulated before checking the experts"))
    with pytest.raises(OptionsError, match=message):
        train_expert_scheduler(tmp_path / "x.pt", **options)
    assert not (tmp_path / "x.pt").exists()


def test_train_scheduler_cli_rejects_a_bad_guide_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["gpualloc", "train", "scheduler", "--experts", "srtf,sjf", "--guide", "nope",
                                      "--steps", "0", "-o", str(tmp_path / "a.pt")])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "guide" in err and len(err.splitlines()) == 1
