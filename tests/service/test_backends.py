"""Both execution backends for real: local processes, and Ray actors on a local Ray that declares a
heterogeneous cluster (virtual V100/T4/MI50 resources) on this CPU-only host."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import pytest

from gpualloc.service.backends import LocalBackend, RayBackend, RunRef, RunRequest, RunStatus, ray_resource_name
from tests.service.conftest import kill_runs, wait_for, wait_state

RAY_RESOURCES = {"gpu_V100": 4, "gpu_T4": 2, "gpu_MI50": 2}
TYPES = {"V100-16GB": "gpu_V100", "T4": "gpu_T4", "MI50": "gpu_MI50"}


def request(job_id: int, target: dict, device_type: str = "V100-16GB", groups=((0, (0,)),), attempt: int = 1,
            vendor: str = "nvidia") -> RunRequest:
    gpus = tuple(range(sum(len(g[1]) for g in groups)))
    return RunRequest(job_id, attempt, f"job{job_id}", target, device_type, vendor, TYPES[device_type], gpus,
                      tuple(groups))


def wait_ended(backend, ref: RunRef, timeout_s: float = 30.0):
    return wait_for(lambda: (st := backend.poll([ref])[ref.key]).status is not RunStatus.RUNNING and st,
                    timeout_s, every_s=0.1, what=f"run {ref.handle} to end")


def test_resource_names():
    assert ray_resource_name(("V100-16GB", "V100", "V100-SXM2-16GB")) == "gpu_V100"
    assert ray_resource_name(("MI50", "MI50-16GB")) == "gpu_MI50"
    assert ray_resource_name(("V100-32GB", "V100-SXM2-32GB", "V100-32G")) == "gpu_V100_32G"


# ------------------------------------------------------------------------------------------ local
def test_local_backend_runs_stops_and_is_found_again_by_a_new_instance(tmp_path):
    runs = tmp_path / "runs"
    b = LocalBackend(runs, stop_grace_s=1.0)
    try:
        ok = RunRef(1, 1, b.launch(request(1, {"argv": [sys.executable, "-c", "print('x')"]})))
        fail = RunRef(2, 1, b.launch(request(2, {"argv": ["sh", "-c", "exit 4"]})))
        call = RunRef(3, 1, b.launch(request(3, {"callable": "os.path:join", "args": ["a", "b"]})))
        slow = RunRef(4, 1, b.launch(request(4, {"argv": ["sleep", "30"]})))
        gone = RunRef(5, 1, b.launch(request(5, {"argv": ["sleep", "30"]})))
        assert b.launch(request(4, {"argv": ["sleep", "30"]})) == slow.handle  # relaunch: the same run
        st = wait_ended(b, ok)
        assert (st.status, st.exit_code) == (RunStatus.EXITED, 0)
        assert (wait_ended(b, fail).exit_code, wait_ended(b, call).result) == (4, "a/b")
        b.close()  # the service goes away; its runs do not
        b2 = LocalBackend(runs, stop_grace_s=1.0)
        assert b2.poll([slow])[slow.key].status is RunStatus.RUNNING
        assert b2.poll([ok])[ok.key].status is RunStatus.EXITED
        pid = int(__import__("json").loads((runs / gone.handle / "runner.pid").read_text())["pid"])
        os.killpg(pid, signal.SIGKILL)  # the runner dies without an exit status: lost
        st = wait_for(lambda: (s := b2.poll([gone])[gone.key]).status is RunStatus.GONE and s, 10, what="gone")
        assert "gone" in st.error
        t0 = time.monotonic()
        b2.stop(slow)
        assert time.monotonic() - t0 < 5
        assert b2.poll([slow])[slow.key].status is not RunStatus.RUNNING
        # a program with children of its own: stopping it ends its whole process group
        tree = RunRef(6, 1, b2.launch(request(6, {"argv": ["sh", "-c", "sleep 30 & sleep 30; wait"]})))
        prog = runs / tree.handle / "program.pid"
        wait_for(prog.exists, 10, what="the program to start")
        group = int(__import__("json").loads(prog.read_text())["pid"])
        b2.stop(tree)

        def group_gone() -> bool:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(group_gone, 10, what="the program's process group to end")
        assert b2.poll([RunRef(9, 1, "9-1")])[(9, 1)].status is RunStatus.GONE  # never launched
    finally:
        kill_runs(runs)


def _memory(pid: int) -> bytes:
    """Every readable, writable mapping of process ``pid`` (its heap and stacks)."""
    out = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if perms.startswith("rw"):
                lo, hi = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(lo)
                    out.append(mem.read(hi - lo))
                except (OSError, ValueError, OverflowError):
                    pass
    return b"".join(out)


def test_local_backend_forks_runners_from_one_server_and_starts_a_new_one_if_it_died(tmp_path):
    runs = tmp_path / "runs"
    b = LocalBackend(runs, stop_grace_s=1.0)

    def runner(ref: RunRef) -> tuple[int, int]:  # (pid, parent pid) of the run's runner
        pid = int(__import__("json").loads((runs / ref.handle / "runner.pid").read_text())["pid"])
        return pid, int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])

    try:
        first = RunRef(1, 1, b.launch(request(1, {"argv": ["sleep", "30"]})))
        server = b._forks
        assert runner(first)[1] == server.pid  # forked by the server, not a fresh interpreter per job
        server.kill()
        server.wait()
        second = RunRef(2, 1, b.launch(request(2, {"argv": [sys.executable, "-c", "print('y')"]})))
        assert b._forks.pid != server.pid and runner(second)[1] == b._forks.pid
        assert wait_ended(b, second).exit_code == 0
        assert (runs / second.handle / "stdout.log").read_text() == "y\n"
        assert b.poll([first])[first.key].status is RunStatus.RUNNING  # a runner outlives its server
        secret = f"s3cret-{os.getpid()}-{time.time_ns()}"
        third = RunRef(3, 1, b.launch(request(3, {"argv": ["sh", "-c", 'test "$TOKEN" = "$0"', secret],
                                                  "env": {"TOKEN": secret}})))
        assert wait_ended(b, third).exit_code == 0
        assert secret.encode() not in _memory(b._forks.pid)  # the target's file reached the runner unread
        assert b.launch(request(1, {"argv": ["sleep", "30"]})) == first.handle  # and is never started twice
        b.close()
        assert server.poll() is not None and b._forks is None
    finally:
        kill_runs(runs)


# -------------------------------------------------------------------------------------------- ray
@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray for the module: 2 CPUs and virtual device-type resources."""
    ray = pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="gr-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, resources=dict(RAY_RESOURCES), _temp_dir=temp,
             namespace="gpualloc", log_to_driver=False)
    yield ray
    ray.shutdown()
    import shutil

    shutil.rmtree(temp, ignore_errors=True)


