"""DQN agent: learning on known-answer environments, action masks, checkpoints, determinism."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from gpualloc.errors import AgentError
from gpualloc.rl.dqn import DQNAgent, DQNConfig, TrainLog, evaluate, train
from gpualloc.rl.dqn.networks import CNNQNet, MLPQNet, build_qnet
from gpualloc.rl.dqn.replay import ReplayBatch, ReplayBuffer


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------------------------ tiny envs
class IdentityEnv(gym.Env):
    """Observe the one-hot of a random target among ``n``; naming it pays 1. One step per episode."""

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self.observation_space = spaces.Box(0.0, 1.0, (n,), np.float32)
        self.action_space = spaces.Discrete(n)
        self._target = 0

    def _obs(self) -> np.ndarray:
        return np.eye(self.n, dtype=np.float32)[self._target]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._target = int(self.np_random.integers(self.n))
        return self._obs(), {}

    def step(self, action):
        reward = float(action == self._target)
        return self._obs(), reward, True, False, {}


class ChainEnv(gym.Env):
    """Two states, two actions, gamma = 0.9, known optimal Q.

    s0: a0 -> s1 (r 0); a1 -> end (r 0.5).  s1: a0 -> end (r 1); a1 -> s0 (r 0).
    Q*(s1,a0) = 1, Q*(s0,a0) = 0.9, Q*(s0,a1) = 0.5, Q*(s1,a1) = 0.9 * 0.9 = 0.81.
    Truncated after 10 steps (bootstrapped, so the answer is unchanged).
    """

    Q_STAR = np.array([[0.9, 0.5], [1.0, 0.81]])

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._state = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.eye(2, dtype=np.float32)[self._state]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._state, self._t = 0, 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        if self._state == 0:
            reward, terminated = (0.0, False) if action == 0 else (0.5, True)
            self._state = 1 if action == 0 else 0
        else:
            reward, terminated = (1.0, True) if action == 0 else (0.0, False)
            self._state = 0
        return self._obs(), reward, terminated, self._t >= 10 and not terminated, {}


class MaskedEnv(gym.Env):
    """Random observations and random action masks in ``info["action_mask"]``; counts invalid actions.

    Reward 1 for the lowest valid action; episodes last 5 steps.
    """

    def __init__(self, n_actions: int = 6, obs_dim: int = 8) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        self.action_space = spaces.Discrete(n_actions)
        self.invalid_actions = 0
        self._mask = np.ones(n_actions, bool)
        self._t = 0

    def _draw(self):
        mask = self.np_random.random(self.action_space.n) < 0.5
        mask[self.np_random.integers(self.action_space.n)] = True
        self._mask = mask
        obs = self.np_random.uniform(-1, 1, self.observation_space.shape).astype(np.float32)
        obs[: mask.size] = mask  # the mask is observable, so the task is learnable
        return obs, {"action_mask": mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw()

    def step(self, action):
        self.invalid_actions += int(not self._mask[action])
        reward = float(action == int(np.flatnonzero(self._mask)[0]))
        self._t += 1
        obs, info = self._draw()
        return obs, reward, False, self._t >= 5, info


class GridEnv(gym.Env):
    """Dict observation (a 4x6 utilisation grid and 3 features); pick a column, paid its mean load.

    Masks come from ``action_masks()`` (reached through the TimeLimit wrapper).
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Dict({
            "grid": spaces.Box(0.0, 1.0, (4, 6), np.float32),
            "features": spaces.Box(-1.0, 1.0, (3,), np.float32),
        })
        self.action_space = spaces.Discrete(6)
        self.invalid_actions = 0
        self._grid = np.zeros((4, 6), np.float32)
        self._mask = np.ones(6, bool)

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def _draw(self):
        self._grid = self.np_random.random((4, 6)).astype(np.float32)
        self._mask = self.np_random.random(6) < 0.6
        self._mask[int(self._grid.mean(0).argmax())] = True
        return {"grid": self._grid.copy(), "features": self.np_random.uniform(-1, 1, 3).astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._draw(), {}

    def step(self, action):
        self.invalid_actions += int(not self._mask[action])
        reward = float(self._grid[:, action].mean())
        return self._draw(), reward, False, False, {}


def make_grid_env() -> gym.Env:
    return gym.wrappers.TimeLimit(GridEnv(), max_episode_steps=3)


@pytest.mark.parametrize("make", [IdentityEnv, ChainEnv, MaskedEnv, GridEnv])
def test_envs_pass_gymnasium_checker(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(make(), skip_render_check=True)


# -------------------------------------------------------------------------------------- config
def fast_config(**overrides) -> DQNConfig:
    base = dict(lr=1e-3, batch_size=32, buffer_size=5_000, learning_starts=100, train_freq=1,
                target_update_interval=100, eps_decay_steps=1_000, hidden=(64,), seed=0)
    base.update(overrides)
    return DQNConfig(**base)


@pytest.mark.parametrize("field, value", [
    ("gamma", 1.5), ("lr", 0.0), ("batch_size", 0), ("train_freq", 0), ("eps_end", -0.1),
    ("max_grad_norm", 0.0), ("hidden", (64, 0)), ("cnn_channels", ()), ("cnn_strides", (1,)), ("seed", -1),
    ("learning_starts", 1.5),
])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(AgentError, match=f"DQNConfig.{field}"):
        DQNConfig(**{field: value})


def test_epsilon_decays_linearly_then_stays():
    cfg = DQNConfig(eps_start=1.0, eps_end=0.1, eps_decay_steps=100)
    assert [cfg.epsilon(t) for t in (0, 50, 100, 1_000)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    assert DQNConfig(eps_decay_steps=0, eps_end=0.2).epsilon(0) == 0.2


# ------------------------------------------------------------------------------------ networks
def test_build_qnet_picks_backbone_by_space():
    mlp = build_qnet(spaces.Box(-1, 1, (5,), np.float32), 3, DQNConfig())
    assert isinstance(mlp, MLPQNet) and mlp(torch.zeros(2, 5)).shape == (2, 3)
    cfg = DQNConfig(backbone="cnn", cnn_channels=(4, 8), hidden=(16, 16))
    grid_dict = spaces.Dict({"grid": spaces.Box(0, 1, (2, 4, 6), np.float32),
                             "features": spaces.Box(0, 1, (3,), np.float32)})
    cnn = build_qnet(grid_dict, 7, cfg)
    assert isinstance(cnn, CNNQNet) and cnn.grid_shape == (2, 4, 6) and cnn.extra_dim == 3
    assert cnn({"grid": torch.zeros(5, 2, 4, 6), "features": torch.zeros(5, 3)}).shape == (5, 7)
    # A bare (H, W) grid Box, one channel, no features; two conv layers and two FC layers + output.
    cnn2 = build_qnet(spaces.Box(0, 1, (4, 6), np.float32), 7, cfg)
    assert cnn2.grid_shape == (1, 4, 6) and cnn2(torch.zeros(5, 4, 6)).shape == (5, 7)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in cnn2.modules()) == 2
    assert sum(isinstance(m, torch.nn.Linear) for m in cnn2.modules()) == 3
    # Default strides (1, 2) halve each side before the head: 8 channels x 2 x 3 cells.
    assert cnn2.head[0].in_features == 8 * 2 * 3
    flat = build_qnet(spaces.Box(0, 1, (5, 7), np.float32), 7, DQNConfig(backbone="cnn", cnn_strides=(1, 1)))
    assert flat.head[0].in_features == 32 * 5 * 7 and flat(torch.zeros(1, 5, 7)).shape == (1, 7)


@pytest.mark.parametrize("space, backbone", [
    (spaces.Dict({"grid": spaces.Box(0, 1, (4, 6))}), "mlp"),
    (spaces.Box(0, 1, (5,)), "cnn"),
    (spaces.Dict({"features": spaces.Box(0, 1, (3,))}), "cnn"),
    (spaces.Box(0, 1, (5,)), "transformer"),
])
def test_build_qnet_rejects_what_it_cannot_read(space, backbone):
    with pytest.raises(AgentError):
        build_qnet(space, 3, DQNConfig(backbone=backbone))


def test_agent_rejects_non_discrete_actions():
    with pytest.raises(AgentError, match="Discrete"):
        DQNAgent(spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (2,)), DQNConfig())
    with pytest.raises(AgentError, match="Discrete"):
        DQNAgent(spaces.Box(-1, 1, (3,)), spaces.Discrete(3, start=1), DQNConfig())


# -------------------------------------------------------------------------------------- replay
def test_replay_buffer_ring_and_dict_observations():
    space = GridEnv().observation_space
    buf = ReplayBuffer(3, space, 6, seed=0)
    for i in range(5):
        obs = {"grid": np.full((4, 6), i, np.float32), "features": np.full(3, -i, np.float32)}
        nxt = {"grid": np.full((4, 6), i + 1, np.float32), "features": np.zeros(3, np.float32)}
        mask = np.arange(6) != i % 6
        buf.add(obs, i % 6, float(i), nxt, i == 4, mask)
    assert len(buf) == 3
    batch = buf.sample(64)
    assert isinstance(batch, ReplayBatch)
    assert batch.observations["grid"].shape == (64, 4, 6) and batch.observations["grid"].dtype == torch.float32
    assert set(batch.rewards.tolist()) == {2.0, 3.0, 4.0}  # the two oldest were overwritten
    i = batch.rewards.long()
    assert torch.equal(batch.observations["grid"][:, 0, 0], i.float())
    assert torch.equal(batch.next_observations["grid"][:, 0, 0], i.float() + 1)
    assert torch.equal(batch.terminated, (i == 4).float())
    assert not batch.next_masks[torch.arange(64), i % 6].any()
    with pytest.raises(AgentError, match="empty"):
        ReplayBuffer(3, space, 6).sample(1)


# ---------------------------------------------------------------------------------- (1) learning
@pytest.mark.slow
def test_identity_env_reaches_optimal_return():
    env, eval_env = IdentityEnv(), IdentityEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config())
    log = train(env, agent, 2_000, seed=1)
    assert isinstance(log, TrainLog) and log.steps == 2_000
    assert len(log.episode_returns) == 2_000 and set(log.episode_lengths) == {1}
    assert log.episode_epsilons[0] > log.episode_epsilons[-1] == pytest.approx(0.05)
    assert len(log.losses) == 2_000 - 99
    returns = evaluate(eval_env, agent, 50, seed=7)
    assert len(returns) == 50 and np.mean(returns) >= 0.95


