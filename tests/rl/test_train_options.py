"""``train_scheduler`` settings are one SchedulerTraining value; bad settings are one AgentError line."""

from __future__ import annotations

from dataclasses import fields

import pytest

from gpualloc.errors import AgentError
from gpualloc.rl.train_scheduler import SchedulerTraining, train_scheduler


def test_unknown_setting_is_an_agent_error(tmp_path):
    with pytest.raises(AgentError, match="train_scheduler: .*'stepz'"):
        train_scheduler("2xV100", tmp_path / "a.pt", stepz=10)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"eval_every": 0}, {"actors": 0}])
def test_non_positive_counts_are_refused(tmp_path, bad):
    with pytest.raises(AgentError, match="must be positive"):
        train_scheduler("2xV100", tmp_path / "a.pt", SchedulerTraining(**bad))
    assert not (tmp_path / "a.pt").exists()


def test_every_cli_setting_is_a_field():
    names = {f.name for f in fields(SchedulerTraining)}
    assert {"steps", "seed", "traces", "actors", "round_steps"} <= names  # what `gpualloc train scheduler` passes
