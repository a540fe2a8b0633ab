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