# -------------------------------------------------------------------------------- (6) known Q*
@pytest.mark.slow
def test_two_state_chain_q_converges_to_analytic_values():
    env = ChainEnv()
    cfg = fast_config(gamma=0.9, eps_start=1.0, eps_end=1.0, hidden=(32, 32), batch_size=64,
                      target_update_interval=50)
    agent = DQNAgent(env.observation_space, env.action_space, cfg)
    train(env, agent, 3_000, seed=0)
    q = np.stack([agent.q_values(np.eye(2, dtype=np.float32)[s]) for s in (0, 1)])
    np.testing.assert_allclose(q, ChainEnv.Q_STAR, atol=0.01)
    assert evaluate(ChainEnv(), agent, 3, seed=0) == [1.0, 1.0, 1.0]  # a0, a0: reach s1 then finish


# ------------------------------------------------------------------------------------ (2) masks
def test_act_never_returns_a_masked_action():
    agent = DQNAgent(spaces.Box(-1, 1, (8,), np.float32), spaces.Discrete(6),
                     DQNConfig(eps_start=0.5, eps_end=0.5, hidden=(16,)))
    rng = np.random.default_rng(3)
    explored = set()
    for _ in range(500):
        obs = rng.uniform(-1, 1, 8).astype(np.float32)
        mask = rng.random(6) < 0.3
        mask[rng.integers(6)] = True
        a_explore = agent.act(obs, mask, explore=True)
        a_greedy = agent.act(obs, mask, explore=False)
        assert mask[a_explore] and mask[a_greedy]
        explored.add(a_explore)
        q = agent.q_values(obs)
        assert a_greedy == int(np.flatnonzero(mask)[np.argmax(q[mask])])
    assert explored == set(range(6))
    with pytest.raises(AgentError, match="no valid action"):
        agent.act(np.zeros(8, np.float32), np.zeros(6, bool))
    with pytest.raises(AgentError, match="mask shape"):
        agent.act(np.zeros(8, np.float32), np.ones(5, bool))


