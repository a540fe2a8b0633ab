"""Running one job attempt: a program (argv, never a shell) or a Python callable.

:class:`Execution` starts a target, reports whether it ended and how, and stops it. Both backends
use it: the ``local`` backend through ``python -m gpualloc.service.runner RUN_DIR`` (a small process
that outlives the service, so a restarted service finds the run and its exit status in the run
folder), the ``ray`` backend inside a Ray actor.

A run folder holds ``spec.json`` (what to run; from the local backend, the job's ``env`` names only: the
values reach the runner on its standard input), ``runner.pid`` and ``program.pid``,
``stdout.log`` / ``stderr.log`` and, once the run ended, ``exit.json`` (``exit_code``, ``error``,
``result``), written atomically.
Folders are created 0700 and files 0600: a job's output and environment are its owner's alone.

Standard library only: this module is imported by every run.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SPEC_FILE, EXIT_FILE, PID_FILE, PROGRAM_PID_FILE = "spec.json", "exit.json", "runner.pid", "program.pid"
LOG_FILES = {"stdout": "stdout.log", "stderr": "stderr.log"}
"""The log file of each output stream, in a run folder."""
MAX_RESULT_CHARS = 65536


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700 for the last part; returns it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def open_private(path: Path, *, append: bool = True):
    """``path`` opened for binary writing, created with mode 0600 (in the ``open`` call itself, so
    the file is never readable by others, not even for a moment)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, 0o600), "ab" if append else "wb")


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the program gets SIGKILL when the process that started it dies (a lost runner or Ray
    worker must not leave its job running unseen). If that process died before the request took
    effect, the program is not started at all."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() != parent:
        os._exit(137)


def _no_cwd(cwd: str) -> dict[str, Any]:
    return {"exit_code": 126, "error": f"working directory not found: {cwd}", "result": None}


def _jsonable(value: Any) -> Any:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)[:MAX_RESULT_CHARS]}
    return value if len(text) <= MAX_RESULT_CHARS else {"repr": text[:MAX_RESULT_CHARS]}


JOB_ENV_PASSED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM",
                  "VIRTUAL_ENV", "CONDA_PREFIX", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                  "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
"""The only variables of the runner's environment a job's process starts with (the rest, the service's token
and whatever secrets its shell held, never reach a job); the submission's ``env`` and the backend's device
variables come on top."""

JOB_ENV_PREFIXES = ("SLURM_", "PMI_", "PMIX_", "OMPI_")
"""Variables the job's scheduler sets for the allocation it runs in (a Slurm job's own), passed as well."""


def job_base_env() -> dict[str, str]:
    """The part of the runner's environment a job inherits: :data:`JOB_ENV_PASSED` and the allocation's
    :data:`JOB_ENV_PREFIXES`, nothing else."""
    return {k: v for k, v in os.environ.items() if k in JOB_ENV_PASSED or k.startswith(JOB_ENV_PREFIXES)}


JOB_UMASK = 0o077
"""The umask of a job run as another user: what it creates is its own alone."""


