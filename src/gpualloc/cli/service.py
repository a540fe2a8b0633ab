"""``gpualloc serve`` (the scheduler service) and its clients: ``submit``, ``jobs``, ``logs``, ``cancel``,
``policy``."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path

import typer

from gpualloc.cli.common import console, err_console, print_json
from gpualloc.options import bounds_of
from gpualloc.service.config import DEFAULT_PORT, ServiceConfig
from gpualloc.workload.jobs import JobType

_DEFAULTS = ServiceConfig()
"""The one written copy of the defaults ``serve``'s options show (their ranges: ``bounds_of``)."""
_SERVER = typer.Option(f"http://{_DEFAULTS.host}:{DEFAULT_PORT}", "--server", envvar="GPUALLOC_SERVER",
                       help="The service's URL.")
_TOKEN = typer.Option(None, "--token", envvar="GPUALLOC_TOKEN",
                      help="Bearer token (kept in the file beside the service's store, made on its first start).")
_TOKEN_FILE = typer.Option(None, "--token-file", help="Read the token from this file instead of --token.")


def _client(server: str, token: str | None, token_file: Path | None):
    """The service's client, with the token of ``--token-file``, else of ``--token``."""
    from gpualloc.service.auth import check_token, read_token
    from gpualloc.service.client import Client

    if token_file is not None:
        token = read_token(token_file)
    elif token is not None:
        token = check_token(token, "--token / GPUALLOC_TOKEN")
    return Client(server, token)


