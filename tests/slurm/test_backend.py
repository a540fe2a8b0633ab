"""The slurm backend against a real Slurm (the session's fake cluster: n0 with Gres=gpu:v100:4,gpu:t4:2,
n1 with Gres=gpu:v100:2,gpu:t4:2): jobs run on the GRES type and nodes the policy chose (multi-node
gangs too), argv without a shell, cancel, `hw show slurm:`, recovery after kill -9 of
`gpualloc serve --backend slurm`, and the advisory job_submit plugin."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter

import httpx
import pytest

from gpualloc.service.client import Client, ClientError
from gpualloc.service.errors import BackendError
from gpualloc.service.slurm import SlurmBackend
from tests.service.conftest import GPUALLOC, LocalService, wait_for, wait_state
from tests.service.test_restart import gpu_intervals_never_overlap
from tests.slurm.conftest import expected_gres, slurm_job_id

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def test_hw_show_slurm_reads_nodes_and_typed_gres(fake_slurm):
    done = _run(*GPUALLOC, "hw", "show", "slurm:", "--json")
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    assert spec["name"] == "slurm" and [n["name"] for n in spec["nodes"]] == ["n0", "n1"]
    assert Counter(d["type"] for d in spec["devices"]) == {"V100-16GB": 6, "T4": 4}
    assert [d["type"] for d in spec["devices"] if d["node"] == 1] == ["V100-16GB"] * 2 + ["T4"] * 2
    table = _run(*GPUALLOC, "hw", "show", "slurm:gpu")
    assert table.returncode == 0 and "4 x V100-16GB, 2 x T4" in table.stdout
    bad = _run(*GPUALLOC, "hw", "show", "slurm:nosuch")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1


def test_jobs_run_once_on_the_chosen_gres_type_with_argv_env_and_exit_status(fake_slurm, tmp_path):
    svc = LocalService(tmp_path, backend="slurm", cluster="slurm:")
    try:
        odd = ["printf", "%s|", "a b", "$HOME", "'q'", ";ls", "*"]
        t4 = svc.submit(name="t4", command=odd, device_type="T4", num_gpus=2, cwd=str(tmp_path), single_node=True)
        v100 = svc.submit(name="v100", command=["sh", "-c", 'echo "$GPUALLOC_DEVICE_TYPE $SLURM_JOB_ID $X $PWD"'],
                          device_type="V100", num_gpus=3, env={"X": "a,b c"}, single_node=True)
        bad = svc.submit(name="bad", command=["sh", "-c", "exit 3"], device_type="V100")
        missing = svc.submit(name="missing", command=["/no/such/program"], device_type="T4")
        for job in (t4, v100):
            assert wait_state(svc.client, job["id"], {"finished", "failed"}, 60)["state"] == "finished"
        assert wait_state(svc.client, bad["id"], {"finished", "failed"}, 60)["exit_code"] == 3
        assert wait_state(svc.client, missing["id"], {"finished", "failed"}, 60)["exit_code"] == 127
        runs = svc.runs_dir
        assert (runs / f"{t4['id']}-1" / "stdout.log").read_text() == "a b|$HOME|'q'|;ls|*|"
        sid = slurm_job_id(runs, v100["id"])
        out = (runs / f"{v100['id']}-1" / "stdout.log").read_text().split()
        assert out[:3] == ["V100-16GB", sid, "a,b"] and out[3] == "c"
        cluster = svc.service.cluster
        for job, gres in ((t4, "gres:gpu:t4:2"), (v100, "gres:gpu:v100:3"), (bad, "gres:gpu:v100:1")):
            rec = fake_slurm.job(slurm_job_id(runs, job["id"]))
            placed = svc.client.get(f"/jobs/{job['id']}").json()
            assert (rec.gres, rec.nodes) == expected_gres(placed, cluster) and rec.gres == gres
        assert fake_slurm.job(slurm_job_id(runs, v100["id"])).nodes == "n0"  # the only node with 3 V100
        assert fake_slurm.job(slurm_job_id(runs, bad["id"])).state == "COMPLETED"  # the runner ended well
        names = Counter(j.name for j in fake_slurm.jobs() if j.name.startswith(f"gpualloc-{svc.service.store.uid}-"))
        assert len(names) == 4 and set(names.values()) == {1}  # one Slurm job per attempt
        logs = svc.client.get(f"/jobs/{t4['id']}/logs")
        assert logs.status_code == 200 and logs.content == b"a b|$HOME|'q'|;ls|*|"
    finally:
        svc.close()


def test_cancel_stops_the_slurm_job_and_frees_its_gpus(fake_slurm, tmp_path):
    svc = LocalService(tmp_path, backend="slurm", cluster="slurm:")
    try:
        long = svc.submit(name="long", command=["sleep", "120"], device_type="V100", num_gpus=4, single_node=True)
        after = svc.submit(name="after", command=["true"], device_type="V100", num_gpus=4, single_node=True)
        wait_state(svc.client, long["id"], {"running"}, 30)
        sid = slurm_job_id(svc.runs_dir, long["id"])
        wait_for(lambda: fake_slurm.job(sid).state == "RUNNING", 30, what="the Slurm job running")
        assert svc.client.get(f"/jobs/{after['id']}").json()["state"] == "queued"
        started = time.monotonic()
        assert svc.client.post(f"/jobs/{long['id']}/cancel").status_code == 200
        assert wait_state(svc.client, long["id"], {"cancelled"}, 30)["state"] == "cancelled"
        assert fake_slurm.job(sid).state == "CANCELLED" and time.monotonic() - started < 20
        assert wait_state(svc.client, after["id"], {"finished"}, 60)["exit_code"] == 0
    finally:
        svc.close()


def test_a_cluster_slurm_does_not_have_is_one_clear_error(fake_slurm, tmp_path):
    from gpualloc.hardware.cluster import load_cluster

    with pytest.raises(BackendError, match="node 'n2' of cluster '4xV100\\+2xT4\\+2xMI50' is not a Slurm node"):
        SlurmBackend(tmp_path / "runs", "x", load_cluster("4xV100+2xT4+2xMI50"))
    with pytest.raises(BackendError, match="slurm node n0: Gres: the cluster has 8 x V100-16GB there, Slurm 4"):
        SlurmBackend(tmp_path / "runs", "x", load_cluster("8xV100"))
    done = _run(*GPUALLOC, "serve", "--backend", "slurm", "--cluster", "8xV100", "--port", "0",
                "--store", str(tmp_path / "s.db"), "--telemetry", "none")
    assert done.returncode == 2 and done.stderr.startswith("error: slurm node n0: Gres")


def test_kill9_mid_stream_then_restart_runs_every_job_exactly_once(fake_slurm, server):
    srv = server(backend="slurm", cluster="slurm:").start()
    token = srv.token
    acked: dict[str, int] = {}
    errors: list[str] = []
    stop = threading.Event()

    def stream() -> None:
        with Client(srv.url, token, timeout_s=5) as c:
            for i in range(40):
                if stop.is_set():
                    return
                name = f"s{i:03d}"
                try:
                    job = c.submit({"name": name, "command": ["sleep", "0.3"], "num_gpus": 1 + i % 2,
                                    "device_type": "V100" if i % 3 else "T4"}, retry_s=60)
                except ClientError as err:
                    errors.append(f"{name}: {err}")
                    return
                acked[name] = job["id"]

    with Client(srv.url, token) as c:
        long = c.submit({"name": "long", "command": ["sleep", "5"], "device_type": "T4", "num_gpus": 1})
        wait_for(lambda: c.job(long["id"])["state"] == "running", 30, what="the long job running")
    worker = threading.Thread(target=stream)
    worker.start()
    wait_for(lambda: len(acked) >= 12, 60, what="12 acknowledged submissions")
    srv.kill9()
    seen_at_kill = len(acked)
    time.sleep(1.0)
    srv.start()
    worker.join(timeout=180)
    stop.set()
    assert not errors, errors
    assert len(acked) == 40 and seen_at_kill < 40
    with Client(srv.url, token) as c:
        def settled():
            jobs = c.jobs()
            return jobs if all(j["state"] in ("finished", "failed", "cancelled") for j in jobs) else None

        jobs = wait_for(settled, 180, every_s=0.5, what="every job to end")
    by_name = {j["name"]: j for j in jobs}
    assert len(by_name) == len(jobs) == 41  # nothing twice
    assert all(by_name[n]["id"] == i for n, i in acked.items())
    assert {j["state"] for j in jobs} == {"finished"}, Counter(j["state"] for j in jobs)
    assert by_name["long"]["attempts"] == 1  # adopted, not re-run
    listed = json.loads(_run(*GPUALLOC, "jobs", "--server", srv.url, "--token", token, "--json").stdout)
    prefix = next(j["handle"] for j in listed if j["handle"]).rsplit("-", 2)[0] + "-"
    slurm_jobs = [j for j in fake_slurm.jobs() if j.name.startswith(prefix)]
    assert Counter(j.name for j in slurm_jobs).most_common(1)[0][1] == 1  # no attempt submitted twice
    ran = Counter(s.name.rsplit("-", 2)[1] for s in slurm_jobs if s.state == "COMPLETED")
    assert all(ran[str(j["id"])] == 1 for j in jobs), ran  # each job ran to its end once in Slurm
    # an attempt allocated but not yet submitted when the service died is re-queued, never run
    assert len(slurm_jobs) <= sum(j["attempts"] for j in jobs)
    from gpualloc.hardware.cluster import load_cluster

    cluster = load_cluster("slurm:")
    for j in jobs:  # each ran on the GRES type and nodes the policy chose
        # a job that ended while the service was down before it recorded the start has no handle
        # in the store (the scheduler's recovery, for every backend): its Slurm name is the same
        handle = j["handle"] or f"{prefix}{j['id']}-{j['attempts']}"
        rec = next(s for s in slurm_jobs if s.name == handle)
        assert (rec.gres, rec.nodes) == expected_gres(j, cluster) and rec.state == "COMPLETED"
    gpu_intervals_never_overlap(srv.store)


def test_job_submit_plugin_applies_advice_and_falls_back_when_the_service_is_silent(fake_slurm, server):
    srv = server(backend="slurm", cluster="slurm:").start()
    etc = fake_slurm.conf.parent
    header = srv.tmp / "advise.header"
    header.write_text(f"Authorization: Bearer {srv.token}\n")
    header.chmod(0o600)
    conf = etc / "gpualloc_advise.conf"
    conf.write_text(f"url={srv.url}\nheader_file={header}\ntimeout_s=2\n")

    def submit(*opts: str) -> str:
        done = _run("sbatch", "--parsable", f"--output={srv.tmp}/slurm-%j.out", *opts, "--wrap", "sleep 0.1")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    try:
        want = httpx.post(f"{srv.url}/advise", json={"gpus": 2}, headers={"Authorization": f"Bearer {srv.token}"},
                          timeout=10).json()
        untyped = submit("--gres=gpu:2")
        assert len(want["gres"]) == 1 and fake_slurm.job(untyped).gres == "gres:" + next(iter(want["gres"].values()))
        assert wait_for(lambda: fake_slurm.job(untyped).nodes, 20, what="the job placed") == want["nodes"][0]
        typed = submit("--gres=gpu:t4:1", "--time=5")
        assert fake_slurm.job(typed).gres == "gres:gpu:t4:1"
        plain = submit()  # no GPUs asked: left alone
        assert fake_slurm.job(plain).gres in ("", "N/A", "(null)")
        srv.stop()  # the service is gone: Slurm's default, without waiting long
        started = time.monotonic()
        fallback = submit("--gres=gpu:2")
        assert time.monotonic() - started < 5
        assert fake_slurm.job(fallback).gres == "gres:gpu:2"
    finally:
        conf.unlink()


def test_a_job_slurm_cancels_behind_the_services_back_is_requeued_and_rerun(fake_slurm, tmp_path):
    svc = LocalService(tmp_path, backend="slurm", cluster="slurm:")
    try:
        job = svc.submit(name="victim", command=["sleep", "120"], device_type="T4")
        wait_state(svc.client, job["id"], {"running"}, 30)
        first = slurm_job_id(svc.runs_dir, job["id"], 1)
        assert _run("scancel", first).returncode == 0  # an administrator, not the service
        again = wait_for(lambda: (j := svc.client.get(f"/jobs/{job['id']}").json())["attempts"] == 2
                         and j["state"] == "running" and j, 60, what="the job re-run")
        assert again["requeues"] == 1
        second = slurm_job_id(svc.runs_dir, job["id"], 2)
        assert second != first and fake_slurm.job(first).state == "CANCELLED"
        svc.client.post(f"/jobs/{job['id']}/cancel")
        wait_state(svc.client, job["id"], {"cancelled"}, 30)
    finally:
        svc.close()


def test_launch_after_a_crash_between_sbatch_and_its_record_submits_nothing_twice(fake_slurm, tmp_path):
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.service.backends import RunRef, RunRequest, RunStatus

    backend = SlurmBackend(tmp_path / "runs", "crash", load_cluster("slurm:"))
    req = RunRequest(job_id=1, attempt=1, name="x", target={"argv": ["sleep", "30"]}, device_type="T4",
                     vendor="nvidia", resource="gpu_T4", gpus=(4,), groups=((0, (0,)),))
    handle = backend.launch(req)
    run_dir = backend.run_dir(handle)
    sid = backend.slurm_job_id(handle)
    (run_dir / "slurm_job.json").unlink()  # as if the service died right after sbatch returned
    fresh = SlurmBackend(tmp_path / "runs", "crash", load_cluster("slurm:"))
    assert fresh.launch(req) == handle
    assert [j.job_id for j in fake_slurm.jobs() if j.name == handle] == [sid]  # not submitted again
    ref = RunRef(1, 1, handle)
    assert fresh.poll([ref])[ref.key].status is RunStatus.RUNNING  # found by its name
    fresh.stop(ref)
    state = fresh.poll([ref])[ref.key]
    assert state.status in (RunStatus.GONE, RunStatus.EXITED) and fake_slurm.job(sid).state == "CANCELLED"
    assert fresh.cleanup([]) == []


def test_multi_node_gangs_one_job_for_equal_counts_a_heterogeneous_job_for_unequal(fake_slurm, tmp_path):
    svc = LocalService(tmp_path, backend="slurm", cluster="slurm:")
    try:
        report = ["sh", "-c", 'echo "$GPUALLOC_WORLD_SIZE $SLURM_JOB_NUM_NODES ${SLURM_HET_SIZE:-1}"']
        equal = svc.submit(name="t4x4", command=report, device_type="T4", num_gpus=4)  # 2 on n0 + 2 on n1
        wait_state(svc.client, equal["id"], {"finished", "failed"}, 60)
        unequal = svc.submit(name="v100x6", command=report, device_type="V100", num_gpus=6)  # 4 on n0 + 2 on n1
        for job, gres, nodes, out in ((equal, "gres:gpu:t4:2", "n[0-1]", "2 2 1"),
                                      (unequal, "gres:gpu:v100:4;gres:gpu:v100:2", "n0;n1", "2 1 2")):
            placed = wait_state(svc.client, job["id"], {"finished", "failed"}, 60)
            assert placed["state"] == "finished", placed
            rec = fake_slurm.job(slurm_job_id(svc.runs_dir, job["id"]))
            assert (rec.gres, rec.nodes) == (gres, nodes) == expected_gres(placed, svc.service.cluster)
            assert (svc.runs_dir / f"{job['id']}-1" / "stdout.log").read_text().split() == out.split()
    finally:
        svc.close()
