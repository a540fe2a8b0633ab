"""Issue 35's trust boundaries, each attacked as a job or another local user would: a job's environment,
the store and the token as seen by a job run as another user, another job's secrets, the store's traces
of an ended job's secret, host-wide device indices, planted store files, and the readiness signal.

Tests that switch users need root (uid 0) and the ``nobody`` / ``daemon`` users; elsewhere they skip."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from gpualloc.service.backends import LocalBackend, RunRef, RunRequest, RunStatus, host_device_indices
from gpualloc.service.jobusers import JobUsers, plan_job_users
from tests.service.conftest import GPUALLOC, free_port, kill_runs, wait_for, wait_state


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not (ROOT and _has_user("nobody") and _has_user("daemon")),
                                reason="switching users needs root and the users nobody and daemon")


def _as_root_users(default: str = "nobody", **teams: str) -> JobUsers:
    return JobUsers(default, dict(teams), pwd.getpwuid(os.geteuid()).pw_name)


def _scan(files, needle: bytes) -> list[str]:
    """The files (of those that exist) whose bytes contain ``needle``: ``strings FILE | grep`` done right."""
    hits = []
    for f in files:
        try:
            if needle in Path(f).read_bytes():
                hits.append(str(f))
        except FileNotFoundError:
            pass
    return hits


# ------------------------------------------------------------------------------------ environment
def test_a_jobs_environment_lacks_the_token_and_the_services_variables(local_service, monkeypatch):
    monkeypatch.setenv("GPUALLOC_TOKEN", "the-service-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a-cloud-key")
    monkeypatch.setenv("GPUALLOC_SERVER", "http://127.0.0.1:1")
    svc = local_service(cluster="4xV100+2xT4")
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    job = svc.submit(name="env", command=[sys.executable, "-c", script], env={"MINE": "1"}, device_type="T4")
    done = wait_state(svc.client, job["id"], {"finished", "failed"})
    assert done["state"] == "finished", done
    seen = json.loads((svc.runs_dir / done["handle"] / "stdout.log").read_text())
    assert "GPUALLOC_TOKEN" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen and "GPUALLOC_SERVER" not in seen
    assert svc.service.token not in json.dumps(seen)
    assert seen["MINE"] == "1" and seen["CUDA_VISIBLE_DEVICES"] == "4" and seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


# --------------------------------------------------------------------------------- user switching
@needs_root
def test_a_job_run_as_nobody_cannot_read_the_token_the_store_or_the_run_folders(local_service):
    svc = local_service(job_users=_as_root_users("nobody"))
    store = Path(svc.config.store)
    token = svc.service.token_path
    attack = (f"id -un; cat {token}; cat {store}; cat {store}-wal; ls {svc.runs_dir}; "
              f"cat {svc.runs_dir}/*/spec.json; echo done")
    job = svc.submit(name="thief", command=["sh", "-c", attack], env={"MY_SECRET": "s3cret-value"})
    done = wait_state(svc.client, job["id"], {"finished", "failed"})
    run = svc.runs_dir / done["handle"]
    out, err = (run / "stdout.log").read_text(), (run / "stderr.log").read_text()
    assert out.splitlines()[0] == "nobody" and out.splitlines()[-1] == "done", (out, err)
    assert svc.service.token not in out and "SQLite format" not in out
    assert err.count("Permission denied") >= 4, err
    # the job's output is written through the runner's descriptors: the files stay the service's
    assert {p.stat().st_uid for p in run.iterdir()} == {os.geteuid()}
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700


@needs_root
def test_a_job_cannot_read_another_users_jobs_secret_but_one_of_its_own_user_can(tmp_path):
    """Team ``a`` runs as daemon, team ``b`` as nobody. A job of ``b`` scans every process's environment
    and run folder for ``a``'s secret and finds nothing; a second job of ``a`` (the same user) does find
    it: jobs of one OS user share its rights, as the docs say."""
    backend = LocalBackend(tmp_path / "runs", job_users=_as_root_users("nobody", a="daemon", b="nobody"))
    secret = "alpha-" + os.urandom(6).hex()
    scan = ("for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done 2>/dev/null | grep MY_SECRET; "
            f"cat {tmp_path}/runs/1-1/spec.json {tmp_path}/runs/1-1/stdout.log 2>&1; echo scanned")

    def request(job_id: int, team: str, argv: list[str], env: dict[str, str]) -> RunRequest:
        return RunRequest(job_id, 1, f"j{job_id}", {"argv": argv, "env": env}, "V100-16GB", "nvidia", "gpu_V100",
                          (job_id - 1,), ((0, (job_id - 1,)),), team=team)

    refs = []
    try:
        refs.append(RunRef(1, 1, backend.launch(request(1, "a", ["sleep", "20"], {"MY_SECRET": secret}))))
        wait_for(lambda: (tmp_path / "runs/1-1/program.pid").exists(), what="job 1 running")
        refs.append(RunRef(2, 1, backend.launch(request(2, "b", ["sh", "-c", scan], {}))))
        refs.append(RunRef(3, 1, backend.launch(request(3, "a", ["sh", "-c", scan], {}))))
        for ref in refs[1:]:
            wait_for(lambda r=ref: backend.poll([r])[r.key].status is RunStatus.EXITED, what=f"job {ref.job_id}")
        other = (tmp_path / "runs/2-1/stdout.log").read_text()
        same = (tmp_path / "runs/3-1/stdout.log").read_text()
        assert other.strip().endswith("scanned") and secret not in other, other
        assert f"MY_SECRET={secret}" in same, same  # the control: the scan does find it when it may
        assert secret not in (tmp_path / "runs/1-1/spec.json").read_text()  # names only on disk
    finally:
        for ref in refs:
            backend.stop(ref)
        kill_runs(tmp_path / "runs")


@needs_root
def test_each_team_runs_as_its_own_user(local_service):
    """``--job-user daemon --job-user ml=nobody``: the job of a user of team ml runs as nobody, the
    bootstrap admin's (no team) as daemon; the team comes from the token, never from the request."""
    svc = local_service(job_users=_as_root_users("daemon", ml="nobody"))
    _, ml_token = svc.service.store.add_user("alice", "ml")
    ids = {
        "ml": svc.client.post("/jobs", json={"name": "a", "command": ["id", "-un"]},
                              headers={"Authorization": f"Bearer {ml_token}"}).json()["id"],
        "admin": svc.submit(name="b", command=["id", "-un"])["id"],
    }
    whom = {}
    for who, job_id in ids.items():
        done = wait_state(svc.client, job_id, {"finished", "failed"})
        assert done["state"] == "finished", done
        whom[who] = (svc.runs_dir / done["handle"] / "stdout.log").read_text().strip()
    assert whom == {"ml": "nobody", "admin": "daemon"}