def serve(
    ctx: typer.Context,
    config_file: Path | None = typer.Option(None, "--config",
                                            help="TOML file of service settings (the ServiceConfig fields, e.g. "
                                                 "tick_s = 0.2, max_queued = 5000; docs/service.md); an option "
                                                 "given here overrides the file."),
    host: str = typer.Option(_DEFAULTS.host, "--host", help="Address to bind (loopback by default)."),
    port: int | None = typer.Option(_DEFAULTS.port, "--port", **bounds_of(ServiceConfig, "port"),
                                    show_default=False,
                                    help=f"Port to listen on (default {DEFAULT_PORT}; 0: a free one)."),
    backend: str = typer.Option(_DEFAULTS.backend, "--backend",
                                help="Where jobs run: local (processes here), ray, or slurm (with --cluster slurm:)."),
    store: str | None = typer.Option(_DEFAULTS.store, "--store",
                                     help="SQLite file (WAL) or database URL (postgresql://...); the token file "
                                          "sits beside it [default: $XDG_STATE_HOME/gpualloc/service.db, else "
                                          "~/.local/state/gpualloc/service.db]."),
    cluster: str = typer.Option(_DEFAULTS.cluster, "--cluster", "-c",
                                help="Preset, shorthand or cluster file scheduled."),
    ray_address: str | None = typer.Option(_DEFAULTS.ray_address, "--ray-address",
                                              help="Join this Ray cluster (default: start a local Ray with the "
                                                   "cluster's device types as resources, e.g. gpu_V100)."),
    ray_num_cpus: int | None = typer.Option(_DEFAULTS.ray_num_cpus, "--ray-num-cpus",
                                               **bounds_of(ServiceConfig, "ray_num_cpus"),
                                               help="CPUs of a locally started Ray."),
    policy: str | None = typer.Option(_DEFAULTS.policy, "--policy", "-p",
                                         help="Scheduling policy (default: the store's last, else fcfs)."),
    token_file: Path | None = typer.Option(_DEFAULTS.token_file, "--token-file",
                                              help="Token file (default: <store>.token)."),
    max_queued: int = typer.Option(_DEFAULTS.max_queued, "--max-queued", **bounds_of(ServiceConfig, "max_queued"),
                                   help="Queue length limit (HTTP 429 beyond)."),
    max_body_bytes: int = typer.Option(_DEFAULTS.max_body_bytes, "--max-body-bytes",
                                       **bounds_of(ServiceConfig, "max_body_bytes"),
                                       help="Request body limit (HTTP 413 beyond)."),
    on_lost: str = typer.Option(_DEFAULTS.on_lost, "--on-lost", help="A run the backend lost: requeue or fail."),
    max_attempts: int = typer.Option(_DEFAULTS.max_attempts, "--max-attempts",
                                     **bounds_of(ServiceConfig, "max_attempts"),
                                     help="Attempts before a lost job fails."),
    preemption: bool = typer.Option(_DEFAULTS.preemption, "--preemption/--no-preemption",
                                    help="Let preemptive policies stop running jobs (they restart from scratch)."),
    telemetry: str = typer.Option(_DEFAULTS.telemetry, "--telemetry",
                                  help="auto (NVML if present), none, nvml or sim."),
    tick_s: float = typer.Option(_DEFAULTS.tick_s, "--tick", **bounds_of(ServiceConfig, "tick_s"),
                                 help="Longest seconds between scheduler passes."),
    log_level: str = typer.Option("warning", "--log-level", help="Server log level."),
    docs: bool = typer.Option(_DEFAULTS.docs, "--docs/--no-docs",
                              help="Serve /docs and /redoc without the token; they load their scripts from a CDN "
                                   "(cdn.jsdelivr.net), so they stay blank offline."),
    agents_dir: Path | None = typer.Option(_DEFAULTS.agents_dir, "--agents-dir", exists=True, file_okay=False,
                                              help="The only folder a dqn policy's agent may be loaded from "
                                                   "(default: the bundled agents)."),
    allowed_hosts: list[str] | None = typer.Option(None, "--allow-host",
                                                      help="Another Host header name to accept (a DNS name of this "
                                                           "machine; repeatable)."),
    quotas: Path | None = typer.Option(_DEFAULTS.quotas, "--quotas",
                                          help="Team quota file (TOML, as `simulate --quotas`): GPUs guaranteed "
                                               "per team and type, idle ones borrowed and reclaimed; only its "
                                               "teams' users may submit."),
    job_user: list[str] | None = typer.Option(None, "--job-user", envvar="GPUALLOC_JOB_USER",
                                                 help="Run jobs as this OS user (local backend; needs root or "
                                                      "CAP_SETUID); TEAM=USER for one team's jobs (repeatable). "
                                                      "Required when serve runs as root (--job-user root runs jobs "
                                                      "as root, with a warning)."),
    knowledge: str = typer.Option(_DEFAULTS.knowledge, "--knowledge", "-k",
                                  help="What the policy knows of job durations (docs/knowledge.md): estimate (each "
                                       "job's time limit, the user's or --default-time-limit), blind (submit-time "
                                       "fields and service attained so far only; srtf, sjf, easy-backfill and "
                                       "gavel-srtf are refused: use their -pred versions) or oracle (the limit "
                                       "taken as exact)."),
    default_time_limit_s: float = typer.Option(_DEFAULTS.default_time_limit_s, "--default-time-limit",
                                               **bounds_of(ServiceConfig, "default_time_limit_s"),
                                               help="Seconds: the time limit of a job submitted without one "
                                                    "(as Slurm's DefaultTime)."),
    migrate: bool = typer.Option(_DEFAULTS.migrate, "--migrate/--no-migrate",
                                 help="Move running jobs to other nodes to make room for a single-node gang that "
                                      "free GPUs split across nodes keep waiting, when it pays (a moved job "
                                      "restarts from scratch; docs/service.md). Not with --quotas."),
    ready_file: Path | None = typer.Option(None, "--ready-file",
                                              help="Once the service accepts connections, write this file "
                                                   "(JSON: url, pid, token_file; mode 0600, atomically); removed "
                                                   "when it stops."),
) -> None:
    """Run the scheduler service: a REST API over a policy deciding on live state."""
    from gpualloc.options import OptionsError, given, load_options, with_overrides
    from gpualloc._extras import require

    require("service", "uvicorn", by="gpualloc serve")  # before any set-up; FastAPI and SQLAlchemy: service.app
    from gpualloc.service.app import LOOPBACK_HOSTS, Service, listen_socket
    from gpualloc.service.auth import check_own_or_missing, check_private_folder
    from gpualloc.service.jobusers import plan_job_users
    from gpualloc.service.scheduler import check_policy_name

    from gpualloc.scheduling.knowledge import check_knowledge, require_policy

    # The file's settings, then the options given on the command line (an option left at its default
    # does not override the file).
    base = load_options(ServiceConfig, config_file) if config_file is not None else ServiceConfig()
    fields = {f.name for f in dataclasses.fields(ServiceConfig)}  # the options named as their fields
    explicit = given(ctx, **{name: value for name, value in ctx.params.items() if name in fields})
    for name in ("token_file", "agents_dir", "quotas"):  # the configuration holds paths as strings
        if explicit.get(name) is not None:
            explicit[name] = str(explicit[name])
    if "allowed_hosts" in explicit:
        explicit["allowed_hosts"] = tuple(explicit["allowed_hosts"] or ())
    cfg = with_overrides(base, **explicit)
    if "agents_dir" not in explicit and cfg.agents_dir is not None and not Path(cfg.agents_dir).is_dir():
        raise OptionsError(f"{config_file}: agents_dir: {cfg.agents_dir!r} is not a folder")
    knowledge, policy, backend, host = cfg.knowledge, cfg.policy, cfg.backend, cfg.host
    check_knowledge(knowledge, "--knowledge")
    if policy is not None:  # refused as the simulator refuses it, before anything is made
        check_policy_name(policy)
        require_policy(policy, knowledge)  # a dqn whose bundled agent reads what the level hides too
    # First, before printing anything or making a token: a port in use is one line and exit 2.
    sock = listen_socket(host, DEFAULT_PORT if cfg.port is None else cfg.port)
    try:
        users, user_warnings = plan_job_users(job_user or (), backend)
        if ready_file is not None:
            ready_file = ready_file.absolute()
            # a ready file another user could replace would send clients (and their token) elsewhere
            check_private_folder(ready_file.parent)
            check_own_or_missing(ready_file, "--ready-file")
            ready_file.unlink(missing_ok=True)
        port = sock.getsockname()[1]
        if host not in LOOPBACK_HOSTS:
            err_console.print(f"[yellow]warning:[/] binding to {host}: the API is reachable from other hosts "
                              "(use TLS in front of it)")
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        service = Service(with_overrides(cfg, port=port, job_users=users)).open()  # it names the default store
        # Connections now wait in the queue instead of being refused: the token file exists already.
        sock.listen(2048)
        for line in user_warnings:
            err_console.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
        _serve(service, sock, service.config, log_level, ready_file)
    finally:
        sock.close()


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _serve(service, sock, config, log_level: str, ready_file: Path | None = None) -> None:
    """Print the banner and answer requests on ``sock`` until stopped; then close ``service``. With
    ``ready_file``, write it once the server accepts connections, and remove it when it stops."""
    from gpualloc._extras import require

    uvicorn = require("service", "uvicorn", by="gpualloc serve")
    from gpualloc.service.app import create_app
    from gpualloc.service.auth import write_private_atomic

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if ready_file is not None and not self.should_exit:
                info = {"url": url, "pid": os.getpid(), "token_file": str(service.token_path)}
                write_private_atomic(ready_file, (json.dumps(info) + "\n").encode())

    try:
        rec = service.recovery
        url = f"http://{f'[{config.host}]' if ':' in config.host else config.host}:{config.port}"
        console.print(f"gpualloc service on {url}{' (docs /docs)' if config.docs else ''}: backend {config.backend}, "
                      f"policy {service.scheduler.policy_name}, cluster {service.cluster.name}, store {config.store}")
        if any(rec.get(k) for k in ("adopted", "ended", "requeued", "failed")):
            console.print("recovered: " + ", ".join(f"{len(v)} {k}" for k, v in rec.items()))
        # the token itself is never printed: a terminal's scroll-back and a service's log are read by others
        console.print(f"token: {'made on this first start and kept' if service.token_created else 'kept'} in "
                      f"{service.token_path} (mode 0600)")
        # Everything loaded so far lives as long as the process: keep it out of the garbage
        # collector's full passes, which would otherwise pause every request now and then.
        gc.collect()
        gc.freeze()
        server = _Server(uvicorn.Config(create_app(service), log_level=log_level.lower(), access_log=False,
                                        timeout_graceful_shutdown=5))
        # uvicorn shuts down on SIGTERM, then raises the signal again: exit through the `finally` below
        # (close the store, remove the ready file) instead of dying by the default action.
        signal.signal(signal.SIGTERM, _exit_on_signal)
        server.run(sockets=[sock])
    finally:
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)
        service.close()


