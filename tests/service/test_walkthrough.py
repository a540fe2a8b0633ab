"""The README's service walkthrough as a user runs it, and what it needs: ``--cwd`` (default: the
submitter's folder, checked by the service), ``GET /jobs/{id}/logs`` and ``gpualloc logs``, and
paging of ``GET /jobs``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpualloc.service.client import Client, ClientError
from gpualloc.service.runner import Execution
from tests.service.conftest import GPUALLOC, wait_for, wait_state

TRAIN_PY = """\
import sys
print("hello from a job")
print(open("data.txt").read().strip())  # relative: only found in the submitter's folder
print("a warning", file=sys.stderr)
"""


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUALLOC, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_readme_walkthrough(server, tmp_path, monkeypatch):
    # `python` on PATH is this interpreter, as in an activated venv
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    srv = server(cluster="4xV100+2xT4").start()
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN_PY)
    (project / "data.txt").write_text("data from the project folder\n")
    env = {**os.environ, "GPUALLOC_SERVER": srv.url, "GPUALLOC_TOKEN": srv.token}

    sub = _cli("submit", "--name", "hello", "--gpus", "1", "--command", "python train.py", cwd=project, env=env)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.strip() == "job 1 queued: hello"
    listed = _cli("jobs", cwd=project, env=env)
    assert listed.returncode == 0 and "hello" in listed.stdout, listed.stderr
    out = _cli("logs", "1", "--follow", cwd=project, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello from a job\ndata from the project folder\n"
    err = _cli("logs", "1", "--stderr", cwd=project, env=env)
    assert err.returncode == 0 and err.stdout == "a warning\n"
    with Client(srv.url, srv.token) as c:
        job = c.job(1)
    assert (job["state"], job["exit_code"], job["spec"]["target"]["cwd"]) == ("finished", 0, str(project))
    # issue 36: each job carries its predicted remaining time (null once it has ended)
    as_json = _cli("jobs", "--json", cwd=project, env=env)
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    assert [j["id"] for j in listed] == [1] and listed[0]["spec"]["time_limit_s"] is None
    for field in ("predicted_remaining_s", "predicted_remaining_lo_s", "predicted_remaining_hi_s",
                  "prediction_interval", "prediction_stage"):
        assert field in listed[0] and listed[0][field] is None
    # logs of a job that does not exist: one line, exit 2
    missing = _cli("logs", "99", cwd=project, env=env)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "no job 99" in missing.stderr


def test_cwd_must_be_an_existing_directory(local_service, tmp_path):
    svc = local_service()
    for cwd in (str(tmp_path / "nope"), str(tmp_path / "file.txt")):
        (tmp_path / "file.txt").write_text("x")
        resp = svc.client.post("/jobs", json={"name": "x", "command": "true", "cwd": cwd})
        assert resp.status_code == 422, resp.text
        detail = resp.json()["detail"][0]
        assert detail["loc"][-1] == "cwd" and "not an existing directory" in detail["msg"]


def test_a_cwd_removed_before_the_start_is_reported_as_such(tmp_path):
    gone = tmp_path / "gone"
    for target in ({"argv": ["true"]}, {"argv": ["/nonexistent/program"]}, {"callable": "math:sqrt", "args": [4]}):
        run = Execution({**target, "cwd": str(gone)}, tmp_path / "logs")
        run.start()
        outcome = run.wait()
        assert outcome["exit_code"] == 126 and outcome["error"] == f"working directory not found: {gone}", outcome
        assert "command not found" not in outcome["error"]


def test_logs_endpoint_reads_from_an_offset(local_service):
    svc = local_service(cluster="1xT4")
    c = svc.client
    script = "import sys; sys.stdout.write('0123456789'); sys.stderr.write('err')"
    job = svc.submit(name="out", command=[sys.executable, "-c", script])
    blocker = svc.submit(name="wait", command="sleep 30")
    queued = svc.submit(name="queued", command="true")
    wait_state(c, job["id"], {"finished"})
    resp = c.get(f"/jobs/{job['id']}/logs")
    assert resp.status_code == 200 and resp.content == b"0123456789"
    assert resp.headers["X-Next-Offset"] == "10" and resp.headers["X-Log-Size"] == "10"
    assert resp.headers["X-Job-State"] == "finished" and resp.headers["X-Job-Attempt"] == "1"
    part = c.get(f"/jobs/{job['id']}/logs", params={"offset": 4, "limit": 3})
    assert part.content == b"456" and part.headers["X-Next-Offset"] == "7"
    assert c.get(f"/jobs/{job['id']}/logs", params={"offset": 50}).content == b""
    far = c.get(f"/jobs/{job['id']}/logs", params={"offset": 2**62})  # beyond what a file system can seek to
    assert far.status_code == 200 and far.content == b"" and far.headers["X-Next-Offset"] == str(2**62)
    assert c.get(f"/jobs/{job['id']}/logs", params={"stream": "stderr"}).content == b"err"
    assert c.get(f"/jobs/{job['id']}/logs", params={"stream": "spec"}).status_code == 422
    assert c.get("/jobs/999/logs").status_code == 404
    wait_state(c, blocker["id"], {"running"})
    early = c.get(f"/jobs/{queued['id']}/logs")  # not started: empty, and says so
    assert early.content == b"" and early.headers["X-Job-State"] == "queued"


def test_client_follows_a_running_job_until_it_ends(local_service):
    svc = local_service()
    script = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.3)"
    job = svc.submit(name="slow", command=[sys.executable, "-c", script])
    wait_state(svc.client, job["id"], {"running", "finished"})
    client = Client("http://127.0.0.1")
    client._http = svc.client  # the in-process app, with the token
    pieces = list(client.follow_logs(job["id"], poll_s=0.05))
    assert b"".join(pieces) == b"0\n1\n2\n"
    assert svc.client.get(f"/jobs/{job['id']}").json()["state"] == "finished"


def test_jobs_are_paged_with_a_cursor(local_service):
    svc = local_service(cluster="1xT4")
    c = svc.client
    blocker = svc.submit(name="b", command="sleep 30")
    ids = [blocker["id"]] + [svc.submit(name=f"j{i}", command="true")["id"] for i in range(4)]
    first = c.get("/jobs", params={"limit": 2})
    assert [j["id"] for j in first.json()] == ids[:2] and "X-Next-Cursor" in first.headers
    second = c.get("/jobs", params={"limit": 2, "cursor": first.headers["X-Next-Cursor"]})
    assert [j["id"] for j in second.json()] == ids[2:4]
    last = c.get("/jobs", params={"limit": 2, "cursor": second.headers["X-Next-Cursor"]})
    assert [j["id"] for j in last.json()] == ids[4:] and "X-Next-Cursor" not in last.headers
    exact = c.get("/jobs", params={"limit": 5})
    assert len(exact.json()) == 5 and "X-Next-Cursor" not in exact.headers  # no empty last page
    queued = c.get("/jobs", params={"limit": 1, "state": "queued"})
    nxt = c.get("/jobs", params={"limit": 10, "state": "queued", "cursor": queued.headers["X-Next-Cursor"]})
    assert [j["id"] for j in queued.json() + nxt.json()] == ids[1:]
    for bad in ("abc", "YWZ0ZXI6eA", "!!"):
        resp = c.get("/jobs", params={"cursor": bad})
        assert resp.status_code == 422 and resp.json()["detail"].startswith("cursor:"), resp.text
    client = Client("http://127.0.0.1")
    client._http = c
    assert [j["id"] for j in client.jobs(page=2)] == ids
    assert [j["id"] for j in client.jobs(["queued"], page=3)] == ids[1:]
    wait_for(lambda: c.post(f"/jobs/{blocker['id']}/cancel").status_code == 200, what="cancel")


def test_no_service_running_is_one_line_saying_so(tmp_path):
    """`gpualloc jobs` before `gpualloc serve`: exit 2, one line naming the URL and what to do."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GPUALLOC_TOKEN": "x", "GPUALLOC_SERVER": f"http://127.0.0.1:{port}"}
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "jobs"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: http://127.0.0.1:{port}: no service answers"), proc.stderr
    assert "gpualloc serve" in lines[0]


