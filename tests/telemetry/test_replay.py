"""Record to Parquet/CSV and replay: the round trip is exact, None stays None, the end is an end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpualloc.cli.monitor import app
from gpualloc.telemetry.backends import open_backend
from gpualloc.telemetry.base import DeviceRecord, DeviceTelemetry, TelemetryError, TelemetryExhausted
from gpualloc.telemetry.replay import ReplayTelemetry, read_records, record, write_records
from gpualloc.scheduling.timeline import sim_backend

FORMATS = ("parquet", "pq", "csv")


def handmade() -> list[list[DeviceRecord]]:
    """Awkward values: all-None readings, empty vs unknown throttle reasons, commas and quotes in names."""
    full = DeviceRecord(0, 'A100 "SXM4", 80GB', "GPU-1", 1.5, 0.25, 0.125, 3 * 2**30, 80 * 2**30, 312.5, 1e9,
                        64.0, 1410.0, 1593.0, 0.9, 1e6, 2e6, ("sw_power_cap", "hw_slowdown"), 3)
    bare = DeviceRecord(1, "T4")
    idle = DeviceRecord(2, "T4", None, 1.5, 0.0, throttle_reasons=(), processes=0)
    return [[full, bare, idle], [full, bare, idle]]


@pytest.mark.parametrize("ext", FORMATS)
def test_round_trip_keeps_every_value(tmp_path, ext):
    samples = handmade()
    path = tmp_path / f"rec.{ext}"
    assert write_records(samples, path) == 2
    back = read_records(path)
    assert back == samples
    assert back[0][1].throttle_reasons is None and back[0][2].throttle_reasons == ()


@pytest.mark.parametrize("ext", FORMATS)
def test_sim_recording_replays_sample_for_sample(tmp_path, ext):
    path = tmp_path / f"sim.{ext}"
    assert record(sim_backend(jobs=40, seed=2, step_s=120.0), 12, path) == 12
    expected = sim_backend(jobs=40, seed=2, step_s=120.0)
    replay = ReplayTelemetry(path)
    assert isinstance(replay, DeviceTelemetry) and len(replay) == 12
    # A recording holds readings, not the power limit: the devices are known by index, name, UUID, memory.
    assert [(d.index, d.name, d.uuid, d.mem_total_bytes) for d in replay.devices()] == \
        [(d.index, d.name, d.uuid, d.mem_total_bytes) for d in expected.devices()]
    for _ in range(12):
        assert replay.sample() == expected.sample()
    with pytest.raises(TelemetryExhausted, match="end of the recording after 12 samples"):
        replay.sample()


def test_loop_starts_over(tmp_path):
    path = tmp_path / "r.parquet"
    write_records(handmade()[:1] + [[DeviceRecord(0, "x", time_s=9.0)]], path)
    replay = open_backend("replay", path=path, loop=True)
    first, second = replay.sample(), replay.sample()
    assert replay.sample() == first and replay.sample() == second


def test_record_waits_between_samples_and_reports_each(tmp_path):
    waits, seen = [], []
    record(sim_backend(jobs=10), 4, tmp_path / "r.csv", interval_s=5.0, sleep=waits.append,
           on_sample=lambda i, recs: seen.append((i, len(recs))))
    assert len(waits) == 3 and all(0 < w <= 5.0 for w in waits)  # none after the last sample
    assert seen == [(0, 16), (1, 16), (2, 16), (3, 16)]


def test_recording_more_than_one_flush(tmp_path):
    samples = [[DeviceRecord(0, "g", time_s=float(i), processes=i)] for i in range(600)]
    write_records(samples, tmp_path / "long.parquet")
    assert read_records(tmp_path / "long.parquet") == samples


def test_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(TelemetryError, match="unknown recording format '.json'"):
        write_records(handmade(), tmp_path / "r.json")
    with pytest.raises(TelemetryError, match="no such recording"):
        ReplayTelemetry(tmp_path / "missing.parquet")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(TelemetryError, match="not a telemetry recording"):
        ReplayTelemetry(tmp_path / "other.csv")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(TelemetryError, match="cannot read the recording"):
        ReplayTelemetry(tmp_path / "junk.parquet")
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)))
    with pytest.raises(TelemetryError, match=r"binary.csv: not UTF-8 text \(a binary file\?\): byte 128"):
        ReplayTelemetry(tmp_path / "binary.csv")
    write_records([], tmp_path / "empty.csv")
    with pytest.raises(TelemetryError, match="no samples"):
        ReplayTelemetry(tmp_path / "empty.csv")


# ------------------------------------------------------------------------------------------ CLI
runner = CliRunner()


@pytest.mark.parametrize("ext", ("parquet", "csv"))
def test_cli_record_then_replay(tmp_path, ext):
    path = tmp_path / f"rec.{ext}"
    result = runner.invoke(app, ["record", "--backend", "sim", "--jobs", "30", "--samples", "3", "--interval", "0",
                                 "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert "recorded 3 samples x 16 devices" in result.stdout
    first = [r.to_dict() for r in read_records(path)[0]]
    result = runner.invoke(app, ["--backend", "replay", "--file", str(path), "--once", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == first

    # Streaming JSON stops cleanly at the end of the recording: one line per sample.
    result = runner.invoke(app, ["--backend", "replay", "--file", str(path), "--json", "--interval", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3 and json.loads(lines[0]) == first


def test_cli_replay_needs_a_file():
    result = runner.invoke(app, ["--backend", "replay", "--once"])
    assert isinstance(result.exception, TelemetryError)
    assert "--file" in str(result.exception)
