"""Execution backends: where a job attempt runs once the scheduler has recorded its GPUs.

One interface (:class:`Backend`), two backends, by name in :data:`BACKENDS`:

* ``local``: a runner process on this host per attempt (:mod:`gpualloc.service.runner`, which runs
  the job's argv without a shell), forked by one ``python -m gpualloc.service.runner --fork-server FD``
  started with the backend (a fresh interpreter per job cost ~50 ms of CPU each). Runs outlive
  the service; their folder holds the exit status, so a restarted service finds what ended while it
  was down.
* ``ray``: detached, named Ray actors (one per node of the allocation) holding custom resources per
  device type (``{"gpu_V100": 2}``), in a placement group that reserves the whole gang at once.
  Ray is started locally with the cluster's device types as virtual resources, or joined at
  ``address``. The actors' names carry the store's id, the job and the attempt, so a restarted
  service finds them; an actor whose worker or node died is reported ``gone``.

The scheduler speaks to a backend in :class:`RunRef` (job, attempt, handle) and gets
:class:`RunState` back; nothing in the scheduler knows which backend it has.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from gpualloc._extras import require
from gpualloc.registry import Registry
from gpualloc.service.errors import BackendError
from gpualloc.service.jobusers import JobUsers
from gpualloc.service.runner import (EXIT_FILE, LOG_FILES, PID_FILE, PROGRAM_PID_FILE, SPEC_FILE, Execution,
                                     private_dir, proc_start_time, write_json_atomic)

log = logging.getLogger(__name__)
"""Best-effort Ray clean-ups that fail are logged here, not raised: the run is over either way."""

__all__ = ["BACKENDS", "Backend", "LocalBackend", "RayBackend", "RunRef", "RunRequest", "RunState", "RunStatus",
           "host_device_indices", "make_backend", "ray_resource_name"]


@dataclass(frozen=True)
class RunRequest:
    """One attempt to launch.

    Attributes:
        job_id, attempt, name: which job, which try (1, 2, ...), its label.
        target: ``{"argv": [...]}`` or ``{"callable", "args", "kwargs"}``, with ``env`` and ``cwd``.
        device_type: canonical device type name.
        vendor: the type's vendor (``"nvidia"``, ``"amd"``), for the visible-devices variable.
        resource: the Ray resource of the type (``"gpu_V100"``).
        gpus: cluster device indices.
        groups: ``(node index, local device indices on that node)`` per node of the allocation.
        team: the submitter's team (None: none recorded): picks the user the job runs as
            (:class:`~gpualloc.service.jobusers.JobUsers`).
    """

    job_id: int
    attempt: int
    name: str
    target: dict[str, Any]
    device_type: str
    vendor: str
    resource: str
    gpus: tuple[int, ...]
    groups: tuple[tuple[int, tuple[int, ...]], ...]
    team: str | None = None


@dataclass(frozen=True)
class RunRef:
    """A launched attempt: the job, the attempt and the backend's handle."""

    job_id: int
    attempt: int
    handle: str

    @property
    def key(self) -> tuple[int, int]:
        return self.job_id, self.attempt


class RunStatus(str, Enum):
    RUNNING = "running"  # launched and not known to have ended (possibly still starting)
    EXITED = "exited"  # ended by itself: see exit_code / error
    GONE = "gone"  # the backend lost it (runner killed, Ray worker or node died): no outcome


@dataclass(frozen=True)
class RunState:
    status: RunStatus
    exit_code: int | None = None
    error: str | None = None
    result: Any = None


class Backend(Protocol):
    """Runs job attempts. Every method may be called from one scheduler thread only."""

    name: str

    def handle(self, job_id: int, attempt: int, n_groups: int) -> str:
        """The handle :meth:`launch` gives this attempt (deterministic: a restart can find it)."""
        ...

    def launch(self, req: RunRequest) -> str:
        """Start the attempt without waiting for it; its handle. Raises :class:`BackendError`."""
        ...

    def poll(self, runs: Sequence[RunRef]) -> dict[tuple[int, int], RunState]:
        """The state of each run (also of runs launched by an earlier service process)."""
        ...

    def stop(self, run: RunRef) -> None:
        """Stop a run (SIGTERM, then SIGKILL) and release what it holds; idempotent."""
        ...

    def release(self, run: RunRef) -> None:
        """Free what an ended run still holds (actors, placement group); idempotent."""
        ...

    def cleanup(self, keep: Sequence[RunRef]) -> list[str]:
        """Stop runs of this store that are not in ``keep`` (left by a crash); their handles."""
        ...

    def capacity(self) -> dict[str, int] | None:
        """Usable devices per device type name as the backend sees them (None: all of the cluster)."""
        ...

    def log_path(self, handle: str, stream: str) -> Path | None:
        """The file holding a run's ``stream`` (``"stdout"`` or ``"stderr"``; rank 0 of a multi-node
        run) on this host, or None when the backend keeps no logs here."""
        ...

    def describe(self) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...


