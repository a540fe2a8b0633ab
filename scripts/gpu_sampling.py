"""The NVML backend's sampling cost and the DCGM-named exporter, on a GPU machine (issue 39; run by gpu-check.sh).

    python scripts/gpu_sampling.py --seconds 5     # JSON: per-sample cost of NvmlTelemetry.sample() and of each
                                                   # NVML call, readings beside nvidia-smi's at the same moment,
                                                   # and a bf16 matmul load's rate with and without sampling
    python scripts/gpu_sampling.py --exporter      # JSON: one scrape of the exporter fed by NVML

Two overheads: wall time per sample on the sampling process (NVML calls are host-side driver queries), against
the 1 ms budget that docs/telemetry.md states; and the GPU work lost while a monitor samples as fast as it can,
from the rate of a matmul loop run beside it (a quiet window, then a sampled one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

from gpualloc.telemetry.nvml import NvmlTelemetry

SMI_FIELDS = "utilization.gpu,memory.used,power.draw,clocks.sm,temperature.gpu"


def _smi() -> list[str]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20, check=False)
    return [x.strip() for x in out.stdout.strip().splitlines()[0].split(",")] if out.stdout.strip() else []


LOAD = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    t0, n = time.time(), 0
    while time.time() - t0 < 0.5:
        a @ a; n += 1
    torch.cuda.synchronize()
    print(time.time(), n / (time.time() - t0), flush=True)
"""
"""A GPU load: bf16 4096-cube matmuls, printing (time, matmuls per second) every half second."""


def per_call(nv, handle, repeats: int = 20) -> dict[str, float]:
    """Median seconds of each NVML query the backend makes, on one device."""
    calls = {"utilization": lambda: nv.nvmlDeviceGetUtilizationRates(handle),
             "memory": lambda: nv.nvmlDeviceGetMemoryInfo(handle),
             "power": lambda: nv.nvmlDeviceGetPowerUsage(handle),
             "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
             "temperature": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
             "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
             "throttle": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
             "compute_processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle),
             "graphics_processes": lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(handle)}
    out = {}
    for name, fn in calls.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            try:
                fn()
            except Exception:  # noqa: BLE001 - an unsupported query is timed as what it costs to fail
                pass
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return out


def sampling(seconds: float) -> dict:
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(3 * seconds + 8)], stdout=subprocess.PIPE, text=True)
    try:
        rates = [tuple(map(float, load.stdout.readline().split())) for _ in range(6)]  # warm, then quiet
        quiet_from = rates[2][0]
        with NvmlTelemetry() as tel:
            tel.sample()  # first call opens handles
            import pynvml

            calls = per_call(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            costs, pairs = [], []
            sampled_from = time.time()
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:  # as fast as it goes: the worst case for the GPU work beside it
                t0 = time.perf_counter()
                records = tel.sample()
                costs.append(time.perf_counter() - t0)
                if len(pairs) < 4 and len(costs) % 50 == 1:  # readings beside nvidia-smi's, at the same moment
                    t1 = time.perf_counter()
                    smi = _smi()
                    r = records[0]
                    pairs.append({"gpualloc": {"utilization": r.utilization, "mem_used_bytes": r.mem_used_bytes,
                                               "power_w": r.power_w, "sm_clock_mhz": r.sm_clock_mhz,
                                               "temperature_c": r.temperature_c},
                                  "nvidia_smi": dict(zip(SMI_FIELDS.split(","), smi, strict=False)),
                                  "nvidia_smi_call_s": time.perf_counter() - t1})
            sampled_to = time.time()
        for line in load.stdout:
            rates.append(tuple(map(float, line.split())))
            if rates[-1][0] > sampled_to + 1:
                break
    finally:
        load.kill()
    quiet = [r for t, r in rates if quiet_from < t <= sampled_from]
    busy = [r for t, r in rates if sampled_from + 0.5 < t <= sampled_to]
    q, b = (statistics.median(x) if x else None for x in (quiet, busy))
    return {"samples": len(costs), "median_sample_s": statistics.median(costs), "max_sample_s": max(costs),
            "p90_sample_s": sorted(costs)[int(0.9 * (len(costs) - 1))], "per_call_s": calls,
            "matmuls_per_s_quiet": q, "matmuls_per_s_sampled": b,
            "work_lost_fraction": (1 - b / q) if q and b else None, "side_by_side": pairs}


def exporter() -> dict:
    from gpualloc.telemetry.exporter import start_exporter

    with NvmlTelemetry() as tel, start_exporter(None, 0) as exp:
        exp.update(tel.sample())
        t0 = time.perf_counter()
        body = urllib.request.urlopen(exp.url, timeout=10).read().decode()  # noqa: S310 - loopback
        scrape_s = time.perf_counter() - t0
    lines = [x for x in body.splitlines() if x.startswith("DCGM_")]
    return {"url_scrape_s": scrape_s, "metrics": sorted({x.split("{")[0].split(" ")[0] for x in lines}),
            "lines": lines[:40]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--exporter", action="store_true")
    args = ap.parse_args()
    print(json.dumps(exporter() if args.exporter else sampling(args.seconds), indent=1, default=str))


if __name__ == "__main__":
    main()
