"""Telemetry overhead: sampling time per device per sample, and Prometheus scrape time.

Targets (issue "Real-time telemetry"): sampling <= 1 ms per device per sample; a scrape of 16 devices
<= 20 ms. Measured:

* ``sim``: the default sim backend (adlro16, 16 GPUs, a synthetic trace under FCFS), and the same on
  gavel108 (108 GPUs) to show the cost per device stays flat;
* ``replay``: a recording of the sim backend played back;
* ``nvml-fake``: the NVML backend over a faked pynvml with 16 devices, i.e. gpualloc's own Python
  cost around the NVML calls, PCIe reads included (on real hardware add the driver's time);
* ``nvml``: real GPUs, when NVML finds any (PCIe off: NVML blocks ~20 ms per PCIe reading);
* scrapes of 16 devices over HTTP on loopback: sampling on each scrape (sim source) and serving
  pushed records (what ``gpualloc monitor --export`` does).

    python benchmarks/telemetry_overhead.py [--samples 500] [--scrapes 200]

Writes benchmarks/results/telemetry_overhead.json and prints a table.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import _args
from gpualloc.telemetry.base import TelemetryError
from gpualloc.telemetry.exporter import start_exporter
from gpualloc.telemetry.nvml import NvmlTelemetry
from gpualloc.telemetry.replay import ReplayTelemetry, record
from gpualloc.scheduling.timeline import sim_backend

OUT = Path(__file__).resolve().parent / "results" / "telemetry_overhead.json"
TARGET_SAMPLE_S = 1e-3
TARGET_SCRAPE_S = 20e-3


def per_device(name: str, source, samples: int) -> dict:
    devices = len(source.devices())
    source.sample()  # warm-up
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        source.sample()
        times.append(time.perf_counter() - t)
    times.sort()
    return {"backend": name, "devices": devices, "samples": samples,
            "median_per_device_s": statistics.median(times) / devices,
            "p95_per_device_s": times[int(0.95 * (len(times) - 1))] / devices,
            "target_s": TARGET_SAMPLE_S}


def scrape_time(name: str, source, pushed, scrapes: int) -> dict:
    with start_exporter(source, 0) as exp:
        if pushed is not None:
            exp.update(pushed)
        urllib.request.urlopen(exp.url, timeout=5).read()
        times, size = [], 0
        for _ in range(scrapes):
            t = time.perf_counter()
            size = len(urllib.request.urlopen(exp.url, timeout=5).read())
            times.append(time.perf_counter() - t)
    times.sort()
    return {"mode": name, "devices": 16, "scrapes": scrapes, "median_s": statistics.median(times),
            "p95_s": times[int(0.95 * (len(times) - 1))], "bytes": size, "target_s": TARGET_SCRAPE_S}


def main() -> None:
    parser = _args.Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=_args.at_least(1), default=500)
    parser.add_argument("--scrapes", type=_args.at_least(1), default=200)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.telemetry import fake_nvml

    rows = [per_device("sim (adlro16)", sim_backend(), args.samples),
            per_device("sim (gavel108)", sim_backend("gavel108", jobs=400), args.samples)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rec.parquet"
        record(sim_backend(), args.samples + 1, path)
        rows.append(per_device("replay", ReplayTelemetry(path), args.samples))
    fake = NvmlTelemetry(nvml=fake_nvml.make([fake_nvml.device(i) for i in range(16)]), pcie=True)
    rows.append(per_device("nvml-fake (16, PCIe on)", fake, args.samples))
    try:
        real = NvmlTelemetry()
    except TelemetryError as err:
        print(f"real NVML skipped: {err}")
    else:
        rows.append(per_device("nvml", real, min(args.samples, 200)))
        real.close()
    scrapes = [scrape_time("sample on scrape (sim)", sim_backend(), None, args.scrapes),
               scrape_time("pushed records", None, sim_backend().sample(), args.scrapes)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"benchmark": "telemetry_overhead", "python": platform.python_version(),
                               "machine": platform.machine(), "sampling": rows, "scrape": scrapes}, indent=2) + "\n")
    print(f"{'backend':<26} {'devices':>7} {'median us/dev':>13} {'p95 us/dev':>10} {'target us':>9}")
    for r in rows:
        print(f"{r['backend']:<26} {r['devices']:>7} {r['median_per_device_s'] * 1e6:>13.2f} "
              f"{r['p95_per_device_s'] * 1e6:>10.2f} {r['target_s'] * 1e6:>9.0f}")
    print(f"{'scrape (16 devices)':<26} {'bytes':>7} {'median ms':>13} {'p95 ms':>10} {'target ms':>9}")
    for r in scrapes:
        print(f"{r['mode']:<26} {r['bytes']:>7} {r['median_s'] * 1e3:>13.2f} {r['p95_s'] * 1e3:>10.2f} "
              f"{r['target_s'] * 1e3:>9.0f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    _args.guarded(main)