def submit(
    name: str = typer.Option(..., "--name", help="Job name."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs, granted all at once."),
    device_type: str | None = typer.Option(None, "--device-type", help="Only this device type (V100, T4, MI50, ...)."),
    gpu_type: list[str] | None = typer.Option(None, "--gpu-type",
                                              help="A device type the job may run on, preferred first "
                                                   "(repeatable: --gpu-type V100 --gpu-type T4 spills over to T4)."),
    command: str | None = typer.Option(None, "--command",
                                       help="Program and arguments (split like a shell, never run by one)."),
    func: str | None = typer.Option(None, "--callable",
                                    help="Python function 'package.module:function' instead of a command."),
    args: str | None = typer.Option(None, "--args", help="--callable: JSON list of positional arguments."),
    kwargs: str | None = typer.Option(None, "--kwargs", help="--callable: JSON object of keyword arguments."),
    job_type: JobType = typer.Option(JobType.ML_TRAINING.value, "--job-type", help="Job category (speed model)."),
    time_limit: str | None = typer.Option(None, "--time-limit", "-t",
                                          help="Your time limit, an estimate as Slurm's --time: seconds (a plain "
                                               "number; Slurm reads minutes), with a unit (90m, 2h, 1.5d), or "
                                               "[D-]HH:MM:SS; on --gpus V100s. Optional: the service predicts run "
                                               "times from its finished jobs."),
    work: float | None = typer.Option(None, "--work", min=1e-6, hidden=True,
                                      help="Older name of --time-limit (seconds)."),
    priority: int = typer.Option(0, "--priority", help="Larger is more important."),
    single_node: bool = typer.Option(False, "--single-node", help="All GPUs on one node."),
    model: str = typer.Option("", "--model", help="Model name for the speed model (resnet50, bert, ...)."),
    env: list[str] | None = typer.Option(None, "--env", help="KEY=VALUE for the job (repeatable)."),
    cwd: Path | None = typer.Option(None, "--cwd", file_okay=False,
                                       help="Working directory of the job on the service's host "
                                            "[default: the current folder]."),
    server: str = _SERVER,
    token: str | None = _TOKEN,
    token_file: Path | None = _TOKEN_FILE,
    retry: float = typer.Option(30.0, "--retry", min=0.0,
                                help="Seconds to keep retrying while the service is unreachable."),
    as_json: bool = typer.Option(False, "--json", help="Print the recorded job as JSON."),
) -> None:
    """Submit a job; exits 0 only once the service has durably recorded it."""
    from gpualloc.service.client import ClientError

    spec: dict = {"name": name, "num_gpus": gpus, "job_type": job_type.value, "priority": priority,
                  "single_node": single_node, "model": model}
    if time_limit is not None and work is not None:
        raise ClientError("--work is the older name of --time-limit: give one of them")
    if time_limit is not None:
        spec["time_limit_s"] = parse_time_limit(time_limit)
    elif work is not None:
        spec["time_limit_s"] = work
    if device_type:
        spec["device_type"] = device_type
    if gpu_type:
        spec["gpu_types"] = list(gpu_type)
    if command is not None:
        spec["command"] = command
    if func is not None:
        spec["callable"] = func
        try:
            spec["args"] = json.loads(args) if args else []
            spec["kwargs"] = json.loads(kwargs) if kwargs else {}
        except ValueError as err:
            raise ClientError(f"--args/--kwargs: not JSON: {err}") from None
    if env:
        pairs = [e.partition("=") for e in env]
        bad = [e for e, (_, sep, _) in zip(env, pairs, strict=False) if not sep]
        if bad:
            raise ClientError(f"--env {bad[0]!r}: expected KEY=VALUE")
        spec["env"] = {k: v for k, _, v in pairs}
    # Relative paths in the command mean what they mean here, as for any command one types.
    spec["cwd"] = os.path.abspath(cwd if cwd is not None else os.getcwd())
    with _client(server, token, token_file) as client:
        job = client.submit(spec, retry_s=retry)
    if as_json:
        print_json(job)
    else:
        console.print(f"job {job['id']} {job['state']}: {job['name']}", highlight=False)


_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_time_limit(text: str) -> float:
    """Seconds of a time limit written as seconds (``5400``), with a unit (``90m``, ``1.5h``, ``2d``), or as
    Slurm writes it (``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``).

    Raises:
        ClientError: anything else, or a limit that is not > 0.
    """
    import re

    from gpualloc.service.client import ClientError

    t = text.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h|d)?", t)
    seconds = None
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2) or ""]
    else:
        m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
        if m and (m.group(1) or m.group(3)):
            days, parts = int(m.group(1) or 0), [int(p) for p in m.group(2, 3, 4) if p is not None]
            if m.group(1):  # D-HH[:MM[:SS]]
                parts += [0] * (3 - len(parts))
            elif len(parts) == 2:  # MM:SS
                parts = [0, *parts]
            h, mi, se = parts
            seconds = days * 86400.0 + h * 3600.0 + mi * 60.0 + se
    if seconds is None or not 0 < seconds <= 1e9:
        raise ClientError(f"--time-limit {text!r}: expected seconds, a number with a unit (90m, 2h, 1.5d) or "
                          f"[D-]HH:MM:SS, more than 0")
    return seconds


