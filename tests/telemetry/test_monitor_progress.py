"""``gpualloc monitor record`` shows its progress on stderr (samples done of total, elapsed)."""

from __future__ import annotations

import io

from rich.console import Console
from typer.testing import CliRunner

import gpualloc.cli.common as common
from gpualloc.cli.monitor import app

runner = CliRunner()


def test_record_shows_samples_done_on_a_terminal_and_keeps_stdout_for_its_summary(tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=screen, force_terminal=True, width=120))
    out = tmp_path / "rec.csv"
    result = runner.invoke(app, ["record", "-o", str(out), "--backend", "sim", "--jobs", "20", "--samples", "4",
                                 "--interval", "0"])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    drawn = screen.getvalue()
    assert "recording sim to rec.csv" in drawn and "4/4" in drawn
    assert "recording" not in result.stdout and "recorded 4 samples" in result.stdout


def test_record_draws_nothing_when_stderr_is_not_a_terminal(tmp_path):
    result = runner.invoke(app, ["record", "-o", str(tmp_path / "rec.csv"), "--backend", "sim", "--jobs", "20",
                                 "--samples", "2", "--interval", "0"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
