"""How long the ``gpualloc`` command takes to answer, as a user runs it: each command in a fresh process.

Cases (issue 35, "respect the user's time"):

* ``help``, ``version``: ``gpualloc --help`` and ``gpualloc --version`` (target <= 0.5 s);
* ``jobs``: ``gpualloc jobs`` against a running service (``gpualloc serve``, a fresh store in the temporary
  folder, started once before the runs), its token from ``--token-file`` (target <= 0.5 s);
  ``jobs-refused``: the same where nothing listens, to its one-line "no service answers" error, exit status 2
  (it includes the client's retry window for a service still starting, ``CONNECT_RETRY_S``);
* ``place-evaluate``: ``gpualloc place evaluate resnet50 --cluster hetero8 --plan P`` with ResNet-50's
  traced graph in the cache (target <= 2 s); ``place-evaluate-no-cache`` the same with ``--no-cache``
  (the trace every call used to pay; one run, skipped with ``--quick``);
* ``simulate-dqn``: ``gpualloc simulate --generate 8 --policy dqn --json`` with the bundled agent's gate
  verdict cached (the failed gate runs its teacher without loading torch).

The cache is a fresh temporary folder (``GPUALLOC_CACHE_DIR``), warmed by one untimed run of each cached
case (``place resnet50 --method ddp -o P`` writes the plan and caches the graph). Each case runs
``--runs`` times; the table shows the median and the fastest wall time, and the median CPU time of the
process (user + system: the steadier figure on a shared machine).

    python benchmarks/cli_startup.py [--runs 5] [--quick] [--out FILE]

Writes benchmarks/results/cli_startup.json (or ``--out``) and prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _args
from gpualloc.service.client import CONNECT_RETRY_S, Client

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "cli_startup.json"
GPUALLOC = Path(sys.executable).parent / "gpualloc"
TARGETS_S = {"help": 0.5, "version": 0.5, "jobs": 0.5, "place-evaluate": 2.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(argv: list[str], env: dict[str, str], expect: int) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the child) of one run; its exit status must be ``expect``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expect:
        raise SystemExit(f"cli_startup.py: {' '.join(argv[1:])}: exit status {proc.returncode}, expected {expect}: "
                         f"{proc.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=_args.at_least(1), default=5, help="Timed runs of each case.")
    ap.add_argument("--quick", action="store_true", help="Skip the uncached place evaluate (a trace, ~20 s).")
    ap.add_argument("--out", type=_args.output, default=OUT)
    args = ap.parse_args(argv)

    g = str(GPUALLOC)
    with tempfile.TemporaryDirectory(prefix="gpualloc-startup-") as tmp:
        env = {**os.environ, "GPUALLOC_CACHE_DIR": str(Path(tmp) / "cache"), "COLUMNS": "200"}
        env.pop("GPUALLOC_NO_CACHE", None)
        plan = str(Path(tmp) / "plan.json")
        refused = f"http://127.0.0.1:{free_port()}"
        port = free_port()
        server = f"http://127.0.0.1:{port}"
        store = Path(tmp) / "service" / "state.db"
        store.parent.mkdir(mode=0o700)
        serve = [g, "serve", "--port", str(port), "--store", str(store), "--telemetry", "none"]
        if os.geteuid() == 0:  # serve refuses to run jobs as root unless told to (and no job runs here)
            serve += ["--job-user", "root"]
        service = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        evaluate = ["place", "evaluate", "resnet50", "--cluster", "hetero8", "--plan", plan]
        # (name, argv, expected exit status, warm-up run or None, runs)
        cases = [
            ("help", [g, "--help"], 0, None, args.runs),
            ("version", [g, "--version"], 0, None, args.runs),
            ("jobs", [g, "jobs", "--server", server, "--token-file", f"{store}.token"], 0, None, args.runs),
            ("jobs-refused", [g, "jobs", "--server", refused], 2, None, args.runs),
            ("place-evaluate", [g, *evaluate], 0,
             [g, "place", "resnet50", "--cluster", "hetero8", "--method", "ddp", "-o", plan], args.runs),
            ("simulate-dqn", [g, "simulate", "--generate", "8", "--policy", "dqn", "--json"], 0,
             [g, "simulate", "--generate", "8", "--policy", "dqn", "--json"], args.runs),
        ]
        if not args.quick:
            cases.append(("place-evaluate-no-cache", [g, "--no-cache", *evaluate], 0, None, 1))
        rows = []
        try:
            with Client(server) as client:
                client.wait_healthy(60)
            for name, cmd, expect, warm, runs in cases:
                if warm is not None:
                    timed(warm, env, 0)
                samples = [timed(cmd, env, expect) for _ in range(runs)]
                walls, cpus = [w for w, _ in samples], [c for _, c in samples]
                median = statistics.median(walls)
                rows.append({"case": name, "command": " ".join(["gpualloc", *cmd[1:]]).replace(tmp, "$TMP"),
                             "runs": runs, "wall_median_s": median, "wall_min_s": min(walls), "walls_s": walls,
                             "cpu_median_s": statistics.median(cpus), "target_s": TARGETS_S.get(name),
                             "meets_target": None if name not in TARGETS_S else median <= TARGETS_S[name]})
        finally:
            service.terminate()
            try:
                service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait(timeout=10)
    load = os.getloadavg()[0]
    result = {"benchmark": "cli_startup", "python": platform.python_version(), "machine": platform.machine(),
              "cpus": os.cpu_count(), "load_average_1min": load, "client_connect_retry_s": CONNECT_RETRY_S,
              "command": "python benchmarks/cli_startup.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    print(f"{'case':<26} {'median':>8} {'fastest':>8} {'cpu':>8} {'target':>8}  meets")
    for r in rows:
        target = "-" if r["target_s"] is None else f"{r['target_s']:.1f} s"
        meets = "-" if r["meets_target"] is None else ("yes" if r["meets_target"] else "NO")
        print(f"{r['case']:<26} {r['wall_median_s']:>6.2f} s {r['wall_min_s']:>6.2f} s {r['cpu_median_s']:>6.2f} s "
              f"{target:>8}  {meets}")
    print(f"(load average {load:.1f} on {os.cpu_count()} CPUs) wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_args.guarded(main))