def visible_devices_env(vendor: str, local: Sequence[int], *, host_wide: bool = False) -> dict[str, str]:
    """The variables that restrict a program to its GPUs (by index on the node). ``host_wide``: the
    indices number the GPUs of one host holding every node, and NVIDIA jobs get
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers them as ``nvidia-smi`` does."""
    ids = ",".join(str(i) for i in local)
    if vendor.lower() == "amd":
        return {"ROCR_VISIBLE_DEVICES": ids, "HIP_VISIBLE_DEVICES": ids}
    return {"CUDA_VISIBLE_DEVICES": ids, **({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if host_wide else {})}


def host_device_indices(vendors: Sequence[str]) -> tuple[int, ...]:
    """The index each cluster device has on one host that holds them all: its position among the
    devices of its vendor, in cluster order (CUDA numbers the NVIDIA GPUs of a host, ROCm the AMD ones).

    Args:
        vendors: the vendor of each cluster device, in cluster device order.
    """
    seen: dict[str, int] = {}
    out = []
    for vendor in vendors:
        key = vendor.lower()
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return tuple(out)


def rank_target(req: RunRequest, rank: int) -> dict[str, Any]:
    """The target of one rank (one node group) with its environment: the job's ``env`` plus
    ``GPUALLOC_*`` (job, attempt, device type, GPUs, rank, world size) and the visible devices."""
    node, local = req.groups[rank]
    env = {**req.target.get("env", {}),
           "GPUALLOC_JOB_ID": str(req.job_id), "GPUALLOC_ATTEMPT": str(req.attempt), "GPUALLOC_JOB_NAME": req.name,
           "GPUALLOC_DEVICE_TYPE": req.device_type, "GPUALLOC_GPUS": ",".join(map(str, req.gpus)),
           "GPUALLOC_NODE": str(node), "GPUALLOC_RANK": str(rank), "GPUALLOC_WORLD_SIZE": str(len(req.groups)),
           **visible_devices_env(req.vendor, local)}
    return {**req.target, "env": env}


# ------------------------------------------------------------------------------------------ local
def read_exit(run_dir: Path) -> dict[str, Any] | None:
    """The outcome the job runner wrote in ``run_dir`` (``exit.json``), or None while it has not."""
    try:
        return json.loads((run_dir / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None


class LocalBackend:
    """Job attempts as processes on this host, one run folder each under ``runs_dir``.

    Every node of the cluster is on this one host, so a job's visible devices are numbered host-wide
    (``host_indices``): on ``4xV100+2xT4`` the T4s are CUDA devices 4 and 5, never 0 and 1 again, and
    NVIDIA jobs get ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers the GPUs as ``nvidia-smi`` does.

    The runner gets the job's target, with its ``env`` values, on its standard input (an unlinked
    file); ``spec.json`` keeps the variable names only. With ``job_users``, the program runs as the
    user named for the job's team; the runner, the run folder and the logs stay the service's.

    Args:
        runs_dir: where run folders go (``<job>-<attempt>/``: spec, logs, exit status).
        python: the interpreter that runs :mod:`gpualloc.service.runner`.
        stop_grace_s: seconds between SIGTERM and SIGKILL when stopping.
        host_indices: each cluster device's index on this host (:func:`host_device_indices`; default:
            the cluster index).
        job_users: who jobs run as (default: the service's user).
    """

    name = "local"

    def __init__(self, runs_dir: str | Path, *, python: str = sys.executable, stop_grace_s: float = 5.0,
                 host_indices: Sequence[int] | None = None, job_users: JobUsers | None = None) -> None:
        try:
            self.runs_dir = private_dir(Path(runs_dir))
            if stat.S_IMODE(self.runs_dir.stat().st_mode) & 0o077:
                # Made 0755 by earlier versions: the runs' output and environment are the owner's alone.
                log.warning("local: %s was open to group or others; setting it to mode 0700", self.runs_dir)
                self.runs_dir.chmod(0o700)
        except OSError as err:
            raise BackendError(f"local: runs folder {runs_dir}: {err.strerror}") from err
        self.python = python
        self.stop_grace_s = float(stop_grace_s)
        self.host_indices = None if host_indices is None else tuple(int(i) for i in host_indices)
        self.job_users = job_users or JobUsers()
        self._forks: subprocess.Popen | None = None  # the fork server (runner.fork_server) and its socket
        self._forks_sock: socket.socket | None = None
        self._forks_lock = threading.Lock()
        try:
            with self._forks_lock:  # now, not at the first job's start: it costs a Python start-up
                self._fork_server()
        except OSError as err:
            raise BackendError(f"local: cannot start the runners' fork server: {err}") from err

    def handle(self, job_id: int, attempt: int, n_groups: int = 1) -> str:
        return f"{job_id}-{attempt}"

    def run_dir(self, handle: str) -> Path:
        if not re.fullmatch(r"\d+-\d+", handle):
            raise BackendError(f"local: bad run handle {handle!r}")
        return self.runs_dir / handle

    def launch(self, req: RunRequest) -> str:
        handle = self.handle(req.job_id, req.attempt)
        d = self.run_dir(handle)
        if (d / PID_FILE).exists():  # launched before a crash: never start an attempt twice
            return handle
        try:
            private_dir(d)
            target = rank_target(req, 0)
            # One host holds every node: every GPU of the allocation is visible to the one process, by
            # its index on the host (never its index within its node, which another node's job shares).
            host = [self.host_indices[g] if self.host_indices is not None else g for g in req.gpus]
            target["env"].update(visible_devices_env(req.vendor, host, host_wide=True))
            user = self.job_users.for_team(req.team)
            if user is not None:
                target["user"] = user
            # spec.json for the record: the env's names, not its values (they may be secrets)
            write_json_atomic(d / SPEC_FILE, {**target, "env": sorted(target["env"])}, durable=False)
            self._fork_runner(d, target)
        except OSError as err:
            raise BackendError(f"local: cannot start job {req.job_id}: {err}") from err
        return handle

    def _fork_runner(self, d: Path, target: dict[str, Any]) -> None:
        """Have the fork server start the runner of run folder ``d`` (it writes ``runner.pid``). The target,
        with the job's secret env values, goes in an unlinked file whose descriptor the server hands to
        the runner unread. A fork server that went away is started again, once; a runner it started
        before is not started twice."""
        header = json.dumps({"run_dir": str(d)}).encode()
        with tempfile.TemporaryFile(dir=d) as spec_in, self._forks_lock:
            spec_in.write(json.dumps(target).encode())
            spec_in.flush()
            for again in (False, True):
                if again and (d / PID_FILE).exists():
                    return
                try:
                    sock = self._fork_server()
                    spec_in.seek(0)
                    socket.send_fds(sock, [header], [spec_in.fileno()])
                    answer = sock.recv(65536)
                except OSError:
                    answer = b""
                if answer:
                    break
                self._close_forks()
            else:
                raise OSError("the fork server of the runners ended")
        reply = json.loads(answer)
        if "error" in reply:
            raise OSError(reply["error"])

    def _fork_server(self) -> socket.socket:
        """The socket of the fork server, started (again) unless it runs."""
        if self._forks is None or self._forks.poll() is not None or self._forks_sock is None:
            self._close_forks()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self._forks = subprocess.Popen(
                    [self.python, "-m", "gpualloc.service.runner", "--fork-server", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                    close_fds=True, start_new_session=True)
            except OSError:
                ours.close()
                raise
            finally:
                theirs.close()
            self._forks_sock = ours
        return self._forks_sock

    def _close_forks(self) -> None:
        forks, sock, self._forks, self._forks_sock = self._forks, self._forks_sock, None, None
        if sock is not None:
            sock.close()  # the server reads the end of its input and exits
        if forks is not None:
            try:
                forks.wait(timeout=5)
            except subprocess.TimeoutExpired:
                forks.kill()
                forks.wait()

    def _runner_pid(self, handle: str) -> int | None:
        """The pid of the run's runner while it lives, else None."""
        d = self.run_dir(handle)
        try:
            info = json.loads((d / PID_FILE).read_text())
        except (OSError, ValueError):  # the fork server writes it before it answers: no pid, no runner
            return None
        st = proc_start_time(int(info["pid"]))
        if st is None or st[0] in ("Z", "X") or (info.get("start") is not None and st[1] != info["start"]):
            return None
        return int(info["pid"])

    def poll(self, runs: Sequence[RunRef]) -> dict[tuple[int, int], RunState]:
        out = {}
        for run in runs:
            alive = self._runner_pid(run.handle) is not None  # before reading exit.json: no race
            outcome = read_exit(self.run_dir(run.handle))
            if outcome is not None:
                out[run.key] = RunState(RunStatus.EXITED, outcome.get("exit_code"), outcome.get("error"),
                                        outcome.get("result"))
            elif alive:
                out[run.key] = RunState(RunStatus.RUNNING)
            else:
                out[run.key] = RunState(RunStatus.GONE, error=f"the runner of {run.handle} is gone")
        return out

    def _kill_program_group(self, handle: str) -> None:
        """SIGKILL what is left of the program's process group (its own children included)."""
        try:
            pid = int(json.loads((self.run_dir(handle) / PROGRAM_PID_FILE).read_text())["pid"])
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass

    def stop(self, run: RunRef) -> None:
        pid = self._runner_pid(run.handle)
        if pid is not None:
            deadline = time.monotonic() + self.stop_grace_s
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    break
                while time.monotonic() < deadline and self._runner_pid(run.handle) is not None:
                    time.sleep(0.02)
                if self._runner_pid(run.handle) is None:
                    break
                deadline = time.monotonic() + 5.0
        self._kill_program_group(run.handle)
        self.release(run)

    def release(self, run: RunRef) -> None:
        pass  # the runners are the fork server's children, reaped by the kernel

    def cleanup(self, keep: Sequence[RunRef]) -> list[str]:
        return []  # a local run never outlives its record: it ends, is stopped, or is found gone

    def capacity(self) -> dict[str, int] | None:
        return None

    def log_path(self, handle: str, stream: str) -> Path | None:
        return self.run_dir(handle) / LOG_FILES[stream]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "runs_dir": str(self.runs_dir), "job_users": self.job_users.describe()}

    def close(self) -> None:
        """Stop the fork server; the runners keep running (a restarted service adopts them)."""
        with self._forks_lock:
            self._close_forks()


# -------------------------------------------------------------------------------------------- ray
def ray_resource_name(names: Sequence[str]) -> str:
    """The Ray custom resource of a device type: ``gpu_`` + its shortest name or alias, with
    characters other than letters, digits and ``_`` made ``_`` (``V100-16GB`` -> ``gpu_V100``,
    ``MI50`` -> ``gpu_MI50``).

    Args:
        names: the type's canonical name and its aliases.
    """
    short = min(names, key=lambda n: (len(n), n))
    return "gpu_" + re.sub(r"\W", "_", short)


class JobActor:
    """One rank of a job on Ray: starts the target and answers polls while it runs."""

    def __init__(self) -> None:
        self.execution: Execution | None = None
        self.failed: dict[str, Any] | None = None

    def start(self, target: dict[str, Any], log_dir: str | None) -> None:
        try:
            self.execution = Execution(target, log_dir, callable_in_thread=True)
            self.execution.start()
        except Exception as exc:  # reported through poll, like any other outcome
            self.failed = {"exit_code": 126, "error": f"cannot start: {type(exc).__name__}: {exc}", "result": None}

    def poll(self) -> dict[str, Any] | None:
        if self.failed is not None:
            return self.failed
        return None if self.execution is None else self.execution.poll()

    def stop(self, grace_s: float) -> None:
        if self.execution is not None:
            self.execution.terminate(grace_s)

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _RayRun:
    actors: list[Any]
    seen_s: float  # when this process launched or found the run
    answered: bool = False  # some rank answered a poll: Ray scheduled it
    polls: dict[int, Any] = field(default_factory=dict)  # rank -> outstanding poll ref
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)


_HANDLE = re.compile(r"^gpualloc-(?P<inst>[0-9a-zA-Z]+)-(?P<job>\d+)-(?P<attempt>\d+)x(?P<ranks>\d+)$")


class RayBackend:
    """Job attempts as detached Ray actors in placement groups.

    Args:
        resources: Ray resource per device type name (see :func:`ray_resource_name`).
        instance: the store's id; names of actors and placement groups start with
            ``gpualloc-<instance>-`` so several services can share a Ray cluster.
        address: a running Ray cluster; None joins the Ray already initialised in this process or
            starts a local one declaring ``local_resources`` (the cluster's devices as virtual
            resources: a heterogeneous cluster on a CPU-only host).
        local_resources: ``{resource: count}`` for a locally started Ray.
        num_cpus: CPUs of a locally started Ray (job actors take none).
        namespace: Ray namespace of the actors.
        log_dir: folder for each rank's ``stdout.log`` / ``stderr.log`` (on the node that runs it).
        launch_timeout_s: a run that Ray has not started within this time (the placement group
            cannot be reserved) is reported gone.
        stop_grace_s: SIGTERM to SIGKILL.
        temp_dir: Ray's session folder for a locally started Ray (default: a new ``/tmp/gr-*``);
            removed on :meth:`close`. A fixed one is reused after a crash instead of left behind.
        host_indices: ``{(node, local index): index on the host}`` for a Ray on this one host (every
            node here: visible devices are numbered host-wide, as for the local backend); None: each
            node is its own machine and its devices are numbered from 0.
    """

    name = "ray"

    def __init__(self, resources: Mapping[str, str], instance: str, *, address: str | None = None,
                 local_resources: Mapping[str, float] | None = None, num_cpus: int | None = None,
                 namespace: str = "gpualloc", log_dir: str | Path | None = None, launch_timeout_s: float = 60.0,
                 stop_grace_s: float = 5.0, temp_dir: str | Path | None = None,
                 host_indices: Mapping[tuple[int, int], int] | None = None) -> None:
        ray = require("ray", "ray", by="gpualloc serve --backend ray", error=BackendError)
        self._ray = ray
        self.resources = dict(resources)
        self.instance = instance
        self.namespace = namespace
        self.log_dir = None if log_dir is None else private_dir(Path(log_dir))
        self.launch_timeout_s = float(launch_timeout_s)
        self.stop_grace_s = float(stop_grace_s)
        self.host_indices = None if host_indices is None else dict(host_indices)
        self._temp_dir: str | None = None
        self._started = False
        if not ray.is_initialized():
            kw: dict[str, Any] = {"namespace": namespace, "log_to_driver": False}
            if address is None:
                # Ray's unix sockets live under the temp dir: keep the path short (~107-byte limit).
                if temp_dir is None:
                    self._temp_dir = tempfile.mkdtemp(prefix="gr-", dir="/tmp")
                else:
                    Path(temp_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
                    self._temp_dir = str(temp_dir)
                kw.update(num_cpus=num_cpus if num_cpus is not None else max(1, os.cpu_count() or 1),
                          resources=dict(local_resources or {}), include_dashboard=False, _temp_dir=self._temp_dir)
            try:
                ray.init(address=address, **kw)
            except Exception as err:
                self._drop_temp()
                raise BackendError(f"ray backend: cannot start or join Ray"
                                   f"{'' if address is None else ' at ' + address}: {err}") from err
            self._started = True
        self._actor_cls = ray.remote(JobActor)
        self._runs: dict[str, _RayRun] = {}
        self._capacity: tuple[float, dict[str, int]] | None = None

    def _drop_temp(self) -> None:
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def handle(self, job_id: int, attempt: int, n_groups: int) -> str:
        return f"gpualloc-{self.instance}-{job_id}-{attempt}x{n_groups}"

    def _ranks(self, handle: str) -> int:
        m = _HANDLE.match(handle)
        if m is None:
            raise BackendError(f"ray: bad run handle {handle!r}")
        return int(m["ranks"])

    def launch(self, req: RunRequest) -> str:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        handle = self.handle(req.job_id, req.attempt, len(req.groups))
        if self._lookup(handle) is not None:  # launched before a crash: never start an attempt twice
            return handle
        res = req.resource
        bundles = [{res: float(len(local))} for _, local in req.groups]
        try:
            pg = placement_group(bundles, strategy="STRICT_PACK" if len(bundles) == 1 else "PACK",
                                 name=handle, lifetime="detached")
            actors = []
            for rank, (_, local) in enumerate(req.groups):
                actor = self._actor_cls.options(
                    name=f"{handle}-r{rank}", namespace=self.namespace, lifetime="detached", num_cpus=0,
                    resources={res: float(len(local))}, max_restarts=0, max_concurrency=2,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                ).remote()
                log = None if self.log_dir is None else str(self.log_dir / f"{handle}-r{rank}")
                target = rank_target(req, rank)
                if self.host_indices is not None:  # one host: its indices, never another node's
                    node = req.groups[rank][0]
                    target["env"].update(visible_devices_env(req.vendor, [self.host_indices[(node, i)]
                                                                          for i in local], host_wide=True))
                actor.start.remote(target, log)
                actors.append(actor)
        except Exception as err:
            self.release(RunRef(req.job_id, req.attempt, handle))
            raise BackendError(f"ray: cannot launch job {req.job_id}: {err}") from err
        self._runs[handle] = _RayRun(actors, time.monotonic())
        return handle

    def _lookup(self, handle: str) -> _RayRun | None:
        """The run of ``handle``: in memory, or found by its actors' names (after a restart)."""
        run = self._runs.get(handle)
        if run is not None:
            return run
        actors = []
        for rank in range(self._ranks(handle)):
            try:
                actors.append(self._ray.get_actor(f"{handle}-r{rank}", namespace=self.namespace))
            except ValueError:
                return None
        run = self._runs[handle] = _RayRun(actors, time.monotonic())
        return run

    def poll(self, runs: Sequence[RunRef], timeout_s: float = 1.0) -> dict[tuple[int, int], RunState]:
        out: dict[tuple[int, int], RunState] = {}
        found: dict[str, tuple[RunRef, _RayRun]] = {}
        for ref in runs:
            run = self._lookup(ref.handle)
            if run is None:
                out[ref.key] = RunState(RunStatus.GONE, error=f"Ray has no actor {ref.handle}-r* (the Ray cluster "
                                                                f"or its node was lost)")
            else:
                found[ref.handle] = (ref, run)
        self._collect(found, timeout_s)
        now = time.monotonic()
        for handle, (ref, run) in found.items():
            out[ref.key] = self._run_state(handle, run, now)
        return out

    def _collect(self, found: Mapping[str, tuple[RunRef, _RayRun]], timeout_s: float) -> None:
        """Ask every rank without an outcome for one (a poll stays outstanding until it answers) and
        record the answers that come within ``timeout_s``."""
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        ray = self._ray
        pending: dict[Any, tuple[_RayRun, int]] = {}
        for _ref, run in found.values():
            for rank, actor in enumerate(run.actors):
                if rank in run.outcomes:
                    continue
                if rank not in run.polls:
                    run.polls[rank] = actor.poll.remote()
                pending[run.polls[rank]] = (run, rank)
        if not pending:
            return
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        for obj in ready:
            run, rank = pending[obj]
            del run.polls[rank]
            try:
                value = ray.get(obj, timeout=timeout_s)
            except (ActorUnavailableError, GetTimeoutError):
                continue  # transient: ask again next time
            except RayActorError as err:
                run.outcomes[rank] = {"lost": True, "error": f"rank {rank}: Ray actor died: "
                                                            f"{str(err).splitlines()[0][:300]}"}
                continue
            run.answered = True
            if value is not None:
                run.outcomes[rank] = value

    def _run_state(self, handle: str, run: _RayRun, now: float) -> RunState:
        """A run's state from its ranks' outcomes: a lost rank loses the run, a failed rank ends it,
        all ranks done end it with rank 0's result."""
        outcomes = run.outcomes.values()
        lost = [o for o in outcomes if o.get("lost")]
        bad = [o for o in outcomes if not o.get("lost") and (o.get("exit_code") != 0 or o.get("error"))]
        if lost:
            return RunState(RunStatus.GONE, error=lost[0]["error"])
        if bad:
            return RunState(RunStatus.EXITED, bad[0].get("exit_code"), bad[0].get("error"))
        if len(run.outcomes) == len(run.actors):
            first = run.outcomes[0]
            return RunState(RunStatus.EXITED, first.get("exit_code"), first.get("error"), first.get("result"))
        if not run.answered and now - run.seen_s > self.launch_timeout_s:
            return RunState(RunStatus.GONE, error=f"Ray did not start {handle} within "
                                                  f"{self.launch_timeout_s:g} s (are the resources there?)")
        return RunState(RunStatus.RUNNING)

    def stop(self, run: RunRef) -> None:
        found = self._lookup(run.handle)
        if found is not None:
            refs = [a.stop.remote(self.stop_grace_s) for a in found.actors]
            try:
                self._ray.wait(refs, num_returns=len(refs), timeout=self.stop_grace_s + 5.0)
            except Exception as err:  # Ray raises many types here; the actors are killed next anyway
                log.warning("ray: stopping run %s: waiting for its actors failed: %s: %s", run.handle,
                            type(err).__name__, err)
        self.release(run)

    def release(self, run: RunRef) -> None:
        from ray.util import get_placement_group
        from ray.util.placement_group import remove_placement_group

        self._runs.pop(run.handle, None)
        for rank in range(self._ranks(run.handle)):
            try:
                self._ray.kill(self._ray.get_actor(f"{run.handle}-r{rank}", namespace=self.namespace))
            except ValueError:
                pass
        try:
            remove_placement_group(get_placement_group(run.handle))
        except Exception as err:  # often already removed; the table scan below catches the rest
            log.debug("ray: releasing run %s: placement group not removed by name: %s: %s", run.handle,
                      type(err).__name__, err)
        for pg_id, info in self._placement_groups().items():
            if info.get("name") == run.handle:
                self._remove_pg(pg_id)

    def _placement_groups(self) -> dict[str, dict[str, Any]]:
        from ray.util import placement_group_table

        return {k: v for k, v in placement_group_table().items() if v.get("state") != "REMOVED"}

    def _remove_pg(self, pg_id: str) -> None:
        from ray import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        try:
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))
        except Exception as err:  # Ray raises many types here; a leftover group only holds resources
            log.warning("ray: cannot remove placement group %s: %s: %s", pg_id, type(err).__name__, err)

    def cleanup(self, keep: Sequence[RunRef]) -> list[str]:
        prefix = f"gpualloc-{self.instance}-"
        kept = {r.handle for r in keep}
        stopped: set[str] = set()
        for entry in self._ray.util.list_named_actors(all_namespaces=True):
            if entry.get("namespace") != self.namespace or not entry.get("name", "").startswith(prefix):
                continue
            handle = entry["name"].rsplit("-r", 1)[0]
            if handle in kept:
                continue
            self._runs.pop(handle, None)
            try:
                actor = self._ray.get_actor(entry["name"], namespace=self.namespace)
                try:
                    self._ray.get(actor.stop.remote(self.stop_grace_s), timeout=self.stop_grace_s + 5.0)
                except Exception as err:  # Ray raises many types here; the actor is killed next anyway
                    log.warning("ray: cleanup: stopping actor %s failed: %s: %s", entry["name"],
                                type(err).__name__, err)
                self._ray.kill(actor)
            except ValueError:
                pass
            stopped.add(handle)
        for pg_id, info in self._placement_groups().items():
            name = info.get("name") or ""
            if name.startswith(prefix) and name not in kept:
                self._remove_pg(pg_id)
                stopped.add(name)
        return sorted(stopped)

    def capacity(self) -> dict[str, int] | None:
        cached = self._capacity
        if cached is not None and time.monotonic() - cached[0] < 2.0:
            return cached[1]
        total = self._ray.cluster_resources()
        cap = {t: int(total.get(res, 0)) for t, res in self.resources.items()}
        self._capacity = (time.monotonic(), cap)
        return cap

    def log_path(self, handle: str, stream: str) -> Path | None:
        self._ranks(handle)  # a malformed handle never becomes a path
        return None if self.log_dir is None else self.log_dir / f"{handle}-r0" / LOG_FILES[stream]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "resources": dict(self.resources), "namespace": self.namespace,
                "started_ray": self._started}

    def close(self) -> None:
        """Shut Ray down if this backend started it (its jobs end with it); a joined cluster keeps
        running the jobs, and a restarted service adopts them."""
        self._runs.clear()
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
        self._started = False
        self._drop_temp()


BACKENDS: Registry[type] = Registry("backend", BackendError)
"""Backend classes by name."""
BACKENDS.register("local", LocalBackend)
BACKENDS.register("ray", RayBackend)
BACKENDS.register("slurm", "gpualloc.service.slurm:SlurmBackend")  # imported when asked for


def make_backend(name: str, **options: Any) -> Backend:
    """The backend registered as ``name``, built with keyword ``options``.

    Raises:
        BackendError: an unknown name (the message lists the known ones), or the backend cannot start.
    """
    return BACKENDS.create(name, **options)