def _available(ray, res: str) -> float:
    return ray.available_resources().get(res, 0.0)


@pytest.mark.slow
def test_ray_backend_gang_resources_restart_and_lost_worker(ray_cluster, tmp_path):
    ray = ray_cluster
    b = RayBackend(TYPES, "t1", log_dir=tmp_path / "logs", launch_timeout_s=30)
    assert b.capacity() == {"V100-16GB": 4, "T4": 2, "MI50": 2}
    # a 3-GPU V100 gang over two nodes: one placement group, one actor per node, ranks 0 and 1
    gang = request(1, {"argv": ["sh", "-c", "echo $GPUALLOC_RANK/$GPUALLOC_WORLD_SIZE $CUDA_VISIBLE_DEVICES; sleep 2"]},
                   groups=((0, (0, 1)), (1, (0,))))
    call = request(2, {"callable": "math:factorial", "args": [5]}, device_type="T4")
    amd = request(3, {"argv": ["sleep", "30"]}, device_type="MI50", groups=((2, (0, 1)),), vendor="amd")
    refs = [RunRef(r.job_id, 1, b.launch(r)) for r in (gang, call, amd)]
    assert refs[0].handle == "gpualloc-t1-1-1x2"
    wait_for(lambda: _available(ray, "gpu_V100") == 1.0 and _available(ray, "gpu_MI50") == 0.0, 30,
             what="the gang's resources to be held")
    st = wait_ended(b, refs[1])
    assert (st.status, st.result) == (RunStatus.EXITED, 120)
    st = wait_ended(b, refs[0])
    assert (st.status, st.exit_code) == (RunStatus.EXITED, 0)
    logs = sorted((tmp_path / "logs").glob("gpualloc-t1-1-1x2-r*/stdout.log"))
    assert [p.read_text().strip() for p in logs] == ["0/2 0,1", "1/2 0"]
    for ref in refs[:2]:
        b.release(ref)
    wait_for(lambda: _available(ray, "gpu_V100") == 4.0, 30, what="V100s to be released")

    # a new backend object (a restarted service) finds the running actor by name
    b2 = RayBackend(TYPES, "t1", log_dir=tmp_path / "logs")
    assert b2.poll([refs[2]])[refs[2].key].status is RunStatus.RUNNING
    assert b2.launch(amd) == refs[2].handle  # relaunching the same attempt starts nothing new
    # its worker dies (as when a node is lost): the run is gone, and its program with it
    pid = ray.get(ray.get_actor(refs[2].handle + "-r0", namespace="gpualloc").pid.remote())
    os.kill(pid, signal.SIGKILL)
    st = wait_for(lambda: (s := b2.poll([refs[2]])[refs[2].key]).status is RunStatus.GONE and s, 30, every_s=0.2,
                  what="lost actor")
    assert "died" in st.error
    b2.release(refs[2])
    wait_for(lambda: _available(ray, "gpu_MI50") == 2.0, 30, what="MI50s to be released")


