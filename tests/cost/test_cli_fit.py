"""`gpualloc cost fit` fits published data; `gpualloc calibrate` measures this machine (issue 37: names)."""

from __future__ import annotations

from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.errors import GpuallocError

runner = CliRunner()


def test_cost_fit_is_listed_and_the_old_name_is_hidden():
    out = runner.invoke(app, ["cost", "--help"]).output
    assert " fit " in out and "published measurements" in out and " calibrate " not in out
    assert "this machine" in runner.invoke(app, ["--help"]).output


def test_the_old_name_still_runs_and_names_the_new_one(tmp_path):
    result = runner.invoke(app, ["cost", "calibrate", "--data", str(tmp_path / "none"), "-o", str(tmp_path / "c.json")])
    said = result.output + (result.stderr or "")
    assert "is now `gpualloc cost fit`" in said and "measures this machine" in said
    assert isinstance(result.exception, GpuallocError) and not (tmp_path / "c.json").exists()  # main(): exit 2
