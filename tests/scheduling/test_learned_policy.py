"""The ``dqn`` policy: it learns the known optimum on a tiny cluster, loads through the registry,
schedules with the bundled agent, and the training entry point writes its checkpoint and plot."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.dqn import DQNAgent, DQNConfig, train
from gpualloc.rl.envs.scheduling_env import SchedulingEnv
from gpualloc.rl.train_scheduler import DEFAULT_CONFIG, train_scheduler
from gpualloc.scheduling import metrics
from gpualloc.rl.features import FeatureLayout, FeatureScaler
from gpualloc.scheduling.policies import make_policy
from gpualloc.rl.sched_policy import DQNPolicy, bundled_agent_path, scheduler_extra
from gpualloc.scheduling.simulator import simulate
from gpualloc.workload.jobs import Job, JobType, Trace
from gpualloc.workload.traces import generate

ML = JobType.ML_TRAINING
TINY = FeatureLayout(max_gpus=2, max_types=1, top_k=4, window=2)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def shuffled_pairs(rng: np.random.Generator) -> Trace:
    """Two short and two long jobs arrive together on 2 GPUs, in random queue order: shortest first
    is optimal (each long job then waits for a short one, not the other way round)."""
    works = [rng.uniform(50, 150), rng.uniform(50, 150), rng.uniform(600, 1500), rng.uniform(600, 1500)]
    return Trace.of([Job(str(i), 0.0, ML, float(w), 1) for i, w in enumerate(rng.permutation(works))],
                    source="pairs")


def tiny_env(traces):
    return SchedulingEnv("2xV100", traces, layout=TINY, slot_order="arrival", reward_scale_s=100.0)


@pytest.fixture(scope="module")
def tiny_agent() -> DQNAgent:
    rng = np.random.default_rng(0)
    env = tiny_env([shuffled_pairs(rng) for _ in range(200)])
    config = DQNConfig(backbone="cnn", cnn_channels=(4,), cnn_strides=(1,), hidden=(64, 64), lr=1e-3, gamma=0.9,
                       batch_size=32, learning_starts=200, train_freq=1, target_update_interval=100,
                       eps_decay_steps=2_000, seed=0)
    agent = DQNAgent(env.observation_space, env.action_space, config)
    agent.extra = scheduler_extra(TINY, env.scaler, slot_order="arrival", work_conserving=True,
                                  idle_weight=env.idle_weight, cluster="2xV100")
    train(env, agent, 4_000, seed=0)
    return agent


def test_learns_shortest_first_on_a_tiny_cluster(tiny_agent):
    cluster = load_cluster("2xV100")
    rng = np.random.default_rng(123)  # held-out orders and lengths
    for _ in range(10):
        tr = shuffled_pairs(rng)
        learned = simulate(tr, cluster, DQNPolicy(tiny_agent))
        sjf = simulate(tr, cluster, make_policy("sjf"))
        fcfs = simulate(tr, cluster, make_policy("fcfs"))
        assert metrics.jct_s(learned).sum() == pytest.approx(metrics.jct_s(sjf).sum())
        assert metrics.jct_s(learned).sum() <= metrics.jct_s(fcfs).sum()


def test_registry_loads_a_saved_agent_and_runs_are_repeatable(tiny_agent, tmp_path):
    path = tiny_agent.save(tmp_path / "tiny.pt")
    policy = make_policy("dqn", agent=str(path))
    assert isinstance(policy, DQNPolicy) and policy.name == "dqn" and not policy.preemptive
    cluster = load_cluster("2xV100")
    tr = Trace.of([Job(str(i), 30.0 * i, ML, 100.0 + 37 * i, 1) for i in range(6)], source="stream")
    first = simulate(tr, cluster, policy)
    again = simulate(tr, cluster, policy)  # the grid history starts afresh for a new run
    assert first.completed.all() and np.array_equal(first.finish_s, again.finish_s)


def test_rejects_agents_that_are_not_schedulers(tmp_path):
    agent = DQNAgent(TINY.observation_space(), TINY.action_space(),
                     DQNConfig(backbone="cnn", hidden=(8,), cnn_channels=(2,), cnn_strides=(1,)))
    path = agent.save(tmp_path / "plain.pt")
    with pytest.raises(AgentError, match="not a scheduling agent"):
        DQNPolicy(path)
    with pytest.raises(AgentError, match="no such DQN checkpoint"):
        DQNPolicy(tmp_path / "missing.pt")


def test_bundled_agent_schedules_adlro16():
    if not bundled_agent_path().is_file():
        pytest.fail(f"bundled agent missing: {bundled_agent_path()}")
    cluster = load_cluster("adlro16")
    tr = generate(40, cluster, 0.8, seed=7)
    result = simulate(tr, cluster, make_policy("dqn"), check=True)
    assert result.completed.all() and result.policy == "dqn"


def test_train_scheduler_keeps_the_best_checkpoint_and_plots(tmp_path):
    rng = np.random.default_rng(1)
    traces = [shuffled_pairs(rng) for _ in range(20)]
    config = replace(DEFAULT_CONFIG, learning_starts=50, batch_size=16, hidden=(16, 16), cnn_channels=(2,),
                     cnn_strides=(1,), buffer_size=1_000)
    calls = []
    report = train_scheduler("2xV100", tmp_path / "s.pt", steps=120, seed=3, traces=traces,
                             eval_traces=traces[:2], eval_every=50, baselines=("fcfs", "sjf"), config=config,
                             layout=TINY, env_options={"slot_order": "arrival"},
                             progress=lambda step, total, stats: calls.append((step, total, stats)))
    assert report.out_path.is_file() and report.plot_path.is_file()
    assert [e.step for e in report.evals] == [50, 100, 120]
    assert report.best.avg_jct_s == min(e.avg_jct_s for e in report.evals)
    assert set(report.baselines) == {"fcfs", "sjf"} and report.steps == 120
    assert calls[-1][0] == 120 and calls[-1][2]["best_avg_jct_s"] == report.best.avg_jct_s
    policy = DQNPolicy(report.out_path)
    assert policy.scaler == FeatureScaler.fit(traces) and policy.layout == TINY
    avg = np.mean([metrics.avg_jct_s(simulate(t, load_cluster("2xV100"), policy)) for t in traces[:2]])
    assert avg == pytest.approx(report.best.avg_jct_s)


def test_per_slot_agent_warns_once_off_its_training_cluster():
    import warnings

    from gpualloc.rl.sched_policy import AgentClusterWarning, off_its_cluster

    assert off_its_cluster("adlro16", load_cluster("adlro16")) is None
    assert off_its_cluster("adlro16", load_cluster("8xV100+4xT4+4xMI50")) is None  # the same GPUs, spelled out
    assert off_its_cluster(None, load_cluster("2xV100")) is None
    assert "trained on adlro16 and runs on 4xV100+4xT4" in off_its_cluster("adlro16", load_cluster("4xV100+4xT4"))
    assert "trained on mine.json" in off_its_cluster("mine.json", load_cluster("2xV100"))  # not at hand: by name
    policy = DQNPolicy(bundled_agent_path())
    other = load_cluster("4xV100+4xT4")
    with pytest.warns(AgentClusterWarning, match="per-slot agent was trained on adlro16") as caught:
        for seed in (1, 2):  # one warning for both runs
            simulate(generate(10, other, 0.8, seed=seed), other, policy)
    assert len([w for w in caught if w.category is AgentClusterWarning]) == 1
    home = load_cluster("adlro16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AgentClusterWarning)
        simulate(generate(10, home, 0.8, seed=1), home, DQNPolicy(bundled_agent_path()))