@needs_root
def test_a_working_directory_the_job_user_cannot_enter_fails_the_job_in_one_line(local_service, tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    svc = local_service(job_users=_as_root_users("nobody"))
    job = svc.submit(name="cwd", command=["true"], cwd=str(private))
    done = wait_state(svc.client, job["id"], {"finished", "failed"})
    assert done["state"] == "failed" and done["exit_code"] == 126
    assert done["error"].startswith(f"working directory not accessible to user nobody: {private}"), done
    assert "\n" not in done["error"]


@needs_root
def test_a_callable_runs_as_the_job_user_in_a_child_process(tmp_path, monkeypatch):
    from gpualloc.service import runner

    src = str(Path(runner.__file__).parents[2])
    for python in (sys.executable, "/usr/bin/python3"):  # one nobody may run (not one in root's home)
        try:
            ok = subprocess.run([python, "-c", "import gpualloc.service.runner"], user="nobody", cwd="/",
                                env={"PYTHONPATH": src}, capture_output=True).returncode == 0
        except (PermissionError, FileNotFoundError):
            ok = False
        if ok:
            break
    else:
        pytest.skip("no Python here that nobody may run")
    monkeypatch.setattr(sys, "executable", python)
    env = {"PYTHONPATH": src, "MY_SECRET": "for-the-callable"}
    run = runner.Execution({"callable": "os:getuid", "user": "nobody", "cwd": "/", "env": env}, tmp_path / "run")
    run.start()
    assert run.wait() == {"exit_code": 0, "error": None, "result": pwd.getpwnam("nobody").pw_uid}
    run = runner.Execution({"callable": "os:getenv", "args": ["MY_SECRET"], "user": "nobody", "env": env},
                           tmp_path / "run")
    run.start()
    assert run.wait()["result"] == "for-the-callable"
    run = runner.Execution({"callable": "math:sqrt", "args": ["x"], "user": "nobody", "env": env}, tmp_path / "run")
    run.start()
    assert run.wait() == {"exit_code": 1, "error": "TypeError: must be real number, not str", "result": None}
    assert os.getuid() == 0 and "MY_SECRET" not in os.environ  # nothing ran in this process


def test_job_user_rules():
    me = pwd.getpwuid(os.geteuid()).pw_name
    with pytest.raises(Exception, match="no user 'no-such-user-x'"):
        plan_job_users(["no-such-user-x"], "local")
    with pytest.raises(Exception, match="expected USER or TEAM=USER"):
        plan_job_users(["bad team=root"], "local")
    if ROOT:
        with pytest.raises(Exception, match="serve runs as root and would run jobs as root"):
            plan_job_users([], "local")
        users, warnings = plan_job_users(["root"], "local")
        assert not users.switches and len(warnings) == 1 and "jobs run as root" in warnings[0]
        if _has_user("nobody"):
            users, warnings = plan_job_users(["nobody", "ml=daemon"], "local")
            assert warnings == [] and users.for_team("ml") == "daemon" and users.for_team("x") == "nobody"
            assert users.for_team(None) == "nobody"
            with pytest.raises(Exception, match="the ray backend runs jobs as root"):
                plan_job_users(["nobody"], "ray")
    else:
        users, warnings = plan_job_users([], "local")
        assert users.for_team("t") is None and f"jobs run as {me}, the service's own user" in warnings[0]


def test_a_service_that_cannot_switch_users_says_so_and_refuses_another_user(monkeypatch):
    from gpualloc.service import jobusers

    other = next((p for p in pwd.getpwall() if p.pw_uid not in (0, os.geteuid())), None)
    if other is None or not _has_user("nobody"):
        pytest.skip("needs a second user and nobody")
    monkeypatch.setattr(jobusers.os, "geteuid", lambda: other.pw_uid)
    monkeypatch.setattr(jobusers, "can_switch_users", lambda: False)
    users, warnings = plan_job_users([], "local")
    assert users.for_team("any") is None and warnings == [
        f"jobs run as {other.pw_name}, the service's own user: a job can read the store, the token and other "
        "jobs' files (run serve as root, or with CAP_SETUID, and --job-user to keep them out)"]
    assert plan_job_users([other.pw_name], "local")[0].switches is False  # naming itself is no switch
    with pytest.raises(Exception, match=f"{other.pw_name} cannot run jobs as another user"):
        plan_job_users(["nobody"], "local")


def test_serve_as_root_without_a_job_user_is_refused_in_one_line(tmp_path):
    if not ROOT:
        pytest.skip("the rule is for a service running as root")
    env = {k: v for k, v in os.environ.items() if k != "GPUALLOC_JOB_USER"}
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(tmp_path / "s" / "state.db"),
                          "--telemetry", "none"], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: serve runs as root") and "--job-user" in line
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------------------- secrets
def test_an_ended_jobs_secret_is_gone_from_the_store_files(local_service):
    svc = local_service(cluster="1xV100")
    store = Path(svc.config.store)
    files = [store, Path(f"{store}-wal"), Path(f"{store}-shm")]
    secret = "MY_SECRET_" + os.urandom(8).hex()
    job = svc.submit(name="s", command=["sleep", "1"], env={"MY_SECRET": secret})
    assert _scan(files, secret.encode()) != []  # the control: while the job may run, the store holds it
    done = wait_state(svc.client, job["id"], {"finished", "failed"})
    assert done["state"] == "finished" and done["spec"]["target"]["env"] == ["MY_SECRET"]
    wait_for(lambda: _scan(files, secret.encode()) == [], timeout_s=10, what="the secret to leave the store")
    assert secret not in (svc.runs_dir / done["handle"] / "spec.json").read_text()
    # and a retry of the same submission (same Idempotency-Key) still finds its job
    resp = svc.client.post("/jobs", json={"name": "s2", "command": ["true"], "env": {"K": "v"}},
                           headers={"Idempotency-Key": "k1"})
    first = wait_state(svc.client, resp.json()["id"], {"finished"})
    again = svc.client.post("/jobs", json={"name": "s2", "command": ["true"], "env": {"K": "v"}},
                            headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == first["id"], again.text


# ---------------------------------------------------------------------------------- device indices
@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["nvidia", "amd", "NVIDIA", "intel"]), min_size=1, max_size=64))
def test_host_indices_number_each_vendors_devices_from_zero(vendors):
    idx = host_device_indices(vendors)
    for vendor in {v.lower() for v in vendors}:
        mine = [i for i, v in zip(idx, vendors, strict=True) if v.lower() == vendor]
        assert mine == list(range(len(mine)))


