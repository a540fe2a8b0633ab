"""Fixtures of the service tests: in-process services (FastAPI TestClient), `gpualloc serve`
subprocesses on loopback, and cleanup of every job process they start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import warnings

import pytest

with warnings.catch_warnings():  # Starlette 1.x deprecates httpx-based test clients; it still works
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from gpualloc.service.app import Service, ServiceConfig, create_app

GPUALLOC = [sys.executable, "-m", "gpualloc.cli.main"]

if os.geteuid() == 0:
    # `gpualloc serve` as root refuses to start unless told whom jobs run as; these tests' jobs run in
    # root's private temporary folders, so as root (tests/service/test_isolation.py runs other users).
    os.environ.setdefault("GPUALLOC_JOB_USER", "root")


def kill_runs(runs_dir: Path) -> None:
    """SIGKILL the process group of every local run still alive under ``runs_dir``."""
    if not runs_dir.is_dir():
        return
    for pid_file in [*runs_dir.glob("*/runner.pid"), *runs_dir.glob("*/program.pid")]:
        try:
            pid = int(json.loads(pid_file.read_text())["pid"])
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def wait_for(predicate: Callable[[], object], timeout_s: float = 20.0, every_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_state(client: TestClient, job_id: int, states: set[str], timeout_s: float = 20.0) -> dict:
    def check():
        job = client.get(f"/jobs/{job_id}").json()
        return job if job["state"] in states else None

    return wait_for(check, timeout_s, what=f"job {job_id} in {states}")


BASE_URL = "http://127.0.0.1"
"""Where the TestClients say they are (the service checks the Host header against its address)."""


class LocalService:
    """An in-process service (local backend unless told): ``client`` sends the token, ``anon`` does
    not; ``headers`` are the auth headers."""

    def __init__(self, tmp: Path, **config) -> None:
        config.setdefault("telemetry", "none")
        config.setdefault("tick_s", 0.05)
        config.setdefault("backend", "local")
        self.config = ServiceConfig(store=str(tmp / "state.db"), **config)
        self.service = Service(self.config)
        self.app = create_app(self.service)
        self.client = TestClient(self.app, base_url=BASE_URL)
        self.client.__enter__()  # opens the service, which makes the token
        self.headers = {"Authorization": f"Bearer {self.service.token}"}
        self.client.headers.update(self.headers)
        self.anon = TestClient(self.app, base_url=BASE_URL)  # never entered: the service is opened once
        self.runs_dir = tmp / "state.db.runs"

    def submit(self, **spec) -> dict:
        resp = self.client.post("/jobs", json=spec, headers=self.headers)
        assert resp.status_code in (200, 201), resp.text
        return resp.json()

    def close(self) -> None:
        try:
            self.client.__exit__(None, None, None)
        finally:
            kill_runs(self.runs_dir)


@pytest.fixture
def local_service(tmp_path) -> Iterator[Callable[..., LocalService]]:
    """Factory of in-process local-backend services; all closed and their runs killed afterwards."""
    made: list[LocalService] = []

    def make(**config) -> LocalService:
        svc = LocalService(tmp_path, **config)
        made.append(svc)
        return svc

    yield make
    for svc in reversed(made):
        svc.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``gpualloc serve`` in a subprocess on 127.0.0.1."""

    def __init__(self, tmp: Path, *extra: str, backend: str = "local", cluster: str = "adlro16") -> None:
        self.tmp, self.extra, self.backend, self.cluster = tmp, extra, backend, cluster
        self.store = tmp / "state.db"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "serve.log"

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        from gpualloc.service.client import Client

        cmd = [*GPUALLOC, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--backend", self.backend,
               "--store", str(self.store), "--cluster", self.cluster, "--telemetry", "none", "--tick", "0.05",
               *self.extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        with Client(self.url) as c:
            deadline = time.monotonic() + timeout_s
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"gpualloc serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
                try:
                    if c.health().get("status") == "ok":
                        return self
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"gpualloc serve not healthy in {timeout_s} s:\n{self.log.read_text()}")
                time.sleep(0.1)

    @property
    def token(self) -> str:
        return (self.tmp / "state.db.token").read_text().strip()

    def kill9(self) -> None:
        """SIGKILL the service process only (its job runners live on, as after a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def server(tmp_path) -> Iterator[Callable[..., ServerProcess]]:
    """Factory of ``gpualloc serve`` subprocesses; all stopped (and their job processes killed) afterwards."""
    made: list[ServerProcess] = []

    def make(*extra: str, backend: str = "local", cluster: str = "adlro16") -> ServerProcess:
        srv = ServerProcess(tmp_path, *extra, backend=backend, cluster=cluster)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()
    kill_runs(tmp_path / "state.db.runs")