# ------------------------------------------------------------------------------ two teams with quotas
TEAMS_WALKTHROUGH = """\
gpualloc user add ana --team vision --token-file ana.token   # a 0600 file: tokens are never printed
gpualloc user add ned --team nlp --token-file ned.token
gpualloc serve --cluster 4xV100+2xT4 --quotas examples/quotas.toml &   # state in ~/.local/state/gpualloc
printf 'import time\\nprint("hello from a job")\\ntime.sleep(20)\\n' > train.py
gpualloc submit --name big --gpus 4 --gpu-type V100 --command "python train.py" --token-file ned.token  # borrows
gpualloc submit --name mine --gpus 2 --gpu-type V100 --command "python train.py" --token-file ana.token  # reclaims
gpualloc jobs --token-file ned.token   # nlp's jobs only: big is back in the queue
"""
"""The README's two-team walkthrough, until the README's service block holds it (then that is run)."""

README = Path(__file__).resolve().parents[2] / "README.md"


def teams_walkthrough() -> str:
    """The README's bash block that adds users and starts the service with quotas, else
    :data:`TEAMS_WALKTHROUGH`."""
    import re

    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        if "gpualloc user add" in block and "--quotas" in block and "gpualloc serve" in block:
            return block
    return TEAMS_WALKTHROUGH