def jobs(
    server: str = _SERVER,
    token: str | None = _TOKEN,
    token_file: Path | None = _TOKEN_FILE,
    state: list[str] | None = typer.Option(None, "--state", help="Only jobs in this state (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the jobs as a JSON list."),
) -> None:
    """List the service's jobs."""
    with _client(server, token, token_file) as client:
        rows = client.jobs(state)
    if as_json:
        print_json(rows)
        return
    from gpualloc.reports.service import jobs_table

    console.print(jobs_table(rows))


def logs(
    job_id: int = typer.Argument(..., min=1, help="The job's id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends."),
    stderr: bool = typer.Option(False, "--stderr", help="Print its standard error instead of its standard output."),
    server: str = _SERVER,
    token: str | None = _TOKEN,
    token_file: Path | None = _TOKEN_FILE,
) -> None:
    """Print a job's output (of its latest attempt), as bytes, unchanged."""
    out = sys.stdout.buffer
    with _client(server, token, token_file) as client:
        for data in client.follow_logs(job_id, "stderr" if stderr else "stdout", follow=follow):
            out.write(data)
            out.flush()


def cancel(
    job_id: int = typer.Argument(..., min=1, help="The job's id."),
    server: str = _SERVER,
    token: str | None = _TOKEN,
    token_file: Path | None = _TOKEN_FILE,
) -> None:
    """Cancel a job (a running one is stopped)."""
    with _client(server, token, token_file) as client:
        job = client.cancel(job_id)
    stopping = job["cancel_requested"] and job["state"] != "cancelled"
    console.print(f"job {job['id']} {job['state']}{' (stopping)' if stopping else ''}", highlight=False)


