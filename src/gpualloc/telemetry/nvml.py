"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package): the only module that imports ``pynvml``.

:class:`NvmlTelemetry` reads, per device and per sample, the fields ``nvidia-smi`` and DCGM show:
utilisation (GPU and memory), memory used and total, power, the energy counter, temperature, SM and
memory clocks (and the SM clock over its maximum), throttle reasons, the number of processes, and,
when asked, PCIe throughput. Every field is read on its own; one the device does not support (or
that fails for any NVML reason) becomes None and the others are still read, as in gpustat.

``pynvml`` is imported when a backend is opened, not when this module is: a machine without the
package or without a driver gets one :class:`~gpualloc.telemetry.base.TelemetryError` line, and
everything else in gpualloc keeps working.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from gpualloc._extras import require
from gpualloc.telemetry.base import Backend, DeviceInfo, DeviceRecord, TelemetryError, throttle_names

__all__ = ["NvmlTelemetry", "load_pynvml"]

_KIB = 1024


def load_pynvml() -> ModuleType:
    """Import ``pynvml`` (``nvidia-ml-py``, the ``nvml`` extra); a missing package is a :class:`TelemetryError`."""
    return require("nvml", "pynvml", by="nvml: the telemetry backend", error=TelemetryError)


def _text(value: Any) -> str:
    """NVML strings are ``bytes`` in old bindings and ``str`` in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlTelemetry(Backend):
    """A :class:`~gpualloc.telemetry.base.DeviceTelemetry` over every GPU NVML sees.

    Args:
        nvml: the ``pynvml`` module, or a stand-in with its names (tests pass a fake); default:
            imported now.
        pcie: also read PCIe TX/RX throughput. Off by default: NVML measures it over a 20 ms window
            and blocks for it, twice per device per sample, which alone is 40x the 1 ms budget.
        energy: also read the total-energy counter. Off by default: on an H100 (driver 580.159.04) one
            reading took 3.1 ms, 38x the other queries together (80 us), and made a sample 3.3 ms
            (``scripts/gpu_sampling.py``; docs/telemetry.md). ``energy_j`` is None without it.
        clock: the clock of ``DeviceRecord.time_s`` (default Unix time).

    Raises:
        TelemetryError: ``nvidia-ml-py`` is not installed, NVML cannot start (no driver, no GPU,
            insufficient permissions) or finds no device.
    """

    def __init__(self, *, nvml: ModuleType | Any | None = None, pcie: bool = False, energy: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self._nvml = nv = nvml if nvml is not None else load_pynvml()
        self._error: type[Exception] = nv.NVMLError
        self._pcie = pcie
        self._energy = energy
        self._clock = clock
        try:
            nv.nvmlInit()
        except self._error as err:
            raise TelemetryError(f"nvml: no NVIDIA driver/GPU: {err}") from err
        self._open = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            if count == 0:
                raise TelemetryError("nvml: no NVIDIA GPU found")
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._error as err:
            self.close()
            raise TelemetryError(f"nvml: cannot list the GPUs: {err}") from err
        except TelemetryError:
            self.close()
            raise
        # Newer drivers name throttle reasons "clocks event reasons"; the bits are the same.
        self._reasons_fn = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                            or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        self._info = [self._device_info(i, h) for i, h in enumerate(self._handles)]
        self._max_sm_mhz = [self._read(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM) for h in self._handles]

    # ---------------------------------------------------------------------------------------- reads
    def _read(self, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """``fn(*args)``, or None when the binding lacks ``fn`` or NVML raises (not supported, lost GPU...)."""
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._error:
            return None

    def _device_info(self, index: int, handle: Any) -> DeviceInfo:
        nv = self._nvml
        name = self._read(nv.nvmlDeviceGetName, handle)
        uuid = self._read(nv.nvmlDeviceGetUUID, handle)
        mem = self._read(nv.nvmlDeviceGetMemoryInfo, handle)
        limit_mw = self._read(getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", None), handle)
        return DeviceInfo(index=index, name=_text(name) if name is not None else f"GPU {index}",
                          uuid=_text(uuid) if uuid is not None else None,
                          mem_total_bytes=int(mem.total) if mem is not None else None,
                          power_limit_w=limit_mw / 1000.0 if limit_mw is not None else None)

    def _processes(self, handle: Any) -> int | None:
        nv = self._nvml
        compute = self._read(nv.nvmlDeviceGetComputeRunningProcesses, handle)
        graphics = self._read(nv.nvmlDeviceGetGraphicsRunningProcesses, handle)
        if compute is None and graphics is None:
            return None
        # A process that both computes and draws is listed twice.
        return len({p.pid for p in (compute or [])} | {p.pid for p in (graphics or [])})

    def _record(self, index: int, handle: Any, now: float) -> DeviceRecord:
        nv, read, info = self._nvml, self._read, self._info[index]
        util = read(nv.nvmlDeviceGetUtilizationRates, handle)
        mem = read(nv.nvmlDeviceGetMemoryInfo, handle)
        power_mw = read(nv.nvmlDeviceGetPowerUsage, handle)
        energy_mj = read(nv.nvmlDeviceGetTotalEnergyConsumption, handle) if self._energy else None
        temp = read(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        sm = read(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
        memclk = read(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM)
        reasons = read(self._reasons_fn, handle)
        tx = rx = None
        if self._pcie:  # NVML reports KiB/s
            tx = read(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_TX_BYTES)
            rx = read(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
        max_sm = self._max_sm_mhz[index]
        return DeviceRecord(
            index=index, name=info.name, uuid=info.uuid, time_s=now,
            utilization=util.gpu / 100.0 if util is not None else None,
            mem_utilization=util.memory / 100.0 if util is not None else None,
            mem_used_bytes=int(mem.used) if mem is not None else None,
            mem_total_bytes=int(mem.total) if mem is not None else info.mem_total_bytes,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            energy_j=energy_mj / 1000.0 if energy_mj is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(sm) if sm is not None else None,
            mem_clock_mhz=float(memclk) if memclk is not None else None,
            sm_clock_ratio=sm / max_sm if sm is not None and max_sm else None,
            pcie_tx_bytes_per_s=float(tx * _KIB) if tx is not None else None,
            pcie_rx_bytes_per_s=float(rx * _KIB) if rx is not None else None,
            throttle_reasons=throttle_names(int(reasons)) if reasons is not None else None,
            processes=self._processes(handle),
        )

    # ---------------------------------------------------------------------------------------- interface
    def sample(self) -> list[DeviceRecord]:
        if not self._open:
            raise TelemetryError("nvml: the backend is closed")
        now = self._clock()
        return [self._record(i, h, now) for i, h in enumerate(self._handles)]

    def close(self) -> None:
        if self._open:
            self._open = False
            self._read(self._nvml.nvmlShutdown)
