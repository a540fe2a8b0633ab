"""The service's defences: the Host check (DNS rebinding), owner-only run folders, agents only from
the agents folder, docs off by default, and a port in use refused before anything is printed."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess

import pytest

from gpualloc.service.app import HostCheck, bundled_agents_dir
from tests.service.conftest import GPUALLOC, wait_state


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ------------------------------------------------------------------------------------ Host header
def test_forged_host_header_is_refused_before_the_token_is_checked(local_service):
    svc = local_service()
    c = svc.client  # sends the token: a rebinding page would not have it, but the Host check comes first
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example", "localhost.evil.example",
                 "[::2]", "", "127.0.0.1:notaport", "[::1"):
        for path in ("/health", "/jobs", "/openapi.json"):
            resp = c.get(path, headers={"Host": host})
            assert resp.status_code == 400 and "Host header" in resp.json()["detail"], (host, path)
    for host in ("127.0.0.1", "localhost", "LOCALHOST:8765", "[::1]", "[::1]:8765", "127.0.0.1:1"):
        assert c.get("/jobs", headers={"Host": host}).status_code == 200, host


@pytest.mark.parametrize("bind, port, ok, refused", [
    ("127.0.0.1", 8765, ["127.0.0.1:8765", "localhost:8765", "localhost", "[::1]:8765", "127.0.0.1"],
     ["127.0.0.1:8766", "evil.example:8765", "10.0.0.1:8765"]),
    ("::1", 9000, ["[::1]:9000", "localhost:9000", "127.0.0.1"], ["[::1]:9001", "[::2]:9000", "evil.example"]),
    ("10.1.2.3", 80, ["10.1.2.3", "10.1.2.3:80"], ["localhost", "127.0.0.1:80", "10.1.2.4", "evil.example"]),
    ("0.0.0.0", 80, ["10.1.2.3:80", "localhost", "[fe80::1]", socket.gethostname()],
     ["evil.example:80", "10.1.2.3:81"]),
])
def test_host_check_accepts_the_bound_address_and_loopback_names(bind, port, ok, refused):
    check = HostCheck(None, bind, port)
    assert [h for h in ok if not check.allows(h)] == []
    assert [h for h in refused if check.allows(h)] == []


def test_extra_allowed_host_names():
    check = HostCheck(None, "10.1.2.3", 80, allowed=("gpu-box.lab",))
    assert check.allows("gpu-box.lab:80") and check.allows("GPU-BOX.lab") and not check.allows("other.lab")


# ----------------------------------------------------------------------------------- file modes
def test_run_folders_are_0700_and_their_files_0600(local_service):
    svc = local_service()
    job = svc.submit(name="m", command="echo hi")
    done = wait_state(svc.client, job["id"], {"finished", "failed"})
    assert done["state"] == "finished"
    run = svc.runs_dir / done["handle"]
    assert _mode(svc.runs_dir) == 0o700 and _mode(run) == 0o700
    files = {p.name: _mode(p) for p in run.iterdir()}
    assert {"spec.json", "stdout.log", "stderr.log", "exit.json", "runner.pid", "runner.log"} <= set(files)
    assert {name: m for name, m in files.items() if m != 0o600} == {}


def test_an_old_world_readable_runs_folder_is_closed(tmp_path):
    from gpualloc.service.backends import LocalBackend

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    os.chmod(runs, 0o755)
    LocalBackend(runs)
    assert _mode(runs) == 0o700


# --------------------------------------------------------------------------------------- agents
def test_policy_agents_only_from_the_agents_folder(local_service, tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    shutil.copy(bundled_agents_dir() / "sched-experts.pt", agents / "mine.pt")
    outside = tmp_path / "outside.pt"
    shutil.copy(bundled_agents_dir() / "sched-experts.pt", outside)
    (agents / "link.pt").symlink_to(outside)
    svc = local_service(agents_dir=str(agents))

    def put(agent):
        return svc.client.put("/policy", json={"name": "dqn", "options": {"agent": agent}})

    bundled = str(bundled_agents_dir() / "sched-experts.pt")
    for agent in (str(outside), "../outside.pt", "link.pt", "missing.pt", bundled,
                  "", ".", 7, ["mine.pt"], "/etc/passwd"):
        resp = put(agent)
        assert resp.status_code == 422, (agent, resp.text)
        assert "options.agent" in resp.text, resp.text
    assert svc.client.get("/policy").json()["name"] == "fcfs"  # nothing was loaded
    resp = put("mine.pt")
    assert resp.status_code == 200, resp.text
    assert resp.json()["name"] == "dqn" and resp.json()["options"]["agent"] == str((agents / "mine.pt").resolve())


def test_default_agents_folder_is_the_bundled_one(local_service):
    svc = local_service()
    assert svc.service.agents_dir == bundled_agents_dir()
    assert (bundled_agents_dir() / "sched-experts.pt").is_file()
    resp = svc.client.put("/policy", json={"name": "dqn", "options": {"agent": os.devnull}})
    assert resp.status_code == 422 and "options.agent" in resp.text


# ----------------------------------------------------------------------------------------- docs
def test_docs_are_off_by_default(local_service):
    svc = local_service()
    assert svc.anon.get("/docs").status_code == 401 and svc.anon.get("/redoc").status_code == 401
    assert svc.client.get("/docs").status_code == 404 and svc.client.get("/redoc").status_code == 404


def test_docs_on_request_carry_the_schema_and_the_schema_still_needs_the_token(local_service):
    svc = local_service(docs=True)
    swagger, redoc = svc.anon.get("/docs"), svc.anon.get("/redoc")
    assert swagger.status_code == 200 and "swagger-ui" in swagger.text and '"spec"' in swagger.text
    assert redoc.status_code == 200 and "Redoc.init(" in redoc.text and "/jobs/{job_id}/logs" in redoc.text
    assert svc.anon.get("/openapi.json").status_code == 401
    assert svc.anon.get("/jobs").status_code == 401


# ------------------------------------------------------------------------------------------ port
def test_serve_on_a_port_in_use_fails_before_printing_or_making_a_token(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        store = tmp_path / "state.db"
        res = subprocess.run([*GPUALLOC, "serve", "--port", str(port), "--store", str(store), "--telemetry", "none"],
                             capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: port {port} is in use"]
    assert not (tmp_path / "state.db.token").exists() and not store.exists()


@pytest.mark.parametrize("policy", ["bogus", "mymod:MyPolicy"])
def test_serve_with_an_unknown_policy_fails_before_making_a_store_or_a_token(tmp_path, policy):
    store = tmp_path / "state.db"
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(store), "--policy", policy,
                          "--telemetry", "none"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    assert res.stdout == ""
    from gpualloc.scheduling.policies import POLICIES

    known = ", ".join(sorted(POLICIES))
    assert res.stderr.strip().splitlines() == [f"error: unknown policy '{policy}' (known: {known})"]
    assert list(tmp_path.iterdir()) == []


def test_a_stored_policy_with_an_agent_outside_the_folder_is_not_loaded(tmp_path):
    import json

    from gpualloc.service.app import Service, ServiceConfig
    from gpualloc.service.errors import ServiceError
    from gpualloc.service.store import Store

    store = Store(tmp_path / "state.db")
    store.set_meta("policy", json.dumps({"name": "dqn", "options": {"agent": str(tmp_path / "evil.pt")}}))
    store.close()
    with pytest.raises(ServiceError, match="options.agent"):
        Service(ServiceConfig(store=str(tmp_path / "state.db"), telemetry="none")).open()


def test_runs_folder_that_cannot_be_made_is_one_error(tmp_path):
    from gpualloc.service.backends import LocalBackend
    from gpualloc.service.errors import BackendError

    (tmp_path / "file").write_text("x")
    with pytest.raises(BackendError, match="runs folder"):
        LocalBackend(tmp_path / "file" / "runs")


# ------------------------------------------------------------------------------------------ issue 35: attacks
def test_a_token_planted_in_a_folder_others_can_write_to_is_refused(tmp_path):
    """Another local user makes the store's folder first, world-writable without a sticky bit, and plants a
    0600 token there: ``serve`` refuses the folder instead of adopting the token."""
    shared = tmp_path / "gpualloc"
    shared.mkdir()
    shared.chmod(0o777)
    planted = shared / "state.db.token"
    planted.write_text("planted-by-someone-else\n")
    planted.chmod(0o600)
    res = subprocess.run([*GPUALLOC, "serve", "--port", "0", "--store", str(shared / "state.db"),
                          "--telemetry", "none"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    (line,) = res.stderr.strip().splitlines()
    assert "others may write to the folder" in line and "planted-by-someone-else" not in line
    assert not (shared / "state.db").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_token_or_folder_another_user_owns_is_refused(tmp_path):
    from gpualloc.service.auth import load_or_create_token, read_token
    from gpualloc.service.errors import ServiceError

    theirs = tmp_path / "theirs.token"
    theirs.write_text("their-token\n")
    theirs.chmod(0o600)
    os.chown(theirs, 65534, 65534)  # nobody
    with pytest.raises(ServiceError, match="belongs to another user"):
        read_token(theirs)
    folder = tmp_path / "their-folder"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)
    with pytest.raises(ServiceError, match="folder belongs to another user"):
        load_or_create_token(folder / "state.db.token")


def test_tokens_are_never_echoed_and_bad_ones_are_one_line(tmp_path):
    binary = tmp_path / "binary.token"
    binary.write_bytes(b"\xff\xfe\x00secret")
    binary.chmod(0o600)
    for args in (["--token-file", str(binary)], ["--token", "bad\ntoken-SECRET"], ["--token", "tökenSECRET"]):
        res = subprocess.run([*GPUALLOC, "jobs", "--server", "http://127.0.0.1:9", *args],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res
        (line,) = res.stderr.strip().splitlines()
        assert "SECRET" not in line and "secret" not in line and "not shown" in line


def test_jobs_start_without_the_services_environment(tmp_path, monkeypatch):
    """A job's process sees a short, documented list of the service's variables, never its token or its
    shell's secrets; the submission's own variables come on top."""
    import json
    import sys

    from gpualloc.service.runner import JOB_ENV_PASSED, JOB_ENV_PREFIXES, Execution

    monkeypatch.setenv("GPUALLOC_TOKEN", "the-service-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a-cloud-key")
    script = "import json, os; print(json.dumps(dict(os.environ)))"
    run = Execution({"argv": [sys.executable, "-c", script], "env": {"MINE": "1"}}, tmp_path / "run")
    run.start()
    assert run.wait()["exit_code"] == 0
    seen = json.loads((tmp_path / "run" / "stdout.log").read_text())
    assert "GPUALLOC_TOKEN" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen and seen["MINE"] == "1"
    shell = {"MINE", "PWD", "SHLVL", "_"}
    assert all(k in JOB_ENV_PASSED or k.startswith(JOB_ENV_PREFIXES) or k in shell for k in seen)


def test_job_names_with_bidi_overrides_are_refused():
    from pydantic import ValidationError

    from gpualloc.service.models import JobSpec

    with pytest.raises(ValidationError):
        JobSpec(name="invoice\u202egpj.exe", command="true")
    assert JobSpec(name="résumé-2 (v1)", command="true").name == "résumé-2 (v1)"
