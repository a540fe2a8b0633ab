"""Domain errors. Every message is one line that names the file, line, field or id at fault."""

from __future__ import annotations


class GpuallocError(Exception):
    """Base class of every error gpualloc raises on purpose (the CLI prints these as one line)."""


class GpuallocWarning(UserWarning):
    """Base class of every warning gpualloc issues (the CLI prints these as one line)."""


class CatalogError(GpuallocError):
    """Unknown device or link type, or a malformed catalog entry."""


class ClusterError(GpuallocError):
    """Malformed cluster file, preset or shorthand."""


class GraphError(GpuallocError):
    """Invalid operator graph: cycle, dangling edge, negative size, bad JSON."""


class CaptureError(GpuallocError):
    """A model could not be loaded or traced."""


class ImportFormatError(GpuallocError):
    """A published profile or foreign graph format could not be parsed."""


class CostModelError(GpuallocError):
    """The cost model lacks what it needs (e.g. no peak and no measured time for a device)."""


class PlacementError(GpuallocError):
    """A graph cannot be placed: it does not fit in the cluster's memory, or a plan is invalid."""


class TraceError(GpuallocError):
    """A job trace could not be read: bad file, malformed row or field (message names file:line)."""


class SchedulingError(GpuallocError):
    """A scheduling run cannot proceed: a job larger than the cluster, an invalid policy decision."""


class UnplaceableJobs(SchedulingError):
    """A trace holds jobs that no device type of the cluster can ever run (and they are not to be dropped)."""


class AgentError(GpuallocError):
    """A learning agent or environment was misconfigured, or a checkpoint could not be loaded."""


class ExecutionError(GpuallocError):
    """A plan cannot be run on real devices: a missing device, a failing worker, a model that will not split."""


class EngineError(ExecutionError):
    """The engine cannot run a plan under torchrun: the message is one line that says why."""


class ExtraMissingError(GpuallocError):
    """An optional part of gpualloc is not installed: the message names the extra that installs it."""


def read_text(path, error: type[GpuallocError], where: str | None = None) -> str:
    """The UTF-8 text of ``path``; an unreadable, missing or binary file raises ``error`` in one line.

    Every file reader goes through here, so a binary file is one message everywhere, never a
    ``UnicodeDecodeError`` traceback.
    """
    from pathlib import Path

    where = where or str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise error(not_utf8(where, err)) from err
    except OSError as err:
        raise error(cannot_read(where, err)) from err


def cannot_read(where: str, err: OSError) -> str:
    """The one message for a file that cannot be opened or read (missing, a folder, no permission)."""
    return f"{where}: cannot read: {err.strerror or err}"


def not_utf8(where: str, err: UnicodeDecodeError) -> str:
    """The one message for a file that is not UTF-8 text (readers that decode through a library, such as
    pandas, raise their error with it too)."""
    return f"{where}: not UTF-8 text (a binary file?): byte {err.start}: {err.reason}"


def parse_json(text: str, error: type[GpuallocError], where: str):
    """``text`` parsed as JSON; malformed JSON raises ``error`` naming ``where`` and the line, in one line."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{where}:{err.lineno}: not valid JSON: {err.msg}") from err
    except RecursionError as err:  # "[[[[...": deeper than the JSON decoder can nest
        raise error(f"{where}: not valid JSON: nested too deeply") from err


def read_json(path, error: type[GpuallocError]):
    """The JSON document in ``path``: every JSON file reader goes through here (one message per fault)."""
    return parse_json(read_text(path, error), error, str(path))


class OutputError(GpuallocError):
    """An output file or folder cannot be created or written."""


def cannot_write(where: str, err: OSError) -> str:
    """The one message for an output that cannot be written (no space, read-only, no permission)."""
    return f"{where}: cannot write: {err.strerror or err}"


def atomic_output(path, error: type[GpuallocError] = OutputError, where: str | None = None):
    """A context manager yielding a temporary path beside ``path``; on success it replaces ``path``.

    Every writer of a user's output goes through here (or :func:`write_text`), so a failed or interrupted
    write leaves the previous file whole and no half-written one: the temporary file keeps ``path``'s
    suffix (libraries that pick a format by suffix, such as matplotlib, still see it), gets the mode a new
    file would get (or the existing file's), and is removed on failure. A path that exists and is not a
    regular file (``/dev/null``, a FIFO) is written in place. Any ``OSError`` becomes ``error``, one line
    naming ``where`` (default ``path``).
    """
    return _AtomicOutput(path, error, where)


def write_text(path, text: str, error: type[GpuallocError] = OutputError, where: str | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_output`)."""
    with atomic_output(path, error, where) as tmp:
        tmp.write_text(text, encoding="utf-8")


class _AtomicOutput:
    def __init__(self, path, error: type[GpuallocError], where: str | None) -> None:
        from pathlib import Path

        self.path = Path(path)
        self.error = error
        self.where = where or str(path)
        self.tmp = None

    def __enter__(self):
        import os
        import stat
        import uuid

        target = self.path.resolve() if self.path.is_symlink() else self.path
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        except OSError as err:
            raise self.error(cannot_write(self.where, err)) from err
        if st is not None and not stat.S_ISREG(st.st_mode):
            self.target = self.tmp = target  # a device or a FIFO: nothing to replace
            return target
        self.target = target
        name = f".{target.stem}.{uuid.uuid4().hex[:8]}.tmp{target.suffix}"
        tmp = target.with_name(name)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies
            if st is not None:
                os.chmod(tmp, stat.S_IMODE(st.st_mode))
        except OSError as err:
            raise self.error(cannot_write(self.where, err)) from err
        self.tmp = tmp
        return tmp

    def __exit__(self, kind, exc, tb) -> bool:
        import os

        if self.tmp == self.target:  # written in place
            if isinstance(exc, OSError):
                raise self.error(cannot_write(self.where, exc)) from exc
            return False
        if kind is None:
            try:
                os.replace(self.tmp, self.target)
                return False
            except OSError as err:
                exc = err
        try:
            os.unlink(self.tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise self.error(cannot_write(self.where, exc)) from exc
        return False