def test_concurrent_jobs_never_share_a_visible_device_on_4xV100_plus_2xT4(local_service):
    """The issue's case: a T4 job (cluster devices 4,5) was given CUDA_VISIBLE_DEVICES=0,1, the same as a
    V100 job's. Every job records its devices and when it ran; no two overlapping runs share a device."""
    svc = local_service(cluster="4xV100+2xT4")
    script = ("import os, time; t0 = time.time(); time.sleep(0.4); "
              "print(os.environ['CUDA_VISIBLE_DEVICES'], t0, time.time())")
    shapes = [("V100", 2), ("T4", 2), ("V100", 2), ("T4", 1), ("V100", 1), ("V100", 3), ("T4", 1), (None, 1),
              ("V100", 4), ("T4", 2), (None, 2), ("V100", 1)]
    ids = []
    for i, (dtype, gpus) in enumerate(shapes):
        spec = {"name": f"d{i}", "command": [sys.executable, "-c", script], "num_gpus": gpus}
        if dtype:
            spec["device_type"] = dtype
        ids.append(svc.submit(**spec)["id"])
    runs = []
    for job_id in ids:
        done = wait_state(svc.client, job_id, {"finished", "failed"}, timeout_s=60)
        assert done["state"] == "finished", done
        visible, t0, t1 = (svc.runs_dir / done["handle"] / "stdout.log").read_text().split()
        devices = {int(d) for d in visible.split(",")}
        assert devices == set(done["gpus"]), done  # all NVIDIA: the host index is the cluster index
        assert devices <= ({4, 5} if done["device_type"] == "T4" else {0, 1, 2, 3}), done
        runs.append((devices, float(t0), float(t1)))
    clashes = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]
               if a[0] & b[0] and a[1] < b[2] and b[1] < a[2]]
    assert clashes == []


