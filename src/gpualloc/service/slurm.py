"""The ``slurm`` backend: each job attempt is one Slurm batch job pinned to the GPUs the policy chose.

The service keeps its queue, policy and store; for each decision :meth:`SlurmBackend.launch` writes
the run folder (``<runs_dir>/<job>-<attempt>/``: ``spec.json``, a batch script) and calls ``sbatch``
with ``--gres=gpu:<GRES type>:<n>``, ``--nodelist``, ``--nodes`` (``--nodes=1`` for a single-node
gang; a gang with unequal counts per node is a heterogeneous job, one component per node),
``--chdir`` and the job name ``gpualloc-<store id>-<job>-<attempt>``. The batch script only
``exec``-s :mod:`gpualloc.service.runner` on the run folder (quoted with :func:`shlex.join`), which
runs the job's argv without a shell, with its environment, and writes ``exit.json``: the same
runner and outcome file as the ``local`` backend. The environment travels in ``spec.json`` rather
than ``--export`` because ``--export`` cannot carry a value with a comma.

Following: one ``squeue --me --states=all`` per poll (``--format`` with ``|`` separators, never a
table), then the run folder's ``exit.json``. A run is reported ended only once Slurm no longer
holds its GPUs, so the service's allocations always contain Slurm's. A job Slurm has forgotten
(older than ``MinJobAge``) is looked up with ``sacct`` when accounting is on; without accounting,
``exit.json`` is the record. The Slurm job id is written to ``slurm_job.json`` with the times of
the ``sbatch`` call.

Recovery: the handle is the Slurm job name, so a restarted service finds an attempt by name even if
it crashed between ``sbatch`` and writing the id; an attempt that has a run folder marked
``submitting`` is never submitted again without that check.

The run folder must be on a file system the nodes share (as home folders are on HPC clusters), and
the service's Python at the same path on the nodes.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gpualloc.hardware.cluster import ClusterSpec
from gpualloc.hardware.slurm import SINFO_FORMAT, gres_device_type, parse_sinfo, run_slurm
from gpualloc.service.backends import (RunRef, RunRequest, RunState, RunStatus, rank_target, read_exit,
                                       visible_devices_env)
from gpualloc.service.errors import BackendError
from gpualloc.service.models import NAME_PATTERN
from gpualloc.service.runner import EXIT_FILE, LOG_FILES, SPEC_FILE, private_dir, write_json_atomic
from gpualloc.workload.jobs import Job, JobType

log = logging.getLogger(__name__)

__all__ = ["ACTIVE_STATES", "SQUEUE_FORMAT", "AdviceRequest", "SlurmBackend", "SlurmJob", "advise", "batch_script",
           "exit_status", "merge_components", "parse_scontrol_record", "parse_squeue", "sbatch_argv"]

SQUEUE_FORMAT = "%i|%j|%T|%r|%b|%N"
"""``squeue --format`` of :func:`parse_squeue`: id, name, long state, reason, GRES per node, nodes."""
SLURM_JOB_FILE, SUBMITTING_FILE, SCRIPT_FILE, SLURM_OUT_FILE = "slurm_job.json", "submitting", "job.sh", "slurm.out"

ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"})
"""Slurm job states in which the job may still hold (or be about to hold) its GPUs."""
LOST_STATES = frozenset({"CANCELLED", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "DEADLINE", "REVOKED"})
"""Ended states in which the job did not end by itself: the run is lost (re-queued by the scheduler)."""
HOPELESS_REASONS = frozenset({"BadConstraints", "PartitionConfig", "InvalidAccount", "InvalidQOS", "JobHeldAdmin",
                              "PartitionDown", "PartitionInactive", "ReqNodeNotAvail", "NodeDown"})
"""Pending reasons under which the job will not start without an administrator: it is cancelled after
``launch_timeout_s`` and reported lost."""

_HANDLE = re.compile(r"^gpualloc-(?P<instance>[A-Za-z0-9]+)-(?P<job>\d+)-(?P<attempt>\d+)$")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


@dataclass(frozen=True)
class SlurmJob:
    """One ``squeue`` line."""

    job_id: str
    name: str
    state: str
    reason: str
    gres: str
    nodes: str

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def parse_squeue(text: str) -> list[SlurmJob]:
    """Jobs of ``squeue --noheader --format=%i|%j|%T|%r|%b|%N`` output.

    Raises:
        BackendError: a line without six ``|``-separated fields.
    """
    jobs = []
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 6:
            raise BackendError(f"squeue line {k}: expected {SQUEUE_FORMAT}, got {line[:200]!r}")
        # a job name may hold "|": the id is first and the four other fields last
        job_id, name, (state, reason, gres, nodes) = parts[0], "|".join(parts[1:-4]), parts[-4:]
        jobs.append(SlurmJob(job_id.strip(), name, state.strip().split()[0].upper() if state.strip() else "",
                             reason.strip(), gres.strip(), nodes.strip()))
    return jobs


def merge_components(jobs: Sequence[SlurmJob]) -> SlurmJob:
    """One job from the ``squeue`` lines of a heterogeneous job (ids ``7+0``, ``7+1``): the leader's id,
    active while any component is, the components' GRES and nodes joined with ``;``."""
    if len(jobs) == 1 and "+" not in jobs[0].job_id:
        return jobs[0]
    lead = next((j for j in jobs if j.active), jobs[0])
    return SlurmJob(jobs[0].job_id.split("+")[0], jobs[0].name, lead.state, lead.reason,
                    ";".join(j.gres for j in jobs), ";".join(j.nodes for j in jobs))