def policy(
    name: str | None = typer.Argument(None, help="Switch to this policy (omit to show the current one)."),
    options: str | None = typer.Option(None, "--options", help="JSON object of the policy's options."),
    server: str = _SERVER,
    token: str | None = _TOKEN,
    token_file: Path | None = _TOKEN_FILE,
) -> None:
    """Show or switch the service's scheduling policy."""
    from gpualloc.service.client import ClientError

    with _client(server, token, token_file) as client:
        if name is None:
            info = client.policy()
        else:
            try:
                opts = json.loads(options) if options else {}
            except ValueError as err:
                raise ClientError(f"--options: not JSON: {err}") from None
            info = client.set_policy(name, opts)
    knows = f"knowledge {info['knowledge']}; " if info.get("knowledge") else ""
    console.print(f"policy {info['name']} ({knows}available: {', '.join(info['available'])})", highlight=False)


def whoami(
    server: str = _SERVER,
    token: str | None = _TOKEN,
    token_file: Path | None = _TOKEN_FILE,
    as_json: bool = typer.Option(False, "--json", help="Print it as JSON."),
) -> None:
    """Say whose the token is: user, team, admin."""
    with _client(server, token, token_file) as client:
        me = client.me()
    if as_json:
        print_json(me)
        return
    team = f"team {me['team']}" if me["team"] else "no team"
    console.print(f"{me['user']} ({team}{', admin' if me['admin'] else ''})", highlight=False)