@pytest.mark.slow
def test_a_ray_started_on_this_host_numbers_devices_host_wide(local_service):
    """The service's own local Ray holds every node on this host, as the local backend does: a T4 job on
    4xV100+2xT4 sees devices 4,5 there too (a Ray joined with --ray-address keeps per-node indices)."""
    pytest.importorskip("ray")
    svc = local_service(backend="ray", cluster="4xV100+2xT4", ray_num_cpus=1)
    script = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUALLOC_RANK'])"
    job = svc.submit(name="t4", command=[sys.executable, "-c", script], device_type="T4", num_gpus=2)
    done = wait_state(svc.client, job["id"], {"finished", "failed"}, timeout_s=60)
    assert done["state"] == "finished", done
    assert svc.client.get(f"/jobs/{job['id']}/logs").content.decode().split() == ["4,5", "0"]


# ---------------------------------------------------------------------------------- planted files
def test_serve_refuses_planted_store_folders_and_files(tmp_path):
    from gpualloc.service.auth import check_store_files
    from gpualloc.service.errors import ServiceError

    for mode in (0o777, 0o1777, 0o775):
        folder = tmp_path / f"f{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        with pytest.raises(ServiceError, match="others may write to the folder"):
            check_store_files(folder / "state.db")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_bytes(b"")
    (mine / "state.db-wal").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ServiceError, match="symbolic link"):
        check_store_files(mine / "state.db")
    (mine / "state.db-wal").unlink()
    (mine / "state.db").write_bytes(b"")
    (mine / "state.db").chmod(0o644)
    check_store_files(mine / "state.db")
    assert stat.S_IMODE((mine / "state.db").stat().st_mode) == 0o600  # closed, not refused: it is ours
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(ServiceError, match="chmod 700"):
        check_store_files(open_folder / "state.db", private_folder=True)
    if ROOT and _has_user("nobody"):
        for suffix in ("", "-wal", "-shm", ".lock"):
            f = mine / f"planted.db{suffix}"
            f.write_bytes(b"")
            os.chown(f, pwd.getpwnam("nobody").pw_uid, -1)
            with pytest.raises(ServiceError, match="belongs to another user"):
                check_store_files(mine / "planted.db")
            f.unlink()