def parse_scontrol_record(text: str) -> dict[str, str]:
    """``Key=Value`` fields of one ``scontrol show job -o`` (or ``show node -o``) line; a value runs
    up to the next ``Key=`` (values such as ``OS=Linux 5.15 #1 SMP`` hold spaces)."""
    text = text.strip()
    keys = list(_KEY.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(text)
        out[m.group(1)] = text[m.end():end].strip()
    return out


def exit_status(value: str) -> tuple[int | None, str | None]:
    """Slurm's ``ExitCode=code:signal`` -> ``(exit code, error)``: ``"1:0"`` -> ``(1, "exited with status 1")``,
    ``"0:9"`` -> ``(-9, "killed by signal 9")``."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", value or "")
    if m is None:
        return None, None
    code, sig = int(m[1]), int(m[2])
    if sig:
        return -sig, f"killed by signal {sig}"
    return code, None if code == 0 else f"exited with status {code}"


def batch_script(python: str, run_dir: Path, job_id: int, attempt: int) -> str:
    """The batch script of one attempt: it only ``exec``-s the runner, every word quoted."""
    return (f"#!/bin/sh\n# gpualloc job {job_id}, attempt {attempt} (generated): the runner runs the job's argv "
            f"without a shell and writes {EXIT_FILE}\n"
            f"exec {shlex.join([python, '-m', 'gpualloc.service.runner', str(run_dir)])}\n")


def sbatch_argv(name: str, groups: Sequence[tuple[str, str, int]], *, chdir: str, output: str,
                partition: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``sbatch`` arguments (without the script) for GPUs ``(node, GRES type, count)`` per node.

    One node, or equal counts on every node: one job ``--nodes=N --nodelist=... --gres=gpu:T:n``.
    Unequal counts: a heterogeneous job, one ``--nodes=1`` component per node joined by ``:``.
    """
    common = ["--parsable", f"--job-name={name}", f"--chdir={chdir}", f"--output={output}", f"--error={output}",
              "--export=ALL", "--ntasks-per-node=1"]
    if partition:
        common.append(f"--partition={partition}")
    common += list(extra)
    counts = {n for _, _, n in groups}
    types = {t for _, t, _ in groups}
    if len(counts) == 1 and len(types) == 1:
        return ["sbatch", *common, f"--nodes={len(groups)}", f"--nodelist={','.join(g[0] for g in groups)}",
                f"--gres=gpu:{groups[0][1]}:{groups[0][2]}"]
    argv = ["sbatch"]
    for k, (node, gtype, n) in enumerate(groups):
        if k:
            argv.append(":")
        argv += [*common, "--nodes=1", f"--nodelist={node}", f"--gres=gpu:{gtype}:{n}"]
    return argv


class SlurmBackend:
    """Job attempts as Slurm batch jobs.

    Args:
        runs_dir: run folders (shared with the nodes).
        instance: the store's id; job names start with ``gpualloc-<instance>-``.
        cluster: the cluster the service schedules; its node names must be Slurm nodes holding at
            least its devices as typed GPU GRES (``--cluster slurm:`` reads it from Slurm).
        partition: submit to this partition (default: Slurm's default).
        python: the interpreter the batch script runs the runner with (same path on the nodes).
        sbatch_args: more ``sbatch`` options (``--account=...``, ``--time=...``).
        launch_timeout_s: a job pending for a reason that needs an administrator (e.g. its node is
            down) is cancelled after this long and reported lost.
        stop_grace_s: how long :meth:`stop` waits for Slurm to end a cancelled job.
        timeout_s: limit of each Slurm command.
    """

    name = "slurm"

    def __init__(self, runs_dir: str | Path, instance: str, cluster: ClusterSpec, *, partition: str | None = None,
                 python: str = sys.executable, sbatch_args: Sequence[str] = (), launch_timeout_s: float = 60.0,
                 stop_grace_s: float = 30.0, timeout_s: float = 30.0) -> None:
        try:
            self.runs_dir = private_dir(Path(runs_dir))
        except OSError as err:
            raise BackendError(f"slurm: runs folder {runs_dir}: {err.strerror}") from err
        self.instance, self.cluster, self.partition = instance, cluster, partition
        self.python, self.sbatch_args = python, tuple(sbatch_args)
        self.launch_timeout_s, self.stop_grace_s, self.timeout_s = float(launch_timeout_s), float(stop_grace_s), \
            float(timeout_s)
        self._accounting: bool | None = None
        self._capacity: tuple[float, dict[str, int] | None] | None = None
        self._pending_since: dict[str, float] = {}
        self.gres = self._map_gres(self._sinfo())
        """``(node name, device type name) -> GRES type`` as this Slurm spells it."""

    # ---------------------------------------------------------------------------- slurm commands
    def _run(self, *argv: str, check: bool = True):
        return run_slurm(argv, timeout_s=self.timeout_s, error=BackendError, check=check)

    def _sinfo(self):
        argv = ["sinfo", "--Node", "--noheader", f"--format={SINFO_FORMAT}"]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        out = self._run(*argv).stdout
        try:
            return parse_sinfo(out)
        except Exception as err:  # ClusterError from the parser: the same one-line message
            raise BackendError(f"slurm: {err}") from err

    def _map_gres(self, nodes) -> dict[tuple[str, str], str]:
        """Check that every node of the cluster is a Slurm node with its devices; map the types."""
        by_name = {n.name: n for n in nodes}
        out: dict[tuple[str, str], str] = {}
        for node in self.cluster.nodes:
            slurm = by_name.get(node.name)
            if slurm is None:
                raise BackendError(f"slurm: node {node.name!r} of cluster {self.cluster.name!r} is not a Slurm node"
                                   f"{' of partition ' + self.partition if self.partition else ''} "
                                   f"(Slurm has: {', '.join(by_name) or 'none'}; use --cluster slurm:)")
            have: dict[str, tuple[str, int]] = {}
            for gtype, n in slurm.gpus:
                try:
                    dev = gres_device_type(gtype, self.cluster.catalog, f"slurm node {node.name}: Gres")
                except Exception as err:
                    raise BackendError(str(err)) from err
                old = have.get(dev.name)
                have[dev.name] = (gtype, n + (old[1] if old else 0))
            need = Counter(self.cluster.devices[i].type.name for i in node.devices)
            for t, n in need.items():
                if have.get(t, ("", 0))[1] < n:
                    raise BackendError(f"slurm node {node.name}: Gres: the cluster has {n} x {t} there, Slurm "
                                       f"{have.get(t, ('', 0))[1]} (use --cluster slurm:)")
                out[(node.name, t)] = have[t][0]
        return out

    def _jobs(self) -> dict[str, SlurmJob]:
        """This user's jobs of this store by name (the newest one of a name wins)."""
        done = self._run("squeue", "--me", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}")
        prefix = f"gpualloc-{self.instance}-"
        parts: dict[str, dict[int, list[SlurmJob]]] = {}
        for job in parse_squeue(done.stdout):
            base = job.job_id.split("+")[0]
            if job.name.startswith(prefix) and base.isdigit():
                parts.setdefault(job.name, {}).setdefault(int(base), []).append(job)
        return {name: merge_components(by_id[max(by_id)]) for name, by_id in parts.items()}

    def _scontrol_exit(self, job_id: str) -> tuple[int | None, str | None]:
        done = self._run("scontrol", "--oneliner", "show", "job", job_id, check=False)
        lines = done.stdout.splitlines()  # a heterogeneous job: one line per component, the leader first
        return exit_status(parse_scontrol_record(lines[0] if lines else "").get("ExitCode", ""))

    def _sacct(self, job_id: str) -> tuple[str, str] | None:
        """``(state, ExitCode)`` from accounting, or None (accounting off, or no record)."""
        if self._accounting is False:
            return None
        done = self._run("sacct", "--noheader", "--parsable2", "--jobs", job_id, "--format=JobID,State,ExitCode",
                         check=False)
        if done.returncode != 0:
            self._accounting = False  # "Slurm accounting storage is disabled": exit.json is the record
            return None
        self._accounting = True
        for line in done.stdout.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] == job_id:
                return parts[1].split()[0].upper() if parts[1] else "", parts[2]
        return None

    # ------------------------------------------------------------------------------- interface
    def handle(self, job_id: int, attempt: int, n_groups: int = 1) -> str:
        return f"gpualloc-{self.instance}-{job_id}-{attempt}"

    def run_dir(self, handle: str) -> Path:
        m = _HANDLE.match(handle)
        if m is None:
            raise BackendError(f"slurm: bad run handle {handle!r}")
        return self.runs_dir / f"{m['job']}-{m['attempt']}"

    def slurm_job_id(self, handle: str) -> str | None:
        """The Slurm job id of a submitted attempt (from its run folder), or None."""
        try:
            return str(json.loads((self.run_dir(handle) / SLURM_JOB_FILE).read_text())["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def launch(self, req: RunRequest) -> str:
        handle = self.handle(req.job_id, req.attempt)
        d = self.run_dir(handle)
        if (d / SLURM_JOB_FILE).exists() or (d / EXIT_FILE).exists():
            return handle  # submitted before a crash: never twice
        if (d / SUBMITTING_FILE).exists() and handle in self._jobs():
            return handle  # crashed between sbatch and writing its id
        groups = []
        for node_index, local in req.groups:
            node = self.cluster.nodes[node_index].name
            groups.append((node, self.gres[(node, req.device_type)], len(local)))
        target = rank_target(req, 0)
        for var in visible_devices_env(req.vendor, []):  # Slurm binds the GPUs itself
            target["env"].pop(var, None)
        chdir = target.get("cwd") or str(d)
        argv = sbatch_argv(handle, groups, chdir=chdir, output=str(d / SLURM_OUT_FILE), partition=self.partition,
                           extra=self.sbatch_args)
        try:
            private_dir(d)
            write_json_atomic(d / SPEC_FILE, target)
            (d / SCRIPT_FILE).write_text(batch_script(self.python, d, req.job_id, req.attempt))
            (d / SUBMITTING_FILE).touch()
        except OSError as err:
            raise BackendError(f"slurm: cannot write the run folder of job {req.job_id}: {err}") from err
        asked = time.time()
        done = self._run(*argv, str(d / SCRIPT_FILE))
        job_id = done.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch: unexpected answer {done.stdout.strip()[:200]!r} for job {req.job_id}")
        write_json_atomic(d / SLURM_JOB_FILE, {"job_id": job_id, "sbatch_called_at": asked,
                                              "submitted_at": time.time(), "argv": argv})
        log.info("slurm: job %d attempt %d is Slurm job %s", req.job_id, req.attempt, job_id)
        return handle

    def poll(self, runs: Sequence[RunRef]) -> dict[tuple[int, int], RunState]:
        if not runs:
            return {}
        jobs = self._jobs()  # before reading exit.json: an outcome written meanwhile is still seen
        return {run.key: self._state(run.handle, jobs.get(run.handle)) for run in runs}

    def _state(self, handle: str, job: SlurmJob | None) -> RunState:
        if job is not None and job.active:
            return self._active_state(handle, job)
        self._pending_since.pop(handle, None)
        outcome = read_exit(self.run_dir(handle))
        if outcome is not None:
            return RunState(RunStatus.EXITED, outcome.get("exit_code"), outcome.get("error"), outcome.get("result"))
        job_id = job.job_id if job is not None else self.slurm_job_id(handle)
        if job_id is None:
            return RunState(RunStatus.GONE, error=f"{handle} was never submitted to Slurm")
        if job is not None:
            state, code = job.state, self._scontrol_exit(job_id)
        else:
            record = self._sacct(job_id)
            if record is None:
                return RunState(RunStatus.GONE, error=f"Slurm no longer knows job {job_id} and it left no exit status")
            state, code = record[0], exit_status(record[1])
        if state in LOST_STATES:
            return RunState(RunStatus.GONE, error=f"Slurm job {job_id} {state.lower()}")
        exit_code, error = code
        if state != "COMPLETED" or exit_code not in (0, None):
            error = f"Slurm job {job_id} {state.lower()}" + (f": {error}" if error else "")
        return RunState(RunStatus.EXITED, exit_code, error)

    def _active_state(self, handle: str, job: SlurmJob) -> RunState:
        if job.state == "PENDING" and job.reason.split(",")[0] in HOPELESS_REASONS:
            since = self._pending_since.setdefault(handle, time.monotonic())
            if time.monotonic() - since > self.launch_timeout_s:
                self._run("scancel", job.job_id, check=False)
                self._pending_since.pop(handle, None)
                return RunState(RunStatus.GONE, error=f"Slurm job {job.job_id} pending ({job.reason}) for more "
                                                      f"than {self.launch_timeout_s:g} s: cancelled")
        else:
            self._pending_since.pop(handle, None)
        return RunState(RunStatus.RUNNING)

    def stop(self, run: RunRef) -> None:
        job_id = self.slurm_job_id(run.handle)
        if job_id is None:
            job = self._jobs().get(run.handle)
            job_id = None if job is None else job.job_id
        if job_id is None:
            return
        self._run("scancel", job_id, check=False)  # SIGTERM, SIGKILL after Slurm's KillWait
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline:
            job = self._jobs().get(run.handle)
            if job is None or not job.active:
                return
            time.sleep(0.2)
        log.warning("slurm: job %s (%s) still active %g s after scancel", job_id, run.handle, self.stop_grace_s)

    def release(self, run: RunRef) -> None:
        self._pending_since.pop(run.handle, None)  # Slurm frees the GPUs when the job ends

    def cleanup(self, keep: Sequence[RunRef]) -> list[str]:
        kept = {r.handle for r in keep}
        stale = [(name, job) for name, job in self._jobs().items() if job.active and name not in kept]
        for _name, job in stale:
            self._run("scancel", job.job_id, check=False)
        return sorted(name for name, _ in stale)

    def capacity(self) -> dict[str, int] | None:
        """Devices per type on nodes Slurm will start jobs on (down or drained nodes count none)."""
        cached = self._capacity
        if cached is not None and time.monotonic() - cached[0] < 5.0:
            return cached[1]
        try:
            usable = {n.name for n in self._sinfo() if n.usable}
        except BackendError as err:
            log.warning("slurm: capacity unknown: %s", err)
            cap = None if cached is None else cached[1]
        else:
            cap = {t: 0 for t in self.cluster.type_names}
            for d in self.cluster.devices:
                if self.cluster.nodes[d.node].name in usable:
                    cap[d.type.name] += 1
        self._capacity = (time.monotonic(), cap)
        return cap

    def gres_type(self, node: str, device_type: str) -> str:
        """How this Slurm names ``device_type`` on ``node`` (``v100``)."""
        return self.gres[(node, device_type)]

    def log_path(self, handle: str, stream: str) -> Path | None:
        return self.run_dir(handle) / LOG_FILES[stream]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "runs_dir": str(self.runs_dir), "partition": self.partition,
                "gres": {f"{n}/{t}": g for (n, t), g in self.gres.items()}}

    def close(self) -> None:
        """Nothing to stop: the jobs keep running in Slurm, and a restarted service adopts them."""


# ------------------------------------------------------------------------------------- advice
class AdviceRequest(BaseModel):
    """``POST /advise``: a job another scheduler (Slurm's own) will run; which GPUs should it get?"""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpus: int = Field(ge=1, le=1024, description="GPUs in all (per node times nodes).")
    gpu_type: str | None = Field(None, min_length=1, max_length=64,
                                 description="Only this device type (catalog name, alias or GRES type).")
    duration_s: float | None = Field(None, gt=0, le=1e9, description="Expected run time (the time limit).")
    single_node: bool = Field(True, description="All GPUs on one node.")
    job_type: JobType = Field(JobType.ML_TRAINING, description="The job category the speed model uses.")
    name: str = Field("slurm-job", min_length=1, max_length=128, pattern=NAME_PATTERN)  # a job's name rule


def advise(scheduler, backend, request: AdviceRequest) -> dict[str, Any]:
    """The GPUs the service's policy would give ``request`` now: its device type, nodes and the
    ``--gres`` per node, as the job_submit plugin applies them.

    The policy (a fresh instance of the service's, so its state is untouched) decides on the free
    GPUs alone; when none fit now it decides on the whole cluster (``"busy": true``: where the job
    should go once GPUs free up). GPUs the service's own jobs hold are never offered.

    Raises:
        InvalidJob: an unknown type, or a job no allowed type can ever hold.
    """
    from gpualloc.scheduling.base import GPU_DOWN, GPU_FREE, QUEUED, ClusterView, Decision
    from gpualloc.scheduling.rules import InvalidDecision, check_start
    from gpualloc.service.models import JobSpec
    from gpualloc.service.scheduler import LiveJobsView, LiveTable, normalise_spec
    from gpualloc.workload.speed import speed_matrix

    cluster, types = scheduler.cluster, scheduler.types
    spec = JobSpec(name=request.name, command=["true"], num_gpus=request.gpus, device_type=request.gpu_type,
                   job_type=request.job_type, time_limit_s=request.duration_s, single_node=request.single_node)
    norm = normalise_spec(spec, cluster, types)
    now = scheduler.now_s()
    job = Job("advice", now, request.job_type, norm["time_limit_s"] or scheduler.default_limit_s, request.gpus,
              gpu_types=tuple(norm["gpu_types"]), single_node=request.single_node)
    live = LiveTable(len(types.names), capacity=1)
    row = live.add([job], speed_matrix([job], cluster.device_types), [0])[0]
    t = live.table
    t.status[row], t.queued_since_s[row] = QUEUED, now
    jobs = LiveJobsView(t, scheduler.knowledge, live.limit_s)  # what the service's policy may know
    held = scheduler.gpu_job.copy()
    down = held == GPU_DOWN
    for busy, owners in ((False, np.where(held == GPU_FREE, GPU_FREE, GPU_DOWN)),
                         (True, np.where(down, GPU_DOWN, GPU_FREE))):
        view = ClusterView(now_s=now, cluster=cluster, type_names=types.names, gpu_type=scheduler.gpu_type,
                           gpu_node=scheduler.gpu_node, gpu_job=owners, jobs=jobs, queue=[row], running=[])
        decision = scheduler.advice_policy().decide(view)
        for item in decision.starts if isinstance(decision, Decision) else ():
            try:
                _, gpus, ti = check_start(item, t, owners, scheduler.gpu_type, scheduler.gpu_node, types.names)
            except InvalidDecision:
                continue
            return _advice(cluster, backend, types.names[ti], gpus, busy)
    return {"gpu_type": None, "nodes": [], "gres": {}, "busy": True}


def _advice(cluster: ClusterSpec, backend, type_name: str, gpus: Sequence[int], busy: bool) -> dict[str, Any]:
    per_node = Counter(cluster.nodes[cluster.devices[g].node].name for g in gpus)
    gres_type = getattr(backend, "gres_type", None)
    gres = {node: f"gpu:{gres_type(node, type_name) if gres_type else type_name.lower()}:{n}"
            for node, n in per_node.items()}
    return {"gpu_type": type_name, "nodes": list(per_node), "gres": gres, "busy": busy}
