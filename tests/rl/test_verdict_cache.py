"""The dqn policy's gate verdict is cached with its checkpoint: a failed gate then runs the teacher without
loading the checkpoint (or torch); a changed checkpoint, a passed gate or a corrupt entry reads the file."""

from __future__ import annotations

import shutil

import pytest

from gpualloc.cache import DiskCache
from gpualloc.rl import sched_policy
from gpualloc.rl.dqn.agent import DQNAgent
from gpualloc.rl.sched_policy import (BUNDLED_EXPERT_AGENT, VERDICT_KIND, AgentFallbackWarning, bundled_agent_path,
                                      learned_policy, verdict_key)


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "agent.pt"
    shutil.copy(bundled_agent_path(BUNDLED_EXPERT_AGENT), path)
    return path


@pytest.fixture
def loads(monkeypatch):
    """Checkpoints read during a test."""
    seen = []
    real = DQNAgent.load.__func__

    def spy(cls, path, **kw):
        seen.append(str(path))
        return real(cls, path, **kw)

    monkeypatch.setattr(DQNAgent, "load", classmethod(spy))
    return seen


def _policy(agent_file, cache):
    with pytest.warns(AgentFallbackWarning):
        return learned_policy(agent_file, cache=cache)


def test_a_cached_failed_verdict_runs_the_teacher_without_reading_the_checkpoint(agent_file, tmp_path, loads):
    cache = DiskCache(tmp_path / "cache")
    first = _policy(agent_file, cache)
    assert first.fallback and loads == [str(agent_file)]  # the bundled agent failed its gate
    assert cache.get(VERDICT_KIND, verdict_key(agent_file))["gate"]["passed"] is False
    second = _policy(agent_file, cache)
    assert loads == [str(agent_file)]  # not read again
    assert (second.experts, second.teacher, second.note, second.fallback) == \
        (first.experts, first.teacher, first.note, True)
    assert second.agent is None and second.round_s == first.round_s
    assert second.learned is not None and loads == [str(agent_file)] * 2  # loaded only when asked for


def test_a_changed_checkpoint_misses(agent_file, tmp_path):
    cache = DiskCache(tmp_path / "cache")
    _policy(agent_file, cache)
    before = verdict_key(agent_file)
    agent_file.write_bytes(agent_file.read_bytes() + b"\0")
    assert verdict_key(agent_file) != before
    assert cache.get(VERDICT_KIND, verdict_key(agent_file)) is None


def test_a_passed_or_corrupt_verdict_reads_the_checkpoint(agent_file, tmp_path, loads):
    cache = DiskCache(tmp_path / "cache")
    key = verdict_key(agent_file)
    cache.put(VERDICT_KIND, key, {"format": sched_policy.EXPERT_FORMAT, "experts": ["fcfs"], "teacher": 0,
                                  "gate": {"passed": True}})  # not a verdict GateResult can read
    _policy(agent_file, cache)
    assert loads == [str(agent_file)]
    assert cache.get(VERDICT_KIND, key)["gate"]["passed"] is False  # rewritten from the checkpoint
    passed = dict(cache.get(VERDICT_KIND, key))
    passed["gate"] = {**passed["gate"], "passed": True}
    cache.put(VERDICT_KIND, key, passed)
    _policy(agent_file, cache)  # a passing agent must be loaded to decide (the checkpoint's own verdict fails)
    assert loads == [str(agent_file)] * 2


def test_without_a_cache_nothing_is_written(agent_file, tmp_path, loads):
    _policy(agent_file, None)
    _policy(agent_file, None)
    assert loads == [str(agent_file)] * 2


def test_the_scheduling_table_reads_verdicts_from_the_cache(tmp_path, loads):
    from gpualloc.experiments.scheduling_table import _make, agent_notes

    cache_dir = str(tmp_path / "cache")
    assert agent_notes(["dqn"], None, cache_dir) == agent_notes(["dqn"])  # the note does not depend on it
    calls = len(loads)
    policy = _make("dqn", None, cache_dir)
    assert len(loads) == calls and policy.fallback  # the verdict came from the cache
