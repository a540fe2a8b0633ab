"""The NVML backend against a faked pynvml: units, unsupported fields, missing library or driver."""

from __future__ import annotations

import json
import sys
import time

import pytest
from typer.testing import CliRunner

from gpualloc.cli.monitor import app
from gpualloc.telemetry.backends import open_backend
from gpualloc.telemetry.base import DeviceTelemetry, TelemetryError
from gpualloc.telemetry.nvml import NvmlTelemetry
from tests.telemetry import fake_nvml

ALL_READINGS = ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage",
                "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo",
                "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetPcieThroughput",
                "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses",
                "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
                "nvmlDeviceGetEnforcedPowerLimit")


def test_reads_every_field_in_gpualloc_units():
    fake = fake_nvml.make()
    with NvmlTelemetry(nvml=fake, pcie=True, energy=True, clock=lambda: 1000.0) as tele:
        assert isinstance(tele, DeviceTelemetry)
        info = tele.devices()
        assert [d.index for d in info] == [0, 1]
        assert info[0].name == "NVIDIA A100-SXM4-80GB" and info[0].uuid.startswith("GPU-00000000")
        assert info[0].mem_total_bytes == 80 * 2**30 and info[0].power_limit_w == 400.0
        r = tele.sample()[0]
    assert r.index == 0 and r.time_s == 1000.0
    assert r.utilization == pytest.approx(0.87) and r.mem_utilization == pytest.approx(0.41)
    assert r.mem_used_bytes == 30 * 2**30 and r.mem_total_bytes == 80 * 2**30
    assert r.power_w == pytest.approx(312.5)  # mW -> W
    assert r.energy_j == pytest.approx(123_456.789)  # mJ -> J
    assert r.temperature_c == 64.0
    assert r.sm_clock_mhz == 1275.0 and r.mem_clock_mhz == 1593.0
    assert r.sm_clock_ratio == pytest.approx(1275 / 1410)
    assert r.pcie_tx_bytes_per_s == 2_000 * 1024 and r.pcie_rx_bytes_per_s == 500_000 * 1024  # KiB/s -> B/s
    assert r.throttle_reasons == ("sw_power_cap", "sw_thermal_slowdown")
    assert r.processes == 2  # pid 102 computes and draws: counted once
    assert fake.state["initialised"] is False  # closed by the context manager


def test_unsupported_fields_become_none_and_the_rest_is_read():
    broken = fake_nvml.device(1, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption",
                                              "nvmlDeviceGetTemperature", "nvmlDeviceGetUtilizationRates",
                                              "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetComputeRunningProcesses",
                                              "nvmlDeviceGetGraphicsRunningProcesses",
                                              "nvmlDeviceGetCurrentClocksEventReasons"})
    tele = NvmlTelemetry(nvml=fake_nvml.make([fake_nvml.device(0), broken]))
    ok, r = tele.sample()
    assert ok.power_w is not None and ok.processes == 2
    for field in ("power_w", "energy_j", "temperature_c", "utilization", "mem_utilization", "sm_clock_ratio",
                  "processes", "throttle_reasons", "pcie_tx_bytes_per_s"):
        assert getattr(r, field) is None, field
    assert r.mem_used_bytes == 30 * 2**30 and r.sm_clock_mhz == 1275.0  # still read
    tele.close()


def test_a_device_that_supports_nothing_still_samples():
    nothing = fake_nvml.device(0, unsupported=set(ALL_READINGS))
    tele = NvmlTelemetry(nvml=fake_nvml.make([nothing]), pcie=True)
    (r,) = tele.sample()
    assert r.index == 0 and r.name == "GPU 0" and r.uuid is None and r.time_s is not None
    assert all(v is None for k, v in r.to_dict().items() if k not in ("index", "name", "time_s"))
    assert tele.devices()[0].mem_total_bytes is None
    tele.close()


def test_pcie_is_not_read_unless_asked():
    fake = fake_nvml.make()
    tele = NvmlTelemetry(nvml=fake)
    records = tele.sample()
    assert all(r.pcie_tx_bytes_per_s is None and r.pcie_rx_bytes_per_s is None for r in records)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0  # NVML blocks ~20 ms per call
    tele.close()