def test_serve_with_a_planted_store_folder_is_one_line_and_makes_nothing(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky, like /tmp: fine for a token elsewhere, not for a store
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(shared / "state.db"),
                          "--telemetry", "none"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert "others may write to the folder" in line and "chmod go-w" in line
    assert list(shared.iterdir()) == []


def test_the_default_store_is_in_the_users_state_folder(tmp_path):
    from gpualloc.service.auth import default_store, state_dir

    assert state_dir({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}) == Path("/x/state/gpualloc")
    assert state_dir({"XDG_STATE_HOME": "relative", "HOME": "/h"}) == Path("/h/.local/state/gpualloc")
    assert state_dir({"HOME": "/h"}) == Path("/h/.local/state/gpualloc")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    port = free_port()
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([*GPUALLOC, "serve", "--port", str(port), "--telemetry", "none", "--ready-file",
                             str(ready)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        folder = tmp_path / "state" / "gpualloc"
        wait_for(lambda: ready.exists() or proc.poll() is not None, timeout_s=60)
        assert proc.poll() is None
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / "service.db.token").stat().st_mode) == 0o600
        assert stat.S_IMODE((folder / "service.db").stat().st_mode) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert f"store{folder / 'service.db'}" in "".join(out.split())  # the banner may wrap
    assert default_store() == str(state_dir() / "service.db")


# ------------------------------------------------------------------------------------- readiness
def test_the_token_file_appears_whole_and_once(tmp_path):
    from gpualloc.service.auth import load_or_create_token

    path = tmp_path / "tok" / "state.db.token"
    results = []
    threads = [threading.Thread(target=lambda: results.append(load_or_create_token(path))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({tok for tok, _ in results}) == 1 and sum(created for _, created in results) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.db.token"]  # no temporary left
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_the_ready_file_appears_only_once_health_answers(tmp_path):
    ready = tmp_path / "ready.json"
    store = tmp_path / "s" / "state.db"
    port = free_port()
    proc = subprocess.Popen([*GPUALLOC, "serve", "--port", str(port), "--store", str(store), "--telemetry", "none",
                             "--ready-file", str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.01)
        # no retry here: the moment the file exists, the service answers
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert health.status_code == 200
        info = json.loads(ready.read_text())
        assert info == {"url": f"http://127.0.0.1:{port}", "pid": proc.pid, "token_file": f"{store}.token"}
        assert stat.S_IMODE(ready.stat().st_mode) == 0o600
        token = Path(info["token_file"]).read_text().strip()
        assert httpx.get(f"{info['url']}/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not ready.exists()  # removed when the service stops


@pytest.mark.skipif(not (ROOT and _has_user("nobody")), reason="needs root to plant a file as nobody")
def test_a_ready_file_another_user_planted_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky, like /tmp: allowed for a ready file, but not a planted one
    planted = shared / "ready.json"
    planted.write_text('{"url": "http://127.0.0.1:1", "pid": 1, "token_file": "/dev/null"}')
    os.chown(planted, pwd.getpwnam("nobody").pw_uid, -1)
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(tmp_path / "s" / "state.db"),
                          "--telemetry", "none", "--ready-file", str(planted)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert "--ready-file" in line and "not a file of yours" in line
    assert not (tmp_path / "s").exists()


def test_a_client_started_with_the_service_waits_for_it(tmp_path):
    """`gpualloc serve ... &` and at once a client call: the client retries a refused connection."""
    store = tmp_path / "s" / "state.db"
    port = free_port()
    proc = subprocess.Popen([*GPUALLOC, "serve", "--port", str(port), "--store", str(store), "--telemetry", "none"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from gpualloc.service.client import Client

        with Client(f"http://127.0.0.1:{port}") as c:  # sent at once: refused until the service listens
            assert c.health()["status"] == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


# ------------------------------------------------------------------------------------ token input
@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary-SECRET", "t\u00f6ken-SECRET\n".encode()])
def test_serve_with_a_bad_token_file_is_one_line(tmp_path, content):
    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    (folder / "state.db.token").write_bytes(content)
    (folder / "state.db.token").chmod(0o600)
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(folder / "state.db"),
                          "--telemetry", "none"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: ") and "SECRET" not in line and "not shown" in line, line
    assert re.search(r"Traceback", res.stderr) is None
