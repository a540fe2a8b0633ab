"""Jobs through ``gpualloc serve --backend slurm`` on a fake Slurm cluster: exactly once, on the chosen
GRES type, no GPU shared, and the decision-to-sbatch latency.

Starts the fake cluster of ``scripts/slurm/fake-cluster.sh`` (``n0`` with ``Gres=gpu:v100:4,gpu:t4:2``,
``n1`` with ``Gres=gpu:v100:2,gpu:t4:2``) in a temporary folder, or uses the one ``--slurm-conf`` names, then
``gpualloc serve --backend slurm --cluster slurm:`` (fcfs) on a fresh store, and submits ``--jobs``
short jobs (``sleep --sleep``; 1 or 2 GPUs; V100, T4 or any type, so the policy picks the type for a
third of them) one after another, each retried with its idempotency key until acknowledged. With
``--kill9`` the service is killed with SIGKILL after a third of the submissions and restarted on the
same store while the client keeps retrying.

Checks, from Slurm's records (``squeue --states=all`` and ``scontrol show job -d``, which keep ended
jobs for ``MinJobAge``; the fake cluster has no slurmdbd, so no ``sacct``) against the store:

* every acknowledged job is in the store once, finished, in one attempt, and Slurm has exactly one
  job of that attempt's name;
* Slurm's ``--gres`` and nodes of each job are those of the GPUs the store recorded for it (type,
  count per node; a gang over nodes with unequal counts is a heterogeneous job);
* no two jobs hold one GPU at once: per GPU (node, index) Slurm bound (``IDX``, which each job prints from
  ``scontrol`` while it runs: Slurm drops it from the record when the job ends), Slurm's start/end
  intervals are disjoint (whole seconds; an end at t before a start at t), and so are the store's
  allocation intervals (exact times).

Latency: from the store's ``allocated`` event (the decision committed) to ``sbatch`` returning the job
id (``slurm_job.json`` in the run folder); also the ``sbatch`` call alone.

    python benchmarks/slurm_load.py [--jobs 200] [--sleep 0.2] [--kill9]

Writes benchmarks/results/slurm_load.json (``slurm_load_kill9.json`` with ``--kill9``; or ``--out``, whose
folder is created if missing) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

import _args

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT = REPO / "scripts" / "slurm" / "fake-cluster.sh"
END_EVENTS = {"finished", "failed", "cancelled", "requeued"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


class Serve:
    """``gpualloc serve --backend slurm`` in a subprocess."""

    def __init__(self, tmp: Path) -> None:
        self.store, self.port, self.log = tmp / "state.db", free_port(), tmp / "serve.log"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        from gpualloc.service.client import Client

        cmd = [sys.executable, "-m", "gpualloc.cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend", "slurm", "--cluster", "slurm:", "--store", str(self.store), "--telemetry", "none",
               "--tick", "0.05", "--policy", "fcfs"]
        if os.geteuid() == 0:  # serve refuses to run jobs as root unless told to (sbatch runs them as the service)
            cmd += ["--job-user", "root"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        with Client(self.url) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise SystemExit(f"gpualloc serve exited:\n{self.log.read_text()[-2000:]}")
                try:
                    if c.health().get("status") == "ok":
                        return
                except Exception:
                    pass
                time.sleep(0.1)
        raise SystemExit("gpualloc serve did not become healthy")

    @property
    def token(self) -> str:
        return self.store.with_name(self.store.name + ".token").read_text().strip()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


def submit_stream(srv: Serve, n: int, sleep_s: float, acked: dict[str, int], errors: list[str]) -> None:
    from gpualloc.service.client import Client, ClientError

    with Client(srv.url, srv.token, timeout_s=5) as c:
        for i in range(n):
            # the job prints Slurm's record of itself while it runs: the GPU indices Slurm bound (IDX)
            # are gone from Slurm's record once the job ends
            spec = {"name": f"j{i:04d}", "num_gpus": 1 + (i // 3) % 2, "work_s": 10.0,
                    "command": ["sh", "-c", 'scontrol --details --oneliner show job "$SLURM_JOB_ID"; sleep "$0"',
                                str(sleep_s)]}
            kind = i % 3
            if kind:
                spec["device_type"] = "V100" if kind == 1 else "T4"
            try:
                acked[spec["name"]] = c.submit(spec, retry_s=120)["id"]
            except ClientError as err:
                errors.append(f"{spec['name']}: {err}")
                return


def _slurm_time(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def expand_hostlist(text: str) -> list[str]:
    """``"n[0-1,3]"`` -> ``["n0", "n1", "n3"]``; ``"n0"`` -> ``["n0"]``."""
    m = re.fullmatch(r"([^\[]*)\[([0-9,\-]+)\]", text)
    if m is None:
        return [text]
    out = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        out += [f"{m.group(1)}{i}" for i in range(int(lo), int(hi or lo) + 1)]
    return out


def slurm_records(prefix: str, runs: Path) -> list[dict]:
    """Slurm's record of each job of this store (a heterogeneous job's components merged): id, name,
    state, GRES, nodes, start and end (``scontrol``), and the ``(node, GPU index)`` pairs Slurm bound
    (from the job's own ``scontrol --details`` output in its run folder)."""
    from gpualloc.service.slurm import SQUEUE_FORMAT, merge_components, parse_scontrol_record, parse_squeue

    out = subprocess.run(["squeue", "--me", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    parts: dict[str, list] = defaultdict(list)
    for job in parse_squeue(out):
        if job.name.startswith(prefix):
            parts[job.job_id.split("+")[0]].append(job)
    records = []
    for comps in parts.values():
        job = merge_components(comps)
        detail = subprocess.run(["scontrol", "--oneliner", "show", "job", job.job_id],
                                capture_output=True, text=True, timeout=30).stdout.splitlines()
        fields = parse_scontrol_record(detail[0] if detail else "")
        _, _, job_no, attempt = job.name.rsplit("-", 3)
        try:
            own = (runs / f"{job_no}-{attempt}" / "stdout.log").read_text()
        except OSError:
            own = ""
        gpus = []
        for nodes, idx in re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=\S*?\(IDX:([0-9,\-]+)\)", own):
            for node in expand_hostlist(nodes):
                for part in idx.split(","):
                    lo, _, hi = part.partition("-")
                    gpus += [(node, i) for i in range(int(lo), int(hi or lo) + 1)]
        records.append({"job_id": job.job_id, "name": job.name, "state": job.state, "gres": job.gres,
                        "nodes": job.nodes, "gpus": gpus, "start": _slurm_time(fields.get("StartTime", "")),
                        "end": _slurm_time(fields.get("EndTime", ""))})
    return records


def expected_gres(cluster, device_type: str, gpus) -> tuple[str, str]:
    """``(GRES, nodes)`` Slurm should show for GPUs ``gpus`` of the cluster: one ``--gres`` when every
    node has the same count, else one component per node (``;``-joined)."""
    per_node = Counter(cluster.nodes[cluster.devices[g].node].name for g in gpus)
    gtype = "t4" if device_type == "T4" else "v100"
    nodes = sorted(per_node)
    if len(set(per_node.values())) == 1:
        hostlist = nodes[0] if len(nodes) == 1 else f"n[{nodes[0][1:]}-{nodes[-1][1:]}]"  # 2 nodes: n[0-1]
        return f"gres:gpu:{gtype}:{per_node[nodes[0]]}", hostlist
    return ";".join(f"gres:gpu:{gtype}:{per_node[n]}" for n in nodes), ";".join(nodes)


def disjoint(spans: dict, what: str) -> list[str]:
    """Per key, intervals ``(start, end, label)`` must not overlap (an end at t before a start at t)."""
    problems = []
    for key, items in spans.items():
        items = sorted(items, key=lambda s: (s[0], s[1]))
        for (a0, a1, la), (b0, _b1, lb) in zip(items, items[1:], strict=False):
            if b0 < a1:
                problems.append(f"{what} {key}: {la} [{a0}, {a1}) and {lb} from {b0}")
    return problems


def check(srv: Serve, acked: dict[str, int]) -> dict:
    from gpualloc.service.store import Store

    store = Store(str(srv.store))
    try:
        jobs, events = store.list_jobs(None, limit=100_000), store.events()
    finally:
        store.close()
    recs = {j.name: j for j in jobs}
    names = Counter(j.name for j in jobs)
    uid = next((j.handle.split("-")[1] for j in jobs if j.handle), None)
    prefix = f"gpualloc-{uid}-" if uid else "gpualloc-"
    runs = srv.store.with_name(srv.store.name + ".runs")
    slurm = slurm_records(prefix, runs)
    by_name = Counter(r["name"] for r in slurm)
    slurm_of = {r["name"]: r for r in slurm}
    problems = [f"{n} in the store {k} times" for n, k in names.items() if k > 1]
    problems += [f"{n} acknowledged but not in the store" for n in acked if n not in recs]
    problems += [f"{j.name}: {j.state.value}, {j.attempts} attempts" for j in jobs
                 if j.state.value != "finished" or j.attempts != 1]
    problems += [f"Slurm job {n} submitted {k} times" for n, k in by_name.items() if k > 1]
    # a job that ended while the service was down, before its start was recorded, has no handle in
    # the store (the scheduler's recovery, for every backend); its Slurm name is the same
    handle = {j.name: j.handle or f"{prefix}{j.id}-{j.attempts}" for j in jobs}
    problems += [f"{j.name}: no Slurm job {handle[j.name]}" for j in jobs if handle[j.name] not in slurm_of]
    from gpualloc.hardware.cluster import load_cluster

    cluster = load_cluster("slurm:")
    wrong_type = []
    for j in jobs:
        r = slurm_of.get(handle[j.name])
        want = expected_gres(cluster, j.device_type, j.gpus)
        if r is not None and ((r["gres"], r["nodes"]) != want or r["state"] != "COMPLETED"):
            wrong_type.append(f"{j.name}: Slurm {r['gres']} on {r['nodes']} {r['state']}, store {want}")
    slurm_spans: dict[tuple[str, int], list] = defaultdict(list)
    for r in slurm:
        for g in r["gpus"]:
            slurm_spans[g].append((r["start"], r["end"], r["name"]))
    opened: dict[tuple[int, int], tuple[float, list[int]]] = {}
    store_spans: dict[int, list] = defaultdict(list)
    allocated_at: dict[tuple[int, int], float] = {}
    for e in events:
        key = (e["job_id"], e["detail"].get("attempt"))
        if e["kind"] == "allocated":
            opened[key] = (e["at"], e["detail"]["gpus"])
            allocated_at[key] = e["at"]
        elif e["kind"] in END_EVENTS and key in opened:
            start, gpus = opened.pop(key)
            for g in gpus:
                store_spans[g].append((start, e["at"], e["job_id"]))
    overlap = disjoint(slurm_spans, "Slurm GPU") + disjoint(store_spans, "store GPU")
    decision, sbatch = [], []
    for j in jobs:
        try:
            sj = json.loads((runs / f"{j.id}-{j.attempts}" / "slurm_job.json").read_text())
        except (OSError, ValueError):
            continue
        decision.append(sj["submitted_at"] - allocated_at[(j.id, j.attempts)])
        sbatch.append(sj["submitted_at"] - sj["sbatch_called_at"])
    decision.sort()
    sbatch.sort()
    return {"jobs_in_store": len(jobs), "slurm_jobs": len(slurm), "acknowledged": len(acked),
            "exactly_once": not problems, "exactly_once_problems": problems[:20],
            "on_chosen_gres_type": not wrong_type, "gres_problems": wrong_type[:20],
            "gpus_with_slurm_idx": len(slurm_spans), "no_gpu_overlap": not overlap, "overlap_problems": overlap[:20],
            "types_chosen": dict(Counter(j.device_type for j in jobs)),
            "multi_node_slurm_jobs": sum(1 for r in slurm if "[" in r["nodes"] or ";" in r["nodes"]),
            "heterogeneous_slurm_jobs": sum(1 for r in slurm if ";" in r["nodes"]),
            "decision_to_sbatch_s": {"p50": percentile(decision, 0.5), "p99": percentile(decision, 0.99),
                                     "max": decision[-1] if decision else None, "n": len(decision)},
            "sbatch_call_s": {"p50": percentile(sbatch, 0.5), "p99": percentile(sbatch, 0.99)}}


def start_cluster(tmp: Path) -> Path:
    d = tmp / "slurm"
    done = subprocess.run(["bash", str(SCRIPT), "start", str(d)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"fake Slurm cluster did not start: {done.stderr.strip()[-1000:]}")
    return d


def run(args: argparse.Namespace, tmp: Path) -> dict:
    srv = Serve(tmp)
    srv.start()
    acked: dict[str, int] = {}
    errors: list[str] = []
    t0 = time.monotonic()
    worker = threading.Thread(target=submit_stream, args=(srv, args.jobs, args.sleep, acked, errors))
    worker.start()
    killed_at = None
    try:
        if args.kill9:
            while len(acked) < args.jobs // 3 and worker.is_alive():
                time.sleep(0.05)
            srv.kill9()
            killed_at = len(acked)
            time.sleep(1.0)
            srv.start()
        worker.join(timeout=args.max_seconds)
        from gpualloc.service.client import Client

        with Client(srv.url, srv.token) as c:
            deadline = time.monotonic() + args.max_seconds
            while time.monotonic() < deadline:
                if all(j["state"] in ("finished", "failed", "cancelled") for j in c.jobs()):
                    break
                time.sleep(0.5)
        wall = time.monotonic() - t0
        result = check(srv, acked)
    finally:
        srv.stop()
    return {**result, "errors": errors, "killed_after_acks": killed_at, "wall_s": round(wall, 1),
            "jobs_per_s": round(len(acked) / wall, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = _args.Parser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=_args.at_least(1), default=200)
    ap.add_argument("--sleep", type=_args.non_negative, default=0.2, help="Seconds each job sleeps.")
    ap.add_argument("--kill9", action="store_true", help="SIGKILL the service after a third of the submissions.")
    ap.add_argument("--slurm-conf", type=_args.existing_file, default=None,
                    help="Use this Slurm instead of a fake cluster.")
    ap.add_argument("--max-seconds", type=_args.positive, default=600.0)
    ap.add_argument("--out", type=_args.output, default=None)
    args = ap.parse_args(argv)
    out = args.out or RESULTS / ("slurm_load_kill9.json" if args.kill9 else "slurm_load.json")
    with tempfile.TemporaryDirectory(prefix="gslurm-") as tmp_name:
        tmp = Path(tmp_name)
        cluster = None
        if args.slurm_conf is not None:
            os.environ["SLURM_CONF"] = str(args.slurm_conf)
        else:
            cluster = start_cluster(tmp)
            os.environ["SLURM_CONF"] = str(cluster / "etc" / "slurm.conf")
        try:
            version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.strip()
            result = run(args, tmp)
        finally:
            if cluster is not None:
                subprocess.run(["scancel", "--me"], capture_output=True, timeout=30)
                subprocess.run(["bash", str(SCRIPT), "stop", str(cluster)], capture_output=True, timeout=60)
    result = {"benchmark": "slurm_load", "jobs": args.jobs, "sleep_s": args.sleep, "kill9": args.kill9,
              "slurm": version, "cluster": "n0: gpu:v100:4,gpu:t4:2; n1: gpu:v100:2,gpu:t4:2", "host": platform.node(),
              "cpus": os.cpu_count(), **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    d, s = result["decision_to_sbatch_s"], result["sbatch_call_s"]
    rows = [("jobs acknowledged / in store / Slurm jobs",
             f"{result['acknowledged']} / {result['jobs_in_store']} / {result['slurm_jobs']}"),
            ("kill -9 after acks", str(result["killed_after_acks"] or "-")),
            ("exactly once", "yes" if result["exactly_once"] else f"NO: {result['exactly_once_problems'][:3]}"),
            ("on the chosen GRES type",
             "yes" if result["on_chosen_gres_type"] else f"NO: {result['gres_problems'][:3]}"),
            ("no GPU overlap (Slurm IDX, store)",
             "yes" if result["no_gpu_overlap"] else f"NO: {result['overlap_problems'][:3]}"),
            ("types chosen", ", ".join(f"{k} {v}" for k, v in result["types_chosen"].items())),
            ("Slurm jobs over 2 nodes (heterogeneous)",
             f"{result['multi_node_slurm_jobs']} ({result['heterogeneous_slurm_jobs']})"),
            ("decision -> sbatch p50 / p99 / max", f"{ms(d['p50'])} / {ms(d['p99'])} / {ms(d['max'])}"),
            ("sbatch call p50 / p99", f"{ms(s['p50'])} / {ms(s['p99'])}"),
            ("wall, jobs/s", f"{result['wall_s']} s, {result['jobs_per_s']}")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"wrote {out}")
    ok = result["exactly_once"] and result["on_chosen_gres_type"] and result["no_gpu_overlap"] and not result["errors"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_args.guarded(main))