def test_training_respects_masks_from_info():
    env = MaskedEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config(learning_starts=64))
    train(env, agent, 600, seed=0)
    assert env.invalid_actions == 0


def _set_constant_q(net: torch.nn.Module, values) -> None:
    last = [m for m in net.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor(values, dtype=torch.float32))


def _hand_batch() -> ReplayBatch:
    # Rows: masked huge action; all valid; terminal; no valid next action.
    return ReplayBatch(
        observations=torch.zeros(4, 3),
        actions=torch.tensor([0, 1, 2, 3]),
        rewards=torch.tensor([0.5, 0.5, 1.0, 0.25]),
        next_observations=torch.ones(4, 3),
        terminated=torch.tensor([0.0, 0.0, 1.0, 0.0]),
        next_masks=torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool),
    )


@pytest.mark.parametrize("double", [True, False])
def test_target_maximises_over_valid_next_actions_only(double):
    agent = DQNAgent(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(4),
                     DQNConfig(gamma=0.9, double=double, hidden=(8,)))
    _set_constant_q(agent.qnet, [1.0, 2.0, 1e6, 3.0])
    agent.sync_target()
    target = agent.td_target(_hand_batch())
    expected = torch.tensor([0.5 + 0.9 * 3.0, 0.5 + 0.9 * 1e6, 1.0, 0.25])
    torch.testing.assert_close(target, expected)
    # update() regresses Q(s, a) onto exactly this target.
    batch = _hand_batch()
    q = agent.qnet(batch.observations).gather(1, batch.actions[:, None]).squeeze(1).detach()
    stats = agent.update(batch)
    assert stats["loss"] == pytest.approx(F.smooth_l1_loss(q, expected).item(), rel=1e-6)
    assert stats["q_mean"] == pytest.approx(q.mean().item())


