"""``ServiceConfig``: everything ``gpualloc serve`` configures, with its defaults written once.

``gpualloc serve`` reads its options' defaults and ranges from these fields
(:func:`gpualloc.options.default_of`, :func:`~gpualloc.options.bounds_of`), and ``serve --config
service.toml`` reads the same fields from a TOML file (:func:`gpualloc.options.load_options`); an
option given on the command line overrides the file. This module imports nothing heavy (no pydantic,
FastAPI or SQLAlchemy), so the CLI reads it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpualloc.options import check_options, option
from gpualloc.service.jobusers import JobUsers

DEFAULT_PORT = 8765
"""The port ``gpualloc serve`` binds when neither ``--port`` nor its file names one."""
DEFAULT_TIME_LIMIT_S = 3600.0
"""The time limit of a job submitted without one (as Slurm's ``DefaultTime``)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything ``gpualloc serve`` configures.

    Attributes:
        store: SQLite file or database URL (None: :func:`gpualloc.service.auth.default_store`,
            ``$XDG_STATE_HOME/gpualloc/service.db``, else ``~/.local/state/gpualloc/service.db``).
        cluster: preset, shorthand or cluster file the policy schedules.
        backend: ``"local"``, ``"ray"`` or ``"slurm"``.
        ray_address: join this Ray cluster (default: start a local Ray declaring the cluster's
            device types as resources).
        ray_num_cpus: CPUs of a locally started Ray.
        policy, policy_options: the policy (default: the one stored, else ``fcfs``).
        token_file: default ``<store>.token``.
        max_queued: queue length limit (429 beyond).
        max_body_bytes: request body limit (413 beyond).
        on_lost, max_attempts, preemption, tick_s: see :class:`~gpualloc.service.scheduler.Scheduler`.
        telemetry: ``"auto"`` (NVML when it opens, else none), ``"none"``, ``"nvml"`` or ``"sim"``.
        runs_dir: local backend's run folders (default ``<store>.runs``); Ray backend's logs.
        synchronous: SQLite synchronous pragma.
        host, port: the bound address; a request's ``Host`` header must name it (port None: any port,
            as for an app served in-process). ``serve`` binds ``port`` (None: :data:`DEFAULT_PORT`; 0: a
            free one) and records the port it got.
        allowed_hosts: more ``Host`` names to accept (a DNS name of a non-loopback bind).
        docs: serve ``/docs`` and ``/redoc`` (assets loaded from a CDN) without the token.
        agents_dir: the only folder a ``dqn`` policy's ``agent`` option may name a file in
            (default: the bundled agents, :func:`~gpualloc.service.app.bundled_agents_dir`).
        quotas: a team quota file (:meth:`gpualloc.scheduling.quotas.Quotas.from_file`): the policy
            is wrapped in :class:`~gpualloc.scheduling.quotas.QuotaPolicy`, and only its teams submit.
        job_users: who jobs of the local backend run as (:func:`~gpualloc.service.jobusers.plan_job_users`;
            None: the service's own user). When they switch users, the store's folder must be 0700.
            Not read from a file: ``serve`` takes it from ``--job-user`` only, where it is checked.
        knowledge: what the policy may know of durations (:mod:`gpualloc.scheduling.knowledge`):
            ``estimate`` (each job's time limit: the ``time_limit_s`` a user submits, else
            ``default_time_limit_s``), ``blind`` (submit-time fields and time run so far only: a policy
            that needs durations is refused) or ``oracle`` (the limit taken as exact).
        default_time_limit_s: the time limit of a job submitted without one (as Slurm's ``DefaultTime``).
        predictor_options: :class:`~gpualloc.scheduling.predict.PredictorConfig` fields of the duration
            predictor learned from the store's finished jobs (:mod:`gpualloc.service.prediction`).
        migrate: move running jobs to other nodes to make room for a single-node gang that free GPUs
            split across nodes keep waiting, when it pays (``Scheduler(migrate=)``, as the simulator's
            ``migrate``); a move stops a job and starts it again from scratch. Not with ``quotas``.
    """

    store: str | None = None
    cluster: str = "adlro16"
    backend: str = "local"
    ray_address: str | None = None
    ray_num_cpus: int | None = option(None, min=1)
    policy: str | None = None
    policy_options: dict[str, Any] = option(factory=dict)
    token_file: str | None = None
    max_queued: int = option(100_000, min=1)
    max_body_bytes: int = option(64 * 1024, min=1024)
    on_lost: str = "requeue"
    max_attempts: int = option(3, min=1)
    preemption: bool = False
    telemetry: str = "auto"
    tick_s: float = option(0.5, min=0.01)
    runs_dir: str | None = None
    synchronous: str = "FULL"
    host: str = "127.0.0.1"
    port: int | None = option(None, min=0, max=65535)
    allowed_hosts: tuple[str, ...] = ()
    docs: bool = False
    agents_dir: str | None = None
    quotas: str | None = None
    job_users: JobUsers | None = option(None, file=False)
    knowledge: str = "estimate"
    default_time_limit_s: float = option(DEFAULT_TIME_LIMIT_S, min=1e-6)
    predictor_options: dict[str, Any] = option(factory=dict)
    migrate: bool = False

    def __post_init__(self) -> None:
        check_options(self)