# ------------------------------------------------------------------------------------------- users
user_app = typer.Typer(help="Users and teams of the service: each user holds a token and belongs to one team "
                            "(run on the service's host; works while it runs).", no_args_is_help=True)
_STORE = typer.Option(None, "--store", help="The service's store (as given to `gpualloc serve --store`) "
                                            "[default: serve's default].")


def _open_store(store: str | None):
    """The store, checked as ``serve`` checks it (folder made 0700, no planted or foreign store file),
    closed at the end of the ``with`` block."""
    from contextlib import closing

    from gpualloc.service.auth import check_store_files, default_store
    from gpualloc.service.store import Store, sqlite_path

    store = store or default_store()
    path = sqlite_path(store)
    if path is not None:
        check_store_files(path)
    return closing(Store(store))


def default_user_token_path(db, name: str) -> Path:
    """Where ``gpualloc user add`` writes a user's token without ``--token-file``:
    ``<store>.tokens/<name>.token`` (``./gpualloc-tokens/<name>.token`` for a database URL)."""
    path = db.path
    folder = Path("gpualloc-tokens").absolute() if path is None else path.with_name(path.name + ".tokens")
    return folder / f"{name}.token"


def _quota_teams(quotas: Path | None, db) -> tuple[frozenset[str], str] | None:
    """The teams a user may belong to: those of ``--quotas``, else those the running service's quota
    file named (kept in the store by ``serve --quotas``), else any (None)."""
    if quotas is not None:
        from gpualloc.scheduling.quotas import Quotas

        return frozenset(t.name for t in Quotas.from_file(quotas).teams), str(quotas)
    raw = db.get_meta("quota_teams")
    data = json.loads(raw) if raw is not None else {}
    if data.get("teams") is None:
        return None
    return frozenset(data["teams"]), str(data["file"])


_TOKEN_OUT = typer.Option(None, "--token-file",
                          help="Write the token to this file, mode 0600 [default: <store>.tokens/NAME.token].")