def _may_enter(folder: str, pw: pwd.struct_passwd) -> bool:
    """Whether user ``pw`` (its primary group only, as the job runs) may enter ``folder``: checked in a
    forked child that takes the user's identity (``access`` as root would always say yes)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only checks and exits
        try:
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os._exit(0 if os.access(folder, os.X_OK) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


class Execution:
    """One run of a target.

    Args:
        target: ``{"argv": [...]}`` or ``{"callable": "mod:fn", "args": [...], "kwargs": {...}}``, with
            optional ``env`` (extra variables), ``cwd`` and ``user``. With ``user``, the program runs as that
            user (its primary group only, umask 077, ``HOME`` its home; default ``cwd`` its home, else
            ``/``), and a callable runs in a child process as that user (``python -m
            gpualloc.service.runner --call``), never in this process. The job's ``env`` reaches the
            program through its environment only.
        log_dir: where ``stdout.log`` and ``stderr.log`` go (None: discarded).
        callable_in_thread: run a callable in a thread (a Ray actor stays responsive) rather than in
            :meth:`wait`'s caller.
    """

    def __init__(self, target: dict[str, Any], log_dir: str | Path | None = None, *,
                 callable_in_thread: bool = True) -> None:
        self.target = target
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.in_thread = callable_in_thread
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.outcome: dict[str, Any] | None = None
        self._result_file = None  # a callable run as another user writes its outcome here

    def _streams(self):
        if self.log_dir is None:
            return subprocess.DEVNULL, subprocess.DEVNULL
        private_dir(self.log_dir)
        return open_private(self.log_dir / LOG_FILES["stdout"]), open_private(self.log_dir / LOG_FILES["stderr"])

    def _as_user(self, user: str, env: dict[str, str], cwd: str | None) -> tuple[dict[str, Any], str | None]:
        """The ``Popen`` arguments that run the program as ``user`` and its working directory; sets the
        user's ``HOME``, ``USER`` and ``LOGNAME`` in ``env``.

        Raises:
            OSError: one line: no such user, or a working directory the user may not enter.
        """
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            raise OSError(f"no user {user!r} on this host") from None
        env.update(HOME=pw.pw_dir, USER=pw.pw_name, LOGNAME=pw.pw_name)
        if not cwd:
            cwd = pw.pw_dir if os.path.isdir(pw.pw_dir) else "/"
        # Popen changes folder before it changes user, so it would not notice (a missing folder is
        # reported by the caller as such).
        if os.path.isdir(cwd) and not _may_enter(cwd, pw):
            raise OSError(f"working directory not accessible to user {pw.pw_name}: {cwd} (it needs search "
                          "permission, x, on the folder and every folder above it)")
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "umask": JOB_UMASK}, cwd

    def _callable_child(self) -> tuple[list[str], Any, tuple[int, ...]]:
        """argv, standard input and the descriptor to pass of a child that runs the callable (as the
        job's user: never in this process, the service's user). It reads its call from an unlinked file
        and writes its outcome to another."""
        import tempfile  # here, not at the top: every job's runner imports this module (start-up CPU)

        call = {k: self.target[k] for k in ("callable", "args", "kwargs") if k in self.target}
        if self.log_dir is not None:
            private_dir(self.log_dir)
        stdin = tempfile.TemporaryFile(dir=self.log_dir)
        stdin.write(json.dumps(call).encode())
        stdin.seek(0)
        self._result_file = tempfile.TemporaryFile(dir=self.log_dir)
        fd = self._result_file.fileno()
        return [sys.executable, "-m", "gpualloc.service.runner", "--call", str(fd)], stdin, (fd,)

    def start(self) -> int:
        """Start the target; returns the program's pid (0 for a callable run in this process)."""
        env = {**job_base_env(), **self.target.get("env", {})}
        cwd = self.target.get("cwd")
        user = self.target.get("user")
        as_user: dict[str, Any] = {}
        if user:
            try:
                as_user, cwd = self._as_user(str(user), env, cwd)
            except OSError as exc:
                error = str(exc) if str(exc).startswith("working directory") else f"cannot run as {user}: {exc}"
                self.outcome = {"exit_code": 126, "error": error, "result": None}
                return 0
        if cwd and not os.path.isdir(cwd):
            # Popen raises the same FileNotFoundError for a missing cwd as for a missing program.
            self.outcome = _no_cwd(cwd)
            return 0
        stdin: Any = subprocess.DEVNULL
        pass_fds: tuple[int, ...] = ()
        if user and "callable" in self.target:
            argv, stdin, pass_fds = self._callable_child()
        elif "argv" in self.target:
            argv = [str(a) for a in self.target["argv"]]
        else:
            if self.in_thread:
                self.thread = threading.Thread(target=self._call, name="gpualloc-job", daemon=True)
                self.thread.start()
            return 0
        out, err = self._streams()
        parent = os.getpid()
        try:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=out, stderr=err, close_fds=True,
                                         pass_fds=pass_fds, start_new_session=True,
                                         preexec_fn=(lambda: _die_with_parent(parent))
                                         if sys.platform == "linux" else None, **as_user)
        except FileNotFoundError:
            if cwd and not os.path.isdir(cwd):  # removed between the check above and the start
                self.outcome = _no_cwd(cwd)
            else:
                self.outcome = {"exit_code": 127, "error": f"command not found: {argv[0]}", "result": None}
        except PermissionError:
            whom = f" (to user {user})" if user else ""
            self.outcome = {"exit_code": 126, "error": f"permission denied{whom}: {argv[0]}", "result": None}
        except OSError as exc:
            self.outcome = {"exit_code": 126, "error": f"cannot start {argv[0]}: {exc}", "result": None}
        finally:
            for stream in (out, err, stdin):
                if hasattr(stream, "close"):
                    stream.close()
        return 0 if self.proc is None else self.proc.pid

    def _call(self) -> None:
        t = self.target
        try:
            module, _, name = str(t["callable"]).partition(":")
            import importlib

            fn = getattr(importlib.import_module(module), name)
            for k, v in t.get("env", {}).items():
                os.environ[k] = v
            if t.get("cwd"):
                os.chdir(t["cwd"])
            result = fn(*t.get("args", []), **t.get("kwargs", {}))
            self.outcome = {"exit_code": 0, "error": None, "result": _jsonable(result)}
        except BaseException as exc:  # the job's own failure, whatever it is, is its outcome
            self.outcome = {"exit_code": 1, "error": f"{type(exc).__name__}: {exc}"[:MAX_RESULT_CHARS],
                            "result": None}

    def poll(self) -> dict[str, Any] | None:
        """``None`` while running; then ``{"exit_code", "error", "result"}``."""
        if self.outcome is not None:
            return self.outcome
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                return None
            error = None if code == 0 else (f"killed by signal {-code}" if code < 0 else f"exited with status {code}")
            self.outcome = {"exit_code": code, "error": error, "result": None}
            if self._result_file is not None:  # a callable run as another user: its own outcome
                self._result_file.seek(0)
                try:
                    told = json.loads(self._result_file.read(4 * MAX_RESULT_CHARS + 4096) or b"null")
                except ValueError:
                    told = None
                if code == 0 and isinstance(told, dict):
                    self.outcome = {"exit_code": told.get("exit_code"), "error": told.get("error"),
                                    "result": told.get("result")}
                self._result_file.close()
                self._result_file = None
        return self.outcome

    def wait(self) -> dict[str, Any]:
        """Block until the target ends (a callable runs here when not in a thread)."""
        if "callable" in self.target and self.thread is None and self.proc is None and self.outcome is None:
            self._call()
        # Block (no polling loop: a host running many jobs should not wake each runner 20 times a
        # second); a signal still runs its handler, then the wait resumes.
        if self.proc is not None:
            self.proc.wait()
        elif self.thread is not None:
            self.thread.join()
        self.poll()
        return self.outcome  # type: ignore[return-value]

    def terminate(self, grace_s: float = 5.0) -> None:
        """SIGTERM the program's process group, SIGKILL after ``grace_s``. A callable in a thread
        cannot be stopped from outside; its process (runner or actor) is ended by the caller."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def write_json_atomic(path: Path, data: Any, *, durable: bool = True) -> None:
    """Write ``data`` as JSON to ``path`` so readers see the old file or the whole new one.

    ``durable=False`` skips the fsync, for files that only matter while their processes live (pid
    files: after a machine crash no run is left, and a lost or empty pid file reads as a run gone);
    an fsync waits for the disk, and the local backend writes two of them per job it starts."""
    tmp = path.with_name(path.name + ".tmp")
    with open_private(tmp, append=False) as fh:
        fh.write(json.dumps(data).encode())
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def proc_start_time(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks)`` of a live process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def fork_server(fd: int) -> int:
    """``--fork-server FD``: start runners by forking this process, which is past Python's start-up and
    this module's imports. A fresh ``python -m gpualloc.service.runner`` costs about 50 ms of CPU; a fork,
    about 1 ms. On a small host the first jobs of a busy service, all starting at once, took that CPU
    from the service and its clients.

    ``FD`` is a ``SOCK_SEQPACKET`` Unix socket. Each request is one message ``{"run_dir"}`` carrying one
    descriptor, an unlinked file holding the target: the runner reads it, this process never does (no
    job's secret env values pass through its memory, so a runner forked later holds none of them). Each
    answer is one message, ``{"pid": N}`` (the runner's ``runner.pid`` is written by then) or ``{"error"}``.
    Each runner is a session leader writing to ``run_dir/runner.log``, as one started alone. At the end
    of its input (the service went away) the server exits; its runners go on.
    """
    import socket

    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps ended runners: no zombies
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 65536, 1)
        if not msg:
            return 0
        try:
            if len(fds) != 1:
                raise ValueError("expected one descriptor, the target's file")
            answer = {"pid": _fork_runner(Path(json.loads(msg)["run_dir"]), fds[0])}
        except (OSError, ValueError, KeyError, TypeError) as err:
            answer = {"error": f"{type(err).__name__}: {err}"}
        finally:
            for f in fds:
                os.close(f)
        sock.sendall(json.dumps(answer).encode())


def _fork_runner(run_dir: Path, target_fd: int) -> int:
    """Fork a runner of the target in file ``target_fd`` in ``run_dir`` and write its ``runner.pid``;
    returns its pid."""
    log_fd = os.open(run_dir / "runner.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the runner, until it exits
            code = 1
            try:
                os.setsid()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                os.close(null)
                os.close(log_fd)
                with os.fdopen(os.dup(target_fd), "rb") as fh:
                    target = json.loads(fh.read())
                code = run_folder(run_dir, target)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:
                        pass
                os._exit(code)
    finally:
        os.close(log_fd)
    start = proc_start_time(pid)
    write_json_atomic(run_dir / PID_FILE, {"pid": pid, "start": None if start is None else start[1]}, durable=False)
    return pid


def run_folder(run_dir: Path, spec: dict[str, Any] | None = None) -> int:
    """Run ``spec`` (default: the target described in ``run_dir/spec.json``) and record its outcome in
    ``exit.json``."""
    if spec is None:
        spec = json.loads((run_dir / SPEC_FILE).read_text())
    execution = Execution(spec, run_dir, callable_in_thread=False)

    def _on_term(signum, _frame) -> None:
        # Stopped by the service: pass it on to the program's process group (its own children too).
        if execution.proc is not None and execution.proc.poll() is None:
            try:
                os.killpg(execution.proc.pid, signum)
            except ProcessLookupError:
                pass
        if execution.proc is None:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _on_term)
    pid = execution.start()
    if pid:
        write_json_atomic(run_dir / PROGRAM_PID_FILE, {"pid": pid}, durable=False)
    outcome = execution.wait()
    write_json_atomic(run_dir / EXIT_FILE, {**outcome, "ended_at": time.time()})
    return 0


def call_from_stdin(result_fd: int) -> int:
    """``--call FD``: run the callable whose ``{"callable", "args", "kwargs"}`` is on standard input (this
    process already runs as the job's user, in its folder, with its environment) and write its outcome
    as JSON to ``FD``."""
    target = json.loads(sys.stdin.buffer.read())
    execution = Execution(target, None, callable_in_thread=False)
    execution._call()
    outcome = execution.outcome or {"exit_code": 1, "error": "no outcome", "result": None}
    with os.fdopen(result_fd, "wb") as fh:
        fh.write(json.dumps(outcome).encode())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--fork-server" and args[1].isdigit():
        return fork_server(int(args[1]))
    if len(args) == 2 and args[0] == "--call" and args[1].isdigit():
        return call_from_stdin(int(args[1]))
    if len(args) != 1:
        sys.stderr.write("usage: python -m gpualloc.service.runner RUN_DIR\n")
        return 2
    return run_folder(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