def test_double_dqn_selects_with_online_and_values_with_target():
    agent = DQNAgent(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(4),
                     DQNConfig(gamma=0.5, double=True, hidden=(8,)))
    _set_constant_q(agent.qnet, [1.0, 2.0, 3.0, 0.0])
    _set_constant_q(agent.target_net, [10.0, 20.0, 5.0, 0.0])
    batch = _hand_batch()._replace(next_masks=torch.ones(4, 4, dtype=torch.bool))
    torch.testing.assert_close(agent.td_target(batch), torch.tensor([0.5 + 2.5, 0.5 + 2.5, 1.0, 0.25 + 2.5]))
    vanilla = DQNAgent(agent.observation_space, agent.action_space, DQNConfig(gamma=0.5, double=False, hidden=(8,)))
    _set_constant_q(vanilla.target_net, [10.0, 20.0, 5.0, 0.0])
    torch.testing.assert_close(vanilla.td_target(batch), torch.tensor([10.5, 10.5, 1.0, 10.25]))


def test_target_network_is_copied_every_interval():
    agent = DQNAgent(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(4),
                     DQNConfig(target_update_interval=3, lr=1e-2, hidden=(8,)))
    batch = _hand_batch()
    before = [p.clone() for p in agent.target_net.parameters()]
    for _ in range(2):
        agent.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, agent.target_net.parameters(), strict=False))
    agent.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(agent.qnet.parameters(), agent.target_net.parameters(), strict=False))