@user_app.command("add")
def user_add(
    name: str = typer.Argument(..., help="User name (letters, digits, '.', '_', '-')."),
    team: str = typer.Option(..., "--team", help="The user's team: they see and cancel its jobs, and use its quota."),
    admin: bool = typer.Option(False, "--admin", help="May see and cancel every job and change the policy."),
    store: str | None = _STORE,
    token_file: Path | None = _TOKEN_OUT,
    quotas: Path | None = typer.Option(None, "--quotas", help="Refuse a team this quota file does not name "
                                                              "[default: the file the service was started with]."),
) -> None:
    """Add a user; their new token is written to a 0600 file (never printed)."""
    from gpualloc.service.errors import ServiceError
    from gpualloc.service.auth import write_token_file
    from gpualloc.service.users import check_name

    check_name(name, "user")
    check_name(team, "team")
    with _open_store(store) as db:
        allowed = _quota_teams(quotas, db)
        if allowed is not None and team not in allowed[0]:
            raise ServiceError(f"--team {team!r}: not a team of the quota file {allowed[1]} "
                               f"(teams: {', '.join(sorted(allowed[0]))})")
        path = token_file or default_user_token_path(db, name)
        user, secret = db.add_user(name, team, admin=admin)
        try:
            path = write_token_file(path, secret)
        except ServiceError:
            db.remove_user(name)  # a token nobody holds is no user
            raise
    console.print(f"user {user.name} (team {user.team}{', admin' if user.admin else ''}) added; token in {path} "
                  f"(mode 0600): give it to them (gpualloc ... --token-file {path})", highlight=False, soft_wrap=True)


@user_app.command("list")
def user_list(
    store: str | None = _STORE,
    as_json: bool = typer.Option(False, "--json", help="Print the users as a JSON list."),
) -> None:
    """List the users (never their tokens: the store keeps only a hash)."""
    import datetime

    with _open_store(store) as db:
        rows = db.users()
    if as_json:
        print_json(rows)
        return
    from gpualloc.reports.tables import Table

    def when(t: float) -> str:
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")

    table = Table("user", "team", "admin", "added", "token made")
    for r in rows:
        table.add_row(r["name"], r["team"], "yes" if r["admin"] else "", when(r["created_at"]), when(r["token_at"]))
    console.print(table)


@user_app.command("remove")
def user_remove(
    name: str = typer.Argument(..., help="The user."),
    store: str | None = _STORE,
) -> None:
    """Remove a user: their token stops working at once (their jobs stay)."""
    with _open_store(store) as db:
        db.remove_user(name)
        default_user_token_path(db, name).unlink(missing_ok=True)
    console.print(f"user {name} removed; their token no longer works", highlight=False)


@user_app.command("token")
def user_token(
    name: str = typer.Argument(..., help="The user."),
    rotate: bool = typer.Option(False, "--rotate", help="Make a new token (the old one stops working at once)."),
    store: str | None = _STORE,
    token_file: Path | None = _TOKEN_OUT,
) -> None:
    """Give a user a new token (``--rotate``), written to a 0600 file (never printed)."""
    from gpualloc.service.errors import ServiceError
    from gpualloc.service.auth import write_token_file

    if not rotate:
        raise ServiceError("user token: the store keeps only a hash of each token, so it cannot be shown again; "
                           "add --rotate to make a new one")
    with _open_store(store) as db:
        path = token_file or default_user_token_path(db, name)
        secret = db.rotate_token(name)
        path = write_token_file(path, secret)
    console.print(f"user {name}: new token in {path} (mode 0600); the old one no longer works", highlight=False,
                  soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``submit``, ``jobs``, ``logs``, ``cancel``, ``policy``, ``whoami`` and ``user`` to the
    ``gpualloc`` command."""
    app.command("serve")(serve)
    app.command("submit")(submit)
    app.command("jobs")(jobs)
    app.command("logs")(logs)
    app.command("cancel")(cancel)
    app.command("policy")(policy)
    app.command("whoami")(whoami)
    app.add_typer(user_app, name="user")
