"""``train scheduler``'s settings are one frozen TrainConfig: the CLI's defaults come from it, ``--config``
reads it from TOML (explicit flags override the file), bad settings are one line naming the file and the
field (exit 2), and old checkpoints still load (the checkpoint saving the whole configuration is tested
with a training run in test_expert_choice.py)."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gpualloc.cli.main import app, main
from gpualloc.options import OptionsError
from gpualloc.rl import train_scheduler as ts
from gpualloc.rl.dqn.agent import DQNAgent
from gpualloc.rl.sched_policy import AgentFallbackWarning, bundled_agent_path, learned_policy
from gpualloc.rl.train_config import EXPERT_CONFIG, TRAIN_CLUSTERS, TrainConfig

runner = CliRunner()


@pytest.fixture
def captured(monkeypatch):
    """The TrainConfig the CLI would train with (training itself replaced by a recorder)."""
    seen: list[TrainConfig] = []

    def fake(out, run, **kw):
        seen.append(run)
        return SimpleNamespace(out_path=out, wall_s=0.0, gate=SimpleNamespace(note=lambda: "recorded"))

    monkeypatch.setattr(ts, "train_expert_scheduler", fake)
    return seen


def test_defaults_are_written_once_and_the_cli_reads_them(captured, tmp_path):
    result = runner.invoke(app, ["train", "scheduler", "-o", str(tmp_path / "a.pt")])
    assert result.exit_code == 0, result.output
    assert captured == [TrainConfig()]
    assert TrainConfig().clusters == TRAIN_CLUSTERS and TrainConfig().dqn == EXPERT_CONFIG


def test_a_config_file_is_read_and_explicit_flags_override_it(captured, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('experts = ["srtf", "sjf"]\nsteps = 10\nseed = 4\nrollout_horizon_s = 3600.0\n'
                   '[dqn]\nlr = 0.001\n')
    result = runner.invoke(app, ["train", "scheduler", "--config", str(cfg), "--seed", "7", "--rollout-follow-h", "2",
                                 "-o", str(tmp_path / "a.pt")])
    assert result.exit_code == 0, result.output
    run = captured[0]
    assert (run.experts, run.steps, run.seed, run.rollout_horizon_s) == (("srtf", "sjf"), 10, 7, 3600.0)
    assert run.rollout_follow_s == 7200.0
    # a [dqn] table changes only the keys it names: the rest stay the expert-choice agent's
    assert run.dqn == dataclasses.replace(EXPERT_CONFIG, lr=0.001)


@pytest.mark.parametrize(("text", "message"), [
    ("stepz = 3\n", "run.toml:1: stepz: unknown key (did you mean 'steps'?)"),
    ('experts = ["srtf"]\nguide = "nope"\n', "run.toml:2: guide: expected 'teacher' or 'best'"),
    ("steps = -1\n", "run.toml:1: steps: expected a number in 0..100,000,000"),
    ('experts = ["srtf", "psychic"]\n', "run.toml:1: experts: 'psychic' is not an expert"),
    ('seed = "one"\n', "run.toml:1: seed"),
])
def test_a_bad_config_file_is_one_line_naming_the_file_and_field(tmp_path, capsys, monkeypatch, text, message):
    cfg = tmp_path / "run.toml"
    cfg.write_text(text)
    monkeypatch.setattr(sys, "argv", ["gpualloc", "train", "scheduler", "--config", str(cfg),
                                      "-o", str(tmp_path / "a.pt")])
    with pytest.raises(SystemExit) as exc:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "a.pt").exists()


def test_unknown_settings_and_bad_values_in_python_are_options_errors(tmp_path):
    with pytest.raises(OptionsError, match="no field 'stepz'"):
        ts.train_expert_scheduler(tmp_path / "a.pt", stepz=10)
    with pytest.raises(OptionsError, match="bc_rounds"):
        TrainConfig(bc_rounds=0)
    with pytest.raises(OptionsError, match="num_jobs"):
        TrainConfig(num_jobs=(10, 5))


BUNDLED = sorted(p.name for p in bundled_agent_path().parent.glob("sched-*.pt"))


def test_every_bundled_scheduling_agent_is_an_expert_choice_one():
    assert bundled_agent_path().name == "sched-experts.pt" and "sched-experts-hd.pt" in BUNDLED
    assert not [name for name in BUNDLED if not name.startswith("sched-experts")]  # no per-slot agent ships


@pytest.mark.parametrize("name", BUNDLED)
def test_old_bundled_checkpoints_still_load(name):
    path = bundled_agent_path(name)
    extra = DQNAgent.load(path).extra
    assert "config" not in extra  # written before issue 37: the hand-copied keys
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AgentFallbackWarning)  # they fail their gates (docs/scheduling-agent.md)
        policy = learned_policy(path)
    assert policy.experts == tuple(extra["experts"]) and policy.knowledge == extra.get("knowledge", "oracle")
    assert (policy.encoder is not None) == bool(extra.get("hd"))
