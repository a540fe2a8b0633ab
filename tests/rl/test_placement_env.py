"""PlacementEnv: Gymnasium conformance, masking, reward telescoping, SB3 interop."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import gpualloc.rl.envs  # noqa: F401  (registers the environments)
from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.simulate import simulate_step
from gpualloc.rl.envs.placement_env import PlacementEnv, coarsen
from tests.placement.test_simulate import random_dag


def problem(seed: int = 0, cluster: str = "2xA100+2xV100", n: int = 30, microbatches: int = 1) -> PlacementProblem:
    return PlacementProblem(random_dag(np.random.default_rng(seed), n), load_cluster(cluster),
                            microbatches=microbatches)


@pytest.fixture(scope="module")
def env() -> PlacementEnv:
    return PlacementEnv([problem(0), problem(1, "1xA100+1xT4", 20, 4)], max_devices=8)


def test_check_env(env):
    check_env(env, skip_render_check=True)


def test_registered_and_default_problem():
    e = gym.make("gpualloc/Placement-v0", problems=[problem(2)], max_devices=4)
    obs, info = e.reset(seed=3)
    assert obs.shape == e.observation_space.shape
    assert info["action_mask"].tolist() == [True] * 4


def test_coarsen_is_contiguous_in_topological_order():
    p = problem(0)
    g = coarsen(p, 8)
    assert g.max() + 1 <= 8
    assert np.all(np.diff(g[p.graph.topo_order]) >= 0)


def test_return_telescopes_to_gain_over_base(env):
    rng = np.random.default_rng(0)
    for episode in range(4):
        obs, info = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            obs, r, done, _, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
            total += r
        ep = env._ep
        final = simulate_step(ep.problem, env.assignment)
        expected = (ep.base_step_s - final.step_time_s) / ep.base_step_s \
            + env.energy_weight * (ep.base_energy_j - final.energy_per_step_j) / ep.base_energy_j
        assert total == pytest.approx(expected, abs=1e-9)


def test_following_the_base_plan_returns_zero(env):
    obs, info = env.reset(seed=0, options={"problem": 0})
    total, done = 0.0, False
    while not done:
        obs, r, done, _, info = env.step(int(env._ep.base_sub[env._cursor]))
        total += r
    assert total == pytest.approx(0.0, abs=1e-12)


def test_out_of_memory_devices_and_empty_slots_are_masked():
    p = problem(0, "1xA100+1xT4", 12)
    e = PlacementEnv([p], max_devices=4, factor=2)
    _, info = e.reset(seed=0)
    assert info["action_mask"].tolist()[2:] == [False, False]
    # fill the T4 (16 GB) by hand: the next subgraph no longer fits there
    e._mem[1] = p.mem_cap_bytes[1]
    assert e.action_masks().tolist() == [True, False, False, False]


def test_masked_action_is_replaced_and_penalised():
    e = PlacementEnv([problem(0)], max_devices=8)
    _, info = e.reset(seed=0)
    base = int(e._ep.base_sub[0])
    _, r_bad, *_ = e.step(7)  # empty slot
    assert e._sub[0] == base
    e.reset(seed=0)
    _, r_base, *_ = e.step(base)
    assert r_bad == pytest.approx(r_base - 0.1)


def test_rejects_too_many_devices():
    with pytest.raises(AgentError, match="max_devices"):
        PlacementEnv([problem(0, "8xA100")], max_devices=4)


@pytest.mark.slow
def test_sb3_dqn_runs_unchanged(env):
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", env, learning_starts=50, buffer_size=1000, batch_size=16, seed=0, verbose=0,
                policy_kwargs={"net_arch": [32]})
    model.learn(total_timesteps=300)
    obs, _ = env.reset(seed=0)
    action, _ = model.predict(obs, deterministic=True)
    assert env.action_space.contains(int(action))
