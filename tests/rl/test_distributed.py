"""DQN with parallel actors: it learns the known answer, keeps the replay ratio, and its result does
not depend on where the rollouts run."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from gpualloc.errors import AgentError
from gpualloc.parallel import ProcessExecutor, SerialExecutor
from gpualloc.rl.dqn import DQNAgent, evaluate
from gpualloc.rl.dqn.distributed import RolloutTask, collect, train_distributed
from gpualloc.rl.dqn.replay import ReplayBuffer
from tests.rl.test_dqn import ChainEnv, MaskedEnv, fast_config


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def weights_of(agent: DQNAgent) -> dict:
    return {k: v.clone() for k, v in agent.qnet.state_dict().items()}


@pytest.mark.slow
def test_two_actors_learn_the_chains_analytic_q_values():
    cfg = fast_config(gamma=0.9, eps_start=1.0, eps_end=1.0, hidden=(32, 32), batch_size=64,
                      target_update_interval=50)
    agent = DQNAgent(ChainEnv().observation_space, ChainEnv().action_space, cfg)
    log = train_distributed(ChainEnv, agent, 3_000, seed=0, executor=SerialExecutor(), actors=2, round_steps=100)
    q = np.stack([agent.q_values(np.eye(2, dtype=np.float32)[s]) for s in (0, 1)])
    np.testing.assert_allclose(q, ChainEnv.Q_STAR, atol=0.02)
    assert evaluate(ChainEnv(), agent, 3, seed=0) == [1.0, 1.0, 1.0]
    assert log.steps >= 3_000 and log.steps == sum(log.episode_lengths) == agent.num_timesteps


def test_collect_plays_whole_episodes_with_valid_actions_and_the_global_epsilon_clock():
    env = MaskedEnv()
    cfg = fast_config(eps_start=1.0, eps_end=0.0, eps_decay_steps=100)
    agent = DQNAgent(env.observation_space, env.action_space, cfg)
    task = RolloutTask(MaskedEnv, cfg, weights_of(agent), start_step=40, actor=1, actors=3, steps=12, seed=5)
    r = collect(task)
    assert len(r) == 15 and r.episode_lengths == (5, 5, 5)  # 12 steps asked, the third episode finished
    assert r.states[""].shape == (18, 8) and r.next_masks.shape == (15, 6) and r.next_masks.any(axis=1).all()
    assert r.obs_index.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16]
    # the mask is the observation's first entries: every action taken was valid there
    assert all(r.states[""][r.obs_index[i], a] == 1.0 for i, a in enumerate(r.actions))
    np.testing.assert_array_equal(r.states[""][r.obs_index + 1, :6], r.next_masks)
    assert collect(task).rewards.tolist() == r.rewards.tolist()  # a pure function of the task
    buffer = ReplayBuffer(100, env.observation_space, 6, seed=0)
    r.add_to(buffer)
    assert len(buffer) == 15


def test_replay_ratio_matches_the_single_process_loop():
    env = MaskedEnv()
    cfg = fast_config(learning_starts=50, train_freq=2, gradient_steps=3, batch_size=16)
    agent = DQNAgent(env.observation_space, env.action_space, cfg)
    log = train_distributed(MaskedEnv, agent, 200, seed=1, executor=SerialExecutor(), actors=2, round_steps=50)
    # transitions 50..200 (from the one that fills the buffer to learning_starts) earn 151 / 2 * 3
    # gradient steps, as in the single-process loop (which trains at steps 50, 52, ..., 200: 228)
    assert log.steps == 200 and len(log.losses) == 226 == agent.num_updates


@pytest.mark.slow
def test_results_do_not_depend_on_the_executor():
    cfg = fast_config(learning_starts=20, batch_size=16, hidden=(16,))
    make = partial(MaskedEnv, 5, 7)

    def run(executor):
        agent = DQNAgent(make().observation_space, make().action_space, cfg)
        log = train_distributed(make, agent, 120, seed=3, executor=executor, actors=2, round_steps=40)
        return log, weights_of(agent)

    serial_log, serial_w = run(SerialExecutor())
    with ProcessExecutor(2) as ex:
        proc_log, proc_w = run(ex)
    assert serial_log.episode_returns == proc_log.episode_returns and serial_log.losses == proc_log.losses
    assert all(torch.equal(serial_w[k], proc_w[k]) for k in serial_w)


@pytest.mark.parametrize("kwargs", [dict(actors=0), dict(round_steps=1, actors=2), dict(total_steps=-1)])
def test_bad_arguments_are_one_line_errors(kwargs):
    env = MaskedEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config())
    args = dict(total_steps=10, actors=2, round_steps=10) | kwargs
    with pytest.raises(AgentError, match="train_distributed"):
        train_distributed(MaskedEnv, agent, args.pop("total_steps"), seed=0, executor=SerialExecutor(), **args)


def test_replay_extend_equals_one_add_per_transition_across_the_wrap():
    env = MaskedEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config())
    r = collect(RolloutTask(MaskedEnv, agent.config, weights_of(agent), 0, 0, 1, 23, seed=2))  # 25 transitions
    one, many = (ReplayBuffer(10, env.observation_space, 6, seed=0) for _ in range(2))
    for i in list(range(7)) + list(range(len(r))):
        one.add(r.states[""][r.obs_index[i]], int(r.actions[i]), float(r.rewards[i]),
                r.states[""][r.obs_index[i] + 1], bool(r.terminated[i]), r.next_masks[i])
    many.extend(r.states[""][r.obs_index[:7]], r.actions[:7], r.rewards[:7], r.states[""][r.obs_index[:7] + 1],
                r.terminated[:7], r.next_masks[:7])
    r.add_to(many)  # 7 + 25 transitions into 10 slots: wraps, and the batch is longer than the buffer
    assert len(one) == len(many) == 10 and one._pos == many._pos == 2
    for name in ("_actions", "_rewards", "_terminated", "_next_masks"):
        np.testing.assert_array_equal(getattr(one, name), getattr(many, name))
    np.testing.assert_array_equal(one._obs[""], many._obs[""])
    np.testing.assert_array_equal(one._next_obs[""], many._next_obs[""])
