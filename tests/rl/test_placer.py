"""The placement agent: training writes a usable checkpoint, `dqn` is never worse than `best`,
re-planning with the agent, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpualloc.errors import AgentError
from gpualloc.hardware.cluster import load_cluster
from gpualloc.placement.problem import PlacementProblem
from gpualloc.placement.run import best
from gpualloc.rl.dqn import DQNConfig
from gpualloc.rl.placer import dqn_planner, load_placer, place_dqn, train_placer
from tests.placement.test_simulate import random_dag


def problems(seeds, cluster="2xA100+2xV100", microbatches=1):
    return [PlacementProblem(random_dag(np.random.default_rng(s), 24), load_cluster(cluster),
                             microbatches=microbatches) for s in seeds]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("agent") / "placer.pt"
    config = DQNConfig(learning_starts=100, buffer_size=2_000, batch_size=16, eps_decay_steps=400, hidden=(32, 32))
    agent, log = train_placer(problems([0, 1]), 600, out, eval_problems=problems([2]), eval_every=300,
                              config=config, max_devices=8)
    return agent, log, out


@pytest.mark.slow
def test_training_writes_a_checkpoint_with_env_settings(trained):
    agent, log, out = trained
    assert out.exists() and len(log.evals) == 2
    loaded = load_placer(out)
    assert loaded.extra["max_devices"] == 8 and loaded.extra["factor"] == 4
    assert loaded.extra["problems"][0].endswith("@2xA100+2xV100/M1")


def test_dqn_is_never_worse_than_best(trained):
    agent, _, _ = trained
    for p in problems([3, 4], microbatches=4):
        outcome = place_dqn(p, agent)
        heuristic = best(p)
        assert outcome.method == "dqn"
        assert outcome.result.step_time_s <= heuristic.result.step_time_s + 1e-12
        assert ("kept best heuristic" in outcome.note) or ("faster than best heuristic" in outcome.note)


def test_dqn_planner_returns_a_valid_plan(trained):
    agent, _, _ = trained
    p = problems([6])[0]
    plan = dqn_planner(agent)(p, np.zeros(p.n, dtype=np.int64))
    assert plan.shape == (p.n,) and plan.max() < p.k


def test_missing_or_foreign_agent(tmp_path):
    with pytest.raises(AgentError, match="no such agent file"):
        load_placer(tmp_path / "nope.pt")


def test_bundled_agent_loads():
    agent = load_placer()
    assert agent.extra["max_devices"] >= 8


def test_place_dqn_cli(tmp_path):
    from tests.cli.test_cli import invoke

    plan = tmp_path / "plan.json"
    out = json.loads(invoke("place", "resnet-tiny", "--cluster", "2xA100+2xV100", "--method", "dqn", "--json",
                            "-o", str(plan)).stdout)
    assert out["method"] == "dqn" and out["feasible"] and "note" in out
    assert json.loads(plan.read_text())["assignment"]