def test_energy_is_not_read_unless_asked():
    fake = fake_nvml.make()
    with NvmlTelemetry(nvml=fake) as tele:
        records = tele.sample()
    assert all(r.energy_j is None for r in records)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0  # 3.1 ms a reading on an H100


def test_old_binding_bytes_names_and_throttle_function():
    tele = NvmlTelemetry(nvml=fake_nvml.make(old_binding=True))
    r = tele.sample()[0]
    assert r.name == "NVIDIA A100-SXM4-80GB" and r.uuid.startswith("GPU-")
    assert r.throttle_reasons == ("sw_power_cap", "sw_thermal_slowdown")
    tele.close()


def test_close_is_idempotent_and_sampling_after_close_is_an_error():
    fake = fake_nvml.make()
    tele = NvmlTelemetry(nvml=fake)
    tele.close()
    tele.close()
    assert fake.calls["nvmlShutdown"] == 1
    with pytest.raises(TelemetryError, match="closed"):
        tele.sample()


def test_missing_library_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    with pytest.raises(TelemetryError, match=r"needs the 'nvml' extra: pip install 'gpualloc\[nvml\]'") as err:
        NvmlTelemetry()
    assert "\n" not in str(err.value)
    with pytest.raises(TelemetryError, match="'nvml' extra"):
        open_backend("nvml")


def test_no_driver_is_one_clear_line():
    fake = fake_nvml.make(init_error=fake_nvml.NVMLError_DriverNotLoaded())
    with pytest.raises(TelemetryError) as err:
        NvmlTelemetry(nvml=fake)
    assert str(err.value) == "nvml: no NVIDIA driver/GPU: Driver Not Loaded"


def test_no_gpu_shuts_nvml_down_again():
    fake = fake_nvml.make([])
    with pytest.raises(TelemetryError, match="no NVIDIA GPU found"):
        NvmlTelemetry(nvml=fake)
    assert fake.state["initialised"] is False


def test_registry_imports_pynvml_lazily(monkeypatch):
    fake = fake_nvml.make()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    tele = open_backend("nvml", pcie=True)
    assert [r.pcie_tx_bytes_per_s for r in tele.sample()] == [2_048_000.0, 2_048_000.0]
    tele.close()
    with pytest.raises(TelemetryError, match="unknown telemetry backend 'dcgm'"):
        open_backend("dcgm")


def test_python_overhead_per_device_is_far_below_a_millisecond():
    tele = NvmlTelemetry(nvml=fake_nvml.make([fake_nvml.device(i) for i in range(16)]), pcie=True)
    tele.sample()
    n = 50
    start = time.perf_counter()
    for _ in range(n):
        tele.sample()
    per_device_s = (time.perf_counter() - start) / n / 16
    assert per_device_s < 1e-3
    tele.close()


# ------------------------------------------------------------------------------------------ CLI
runner = CliRunner()


def test_cli_once_json_with_unsupported_fields(monkeypatch):
    broken = fake_nvml.device(1, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"})
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml.make([fake_nvml.device(0), broken]))
    result = runner.invoke(app, ["--backend", "nvml", "--once", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[0]["power_w"] == pytest.approx(312.5) and rows[1]["power_w"] is None
    assert rows[1]["temperature_c"] is None and rows[1]["utilization"] == pytest.approx(0.87)
    assert rows[0]["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]


def test_cli_without_nvml_fails_unless_a_fallback_is_asked_for(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = runner.invoke(app, ["--once", "--json"])  # nvml is the default backend
    assert result.exit_code != 0
    assert isinstance(result.exception, TelemetryError)  # main() prints it as one line, exit 2
    assert "needs the 'nvml' extra" in str(result.exception)

    result = runner.invoke(app, ["--once", "--json", "--fallback", "sim", "--seed", "1"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 16 and rows[0]["name"] == "V100-16GB"
    assert "using --fallback sim" in result.stderr


@pytest.mark.gpu
def test_real_gpu_samples_within_budget():
    with NvmlTelemetry() as tele:
        records = tele.sample()
        assert records and all(r.name and r.mem_total_bytes for r in records)
        n = 20
        start = time.perf_counter()
        for _ in range(n):
            tele.sample()
        assert (time.perf_counter() - start) / n / len(records) < 1e-3
