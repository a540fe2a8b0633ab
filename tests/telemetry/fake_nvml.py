"""A stand-in for the ``pynvml`` module: the names NvmlTelemetry calls, backed by plain dicts.

Each device is a dict of raw NVML readings (NVML's units: mW, mJ, KiB/s, percent). A function name
listed in the device's ``"unsupported"`` set raises ``NVMLError_NotSupported`` for that device, as
NVML does on boards without the sensor.
"""

from __future__ import annotations

import types
from collections import Counter
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found"}.get(
            self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9)


def device(index: int = 0, **overrides: Any) -> dict[str, Any]:
    """A healthy A100 under load, in NVML's units."""
    d = {
        "name": "NVIDIA A100-SXM4-80GB", "uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "util_gpu": 87, "util_mem": 41, "mem_total": 80 * 2**30, "mem_used": 30 * 2**30,
        "power_mw": 312_500, "power_limit_mw": 400_000, "energy_mj": 123_456_789, "temp_c": 64,
        "sm_mhz": 1_275, "mem_mhz": 1_593, "max_sm_mhz": 1_410,
        "pcie_kib": {NVML_PCIE_UTIL_TX_BYTES: 2_000, NVML_PCIE_UTIL_RX_BYTES: 500_000},
        "reasons": 0x4 | 0x20, "compute_pids": [101, 102], "graphics_pids": [102],
        "unsupported": set(),
    }
    d.update(overrides)
    return d


def make(devices: list[dict[str, Any]] | None = None, *, init_error: Exception | None = None,
         old_binding: bool = False) -> types.ModuleType:
    """A fake ``pynvml`` module over ``devices``; ``calls`` counts every function called.

    ``old_binding``: names come back as bytes and only the pre-12.x throttle-reason function exists.
    """
    devs = [device(0), device(1)] if devices is None else devices
    mod = types.ModuleType("pynvml")
    calls: Counter[str] = Counter()
    state = {"initialised": False}
    mod.calls = calls
    mod.state = state
    for name, value in (("NVMLError", NVMLError), ("NVMLError_NotSupported", NVMLError_NotSupported),
                        ("NVMLError_DriverNotLoaded", NVMLError_DriverNotLoaded),
                        ("NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU), ("NVML_CLOCK_SM", NVML_CLOCK_SM),
                        ("NVML_CLOCK_MEM", NVML_CLOCK_MEM), ("NVML_PCIE_UTIL_TX_BYTES", NVML_PCIE_UTIL_TX_BYTES),
                        ("NVML_PCIE_UTIL_RX_BYTES", NVML_PCIE_UTIL_RX_BYTES)):
        setattr(mod, name, value)

    def fn(name: str, body):
        def call(*args):
            calls[name] += 1
            if name not in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"):
                if not state["initialised"]:
                    raise NVMLError(1)
                if name in devs[args[0]]["unsupported"]:
                    raise NVMLError_NotSupported()
            return body(*args)

        setattr(mod, name, call)

    def init():
        if init_error is not None:
            raise init_error
        state["initialised"] = True

    def shutdown():
        state["initialised"] = False

    def proc(pid):
        return types.SimpleNamespace(pid=pid, usedGpuMemory=1 << 30)

    fn("nvmlInit", init)
    fn("nvmlShutdown", shutdown)
    fn("nvmlDeviceGetCount", lambda: len(devs))
    fn("nvmlDeviceGetHandleByIndex", lambda i: i)
    fn("nvmlDeviceGetName", lambda h: devs[h]["name"].encode() if old_binding else devs[h]["name"])
    fn("nvmlDeviceGetUUID", lambda h: devs[h]["uuid"].encode() if old_binding else devs[h]["uuid"])
    fn("nvmlDeviceGetMemoryInfo", lambda h: types.SimpleNamespace(
        total=devs[h]["mem_total"], used=devs[h]["mem_used"], free=devs[h]["mem_total"] - devs[h]["mem_used"]))
    fn("nvmlDeviceGetEnforcedPowerLimit", lambda h: devs[h]["power_limit_mw"])
    fn("nvmlDeviceGetUtilizationRates", lambda h: types.SimpleNamespace(gpu=devs[h]["util_gpu"],
                                                                         memory=devs[h]["util_mem"]))
    fn("nvmlDeviceGetPowerUsage", lambda h: devs[h]["power_mw"])
    fn("nvmlDeviceGetTotalEnergyConsumption", lambda h: devs[h]["energy_mj"])
    fn("nvmlDeviceGetTemperature", lambda h, sensor: devs[h]["temp_c"])
    fn("nvmlDeviceGetClockInfo", lambda h, clock: devs[h]["sm_mhz" if clock == NVML_CLOCK_SM else "mem_mhz"])
    fn("nvmlDeviceGetMaxClockInfo", lambda h, clock: devs[h]["max_sm_mhz"])
    fn("nvmlDeviceGetPcieThroughput", lambda h, counter: devs[h]["pcie_kib"][counter])
    fn("nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: devs[h]["reasons"])
    if not old_binding:
        fn("nvmlDeviceGetCurrentClocksEventReasons", lambda h: devs[h]["reasons"])
    fn("nvmlDeviceGetComputeRunningProcesses", lambda h: [proc(p) for p in devs[h]["compute_pids"]])
    fn("nvmlDeviceGetGraphicsRunningProcesses", lambda h: [proc(p) for p in devs[h]["graphics_pids"]])
    return mod
