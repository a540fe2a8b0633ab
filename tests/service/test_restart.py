"""`gpualloc serve` killed with SIGKILL mid-stream, then restarted on the same store: every
acknowledged job is there exactly once, running jobs are reconciled, no GPU is ever held twice.
Also the CLI end to end (`serve`, `submit`, `jobs --json`), on the local backend and on a local Ray
with virtual V100/T4/MI50 resources."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict

import pytest

from gpualloc.service.client import Client, ClientError
from gpualloc.service.store import Store
from tests.service.conftest import GPUALLOC, wait_for

END_EVENTS = {"finished", "failed", "cancelled", "requeued"}


def gpu_intervals_never_overlap(store_path) -> None:
    """From the event log: per GPU, each attempt's [allocated, ended] interval is disjoint from the
    others (an attempt still holding GPUs is open-ended)."""
    s = Store(store_path)
    try:
        events = s.events()
    finally:
        s.close()
    opened: dict[tuple[int, int], tuple[float, list[int]]] = {}
    per_gpu: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for e in events:
        key = (e["job_id"], e["detail"].get("attempt"))
        if e["kind"] == "allocated":
            opened[key] = (e["at"], e["detail"]["gpus"])
        elif e["kind"] in END_EVENTS and key in opened:
            start, gpus = opened.pop(key)
            for g in gpus:
                per_gpu[g].append((start, e["at"], e["job_id"]))
    for key, (start, gpus) in opened.items():
        for g in gpus:
            per_gpu[g].append((start, float("inf"), key[0]))
    for g, spans in per_gpu.items():
        spans.sort()
        for (a0, a1, ja), (b0, _b1, jb) in zip(spans, spans[1:], strict=False):
            assert b0 >= a1, f"GPU {g} held by job {ja} [{a0}, {a1}] and job {jb} from {b0}"


@pytest.mark.slow
def test_kill9_mid_stream_then_restart_loses_and_duplicates_nothing(server, tmp_path):
    srv = server("--cluster", "4xV100+2xT4+2xMI50").start()
    token = srv.token
    acked: dict[str, int] = {}
    errors: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        # one client, unique names, each submission retried with its own idempotency key until acked
        with Client(srv.url, token, timeout_s=5) as c:
            for i in range(400):
                if stop.is_set():
                    return
                name = f"s{i:04d}"
                try:
                    job = c.submit({"name": name, "command": ["sleep", "0.2"], "num_gpus": 1 + i % 2}, retry_s=60)
                except ClientError as err:
                    errors.append(f"{name}: {err}")
                    return
                acked[name] = job["id"]

    # one long job that must survive the crash: running before, adopted after
    with Client(srv.url, token) as c:
        long = c.submit({"name": "long", "command": ["sleep", "4"], "device_type": "MI50", "num_gpus": 2})
    wait_for(lambda: Client(srv.url, token).job(long["id"])["state"] == "running", 20, what="long job running")
    worker = threading.Thread(target=stream)
    worker.start()
    wait_for(lambda: len(acked) >= 60, 60, what="60 acknowledged submissions")
    srv.kill9()  # mid-stream: the client keeps retrying its current submission
    seen_at_kill = dict(acked)
    time.sleep(0.5)
    srv.start()
    wait_for(lambda: len(acked) >= len(seen_at_kill) + 40, 60, what="submissions after the restart")
    stop.set()
    worker.join(timeout=60)
    assert not errors, errors

    with Client(srv.url, token) as c:
        def settled():
            jobs = c.jobs()
            return jobs if all(j["state"] in ("finished", "failed", "cancelled") for j in jobs) else None

        jobs = wait_for(settled, 120, every_s=0.5, what="every job to end")
    names = Counter(j["name"] for j in jobs)
    assert all(n == 1 for n in names.values()), [n for n, k in names.items() if k > 1]  # nothing twice
    by_name = {j["name"]: j for j in jobs}
    for name, job_id in acked.items():  # every acknowledged job is there, under its id
        assert by_name[name]["id"] == job_id
    assert {j["state"] for j in jobs} == {"finished"}, Counter(j["state"] for j in jobs)
    # the long job ran once: adopted by the restarted service, not re-run
    assert by_name["long"]["attempts"] == 1
    gpu_intervals_never_overlap(srv.store)


@pytest.mark.slow
def test_restart_reconciles_runs_that_ended_or_vanished_while_down(server, tmp_path):
    srv = server("--cluster", "1xV100+1xT4+1xMI50", "--max-attempts", "2").start()
    token = srv.token
    # `keeps` runs until this test lets it end (once it is seen running after the restart), not for a fixed 15 s
    # that had to outlast the restart on a slow machine and that the test then waited out
    release = tmp_path / "release-keeps"
    keeps_cmd = ["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.1; done', str(release)]
    with Client(srv.url, token) as c:
        quick = c.submit({"name": "quick", "command": ["sleep", "1.5"], "device_type": "V100"})
        doomed = c.submit({"name": "doomed", "command": ["sleep", "30"], "device_type": "T4"})
        keeps = c.submit({"name": "keeps", "command": keeps_cmd, "device_type": "MI50"})
        waiting = c.submit({"name": "waiting", "command": ["true"], "device_type": "MI50"})
        for j in (quick, doomed, keeps):
            wait_for(lambda j=j: c.job(j["id"])["state"] == "running", 20, what=f"{j['name']} running")
        doomed_handle = c.job(doomed["id"])["handle"]
    srv.kill9()
    # while the service is down: `quick` ends by itself, `doomed`'s runner is killed
    pid = json.loads((srv.store.parent / "state.db.runs" / doomed_handle / "runner.pid").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)
    time.sleep(2.0)
    srv.start()
    with Client(srv.url, token) as c:
        q = c.job(quick["id"])
        assert (q["state"], q["exit_code"], q["attempts"]) == ("finished", 0, 1)  # ended while down
        d = wait_for(lambda: (j := c.job(doomed["id"]))["attempts"] == 2 and j, 20, what="doomed re-queued and re-run")
        assert d["requeues"] == 1
        k = c.job(keeps["id"])
        assert k["state"] == "running" and k["attempts"] == 1  # still running: kept
        release.touch()
        for j in (keeps, waiting):
            wait_for(lambda j=j: c.job(j["id"])["state"] == "finished", 30, what=f"{j['name']} finished")
        assert c.job(keeps["id"])["attempts"] == 1
        c.cancel(doomed["id"])
        kinds = [e["kind"] for e in c.events(doomed["id"])]
        assert kinds[:4] == ["submitted", "allocated", "started", "requeued"]
    gpu_intervals_never_overlap(srv.store)


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUALLOC, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_cli_walkthrough_on_local_ray_with_virtual_device_types(server):
    srv = server("--ray-num-cpus", "1", backend="ray", cluster="4xV100+2xT4+2xMI50").start(timeout_s=90)
    log = srv.log.read_text()
    assert "made on this first start" in log and srv.token not in log  # the token is never printed
    common = ["--server", srv.url, "--token", srv.token]
    for name, dtype, gpus in (("train-v100", "V100", "2"), ("infer-t4", "T4", "1"), ("amd", "MI50", "2")):
        done = _cli("submit", *common, "--name", name, "--gpus", gpus, "--device-type", dtype,
                    "--command", "sh -c 'echo $GPUALLOC_DEVICE_TYPE; sleep 0.5'")
        assert done.returncode == 0, done.stderr
    refused = _cli("submit", *common, "--name", "too-big", "--gpus", "3", "--device-type", "T4", "--command", "true")
    assert refused.returncode == 2 and "can ever hold" in refused.stderr
    unauth = _cli("submit", "--server", srv.url, "--token", "nope", "--name", "x", "--command", "true")
    assert unauth.returncode == 2 and "401" in unauth.stderr

    def listed():
        out = _cli("jobs", *common, "--json")
        assert out.returncode == 0, out.stderr
        jobs = json.loads(out.stdout)
        return jobs if {j["state"] for j in jobs} == {"finished"} else None

    jobs = wait_for(listed, 60, every_s=0.5, what="the three jobs to finish on Ray")
    assert [(j["name"], j["device_type"]) for j in jobs] == [("train-v100", "V100-16GB"), ("infer-t4", "T4"),
                                                            ("amd", "MI50")]
    assert all({"id", "name", "state"} <= set(j) for j in jobs)
    assert all(j["handle"].startswith("gpualloc-") for j in jobs)  # Ray actor names


def test_cli_cancel_says_stopping_for_a_running_job_only(server):
    srv = server().start()
    common = ["--server", srv.url, "--token", srv.token]
    with Client(srv.url, srv.token) as c:
        running = c.submit({"name": "long", "command": "sleep 60", "num_gpus": 8, "device_type": "V100"})
        queued = c.submit({"name": "behind", "command": "true", "num_gpus": 8, "device_type": "V100"})
        wait_for(lambda: c.job(running["id"])["state"] == "running", what="the first job to run")
        done = _cli("cancel", *common, str(queued["id"]))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"job {queued['id']} cancelled"
        done = _cli("cancel", *common, str(running["id"]))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"job {running['id']} running (stopping)"
        wait_for(lambda: c.job(running["id"])["state"] == "cancelled", what="the running job to stop")
        again = _cli("cancel", *common, str(running["id"]))
        assert again.returncode == 2 and "already cancelled" in again.stderr