# ------------------------------------------------------------------------------- (3) checkpoints
def _trained_masked_agent() -> tuple[DQNAgent, MaskedEnv]:
    env = MaskedEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config(learning_starts=32, hidden=(32,)))
    train(env, agent, 100, seed=0)
    return agent, env


def test_checkpoint_round_trip(tmp_path):
    agent, env = _trained_masked_agent()
    extra = {"obs_mean": np.linspace(0, 1, 8), "counts": np.arange(6, dtype=np.int32).reshape(2, 3),
             "meta": {"name": "resnet50", "devices": ("V100", "A100"), "n": np.int64(3)}, "scale": 2.5}
    path = agent.save(tmp_path / "sub" / "agent.pt", extra=extra)
    loaded = DQNAgent.load(path)

    assert loaded.config == agent.config
    assert loaded.observation_space == agent.observation_space and loaded.action_space == agent.action_space
    assert (loaded.num_timesteps, loaded.num_updates) == (agent.num_timesteps, agent.num_updates) == (100, 69)
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs = rng.uniform(-1, 1, 8).astype(np.float32)
        np.testing.assert_array_equal(loaded.q_values(obs), agent.q_values(obs))
    # extra: arrays keep dtype, shape and values; numpy scalars become Python scalars.
    np.testing.assert_array_equal(loaded.extra["obs_mean"], extra["obs_mean"])
    assert loaded.extra["counts"].dtype == np.int32 and loaded.extra["counts"].shape == (2, 3)
    assert loaded.extra["meta"] == {"name": "resnet50", "devices": ("V100", "A100"), "n": 3}
    assert loaded.extra["scale"] == 2.5
    # optimizer state: every Adam moment and step count.
    s_old, s_new = agent.optimizer.state_dict(), loaded.optimizer.state_dict()
    assert s_old["param_groups"] == s_new["param_groups"] and s_old["state"].keys() == s_new["state"].keys()
    for k, state in s_old["state"].items():
        for name, value in state.items():
            assert torch.equal(value, s_new["state"][k][name]), name
    # The loaded agent continues exactly as the original would: same exploration, same updates.
    obs = np.zeros(8, np.float32)
    mask = np.ones(6, bool)
    assert [loaded.act(obs, mask) for _ in range(30)] == [agent.act(obs, mask) for _ in range(30)]
    batch = ReplayBuffer(10, env.observation_space, 6, seed=0)
    for _ in range(10):
        batch.add(rng.uniform(-1, 1, 8), int(rng.integers(6)), 1.0, rng.uniform(-1, 1, 8), False, None)
    sample = batch.sample(16)
    assert agent.update(sample) == loaded.update(sample)
    for a, b in zip(agent.qnet.state_dict().values(), loaded.qnet.state_dict().values(), strict=False):
        assert torch.equal(a, b)


def test_checkpoint_keeps_agent_extra_by_default(tmp_path):
    cfg = DQNConfig(backbone="cnn", hidden=(8,), cnn_channels=(2,), cnn_strides=(1,))
    agent = DQNAgent(GridEnv().observation_space, spaces.Discrete(6), cfg)
    agent.extra["norm"] = {"mean": np.zeros(3), "std": np.ones(3)}
    loaded = DQNAgent.load(agent.save(tmp_path / "cnn.pt"))
    assert loaded.observation_space == agent.observation_space
    np.testing.assert_array_equal(loaded.extra["norm"]["std"], np.ones(3))
    obs = GridEnv().observation_space.sample()
    np.testing.assert_array_equal(loaded.q_values(obs), agent.q_values(obs))


def test_unstorable_extra_raises(tmp_path):
    agent = DQNAgent(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), DQNConfig(hidden=(4,)))
    with pytest.raises(AgentError, match=r"extra\['f'\]"):
        agent.save(tmp_path / "x.pt", extra={"f": object()})
    assert not (tmp_path / "x.pt").exists()


