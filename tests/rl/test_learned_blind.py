"""The expert-choice agent below oracle (issue 36): its state reads no hidden duration, is the same
per seed, the gate falls back to the best expert, and the default ``dqn`` picks the agent of the
run's information level."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpualloc.errors import AgentError
from gpualloc.options import OptionsError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.rl.dqn import DQNAgent, DQNConfig
from gpualloc.rl.envs.expert_env import ExpertChoiceEnv
from gpualloc.rl.expert_choice import (BLIND_EXPERTS, ESTIMATE_EXPERTS, KNOWLEDGE_FEATURES, ExpertPanel,
                                       PredictedWork, gate, obs_dim, observe)
from gpualloc.rl.sched_policy import (AgentFallbackWarning, ByLevel, ExpertChoicePolicy, bundled_agent_path,
                                      expert_extra, learned_policy)
from gpualloc.rl.train_scheduler import LEVEL_ROUND_S, agent_jcts, expert_jcts, train_expert_scheduler
from gpualloc.scheduling.knowledge import InformationError
from gpualloc.scheduling.policies import make_policy
from gpualloc.scheduling.simulator import Simulation, simulate
from gpualloc.workload.traces import generate

BLIND_FAST = ("fcfs", "srtf-pred", "sjf-pred")  # cheap experts that run under blind (no LP, no 60-s rounds)


def _agent(env: ExpertChoiceEnv, seed: int = 0) -> DQNAgent:
    return DQNAgent(env.observation_space, env.action_space, DQNConfig(hidden=(16, 16), seed=seed))


def _biased(env: ExpertChoiceEnv, action: int) -> DQNAgent:
    agent = _agent(env)
    with torch.no_grad():
        for p in agent.qnet.parameters():
            p.zero_()
        [m for m in agent.qnet.modules() if isinstance(m, torch.nn.Linear)][-1].bias[action] = 10.0
    return agent


def _problem(n: int = 14, seed: int = 3):
    cluster = load_cluster("4xV100+2xT4+2xK80")
    return cluster, generate(n, cluster, 1.0, seed=seed)


def test_panels_per_level_run_where_they_should():
    from gpualloc.scheduling.policies import needs_durations

    assert not any(needs_durations(e) for e in BLIND_EXPERTS)
    assert set(BLIND_EXPERTS) < set(ESTIMATE_EXPERTS)
    assert obs_dim(5, 0, "blind") == obs_dim(5) + KNOWLEDGE_FEATURES


def test_observation_under_blind_reads_no_hidden_field_and_the_oracle_one_would():
    cluster, trace = _problem()
    panel = ExpertPanel(BLIND_FAST, 0)
    sim = Simulation(trace, cluster, preemptive=True, round_s=panel.round_s, drop_unplaceable=True, timeline=False,
                     knowledge="blind")
    work = PredictedWork(panel)
    assert not work.own  # srtf-pred's predictor is shared, not fitted twice
    seen = 0
    while not sim.done:
        proposals = panel.propose(sim.view)
        if sim.view.queue or sim.view.running:
            obs = observe(sim.view, proposals, 0, work)
            assert obs.shape == (obs_dim(len(BLIND_FAST), 0, "blind"),) and np.isfinite(obs).all()
            seen += 1
            if seen == 3:
                with pytest.raises(InformationError, match="remaining_s is hidden"):
                    observe(sim.view, proposals, 0)  # the oracle observation reads remaining work
        sim.decide(proposals[seen % len(proposals)])
    assert seen > 3


def test_agent_under_blind_chooses_and_never_reads_a_hidden_field():
    """An agent that switches among the experts at random runs a whole simulation whose view is blind:
    any read of work_s, remaining_s or expected_finish_s would raise."""
    cluster, trace = _problem(16, 5)

    class Switching:  # what ExpertChoicePolicy asks of an agent; checks the observation it is given
        n_actions = len(BLIND_FAST)
        rng = np.random.default_rng(0)

        def act(self, obs, mask, explore=False):
            assert obs.shape == (obs_dim(len(BLIND_FAST), 0, "blind"),) and np.isfinite(obs).all()
            return int(self.rng.choice(np.flatnonzero(mask)))

    policy = ExpertChoicePolicy(Switching(), BLIND_FAST, 0, knowledge="blind", round_s=LEVEL_ROUND_S)
    result = simulate(trace, cluster, policy, drop_unplaceable=True, timeline=False, knowledge="blind")
    assert result.knowledge == "blind" and np.isfinite(result.finish_s).all()
    assert policy.choices.sum() > 0 and np.count_nonzero(policy.choices) >= 2


def test_blind_state_is_deterministic_per_seed():
    cluster, trace = _problem(24, 7)

    def states(seed: int) -> list[np.ndarray]:
        env = ExpertChoiceEnv([(cluster, trace)], experts=("fcfs", "srtf-pred"), knowledge="blind", seed=seed)
        obs, info = env.reset(seed=seed)
        out, done = [obs], False
        while not done:
            allowed = np.flatnonzero(info["action_mask"])
            obs, _, done, _, info = env.step(int(allowed[len(out) % len(allowed)]))
            out.append(obs)
        return out

    a, b = states(4), states(4)
    assert len(a) == len(b) > 2
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_gate_falls_back_to_the_best_expert_under_blind(tmp_path):
    cluster, trace = _problem(12, 9)
    problems = [(cluster, trace)]
    env = ExpertChoiceEnv(problems, experts=BLIND_FAST, knowledge="blind", round_s=LEVEL_ROUND_S)
    bad = _biased(env, 0)  # always FCFS: head-of-line blocking, worse than SRTF on predictions
    level = {"knowledge": "blind", "round_s": LEVEL_ROUND_S}
    mine = agent_jcts(bad, problems, BLIND_FAST, 1, **level)
    theirs = expert_jcts(problems, ["srtf-pred"], "blind")["srtf-pred"]
    verdict = gate(mine, theirs, "srtf-pred")
    assert not verdict.passed
    bad.extra = expert_extra(BLIND_FAST, 1, verdict, **level)
    path = tmp_path / "bad.pt"
    bad.save(path)
    with pytest.warns(AgentFallbackWarning, match="falling back to srtf-pred"):
        policy = make_policy("dqn", agent=str(path))
    fell = simulate(trace, cluster, policy, drop_unplaceable=True, timeline=False, knowledge="blind")
    alone = simulate(trace, cluster, make_policy("srtf-pred"), drop_unplaceable=True, timeline=False,
                     knowledge="blind")
    np.testing.assert_array_equal(fell.finish_s, alone.finish_s)


def test_default_dqn_takes_the_agent_of_the_runs_level(tmp_path):
    cluster, trace = _problem(14, 11)
    panel = ("sjf-pred", "fcfs")
    env = ExpertChoiceEnv([(cluster, trace)], experts=panel, knowledge="blind")
    agent = _biased(env, 0)  # always sjf-pred's proposal: sjf-pred's result
    agent.extra = expert_extra(panel, 0, None, knowledge="blind", round_s=None)
    path = tmp_path / "blind.pt"
    agent.save(path)
    oracle = ExpertChoicePolicy(None, ("srtf",), 0)  # as the bundled oracle agent: its teacher alone
    policy = ByLevel(oracle, {"blind": path})
    assert policy.round_s is None and policy.knowledge == "oracle"
    blind = simulate(trace, cluster, policy, drop_unplaceable=True, timeline=False, knowledge="blind")
    alone = simulate(trace, cluster, make_policy("sjf-pred"), drop_unplaceable=True, timeline=False,
                     knowledge="blind")
    np.testing.assert_array_equal(blind.finish_s, alone.finish_s)
    assert policy.knowledge == "blind"
    at_oracle = simulate(trace, cluster, policy, drop_unplaceable=True, timeline=False)
    ref = simulate(trace, cluster, make_policy("srtf"), drop_unplaceable=True, timeline=False)
    np.testing.assert_array_equal(at_oracle.finish_s, ref.finish_s)
    with pytest.raises(InformationError):  # no estimate agent given: the oracle one, which reads durations
        simulate(trace, cluster, ByLevel(oracle, {}), drop_unplaceable=True, timeline=False, knowledge="blind")


def test_bundled_paths_by_level_and_refusals(tmp_path):
    assert bundled_agent_path(knowledge="blind").name == "sched-experts-blind.pt"
    assert bundled_agent_path(knowledge="oracle").name == "sched-experts.pt"
    with pytest.raises(AgentError, match="unknown information level"):
        bundled_agent_path(knowledge="psychic")
    with pytest.raises(OptionsError, match="needs durations"):
        train_expert_scheduler(tmp_path / "x.pt", knowledge="blind", experts=("las", "srtf"))
    with pytest.raises(OptionsError, match="oracle only"):
        train_expert_scheduler(tmp_path / "x.pt", knowledge="estimate", experts=("las", "srtf"), rollout_points=2)
    with pytest.raises(OptionsError, match="not an expert"):
        train_expert_scheduler(tmp_path / "x.pt", experts=("las", "srtf-pred"))  # -pred only below oracle
    assert isinstance(learned_policy(None), (ByLevel, ExpertChoicePolicy))