@pytest.mark.slow
def test_ray_cleanup_and_unschedulable_runs(ray_cluster):
    b = RayBackend(TYPES, "t2", launch_timeout_s=2.0)
    orphan = RunRef(7, 1, b.launch(request(7, {"argv": ["sleep", "30"]}, device_type="T4")))
    kept = RunRef(8, 1, b.launch(request(8, {"argv": ["sleep", "30"]}, device_type="T4")))
    wait_for(lambda: all(s.status is RunStatus.RUNNING for s in b.poll([orphan, kept]).values())
             and _available(ray_cluster, "gpu_T4") == 0.0, 30, what="two T4 runs")
    # the store knows only `kept`: the other run is stopped
    assert b.cleanup([kept]) == [orphan.handle]
    wait_for(lambda: b.poll([orphan])[orphan.key].status is RunStatus.GONE, 20, every_s=0.2, what="orphan gone")
    # more T4s than Ray has: never scheduled, reported gone after the launch timeout
    big = RunRef(9, 1, b.launch(request(9, {"argv": ["true"]}, device_type="T4", groups=((1, (0, 1, 2)),))))
    st = wait_for(lambda: (s := b.poll([big])[big.key]).status is RunStatus.GONE and s, 20, every_s=0.2,
                  what="unschedulable run")
    assert "did not start" in st.error
    b.release(big)
    b.stop(kept)
    wait_for(lambda: _available(ray_cluster, "gpu_T4") == 2.0, 30, what="T4s to be released")


@pytest.mark.slow
def test_service_on_ray_requeues_jobs_of_a_lost_worker(ray_cluster, local_service):
    svc = local_service(backend="ray", cluster="4xV100+2xT4+2xMI50")
    c = svc.client
    assert c.get("/cluster").json()["backend"]["name"] == "ray"
    jobs = [svc.submit(name="v", command="sleep 1", device_type="V100", num_gpus=2),
            svc.submit(name="t", callable="math:factorial", args=[4], device_type="T4"),
            svc.submit(name="m", command="sleep 30", device_type="MI50", num_gpus=2)]
    v, t = (wait_state(c, j["id"], {"finished", "failed"}, 60) for j in jobs[:2])
    assert (v["state"], v["device_type"], t["result"]) == ("finished", "V100-16GB", 24)
    m = wait_state(c, jobs[2]["id"], {"running"}, 30)
    actor = ray_cluster.get_actor(m["handle"] + "-r0", namespace="gpualloc")
    wait_for(lambda: _available(ray_cluster, "gpu_MI50") == 0.0, 30, what="MI50 job to hold its GPUs")
    os.kill(ray_cluster.get(actor.pid.remote()), signal.SIGKILL)
    # re-queued as a second attempt, which runs again
    again = wait_for(lambda: (j := c.get(f"/jobs/{m['id']}").json())["attempts"] == 2 and j["state"] == "running" and j,
                     60, every_s=0.1, what="the lost job to run again")
    kinds = [e["kind"] for e in c.get(f"/jobs/{m['id']}/events").json()]
    assert kinds == ["submitted", "allocated", "started", "requeued", "allocated", "started"]
    resp = c.post(f"/jobs/{again['id']}/cancel", headers=svc.headers)
    assert resp.status_code == 200
    wait_state(c, m["id"], {"cancelled"}, 30)
    wait_for(lambda: _available(ray_cluster, "gpu_MI50") == 2.0, 30, what="MI50s to be released")