def _bad_files(tmp_path, good: dict):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    yield garbage
    yield tmp_path / "missing.pt"
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    yield foreign
    for name, change in [("version", {"version": 99}),
                         ("config", {"config": {**good["config"], "nonsense": 1}}),
                         ("weights", {"qnet": {k: torch.zeros(1) for k in good["qnet"]}}),
                         ("missing", {"optimizer": None})]:
        path = tmp_path / f"bad_{name}.pt"
        torch.save({**good, **change}, path)
        yield path
    pickled = tmp_path / "pickled.pt"
    torch.save({"format": "gpualloc.dqn", "obj": IdentityEnv()}, pickled)  # refused: not weights-only
    yield pickled


def test_loading_a_bad_file_raises_one_line_naming_it(tmp_path):
    agent = DQNAgent(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), DQNConfig(hidden=(4,)))
    good = torch.load(agent.save(tmp_path / "good.pt"), weights_only=True)
    for path in _bad_files(tmp_path, good):
        with pytest.raises(AgentError) as err:
            DQNAgent.load(path)
        msg = str(err.value)
        assert msg.startswith(f"{path}: ") and "\n" not in msg, msg


# ------------------------------------------------------------------------------ (4) determinism
def _weights_after_training(seed: int) -> tuple[dict, list[float]]:
    env = MaskedEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config(learning_starts=50, seed=seed))
    log = train(env, agent, 300, seed=5)
    return agent.qnet.state_dict(), log.losses


def test_same_seed_gives_identical_weights():
    torch_state = torch.get_rng_state()
    np_state = np.random.get_state()[1].copy()
    (w1, l1), (w2, l2) = _weights_after_training(0), _weights_after_training(0)
    assert l1 == l2 and len(l1) == 251
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    w3, _ = _weights_after_training(1)
    assert not all(torch.equal(w1[k], w3[k]) for k in w1)
    # Nothing touched the global RNGs.
    assert torch.equal(torch.get_rng_state(), torch_state)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)


# ------------------------------------------------------------------------------------- (5) CNN
def test_cnn_backbone_on_dict_observations_trains_and_acts(tmp_path):
    env, eval_env = make_grid_env(), make_grid_env()
    cfg = fast_config(backbone="cnn", cnn_channels=(4, 8), hidden=(32, 32), learning_starts=32)
    agent = DQNAgent(env.observation_space, env.action_space, cfg)
    stops = []

    def stop_at_150(step: int, log: TrainLog) -> bool:
        stops.append(step)
        return step < 150

    log = train(env, agent, 1_000, seed=0, callback=stop_at_150, eval_env=eval_env, eval_every=50,
                eval_episodes=2, checkpoint_path=tmp_path / "best.pt")
    assert log.steps == 150 and stops == list(range(1, 151))
    assert len(log.losses) == 150 - 31 and all(np.isfinite(log.losses))
    assert [e.step for e in log.evals] == [50, 100, 150]
    assert log.best_eval == max(e.mean for e in log.evals)
    assert env.unwrapped.invalid_actions == 0 and eval_env.unwrapped.invalid_actions == 0
    assert set(log.episode_lengths) == {3}
    best = DQNAgent.load(tmp_path / "best.pt")
    assert isinstance(best.qnet, CNNQNet)
    obs, _ = env.reset(seed=3)
    mask = env.unwrapped.action_masks()
    a = best.act(obs, mask, explore=False)
    assert mask[a] and best.q_values(obs).shape == (6,)


def test_train_argument_errors():
    env = IdentityEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config())
    with pytest.raises(AgentError, match="eval_env"):
        train(env, agent, 10, seed=0, eval_every=5)
    with pytest.raises(AgentError, match="eval_env"):
        train(env, agent, 10, seed=0, eval_env=env, eval_every=5)


def test_train_without_eval_saves_final_checkpoint(tmp_path):
    env = IdentityEnv()
    agent = DQNAgent(env.observation_space, env.action_space, fast_config())
    train(env, agent, 20, seed=0, checkpoint_path=tmp_path / "final.pt")
    assert DQNAgent.load(tmp_path / "final.pt").num_timesteps == 20
