"""What the service reads and writes: job requests at the input edge (pydantic), job records inside.

A :class:`JobSpec` is the simulator's job model (:class:`gpualloc.workload.jobs.Job`: type, work,
GPUs, priority, allowed device types, single node) plus what to run: a ``command`` (argv, never
given to a shell) or a Python ``callable`` (``"package.module:function"`` with JSON ``args`` and
``kwargs``). A :class:`JobRecord` is one row of the store; :class:`JobOut`, what the API shows of
it, is derived from its fields, less :data:`API_HIDDEN`, with ``env`` values redacted.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from gpualloc.service.config import DEFAULT_TIME_LIMIT_S
from gpualloc.workload.jobs import Job, JobType

MAX_ARGS = 256
"""Most argv entries (or callable ``args``) a job may have."""
MAX_ARG_CHARS = 4096
"""Longest argv entry."""
MAX_ENV = 64
"""Most extra environment variables a job may set."""


class JobState(str, Enum):
    """Where a job is. ``allocated``: GPUs recorded for it, not yet handed to the backend."""

    QUEUED = "queued"
    ALLOCATED = "allocated"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})
ACTIVE = (JobState.QUEUED, JobState.ALLOCATED, JobState.RUNNING)
HOLDING = (JobState.ALLOCATED, JobState.RUNNING)
"""States in which a job holds GPUs."""


NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]+$"
"""A job's name: printable, without control characters or the bidi marks and overrides (U+200E/F,
U+202A-202E, U+2066-2069) that make a name display as something else (Trojan Source, CVE-2021-42574)."""


def _no_control(value: str, what: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL bytes")
    return value


class JobSpec(BaseModel):
    """A job submission (``POST /jobs``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, str_max_length=MAX_ARG_CHARS)

    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN,
                      description="A label for people; need not be unique.")
    num_gpus: int = Field(1, ge=1, le=1024, description="GPUs granted all at once (gang), all of one type.")
    device_type: str | None = Field(None, min_length=1, max_length=64,
                                    description="Run only on this device type (catalog name or alias, "
                                                "e.g. V100, T4, MI50). Shorthand for gpu_types=[...].")
    gpu_types: list[str] = Field(default_factory=list, max_length=16,
                                 description="Device types the job may run on, preferred first: under team "
                                             "quotas it starts on the first with room and spills over to the "
                                             "next only when that has none; empty: any.")
    job_type: JobType = Field(JobType.ML_TRAINING, description="The job category the speed model uses.")
    time_limit_s: float | None = Field(
        None, gt=0, le=1e9,
        description="The user's time limit (an estimate, as Slurm's --time): seconds on num_gpus reference (V100) "
                    "GPUs. Optional. What a policy sees of it depends on the service's --knowledge "
                    "(docs/service.md, 'Run time: limits and predictions'); the job is not stopped at it.")
    work_s: float | None = Field(None, gt=0, le=1e9,
                                 description="Older name of time_limit_s, still accepted and read as the limit.")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    single_node: bool = Field(False, description="All GPUs on one node.")
    model: str = Field("", max_length=128, description="Model name, for the speed model (e.g. resnet50).")
    command: str | list[str] | None = Field(
        None, description="Program and arguments. A string is split like a POSIX shell would split it "
                          "(shlex), but no shell ever runs it.")
    callable: str | None = Field(None, max_length=256, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                                 description="Python function to call, as 'package.module:function'.")
    args: list[Any] = Field(default_factory=list, max_length=MAX_ARGS, description="callable: positional arguments.")
    kwargs: dict[str, Any] = Field(default_factory=dict, max_length=MAX_ARGS,
                                   description="callable: keyword arguments.")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV, description="Extra environment variables.")
    cwd: str | None = Field(None, min_length=1, max_length=4096,
                            description="Working directory: an absolute path to an existing folder on the service's "
                                        "host (`gpualloc submit` sends the submitter's current folder).")

    @field_validator("command")
    @classmethod
    def _argv(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = shlex.split(_no_control(value, "command"))
            except ValueError as err:
                raise ValueError(f"command cannot be split into arguments: {err}") from None
        if not value:
            raise ValueError("command is empty")
        if len(value) > MAX_ARGS:
            raise ValueError(f"command has {len(value)} arguments (at most {MAX_ARGS})")
        for arg in value:
            if len(arg) > MAX_ARG_CHARS:
                raise ValueError(f"a command argument is longer than {MAX_ARG_CHARS} characters")
            _no_control(arg, "command arguments")
        if not value[0]:
            raise ValueError("command: the program name is empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            if not key or not (key[0].isalpha() or key[0] == "_") or not all(c.isalnum() or c == "_" for c in key) \
                    or not key.isascii():
                raise ValueError(f"env: {key!r} is not a valid variable name")
            _no_control(val, f"env[{key}]")
        return value

    @field_validator("gpu_types")
    @classmethod
    def _types(cls, value: list[str]) -> list[str]:
        for t in value:
            if not 0 < len(t) <= 64:
                raise ValueError("gpu_types entries must be 1 to 64 characters")
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith("/"):
            raise ValueError("cwd must be an absolute path")
        _no_control(value, "cwd")
        # Checked here, not only when the job starts: a missing folder is the submitter's mistake,
        # and answered at once (a run would otherwise fail long after, looking like a missing program).
        if not os.path.isdir(value):
            raise ValueError(f"cwd {value!r} is not an existing directory on the service's host")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> JobSpec:
        if (self.command is None) == (self.callable is None):
            raise ValueError("give exactly one of command or callable")
        if self.command is not None and (self.args or self.kwargs):
            raise ValueError("args and kwargs go with callable, not command")
        if self.work_s is not None and self.time_limit_s is not None and self.work_s != self.time_limit_s:
            raise ValueError("work_s is the older name of time_limit_s: give one of them (or the same value)")
        return self

    @property
    def limit_s(self) -> float | None:
        """The user's time limit: ``time_limit_s``, else ``work_s`` (its older name), else None."""
        return self.time_limit_s if self.time_limit_s is not None else self.work_s

    def allowed_types(self) -> list[str]:
        """The requested device types, ``device_type`` first (names as given)."""
        out = [self.device_type] if self.device_type else []
        return out + [t for t in self.gpu_types if t not in out]


class PolicyChange(BaseModel):
    """``PUT /policy``: the policy to schedule with from now on."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    options: dict[str, Any] = Field(default_factory=dict, max_length=32,
                                    description="Keyword options of the policy's factory.")


@dataclass(frozen=True)
class JobRecord:
    """One job as the store holds it. Times are Unix seconds (None before they happen).

    Attributes:
        id: the store's id (increasing with submission).
        name, state: as submitted / now.
        spec: the normalised submission (device types canonical, command as argv).
        attempts: allocations so far (a re-queued job runs again as a new attempt).
        device_type, gpus: the current or last allocation (cluster device indices).
        handle: the backend's name for the current run.
        exit_code, error, result: the outcome (result: a callable's JSON return value).
        cancel_requested: a cancel arrived while the job held GPUs.
        idempotency_key: the client's key, when it gave one.
        user, team: who submitted it, from the token (never from the request body); None for a job
            recorded before the store had users.
    """

    id: int
    name: str
    state: JobState
    spec: dict[str, Any]
    attempts: int
    requeues: int
    submitted_at: float
    allocated_at: float | None
    started_at: float | None
    finished_at: float | None
    device_type: str | None
    gpus: tuple[int, ...]
    handle: str | None
    exit_code: int | None
    error: str | None
    result: Any
    cancel_requested: bool
    idempotency_key: str | None
    user: str | None = None
    team: str | None = None

    @property
    def time_limit_s(self) -> float | None:
        """The user's time limit: the spec's ``time_limit_s``, or ``work_s`` in a spec stored before the
        limit had its own name (every such spec has one: it defaulted to 3600 s); None: none given."""
        s = self.spec
        value = s["time_limit_s"] if "time_limit_s" in s else s.get("work_s")
        return None if value is None else float(value)

    def to_job(self, epoch: float, default_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Job:
        """The simulator's :class:`Job` for this record (arrival relative to ``epoch``; work: the user's
        time limit, else ``default_limit_s``, also kept as ``time_limit_s``; team and user from the
        record, ``""`` for none; ``gpu_types`` in the submitted order, preferred first)."""
        s = self.spec
        limit = self.time_limit_s
        return Job(id=str(self.id), arrival_s=max(0.0, self.submitted_at - epoch), job_type=JobType(s["job_type"]),
                   work_s=float(limit if limit is not None else default_limit_s), num_gpus=int(s["num_gpus"]),
                   model=s.get("model", ""), priority=int(s["priority"]), gpu_types=tuple(s["gpu_types"]),
                   single_node=bool(s["single_node"]), team=self.team or "", user=self.user or "", time_limit_s=limit)

    def to_api(self, prediction: dict[str, Any] | None = None) -> dict[str, Any]:
        """The fields of :class:`JobOut`: no :data:`API_HIDDEN` field, ``env`` values redacted; the
        :data:`PREDICTION_FIELDS` from ``prediction`` (None where it gives none)."""
        d: dict[str, Any] = {name: getattr(self, name) for name in RECORD_API_FIELDS}
        for name in PREDICTION_FIELDS:
            d[name] = None if prediction is None else prediction.get(name)
        d["state"] = self.state.value
        d["gpus"] = list(self.gpus)
        d["spec"] = redact_spec(self.spec)
        return d


API_HIDDEN = frozenset({"idempotency_key"})
"""Fields of :class:`JobRecord` the API never returns: a key would let whoever reads it pass as the
client that made it."""


def redact_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its target's ``env`` reduced to the variable names (values may be secrets)."""
    target = spec.get("target")
    if not isinstance(target, dict) or "env" not in target:
        return spec
    return {**spec, "target": {**target, "env": sorted(target["env"])}}


RECORD_API_FIELDS = tuple(f.name for f in fields(JobRecord) if f.name not in API_HIDDEN)
"""The fields of :class:`JobRecord` the API shows."""

PREDICTION_FIELDS: dict[str, tuple[Any, str]] = {
    "predicted_remaining_s": (float | None, "Predicted remaining run time, seconds (the median), on the device "
                                            "type it runs on, or for a queued job on its fastest allowed type; "
                                            "null for an ended job, or before any job has run to its end."),
    "predicted_remaining_lo_s": (float | None, "Lower end of the prediction's interval, seconds."),
    "predicted_remaining_hi_s": (float | None, "Upper end of the prediction's interval, seconds."),
    "prediction_interval": (float | None, "The interval's nominal coverage (0.8: 80% of jobs end inside it)."),
    "prediction_stage": (str | None, "What the prediction comes from: 'prior' (no history yet: no "
                                     "prediction), 'empirical' (every finished job's run time) or 'model' "
                                     "(learned from finished jobs' submit-time fields); null for an ended job."),
}
"""What ``GET /jobs`` and ``GET /jobs/{id}`` add to each queued or running job: its remaining run time
as the service's duration predictor sees it (:mod:`gpualloc.service.prediction`)."""


def _api_model() -> type[BaseModel]:
    hints = get_type_hints(JobRecord)
    return create_model(
        "JobOut", __doc__="A job as the API shows it (times are Unix seconds; ``spec.target.env``: names only).",
        **{name: (hints[name], ...) for name in RECORD_API_FIELDS},
        **{name: (kind, Field(None, description=text)) for name, (kind, text) in PREDICTION_FIELDS.items()})


JobOut = _api_model()
"""The API's job: :class:`JobRecord`'s fields (one list, kept there) less :data:`API_HIDDEN`, then
:data:`PREDICTION_FIELDS`."""
