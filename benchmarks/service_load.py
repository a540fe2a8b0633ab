"""Load test of the scheduler service: submissions per second and their latency, on loopback.

Starts ``gpualloc serve`` (local backend, adlro16, a fresh SQLite store in a temporary folder) and
submits ``--requests`` jobs (``sleep 3600`` on 1 GPU: the first 16 start, the rest queue) at a paced,
open-loop rate of ``--rate`` requests/s over ``--connections`` keep-alive HTTP/1.1 connections.
Every submission is an authenticated ``POST /jobs`` answered only once it is committed to the store
(``synchronous=FULL``). Latency is measured from the moment a request was due to its response, so
a client or server that falls behind shows it. Afterwards it checks that the store holds exactly the
acknowledged jobs, cancels the running ones and stops the service.

Targets (issue "The scheduler as a service"): >= 500 requests/s, p99 <= 50 ms, 10,000 jobs.

    python benchmarks/service_load.py [--requests 10000] [--rate 600] [--connections 32]

Writes benchmarks/results/service_load.json (or ``--out``, whose folder is created if missing) and prints
a table. Bounded: it stops after the requests or ``--max-seconds``, whichever comes first.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _args

OUT = Path(__file__).resolve().parent / "results" / "service_load.json"
TARGET_RATE = 500.0
TARGET_P99_S = 0.050


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def p99_by_second(res: dict) -> list[float]:
    """p99 latency of the requests due in each second of the run (where the tail comes from)."""
    by: dict[int, list[float]] = {}
    for sec, lat in zip(res["seconds"], res["latencies"], strict=True):
        by.setdefault(sec, []).append(lat)
    return [percentile(sorted(by[k]), 0.99) for k in sorted(by)]


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:  # None, not NaN: the JSON stays valid
        return None
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    return status, body


async def load(port: int, token: str, requests: int, rate: float, connections: int, max_seconds: float) -> dict:
    """Open-loop paced POST /jobs; returns latencies and statuses."""
    queue: asyncio.Queue = asyncio.Queue()
    latencies: list[float] = []
    seconds: list[int] = []  # the second of the run each request was due in
    service_times: list[float] = []
    statuses: dict[int, int] = {}
    ids: list[int] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.2
    deadline = t0 + max_seconds

    async def producer() -> None:
        for i in range(requests):
            due = t0 + i / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if loop.time() > deadline:
                break
            await queue.put((i, due))
        for _ in range(connections):
            await queue.put(None)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                i, due = item
                body = json.dumps({"name": f"load-{i:05d}", "command": ["sleep", "3600"], "num_gpus": 1,
                                   "work_s": 60.0 + i % 600}).encode()
                req = (f"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
                       f"Content-Type: application/json\r\nIdempotency-Key: load-{i}\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
                sent = loop.time()
                writer.write(req)
                await writer.drain()
                status, payload = await _read_response(reader)
                done = loop.time()
                latencies.append(done - due)
                seconds.append(int(due - t0))
                service_times.append(done - sent)
                statuses[status] = statuses.get(status, 0) + 1
                if status in (200, 201):
                    ids.append(json.loads(payload)["id"])
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(producer(), *(connection() for _ in range(connections)))
    wall = time.perf_counter() - start - 0.2
    return {"latencies": latencies, "seconds": seconds, "service_times": service_times, "statuses": statuses,
            "ids": ids, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=_args.at_least(1), default=10_000)
    ap.add_argument("--rate", type=_args.positive, default=600.0, help="Offered load, requests per second.")
    ap.add_argument("--connections", type=_args.at_least(1), default=32)
    ap.add_argument("--max-seconds", type=_args.positive, default=120.0, help="Stop offering load after this long.")
    ap.add_argument("--out", type=_args.output, default=OUT)
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="gpualloc-load-", dir="/tmp"))
    store = tmp / "state.db"
    port = free_port()
    log = open(tmp / "serve.log", "wb")
    cmd = [sys.executable, "-m", "gpualloc.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--backend", "local", "--store", str(store), "--cluster", "adlro16", "--telemetry", "none",
           "--max-queued", str(args.requests + 100)]
    if os.geteuid() == 0:  # serve refuses to run jobs as root unless told to; the jobs here are `sleep`
        cmd += ["--job-user", "root"]
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    result: dict = {}
    try:
        from gpualloc.service.client import Client

        with Client(f"http://127.0.0.1:{port}") as c:
            c.wait_healthy(60)
        token = (tmp / "state.db.token").read_text().strip()
        res = asyncio.run(load(port, token, args.requests, args.rate, args.connections, args.max_seconds))
        lat = sorted(res["latencies"])
        svc = sorted(res["service_times"])
        ok = sum(n for s, n in res["statuses"].items() if s in (200, 201))
        with Client(f"http://127.0.0.1:{port}", token) as c:
            jobs = c.jobs()
            for j in jobs:
                if j["state"] in ("running", "allocated"):
                    c.cancel(j["id"])
            running_left = [j for j in c.jobs(["running", "allocated"])]
        names = [j["name"] for j in jobs]
        rate = len(lat) / res["wall_s"] if res["wall_s"] > 0 else float("nan")
        result = {
            "requests_offered": args.requests, "rate_offered_per_s": args.rate, "connections": args.connections,
            "requests_done": len(lat), "acknowledged": ok, "statuses": {str(k): v for k, v in res["statuses"].items()},
            "wall_s": res["wall_s"], "rate_achieved_per_s": rate,
            "latency_p50_s": percentile(lat, 0.50), "latency_p90_s": percentile(lat, 0.90),
            "latency_p99_s": percentile(lat, 0.99), "latency_p99_by_second_s": p99_by_second(res),
            "latency_max_s": lat[-1] if lat else None,
            "service_time_p50_s": percentile(svc, 0.50), "service_time_p99_s": percentile(svc, 0.99),
            "jobs_in_store": len(jobs), "duplicates_in_store": len(names) - len(set(names)),
            "acknowledged_ids_all_in_store": set(res["ids"]) <= {j["id"] for j in jobs},
            "running_left_after_cancel": len(running_left),
            "target_rate_per_s": TARGET_RATE, "target_p99_s": TARGET_P99_S,
            "meets_rate": rate >= TARGET_RATE, "meets_p99": bool(lat) and percentile(lat, 0.99) <= TARGET_P99_S,
            "store": "sqlite WAL, synchronous=FULL", "backend": "local", "cluster": "adlro16",
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "cpus": os.cpu_count()},
            "command": "python benchmarks/service_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        }
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=10)
        log.close()
        runs = tmp / "state.db.runs"
        for pid_file in [*runs.glob("*/runner.pid"), *runs.glob("*/program.pid")]:  # no job process outlives it
            try:
                os.killpg(int(json.loads(pid_file.read_text())["pid"]), signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    if not result:
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    def ms(s: float | None) -> str:
        return "-" if s is None else f"{s * 1e3:.1f} ms"

    rows = [("requests (done / acknowledged)", f"{result['requests_done']} / {result['acknowledged']}"),
            ("offered rate", f"{args.rate:.0f} req/s over {args.connections} connections"),
            ("achieved rate", f"{result['rate_achieved_per_s']:.0f} req/s (target >= {TARGET_RATE:.0f})"),
            ("latency p50 / p90", f"{ms(result['latency_p50_s'])} / {ms(result['latency_p90_s'])}"),
            ("latency p99 / max", f"{ms(result['latency_p99_s'])} / {ms(result['latency_max_s'])} "
                                  f"(target p99 <= {ms(TARGET_P99_S)})"),
            ("service time p50 / p99", f"{ms(result['service_time_p50_s'])} / {ms(result['service_time_p99_s'])}"),
            ("jobs in store / duplicates", f"{result['jobs_in_store']} / {result['duplicates_in_store']}"),
            ("meets targets", f"rate {result['meets_rate']}, p99 {result['meets_p99']}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(_args.guarded(main))
