"""The Prometheus exporter scraped over HTTP on loopback: DCGM names, labels, units, speed."""

from __future__ import annotations

import re
import statistics
import time
import urllib.error
import urllib.request

import prometheus_client
import pytest
from typer.testing import CliRunner

from gpualloc.cli.monitor import app
from gpualloc.telemetry.base import DeviceRecord
from gpualloc.telemetry.exporter import LABELS, METRICS, DcgmCollector, start_exporter
from gpualloc.scheduling.timeline import sim_backend

LINE = re.compile(r'^(?P<name>[A-Z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
MIB = 2**20


def scrape(url: str) -> tuple[dict[tuple[str, str], float], dict[str, dict[str, str]], str]:
    """``{(metric, gpu): value}``, the labels of each GPU, and the raw text."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    values, labels = {}, {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, line
        lab = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"]))
        values[(m["name"], lab["gpu"])] = float(m["value"])
        labels[lab["gpu"]] = lab
    return values, labels, text


def record(index: int, **readings) -> DeviceRecord:
    return DeviceRecord(index, "NVIDIA A100-SXM4-80GB", f"GPU-{index}", 0.0, **readings)


def test_scrape_has_dcgm_names_labels_and_units():
    source = sim_backend(jobs=40, seed=4, noise=0.0)
    expected = sim_backend(jobs=40, seed=4, noise=0.0).sample()  # what the first scrape will sample
    with start_exporter(source, 0, hostname="node-a") as exp:
        assert exp.address == "127.0.0.1" and exp.port > 0
        values, labels, text = scrape(exp.url)
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    assert set(labels) == {str(i) for i in range(16)}
    assert labels["3"] == {"gpu": "3", "UUID": expected[3].uuid, "device": "nvidia3", "modelName": "V100-16GB",
                           "Hostname": "node-a"}
    for r in expected:
        g = str(r.index)
        assert values[("DCGM_FI_DEV_GPU_UTIL", g)] == pytest.approx(100 * r.utilization)
        assert values[("DCGM_FI_DEV_MEM_COPY_UTIL", g)] == pytest.approx(100 * r.mem_utilization)
        assert values[("DCGM_FI_DEV_FB_USED", g)] == pytest.approx(r.mem_used_bytes / MIB)
        assert values[("DCGM_FI_DEV_FB_FREE", g)] == pytest.approx((r.mem_total_bytes - r.mem_used_bytes) / MIB)
        assert values[("DCGM_FI_DEV_POWER_USAGE", g)] == pytest.approx(r.power_w)
        assert values[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", g)] == pytest.approx(1000 * r.energy_j)
        assert values[("DCGM_FI_DEV_GPU_TEMP", g)] == pytest.approx(r.temperature_c)
        assert values[("DCGM_FI_PROF_PCIE_TX_BYTES", g)] == pytest.approx(r.pcie_tx_bytes_per_s)
        assert values[("DCGM_FI_PROF_PCIE_RX_BYTES", g)] == pytest.approx(r.pcie_rx_bytes_per_s)
        assert values[("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", g)] == (1.0 if r.utilization == 0 else 0.0)
    # The simulator knows no clock frequencies: those metrics are absent, not 0.
    assert "DCGM_FI_DEV_SM_CLOCK" not in text and "DCGM_FI_DEV_MEM_CLOCK" not in text


def test_unknown_readings_are_left_out_not_zero():
    collector = DcgmCollector(hostname="h")
    collector.update([record(0, power_w=None, utilization=0.5, sm_clock_mhz=1410.0),
                      record(1, power_w=250.0, utilization=None, throttle_reasons=("hw_slowdown",))])
    text = collector.scrape().decode()
    assert 'DCGM_FI_DEV_POWER_USAGE{' in text and 'gpu="0"' not in _lines(text, "DCGM_FI_DEV_POWER_USAGE")
    assert 'gpu="1"' not in _lines(text, "DCGM_FI_DEV_GPU_UTIL")
    assert _lines(text, "DCGM_FI_DEV_SM_CLOCK").count("\n") == 0 and "1410.0" in _lines(text, "DCGM_FI_DEV_SM_CLOCK")
    assert "8.0" in _lines(text, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")  # hw_slowdown = 0x8
    assert "DCGM_FI_DEV_FB_USED" not in text and "DCGM_FI_DEV_GPU_TEMP" not in text  # no reading at all


def _lines(text: str, name: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith(name + "{"))


def test_pushed_records_are_served_and_the_default_registry_is_untouched():
    with start_exporter(None, 0) as exp:
        values, _, _ = scrape(exp.url)
        assert values == {}
        exp.update([record(0, utilization=0.25, power_w=100.0)])
        values, labels, _ = scrape(exp.url)
        assert values == {("DCGM_FI_DEV_GPU_UTIL", "0"): 25.0, ("DCGM_FI_DEV_POWER_USAGE", "0"): 100.0}
        assert set(labels["0"]) == set(LABELS)
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "DCGM_" not in default


def test_close_stops_the_server():
    exp = start_exporter(None, 0)
    url = exp.url
    exp.close()
    exp.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=1)


def test_scrape_of_16_devices_takes_under_20_ms():
    with start_exporter(sim_backend(), 0) as exp:
        scrape(exp.url)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            scrape(exp.url)
            times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.020


def test_every_metric_is_a_documented_dcgm_field():
    names = [m.name for m in METRICS]
    assert len(set(names)) == len(names)
    assert all(n.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")) for n in names)


def test_cli_export_flag(tmp_path):
    result = CliRunner().invoke(app, ["--backend", "sim", "--jobs", "20", "--once", "--json",
                                      "--export", "127.0.0.1:0"])
    assert result.exit_code == 0, result.output
    assert re.search(r"exporting DCGM metrics at http://127\.0\.0\.1:\d+/metrics", result.stderr)
    result = CliRunner().invoke(app, ["--backend", "sim", "--once", "--export", "nope"])
    assert result.exit_code == 2 and "--export" in result.output