@pytest.mark.slow
def test_two_teams_with_quotas_walkthrough(tmp_path):
    """The walkthrough's lines run as written, in a bash shell, in a fresh folder holding
    ``examples/quotas.toml``; only ``--port`` is added to ``serve`` (a free port, named by
    ``GPUALLOC_SERVER``)."""
    import shutil
    import signal

    from tests.service.conftest import free_port, kill_runs

    root = Path(__file__).resolve().parents[2]
    work = tmp_path / "work"
    (work / "examples").mkdir(parents=True)
    shutil.copy(root / "examples" / "quotas.toml", work / "examples" / "quotas.toml")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    lines = []
    for line in teams_walkthrough().splitlines():
        if line.startswith("gpualloc serve"):
            line = line.replace("gpualloc serve", f"gpualloc serve --port {port} --telemetry none --tick 0.05", 1)
        lines.append(line)
    script = "set -e\n" + "\n".join(lines) + '\necho "$!" > serve.pid\n'
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k not in ("GPUALLOC_TOKEN", "GPUALLOC_SERVER")}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", HOME=str(tmp_path / "home"),
               XDG_STATE_HOME=str(tmp_path / "state"), GPUALLOC_SERVER=url, COLUMNS="120")
    state = tmp_path / "state" / "gpualloc"
    try:
        # to files, not pipes: the service started with `&` keeps them open after the shell exits
        with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
            code = subprocess.run(["bash", "-c", script], cwd=work, env=env, stdout=out, stderr=err,
                                  timeout=180).returncode
        run = subprocess.CompletedProcess([], code, (tmp_path / "out.txt").read_text(),
                                          (tmp_path / "err.txt").read_text())
        assert run.returncode == 0, run.stdout + run.stderr
        tokens = {n: (work / f"{n}.token").read_text().strip() for n in ("ana", "ned")}
        for tok in tokens.values():
            assert tok not in run.stdout + run.stderr
        assert "big" in run.stdout and "mine" not in run.stdout.split("job 2 queued: mine")[-1]
        with Client(url, tokens["ned"]) as ned, Client(url, tokens["ana"]) as ana:
            assert [j["name"] for j in ned.jobs()] == ["big"]
            assert [j["name"] for j in ana.jobs()] == ["mine"]
            mine = ana.jobs()[0]
            assert (mine["user"], mine["team"]) == ("ana", "vision")
            # vision's quota of 3 V100s: its 2-GPU job runs, and nlp's borrowed job went back to the queue
            wait_for(lambda: ana.job(mine["id"])["state"] in ("running", "finished"), 30, what="ana's job to start")
            assert ana.job(mine["id"])["device_type"] == "V100-16GB"
            borrowed = ned.jobs()[0]
            assert borrowed["requeues"] >= 1 or borrowed["state"] == "queued", borrowed
            try:  # another team's job: not found, as a job that does not exist
                ned.job(mine["id"])
                raise AssertionError("ned read ana's job")
            except ClientError as err:
                assert err.status == 404
        admin_token = (state / "service.db.token").read_text().strip()
        with Client(url, admin_token) as admin:
            assert sorted(j["name"] for j in admin.jobs()) == ["big", "mine"]
    finally:
        pid_file = work / "serve.pid"
        if pid_file.exists() and pid_file.read_text().strip():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
            wait_for(lambda: not _alive(int(pid_file.read_text())), 30, what="serve to stop")
        kill_runs(state / "service.db.runs")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of this test's shell is gone for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False
