"""SchedulingEnv: Gymnasium conformance, masking, reward arithmetic (a hand-computed case and the
telescoping identity), any cluster and any trace reader's output."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import gpualloc.rl.envs  # noqa: F401  (registers the environments)
from gpualloc.errors import AgentError, SchedulingError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.envs.scheduling_env import INVALID_PENALTY, SchedulingEnv
from gpualloc.scheduling import metrics
from gpualloc.scheduling.base import Decision
from gpualloc.rl.features import FeatureLayout
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import Simulation, simulate
from gpualloc.workload.jobs import Job, JobType, Trace
from gpualloc.workload.traces import generate, read_trace, write_native

ML = JobType.ML_TRAINING
SMALL = FeatureLayout(max_gpus=8, max_types=2, top_k=3, window=4)


def hand_trace() -> Trace:
    return Trace.of([Job("A", 0, ML, 100, 1), Job("B", 0, ML, 300, 1), Job("C", 10, ML, 50, 2)], source="hand")


@pytest.mark.parametrize("policy", ["fcfs", "srtf"])
def test_simulation_steps_through_the_engine_of_simulate(policy):
    """The env's stepping interface is simulate()'s own loop: a caller answering with a policy's
    decisions gets the very same result, and the integrated jobs-in-system area is the sum of JCTs."""
    cluster = load_cluster("adlro16")
    tr = generate(60, cluster, 0.9, seed=5)
    expected = simulate(tr, cluster, make_policy(policy), check=True)
    pol = make_policy(policy)
    sim = Simulation(tr, cluster, name=policy, preemptive=pol.preemptive, check=True)
    while not sim.done:
        sim.decide(pol.decide(sim.view))
    got = sim.result
    assert np.array_equal(got.finish_s, expected.finish_s) and np.array_equal(got.start_s, expected.start_s)
    assert got.decisions == expected.decisions and got.policy == policy
    assert sim.jobs_area_s == pytest.approx(metrics.jct_s(got).sum(), rel=1e-12)
    assert sim.idle_area_gpu_s == pytest.approx(metrics.idle_gpu_s(got), rel=1e-9)
    assert sim.view is None
    with pytest.raises(SchedulingError, match="finished"):
        sim.decide(Decision())


def test_check_env_passes_without_warnings():
    cluster = load_cluster("4xV100+2xT4")
    env = SchedulingEnv(cluster, num_jobs=(10, 30), layout=SMALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)


def test_registered():
    env = gym.make("gpualloc/Scheduling-v0", cluster="2xV100", traces=[hand_trace()], layout=SMALL)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["action_mask"].shape == (SMALL.n_actions,)


@pytest.mark.parametrize("shaping", [False, True])
def test_reward_arithmetic_on_a_hand_computed_case(shaping):
    """2 V100; A (work 100 s, 1 GPU) and B (300 s, 1 GPU) arrive at 0, C (50 s, 2 GPUs) at 10.

    step 1, t=0:   start A                 -> 0 (no time passes)
    step 2, t=0:   wait; run to t=10        -> jobs A,B for 10 s = 20; idle 1 GPU x 10 s = 10
    step 3, t=10:  start B; no GPU left, so the env runs on: C cannot start at t=100 (1 GPU free),
                   only at t=310      -> jobs 3 x 90 + 2 x 210 = 690; idle 1 GPU x 210 s = 210
    step 4, t=310: start C; it ends at 360 -> jobs 1 x 50 = 50
    Sum of JCT: A 100 + B 310 + C 350 = 760 = 20 + 690 + 50; idle GPU time 220.

    Shaped, phi (job-seconds certain to come) is 450 (100 + 300 + 50) at t=0, 440 at t=10 (A has
    90 left), 50 at t=310 (C queued), 0 at the end; every job runs on its fastest type, so starts
    cost 0. Step 2: -(25 + 440 - 450) = -15 (= B waiting 10 s + idle 5); step 3: -(795 + 50 - 440)
    = -405 (= C waiting 300 s + idle 105); step 4: -(50 + 0 - 50) = 0. Sum -420 = -(760 - 450 + 110).
    """
    env = SchedulingEnv("2xV100", [hand_trace()], layout=SMALL, idle_weight=0.5, reward_scale_s=10.0,
                        slot_order="arrival", shaping=shaping)
    W = SMALL.wait_action
    _, info = env.reset(seed=0)
    assert not info["action_mask"][W]  # idle cluster and A can start: wait is invalid
    costs = [0.0, 15.0, 405.0, 0.0] if shaping else [0.0, 25.0, 795.0, 50.0]
    for action, cost, done in zip([0, W, 0, 0], costs, [False, False, False, True], strict=False):
        assert info["action_mask"][action]
        obs, r, terminated, truncated, info = env.step(action)
        assert r == pytest.approx(-cost / 10.0, abs=1e-12)
        assert terminated is done and not truncated
        assert env.observation_space.contains(obs)
    result = info["result"]
    assert metrics.jct_s(result).tolist() == [100.0, 310.0, 350.0]
    assert metrics.idle_gpu_s(result) == pytest.approx(220.0)


def test_shaping_charges_a_slow_type_at_once():
    cluster = load_cluster("4xV100+2xT4")  # ml-training without a model: T4 at 0.52 of a V100
    tr = Trace.of([Job("a", 0, ML, 52, 1)], source="one")
    env = SchedulingEnv(cluster, [tr], layout=SMALL, reward_scale_s=1.0, idle_weight=0.1)
    _, info = env.reset(seed=0)
    assert info["action_mask"][:2].tolist() == [True, True]
    _, r, done, _, _ = env.step(1)  # on the T4: 100 s instead of 52 s, while 5 GPUs idle
    assert r == pytest.approx(-(48.0 + 0.1 * 5 * 100)) and done


@pytest.mark.parametrize("shaping", [False, True])
def test_return_telescopes_to_jct_and_idle_time(shaping):
    cluster = load_cluster("adlro16")
    env = SchedulingEnv(cluster, num_jobs=(20, 40), layout=FeatureLayout(max_gpus=16, max_types=3, top_k=4, window=2),
                        idle_weight=0.3, shaping=shaping)
    rng = np.random.default_rng(0)
    for episode in range(3):
        _, info = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            _, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
            total += r
        res = info["result"]
        excess = res.best_time_s.sum() if shaping else 0.0
        expected = -(metrics.jct_s(res).sum() - excess + 0.3 * metrics.idle_gpu_s(res)) / env.reward_scale_s
        assert total == pytest.approx(expected, rel=1e-9)
        assert res.completed.all()


def test_masked_actions_are_replaced_and_penalised():
    env = SchedulingEnv("2xV100", [hand_trace()], layout=SMALL, idle_weight=0.5, reward_scale_s=10.0,
                        slot_order="arrival")
    _, info = env.reset(seed=0)
    mask = info["action_mask"]
    # 3 slots x 2 types: type 1 does not exist; C (2 GPUs) has not arrived; wait is invalid
    assert mask.tolist() == [True, False, True, False, False, False, False]
    # slot 2 is empty and wait is invalid here: the first valid start (A) is taken instead
    _, r, _, _, info = env.step(4)
    assert r == pytest.approx(-INVALID_PENALTY)
    assert env._point.decision().starts == [(0, (0,))]
    # a masked action now (type 1 does not exist) becomes wait, which is valid again
    _, r, _, _, info = env.step(1)
    assert r == pytest.approx(-INVALID_PENALTY - 15 / 10)  # shaped: B waits 10 s, 1 GPU idles 10 s
    assert env.action_masks().tolist() == info["action_mask"].tolist()


def test_any_trace_reader_output_and_another_cluster(tmp_path):
    cluster = load_cluster("hetero8")
    path = write_native(generate(25, cluster, 0.9, seed=3), tmp_path / "t.csv")
    tr = read_trace(path)
    env = SchedulingEnv(cluster, [tr], layout=FeatureLayout(max_gpus=8, max_types=2, top_k=4, window=4),
                        max_steps=10_000)
    _, info = env.reset(seed=1)
    done, n = False, 0
    while not done:
        _, _, term, trunc, info = env.step(int(np.flatnonzero(info["action_mask"])[0]))
        done, n = term or trunc, n + 1
    assert env.last_result is not None and env.last_result.completed.sum() == len(tr)


def test_truncation_and_bad_arguments():
    env = SchedulingEnv("2xV100", [hand_trace()], layout=SMALL, max_steps=1, slot_order="arrival")
    _, info = env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(0)
    assert truncated and not terminated
    with pytest.raises(AgentError, match="idle_weight"):
        SchedulingEnv("2xV100", [hand_trace()], layout=SMALL, idle_weight=1.0)
    with pytest.raises(AgentError, match="exceeds the layout"):
        SchedulingEnv("adlro16", [hand_trace()], layout=SMALL)
    with pytest.raises(AgentError, match="slot_order"):
        SchedulingEnv("2xV100", [hand_trace()], layout=SMALL, slot_order="random")


# --------------------------------------------------------------------- agents that researchers bring
def test_sb3_dqn_trains_on_the_scheduling_env(one_torch_thread):
    """Stable-Baselines3's DQN runs unchanged on ``gpualloc/Scheduling-v0`` (it ignores the mask: masked
    actions become valid ones, at a penalty)."""
    from stable_baselines3 import DQN

    env = gym.make("gpualloc/Scheduling-v0", cluster="2xV100", traces=[hand_trace()], layout=SMALL)
    model = DQN("MultiInputPolicy", env, learning_starts=20, buffer_size=500, batch_size=8, seed=0, verbose=0,
                policy_kwargs={"net_arch": [16]})
    model.learn(total_timesteps=60)
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(int(action)) and model.num_timesteps == 60


def test_expert_choice_env_is_registered_and_passes_check_env():
    from gpualloc.rl.envs.expert_env import ExpertChoiceEnv

    # generated episodes (check_env makes the environment again from its registered spec: names, not specs)
    env = gym.make("gpualloc/ExpertChoice-v0", clusters=("4xV100+2xT4",), num_jobs=(20, 30),
                   experts=("srtf", "fcfs", "sjf"))
    assert isinstance(env.unwrapped, ExpertChoiceEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # its features are unbounded (queue lengths, log times): Box(-inf, inf), which check_env only remarks on
        warnings.filterwarnings("ignore", message=r".*Box observation space (minimum|maximum) value is")
        check_env(env.unwrapped, skip_render_check=True)


def _pairs(rng: np.random.Generator) -> Trace:
    """Two short and two long jobs arrive together on 2 GPUs, in random queue order: shortest first is
    optimal (each long job then waits for a short one, not the other way round)."""
    works = [rng.uniform(50, 150), rng.uniform(50, 150), rng.uniform(600, 1500), rng.uniform(600, 1500)]
    return Trace.of([Job(str(i), 0.0, ML, float(w), 1) for i, w in enumerate(rng.permutation(works))],
                    source="pairs")


@pytest.mark.slow
def test_our_dqn_learns_shortest_first_on_a_tiny_cluster(one_torch_thread):
    """The environment is learnable: our DQN with the design's CNN finds the known optimum (SJF's total JCT)
    on held-out job orders, played greedily through the environment."""
    from gpualloc.rl.dqn import DQNAgent, DQNConfig, train

    tiny = FeatureLayout(max_gpus=2, max_types=1, top_k=4, window=2)
    rng = np.random.default_rng(0)
    env = SchedulingEnv("2xV100", [_pairs(rng) for _ in range(200)], layout=tiny, slot_order="arrival",
                        reward_scale_s=100.0)
    config = DQNConfig(backbone="cnn", cnn_channels=(4,), cnn_strides=(1,), hidden=(64, 64), lr=1e-3, gamma=0.9,
                       batch_size=32, learning_starts=200, train_freq=1, target_update_interval=100,
                       eps_decay_steps=2_000, seed=0)
    agent = DQNAgent(env.observation_space, env.action_space, config)
    train(env, agent, 4_000, seed=0)
    cluster = load_cluster("2xV100")
    rng = np.random.default_rng(123)  # held-out orders and lengths
    for _ in range(10):
        tr = _pairs(rng)
        obs, info = env.reset(options={"trace": tr})
        done = False
        while not done:
            obs, _, done, _, info = env.step(agent.act(obs, info["action_mask"], explore=False))
        sjf = simulate(tr, cluster, make_policy("sjf"))
        assert metrics.jct_s(env.last_result).sum() == pytest.approx(metrics.jct_s(sjf).sum())
