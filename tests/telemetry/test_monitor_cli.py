"""``gpualloc monitor``: the live table, sample counts, the default sub-command."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner

from gpualloc.cli.monitor import app
from gpualloc.telemetry.base import TelemetryError

runner = CliRunner()


def test_live_table_shows_every_device_and_stops_after_count():
    result = runner.invoke(app, ["--backend", "sim", "--jobs", "30", "--count", "2", "--interval", "0"])
    assert result.exit_code == 0, result.output
    assert "gpualloc monitor (sim): sample 2" in result.stdout
    for column in ("util", "memory", "power", "temp", "throttle"):
        assert column in result.stdout
    assert "V100-16GB" in result.stdout and "MI50" in result.stdout


def test_json_lines_one_list_per_sample_with_advancing_time():
    result = runner.invoke(app, ["--backend", "sim", "--jobs", "30", "--count", "3", "--interval", "0", "--json",
                                 "--sim-step", "60"])
    assert result.exit_code == 0, result.output
    samples = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(samples) == 3 and all(len(s) == 16 for s in samples)
    assert [s[0]["time_s"] - samples[0][0]["time_s"] for s in samples] == [0.0, 60.0, 120.0]


def test_once_json_has_the_documented_keys():
    result = runner.invoke(app, ["--backend", "sim", "--once", "--json"])
    rows = json.loads(result.stdout)
    assert {"index", "name", "utilization", "mem_used_bytes", "mem_total_bytes", "power_w", "temperature_c",
            "uuid", "energy_j", "sm_clock_mhz", "throttle_reasons", "processes"} <= set(rows[0])
    assert rows[0]["sm_clock_mhz"] is None  # unknown is null, not 0


def test_bare_monitor_runs_the_nvml_monitor(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = runner.invoke(app, [])
    assert isinstance(result.exception, TelemetryError)
    assert str(result.exception).startswith("nvml:")


def test_help_lists_record():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "record" in result.stdout


def test_unknown_backend_is_a_telemetry_error():
    result = runner.invoke(app, ["--backend", "dcgm", "--once"])
    assert isinstance(result.exception, TelemetryError)
    assert "known: nvml, replay, sim" in str(result.exception)
