"""Trace readers (native, Gavel, Philly, Pollux/Sia, Tiresias, Alibaba) and the synthetic generator.

Every reader takes a path and returns a :class:`~gpualloc.workload.jobs.Trace`: jobs sorted by arrival,
work in seconds on the reference device (V100-16GB). Sources with absolute timestamps (Philly,
Alibaba) are shifted so the first arrival is 0; the others keep their relative times. Each reader's
docstring gives its column mapping and assumptions; ``docs/workload.md`` collects them.

Every problem is one :class:`~gpualloc.errors.TraceError` line naming the file, the line (``row N``
for Parquet) and the field, e.g. ``philly.csv:12: num_gpus: expected a positive integer, got 'x'``.
Parsing is vectorised (pandas, numpy); jobs are built in one pass.
"""

from __future__ import annotations

import codecs
import csv
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, replace
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from gpualloc.errors import CatalogError, TraceError, atomic_output, cannot_read, not_utf8
from gpualloc.hardware.catalog import Catalog, default_catalog
from gpualloc.hardware.cluster import DEFAULT_NETWORK, ClusterSpec, build_cluster, node_link
from gpualloc.limits import MAX_JOBS, MAX_WORK_S, check_trace_fields
from gpualloc.seeding import seeded
from gpualloc.workload.jobs import Job, JobType, Trace
from gpualloc.workload.speed import (gavel_steps_per_s, load_measured_speeds, mean_speed,
                                     measured_models, speed_matrix)

_JOB_FIELDS = tuple(f.name for f in fields(Job))
_JOB_DEFAULTS = {f.name: f.default for f in fields(Job) if f.default is not MISSING}
_MAX_EXACT_INT = 2 ** 53
_TRUE = {"1", "true", "t", "yes", "y"}
_FALSE = {"0", "false", "f", "no", "n", ""}


# --------------------------------------------------------------------------- parsing helpers
@dataclass(frozen=True)
class _Table:
    """Raw rows of one file and where each came from (1-based line, or row number for Parquet)."""

    path: Path
    frame: pd.DataFrame
    lines: np.ndarray
    row_word: str = ""

    def __len__(self) -> int:
        return len(self.frame)

    def where(self, i: int) -> str:
        return f"{self.path}:{self.row_word}{self.lines[i]}"

    def refuse_first(self, rows: np.ndarray, message: Callable[[int], str]) -> None:
        """One TraceError at the first row of the mask ``rows``, if any: its file:line, then ``message(i)``."""
        if rows.any():
            i = int(np.argmax(rows))
            raise TraceError(f"{self.where(i)}: {message(i)}")

    def header_where(self) -> str:
        return f"{self.path}:1" if not self.row_word else str(self.path)

    def require(self, *columns: str) -> None:
        missing = [c for c in columns if c not in self.frame.columns]
        if missing:
            found = ", ".join(map(str, self.frame.columns[:12]))
            raise TraceError(f"{self.header_where()}: missing column(s) {', '.join(missing)} "
                             f"(found: {found or 'none'})")

    def subset(self, keep: np.ndarray) -> _Table:
        return _Table(self.path, self.frame[keep].reset_index(drop=True), self.lines[keep], self.row_word)

    def raw(self, column: str, i: int) -> str:
        text = str(self.frame[column].iloc[i])
        return text if len(text) <= 40 else text[:37] + "..."

    def text(self, column: str, default: str = "") -> np.ndarray:
        """Stripped strings (object array); ``default`` where the column is absent."""
        if column not in self.frame.columns:
            return np.full(len(self), default, dtype=object)
        s = self.frame[column]
        if s.dtype == object or pd.api.types.is_string_dtype(s):
            s = s.fillna("").astype(str)
        else:  # Parquet numbers or booleans in a text column
            s = s.astype(object).where(s.notna(), "").astype(str)
        return s.str.strip().to_numpy(dtype=object)

    def number(self, column: str, *, integer: bool = False, minimum: float | None = None,
               exclusive: bool = False, default: float | None = None,
               check: np.ndarray | None = None) -> np.ndarray:
        """Numeric column; the first invalid value (among rows ``check``) raises with its line.

        Args:
            integer: whole numbers only (returned as int64).
            minimum: smallest allowed value (excluded when ``exclusive``).
            default: value for an absent column or an empty cell; ``None`` makes the column required.
            check: boolean mask of rows to validate (others may hold anything; they get 0).
        """
        n = len(self)
        if column not in self.frame.columns:
            if default is None:
                self.require(column)
            return np.full(n, default, dtype=np.int64 if integer else np.float64)
        arr = pd.to_numeric(self.frame[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        if default is not None:
            arr = np.where(self.text(column) == "", default, arr)
        bad = ~np.isfinite(arr)
        if integer:
            with np.errstate(invalid="ignore"):
                bad |= (arr != np.floor(arr)) | (np.abs(arr) >= _MAX_EXACT_INT)
        if minimum is not None:
            with np.errstate(invalid="ignore"):
                bad |= (arr <= minimum) if exclusive else (arr < minimum)
        fatal = bad & check if check is not None else bad
        self.refuse_first(fatal, lambda i: f"{column}: expected {_describe(integer, minimum, exclusive)}, "
                                           f"got {self.raw(column, i)!r}")
        arr = np.where(bad, 0.0, arr)  # unchecked rows the caller ignores
        return arr.astype(np.int64) if integer else arr


def _describe(integer: bool, minimum: float | None, exclusive: bool) -> str:
    kind = "integer" if integer else "number"
    if minimum == 0:
        return f"a {'positive' if exclusive else 'non-negative'} {kind}"
    if minimum is not None:
        return f"a {kind} {'>' if exclusive else '>='} {minimum:g}"
    return f"{'an' if integer else 'a'} {kind}"


def _check_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if not path.is_file():
        raise TraceError(f"{path}: not a file")
    return path


def _check_text(path: Path) -> None:
    """A binary file fails here, with the one not-UTF-8 message, before the CSV parser splits its bytes
    into lines and fields and reports a field count instead. The first 64 KiB are checked; pandas
    decodes the rest."""
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as err:
        raise TraceError(not_utf8(str(path), err)) from err
    except OSError as err:
        raise TraceError(cannot_read(str(path), err)) from err


def _read_csv(path: str | Path, *, sep: str = ",", names: Sequence[str] | None = None) -> _Table:
    """Every field as a string; blank lines dropped but counted, so ``lines`` are the file's lines."""
    path = _check_file(path)
    _check_text(path)
    first = 1 if names else 2
    try:
        with warnings.catch_warnings():
            # pandas only warns (and drops fields) when the first row is longer than the header
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(path, sep=sep, header=None if names else 0, names=names, dtype=str,
                                keep_default_na=False, na_filter=False, skip_blank_lines=False,
                                index_col=False, engine="c",
                                quoting=csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL)
    except pd.errors.ParserWarning as err:
        raise TraceError(f"{path}:{first}: more fields than the "
                         f"{'expected ' + str(len(names)) if names else 'header'} columns") from err
    except pd.errors.EmptyDataError as err:
        raise TraceError(f"{path}: empty file") from err
    except pd.errors.ParserError as err:
        msg = " ".join(str(err).split())
        m = re.search(r"line (\d+)", msg)
        detail = msg.split("C error: ")[-1]
        raise TraceError(f"{path}:{m.group(1)}: {detail}" if m else f"{path}: {detail}") from err
    except UnicodeDecodeError as err:
        raise TraceError(not_utf8(str(path), err)) from err
    except (OSError, ValueError) as err:
        raise TraceError(f"{path}: cannot read: {' '.join(str(err).split())}") from err
    frame.columns = [str(c).strip() for c in frame.columns]
    lines = np.arange(first, first + len(frame), dtype=np.int64)
    blank = (frame == "").all(axis=1).to_numpy() if len(frame.columns) else np.zeros(len(frame), bool)
    table = _Table(path, frame, lines)
    return table.subset(~blank) if blank.any() else table


def _read_parquet(path: str | Path) -> _Table:
    path = _check_file(path)
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises many types for a corrupt file; all mean "not Parquet"
        raise TraceError(f"{path}: cannot read Parquet: {' '.join(str(err).split())[:200]}") from err
    frame.columns = [str(c).strip() for c in frame.columns]
    frame = frame.reset_index(drop=True)
    return _Table(path, frame, np.arange(1, len(frame) + 1, dtype=np.int64), row_word="row ")


def _make_jobs(table: _Table, **columns: Sequence[Any]) -> list[Job]:
    """Build the jobs in one pass; a Job's own validation error gets the row's file:line."""
    iters = [columns[name] if name in columns else repeat(_JOB_DEFAULTS[name]) for name in _JOB_FIELDS]
    out: list[Job] = []
    try:
        for values in zip(*iters, strict=False):
            out.append(Job(*values))
    except TraceError as err:  # the failing row is the one after the last job built
        raise TraceError(f"{table.where(len(out))}: {err}") from err
    check_trace_fields(columns, table.where, TraceError)  # absurd values (arrival_s=1e308): limits.TRACE_LIMITS
    return out


def _unique_ids(table: _Table, ids: np.ndarray, column: str) -> None:
    table.refuse_first(pd.Series(ids).duplicated().to_numpy(), lambda i: f"{column}: duplicate job id {ids[i]!r}")
    table.refuse_first(ids == "", lambda i: f"{column}: empty job id")


def _ml(n: int) -> Any:
    return repeat(JobType.ML_TRAINING, n)


# --------------------------------------------------------------------------- native
NATIVE_COLUMNS: tuple[str, ...] = _JOB_FIELDS
"""Columns of the native format: the fields of :class:`~gpualloc.workload.jobs.Job`."""
NATIVE_REQUIRED: tuple[str, ...] = ("id", "arrival_s", "job_type", "work_s")


def _parse_bool(table: _Table, column: str) -> np.ndarray:
    text = np.char.lower(table.text(column).astype(str)) if len(table) else np.array([], dtype=str)
    true = np.isin(text, list(_TRUE))
    bad = ~(true | np.isin(text, list(_FALSE)))
    table.refuse_first(bad, lambda i: f"{column}: expected true or false, got {table.raw(column, i)!r}")
    return true


def _parse_job_types(table: _Table, column: str) -> list[JobType]:
    lookup = {t.value: t for t in JobType}
    out = []
    for i, value in enumerate(table.text(column).tolist()):
        jt = lookup.get(value)
        out.append(jt if jt is not None else JobType.parse(value, where=f"{table.where(i)}: {column}"))
    return out


def _canonical_types(items: Sequence[str], catalog: Catalog) -> tuple[str, ...]:
    out = []
    for item in items:
        try:
            out.append(catalog.device(item).name)
        except CatalogError:
            out.append(item)  # unknown types stay as written; no device of the cluster matches them
    return tuple(out)


def _split_types(text: np.ndarray, catalog: Catalog,
                 mapping: Mapping[str, str] | None = None) -> list[tuple[str, ...]]:
    cache: dict[str, tuple[str, ...]] = {}
    out = []
    for value in text:
        got = cache.get(value)
        if got is None:
            items = [s.strip() for s in value.split("|") if s.strip()]
            if mapping:
                items = [mapping.get(s, s) for s in items]
            got = cache[value] = _canonical_types(items, catalog)
        out.append(got)
    return out


def read_native(path: str | Path) -> Trace:
    """The native format: CSV or Parquet (by extension) whose columns are the fields of ``Job``.

    Columns (required: ``id``, ``arrival_s``, ``job_type``, ``work_s``; others default as in ``Job``):

    ======================  ==================================================================
    ``id``                  text, unique, non-empty
    ``arrival_s``           seconds from the start of the trace, >= 0 (kept as written)
    ``job_type``            ``simulation``, ``ml-training`` or ``data-processing``
    ``work_s``              seconds alone on ``num_gpus`` reference GPUs (V100-16GB), > 0
    ``num_gpus``            positive integer
    ``model``               text
    ``gpu_milli``           integer in (0, 1000]
    ``cpu_cores``           non-negative number
    ``mem_bytes``           non-negative integer
    ``priority``            integer
    ``gpu_types``           device type names separated by ``|`` (aliases become canonical names)
    ``single_node``         true/false (also 1/0, yes/no)
    ``batch_size``          non-negative integer
    ``team``                text: the submitting team (quotas); empty = the default team
    ``user``                text: who submitted the job; empty = not known
    ``qos``                 text: the source's quality-of-service class; empty = none
    ``submit_day_s``        seconds after midnight at submission, in [0, 86400); -1 = not known
    ``time_limit_s``        the user's time limit, reference seconds, > 0; empty = none (an
                            estimate is drawn under ``--knowledge estimate``, docs/knowledge.md)
    ======================  ==================================================================

    Errors name the CSV line, or ``row N`` (1-based) of a Parquet file.
    """
    path = Path(path)
    table = _read_parquet(path) if path.suffix.lower() in (".parquet", ".pq") else _read_csv(path)
    table.require(*NATIVE_REQUIRED)
    ids = table.text("id")
    _unique_ids(table, ids, "id")
    catalog = default_catalog()
    jobs = _make_jobs(
        table,
        id=ids.tolist(),
        arrival_s=table.number("arrival_s", minimum=0).tolist(),
        job_type=_parse_job_types(table, "job_type"),
        work_s=table.number("work_s", minimum=0, exclusive=True).tolist(),
        num_gpus=table.number("num_gpus", integer=True, minimum=0, exclusive=True, default=1).tolist(),
        model=table.text("model").tolist(),
        gpu_milli=table.number("gpu_milli", integer=True, minimum=0, exclusive=True, default=1000).tolist(),
        cpu_cores=table.number("cpu_cores", minimum=0, default=0.0).tolist(),
        mem_bytes=table.number("mem_bytes", integer=True, minimum=0, default=0).tolist(),
        priority=table.number("priority", integer=True, default=0).tolist(),
        gpu_types=_split_types(table.text("gpu_types"), catalog),
        single_node=_parse_bool(table, "single_node").tolist(),
        batch_size=table.number("batch_size", integer=True, minimum=0, default=0).tolist(),
        team=table.text("team").tolist(),
        user=table.text("user").tolist(),
        qos=table.text("qos").tolist(),
        submit_day_s=table.number("submit_day_s", minimum=-1, default=-1.0).tolist(),
        time_limit_s=_time_limits(table),
    )
    return Trace.of(jobs, source=str(path), format="native")


def _time_limits(table: _Table) -> list[float | None]:
    """The optional ``time_limit_s`` column: a positive number of seconds (at most ``limits.MAX_WORK_S``),
    or an empty cell (``None``: no limit recorded)."""
    if "time_limit_s" not in table.frame.columns:
        return [None] * len(table)
    given = table.text("time_limit_s") != ""
    limits = table.number("time_limit_s", minimum=0, exclusive=True, default=1.0, check=given)
    table.refuse_first(given & (limits > MAX_WORK_S), lambda i: f"time_limit_s: {table.raw('time_limit_s', i)!r} "
                                                                f"is above the limit of {MAX_WORK_S:,.0f} (10 years)")
    return [float(v) if g else None for v, g in zip(limits.tolist(), given.tolist(), strict=True)]


def write_native(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` in the native format: ``.csv`` or ``.parquet``/``.pq`` by extension.

    ``read_native(write_native(t, p)).jobs == t.jobs`` (floats are written exactly) for jobs whose
    ``id``, ``model``, ``team``, ``user`` and ``qos`` have no surrounding whitespace and whose ``gpu_types``
    are canonical names: the reader strips text fields and turns aliases into canonical names.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet", ".pq"):
        raise TraceError(f"{path}: expected a .csv, .parquet or .pq file name")
    for job in trace.jobs:
        bad = next((t for t in job.gpu_types if "|" in t or t != t.strip() or not t), None)
        if bad is not None:
            raise TraceError(f"job {job.id}: gpu_types: {bad!r} cannot be written ('|' separates types)")
    frame = pd.DataFrame({
        "id": pd.Series([j.id for j in trace.jobs], dtype=object),
        "arrival_s": np.array([j.arrival_s for j in trace.jobs], dtype=np.float64),
        "job_type": pd.Series([j.job_type.value for j in trace.jobs], dtype=object),
        "work_s": np.array([j.work_s for j in trace.jobs], dtype=np.float64),
        "num_gpus": np.array([j.num_gpus for j in trace.jobs], dtype=np.int64),
        "model": pd.Series([j.model for j in trace.jobs], dtype=object),
        "gpu_milli": np.array([j.gpu_milli for j in trace.jobs], dtype=np.int64),
        "cpu_cores": np.array([j.cpu_cores for j in trace.jobs], dtype=np.float64),
        "mem_bytes": np.array([j.mem_bytes for j in trace.jobs], dtype=np.int64),
        "priority": np.array([j.priority for j in trace.jobs], dtype=np.int64),
        "gpu_types": pd.Series(["|".join(j.gpu_types) for j in trace.jobs], dtype=object),
        "single_node": np.array([j.single_node for j in trace.jobs], dtype=bool),
        "batch_size": np.array([j.batch_size for j in trace.jobs], dtype=np.int64),
        "team": pd.Series([j.team for j in trace.jobs], dtype=object),
        "user": pd.Series([j.user for j in trace.jobs], dtype=object),
        "qos": pd.Series([j.qos for j in trace.jobs], dtype=object),
        "submit_day_s": np.array([j.submit_day_s for j in trace.jobs], dtype=np.float64),
        "time_limit_s": np.array([np.nan if j.time_limit_s is None else j.time_limit_s for j in trace.jobs],
                                 dtype=np.float64),
    }, columns=list(NATIVE_COLUMNS))
    with atomic_output(path, TraceError) as tmp:
        if suffix == ".csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp, index=False)
    return path


# --------------------------------------------------------------------------- Gavel
GAVEL_COLUMNS = ("job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps",
                 "arrival_time_s", "scale_factor")


def read_gavel(path: str | Path) -> Trace:
    """A Gavel ``.trace`` file (tab-separated, no header; Gavel's ``scheduler/traces/``).

    Column mapping:

    - ``job_type`` (``"ResNet-18 (batch size 64)"``) -> ``model`` (the whole string);
      ``job_type`` = ml-training (Gavel's A3C and CycleGAN are training jobs too).
    - ``total_steps`` / V100 steps/s of (job_type, scale_factor) -> ``work_s``: Gavel's measured
      isolated throughput on V100 (``simulation_throughputs.json``, key ``v100``, bundled in
      ``measured_speeds.json``), so work is V100 seconds as Gavel's own generator defines it
      (``total_steps = duration * v100 steps/s``). A scale factor Gavel did not measure for that
      job type (A3C, CycleGAN, Recommendation at 2+ GPUs) uses the 1-GPU throughput: no speed-up
      from extra GPUs is assumed; such rows are counted in ``meta["scale_factor_fallback"]``.
    - ``arrival_time_s`` -> ``arrival_s`` (already relative; kept).
    - ``scale_factor`` -> ``num_gpus``.
    - ``command``, ``num_steps_arg``, ``needs_data_dir``: ignored (how Gavel launches the job).
    - ``id``: 0-based row number in the file.
    """
    table = _read_csv(path, sep="\t", names=GAVEL_COLUMNS)
    n = len(table)
    steps = table.number("total_steps", minimum=0, exclusive=True)
    arrival = table.number("arrival_time_s", minimum=0)
    sf = table.number("scale_factor", integer=True, minimum=0, exclusive=True)
    names = table.text("job_type")
    measured = load_measured_speeds()
    ref_table = measured["gavel_steps_per_s"]["V100-16GB"]
    rate = np.empty(n)
    fallback = 0
    cache: dict[tuple[str, int], float | None] = {}
    for i, (name, g) in enumerate(zip(names.tolist(), sf.tolist(), strict=False)):
        key = (name, g)
        if key not in cache:
            cache[key] = gavel_steps_per_s(name, g, measured=measured)
        sps = cache[key]
        if sps is None or sps <= 0:
            raise TraceError(f"{table.where(i)}: job_type: no measured V100 throughput for {name!r} "
                             f"(known: {len(ref_table)} Gavel job types, e.g. {next(iter(ref_table))!r})")
        fallback += str(g) not in ref_table[name]
        rate[i] = sps
    jobs = _make_jobs(
        table,
        id=[str(i) for i in range(n)],
        arrival_s=arrival.tolist(),
        job_type=_ml(n),
        work_s=(steps / rate).tolist() if n else [],
        num_gpus=sf.tolist(),
        model=names.tolist(),
    )
    return Trace.of(jobs, source=str(path), format="gavel", scale_factor_fallback=int(fallback))


# --------------------------------------------------------------------------- Philly
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")


def read_philly(path: str | Path) -> Trace:
    """Microsoft Philly jobs as published by Pollux/adaptdl (``simulator/traces/philly.csv``).

    Column mapping (``timestamp,duration,num_gpus,gpu_time,cluster``):

    - ``timestamp`` (``YYYY-MM-DD HH:MM:SS``) -> ``arrival_s``, seconds after the earliest timestamp,
      and ``submit_day_s``, its clock time (seconds after midnight, as written: the trace's time zone).
    - ``duration`` (s, > 0) -> ``work_s``. ASSUMPTION: Philly ran on a mix of GPUs of the V100 era and
      records wall time, not the GPU; durations are taken as reference-device (V100-16GB) time.
    - ``num_gpus`` -> ``num_gpus``; ``job_type`` = ml-training; ``model`` unknown (``""``).
    - ``gpu_time`` (``duration * num_gpus``) ignored; ``cluster`` (virtual cluster id, Philly's unit
      of quota) -> ``team``, so a quota file can name Philly's virtual clusters as teams; the number
      of distinct ones is ``meta["virtual_clusters"]``.
    - ``id``: 0-based row number in the file.
    """
    table = _read_csv(path)
    table.require(*PHILLY_COLUMNS)
    n = len(table)
    stamps = pd.to_datetime(pd.Series(table.text("timestamp")), format="%Y-%m-%d %H:%M:%S", errors="coerce")
    table.refuse_first(stamps.isna().to_numpy(),
                       lambda i: f"timestamp: expected 'YYYY-MM-DD HH:MM:SS', got {table.raw('timestamp', i)!r}")
    seconds = stamps.to_numpy(dtype="datetime64[s]").astype(np.int64)
    arrival = (seconds - seconds.min()).astype(np.float64) if n else np.zeros(0)
    duration = table.number("duration", minimum=0, exclusive=True)
    gpus = table.number("num_gpus", integer=True, minimum=0, exclusive=True)
    vc = table.text("cluster")
    clusters = int(pd.Series(vc).nunique()) if "cluster" in table.frame.columns else 0
    day = (seconds % 86400).astype(np.float64)
    jobs = _make_jobs(table, id=[str(i) for i in range(n)], arrival_s=arrival.tolist(), job_type=_ml(n),
                      work_s=duration.tolist(), num_gpus=gpus.tolist(), team=vc.tolist(), submit_day_s=day.tolist())
    return Trace.of(jobs, source=str(path), format="philly", virtual_clusters=clusters)


# --------------------------------------------------------------------------- Pollux / Sia

def pollux_gpu_seconds() -> dict[str, float]:
    """Reference GPU-seconds of one whole training per Pollux/Sia application (an ESTIMATE).

    From the bundled ``sia_training`` table (:func:`gpualloc.workload.speed.build_measured_speeds`):
    ``epochs x samples_per_epoch x V100 step time / local batch``, with the epochs of adaptdl's
    simulator, the datasets' training-split sizes and Sia's measured single-V100 step time at a local
    batch typical of the Pollux workloads:

    ===========  ======  ==========  =====  ==========  ===========
    application  epochs  samples     batch  GPU-s       GPU-hours
    ===========  ======  ==========  =====  ==========  ===========
    bert         2       87,599      32     4,170       1.16
    cifar10      100     50,000      341    1,733       0.48
    deepspeech2  80      7,924       53     8,101       2.25
    imagenet     90      1,281,167   133    235,543     65.4
    ncf          10      4,970,845   32768  291         0.08
    yolov3       50      16,551      16     16,866      4.69
    ===========  ======  ==========  =====  ==========  ===========
    """
    return {app: float(rec["gpu_seconds"]) for app, rec in load_measured_speeds()["sia_training"].items()}


def read_pollux(path: str | Path) -> Trace:
    """A Pollux (adaptdl ``simulator/workloads``) or Sia workload.

    Columns: ``name,time,application,num_replicas,batch_size``.

    Column mapping:

    - ``name`` -> ``id``; ``time`` (s, relative) -> ``arrival_s``; ``application`` -> ``model``
      (bert, cifar10, deepspeech2, imagenet, ncf, yolov3); ``num_replicas`` -> ``num_gpus``;
      ``batch_size`` (global) -> ``batch_size``; ``job_type`` = ml-training.
    - ``work_s``: the workloads carry no duration (Pollux trains each job to completion). ESTIMATE:
      ``work_s = pollux_gpu_seconds()[application] / num_replicas`` -- the application's whole
      training in reference GPU-seconds (table in :func:`pollux_gpu_seconds`) spread over its
      replicas with perfect data-parallel scaling (sync time and batch-size effects ignored).
    """
    table = _read_csv(path)
    table.require("name", "time", "application", "num_replicas")
    n = len(table)
    ids = table.text("name")
    _unique_ids(table, ids, "name")
    arrival = table.number("time", minimum=0)
    replicas = table.number("num_replicas", integer=True, minimum=0, exclusive=True)
    batch = table.number("batch_size", integer=True, minimum=0, default=0)
    apps = table.text("application")
    known = pollux_gpu_seconds()
    unknown = ~np.isin(apps.astype(str), list(known)) if n else np.zeros(0, bool)
    table.refuse_first(unknown, lambda i: f"application: unknown application {apps[i]!r} "
                                          f"(known: {', '.join(sorted(known))})")
    total = np.array([known[a] for a in apps.tolist()], dtype=np.float64)
    jobs = _make_jobs(table, id=ids.tolist(), arrival_s=arrival.tolist(), job_type=_ml(n),
                      work_s=(total / np.maximum(replicas, 1)).tolist() if n else [],
                      num_gpus=replicas.tolist(), model=apps.tolist(), batch_size=batch.tolist())
    return Trace.of(jobs, source=str(path), format="pollux")


# --------------------------------------------------------------------------- Tiresias
TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "duration")


def read_tiresias(path: str | Path) -> Trace:
    """A Tiresias job file (``simulator/*_job.csv``).

    Columns: ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``.

    Column mapping: ``job_id`` -> ``id``; ``num_gpu`` -> ``num_gpus``; ``submit_time`` (s, relative)
    -> ``arrival_s``; ``duration`` (s, > 0) -> ``work_s`` (taken as reference-device time, as for
    Philly, which this trace samples); ``model_name`` -> ``model``; ``job_type`` = ml-training.
    ``iterations`` and ``interval`` (the gap that built ``submit_time``) are ignored.
    """
    table = _read_csv(path)
    table.require(*TIRESIAS_COLUMNS)
    n = len(table)
    ids = table.text("job_id")
    _unique_ids(table, ids, "job_id")
    jobs = _make_jobs(
        table,
        id=ids.tolist(),
        arrival_s=table.number("submit_time", minimum=0).tolist(),
        job_type=_ml(n),
        work_s=table.number("duration", minimum=0, exclusive=True).tolist(),
        num_gpus=table.number("num_gpu", integer=True, minimum=0, exclusive=True).tolist(),
        model=table.text("model_name").tolist(),
    )
    return Trace.of(jobs, source=str(path), format="tiresias")


# --------------------------------------------------------------------------- Alibaba
ALIBABA_GPU_MODELS: Mapping[str, str] = {"V100M16": "V100-16GB", "V100M32": "V100-32GB"}
"""Alibaba GPU model names that differ from catalog names; P100, T4 and A10 match the catalog as
they are. G2, G3, ... are anonymised models with no public identity: they stay as written."""

ALIBABA_QOS_PRIORITY: Mapping[str, int] = {
    "HP": 2, "LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0, "BestEffort": 0,
}
"""QoS class -> ``priority``: high-priority and latency-sensitive (and Kubernetes Guaranteed) 2,
Burstable 1, best-effort 0 (the trace's classes LS/HP/BE and Kubernetes' QoS classes)."""

ALIBABA_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli",
                       "creation_time", "deletion_time", "scheduled_time")


def read_alibaba(path: str | Path) -> Trace:
    """Alibaba's GPU cluster trace 2023 pod list (``cluster-trace-gpu-v2023/csv/openb_pod_list_*.csv``).

    Column mapping (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
    creation_time,deletion_time,scheduled_time``; times in s):

    - ``name`` -> ``id``; ``creation_time`` -> ``arrival_s`` (shifted: first kept pod at 0).
    - ``deletion_time - scheduled_time`` -> ``work_s``: how long the pod held its GPUs, taken as
      reference-device time (the trace does not say what the pod ran). Pods still running when the
      trace ends carry the trace's end as ``deletion_time``; their work is truncated there.
    - ``num_gpu`` -> ``num_gpus``; ``gpu_milli`` -> ``gpu_milli`` (share of each GPU);
      ``cpu_milli / 1000`` -> ``cpu_cores``; ``memory_mib * 2**20`` -> ``mem_bytes``.
    - ``gpu_spec`` (models separated by ``|``, empty = any) -> ``gpu_types`` via
      :data:`ALIBABA_GPU_MODELS` and the catalog; unknown models (``G2``, ``G3``) stay as written,
      so such a job may be constrained to types that no cluster of catalog devices has.
    - ``qos`` -> ``priority`` (:data:`ALIBABA_QOS_PRIORITY`; empty = best-effort, an unknown class
      is an error), and as written -> ``qos``.
    - ``job_type`` = ml-training: the cluster serves machine-learning pods and no column tells
      training from inference or processing. ``single_node`` = true: a pod runs on one node.
    - Skipped and counted in ``meta``: CPU-only pods (``num_gpu == 0``,
      ``skipped_cpu_only``), pods never scheduled (empty ``scheduled_time``, ``skipped_unscheduled``),
      and pods with ``deletion_time <= scheduled_time`` (``skipped_nonpositive_work``).
    - ``pod_phase`` ignored (failed pods used their GPUs too).
    """
    table = _read_csv(path)
    table.require(*ALIBABA_POD_COLUMNS)
    gpus = table.number("num_gpu", integer=True, minimum=0)
    cpu_only = gpus == 0
    unscheduled = (table.text("scheduled_time") == "") & ~cpu_only
    on_gpu = ~cpu_only & ~unscheduled
    created = table.number("creation_time", minimum=0)
    deleted = table.number("deletion_time", minimum=0, check=on_gpu)
    scheduled = table.number("scheduled_time", minimum=0, check=on_gpu)
    cpu_milli = table.number("cpu_milli", minimum=0)
    memory_mib = table.number("memory_mib", integer=True, minimum=0)
    work = deleted - scheduled
    nonpositive = on_gpu & ~(work > 0)
    keep = on_gpu & ~nonpositive
    milli = table.number("gpu_milli", integer=True, minimum=0, exclusive=True, check=keep)
    table.refuse_first(keep & (milli > 1000),
                       lambda i: f"gpu_milli: expected an integer in 1..1000, got {table.raw('gpu_milli', i)!r}")
    qos = table.text("qos")
    priority = np.zeros(len(table), dtype=np.int64)
    for value in sorted(set(qos[keep].tolist())):
        if value and value not in ALIBABA_QOS_PRIORITY:
            i = int(np.argmax(keep & (qos == value)))
            raise TraceError(f"{table.where(i)}: qos: unknown class {value!r} "
                             f"(known: {', '.join(ALIBABA_QOS_PRIORITY)})")
        priority[qos == value] = ALIBABA_QOS_PRIORITY.get(value, 0)
    ids = table.text("name")
    kept = table.subset(keep)
    kept_ids = ids[keep]
    _unique_ids(kept, kept_ids, "name")
    arrival = created[keep]
    if len(arrival):
        arrival = arrival - arrival.min()
    m = len(kept)
    jobs = _make_jobs(
        kept,
        id=kept_ids.tolist(),
        arrival_s=arrival.tolist(),
        job_type=_ml(m),
        work_s=work[keep].tolist(),
        num_gpus=gpus[keep].tolist(),
        gpu_milli=milli[keep].tolist(),
        cpu_cores=(cpu_milli[keep] / 1000.0).tolist(),
        mem_bytes=(memory_mib[keep] * 2 ** 20).tolist(),
        priority=priority[keep].tolist(),
        qos=qos[keep].tolist(),
        gpu_types=_split_types(table.text("gpu_spec")[keep], default_catalog(), ALIBABA_GPU_MODELS),
        single_node=repeat(True, m),
    )
    return Trace.of(jobs, source=str(path), format="alibaba",
                    skipped_cpu_only=int(cpu_only.sum()), skipped_unscheduled=int(unscheduled.sum()),
                    skipped_nonpositive_work=int(nonpositive.sum()))


class AlibabaNode(NamedTuple):
    """One row of Alibaba's GPU node list."""

    name: str
    device_type: str
    """Canonical catalog name, or the model as written when the catalog does not know it (G2, G3)."""
    num_gpus: int


def read_alibaba_nodes(path: str | Path, catalog: Catalog | None = None,
                       unknown_models: Mapping[str, str] | None = None) -> list[AlibabaNode]:
    """Alibaba's node list (``openb_node_list_gpu_node.csv``: ``sn,cpu_milli,memory_mib,gpu,model``).

    ``sn`` -> name, ``model`` -> device type (:data:`ALIBABA_GPU_MODELS`, then ``unknown_models``,
    then the catalog; unknown models stay as written), ``gpu`` -> GPU count. Nodes without GPUs are
    left out.
    """
    cat = catalog or default_catalog()
    table = _read_csv(path)
    table.require("sn", "gpu", "model")
    gpus = table.number("gpu", integer=True, minimum=0)
    names = table.text("sn")
    table.refuse_first(names == "", lambda i: "sn: empty node name")
    mapping = {**ALIBABA_GPU_MODELS, **(unknown_models or {})}
    types = [t[0] if t else "" for t in _split_types(table.text("model"), cat, mapping)]
    missing = (np.array(types, dtype=object) == "") & (gpus > 0) if len(types) else np.zeros(0, bool)
    table.refuse_first(missing, lambda i: "model: empty GPU model on a node with GPUs")
    return [AlibabaNode(n, t, g) for n, t, g in zip(names.tolist(), types, gpus.tolist(), strict=False) if g > 0]


def alibaba_cluster(path: str | Path, catalog: Catalog | None = None,
                    unknown_models: Mapping[str, str] | None = None,
                    network: str = DEFAULT_NETWORK) -> ClusterSpec:
    """A cluster with one node per row of Alibaba's node list.

    Each node's devices are its GPUs, joined by the type's own intra-node link (the trace does not
    say; :func:`gpualloc.hardware.cluster.node_link`); nodes are joined by ``network``. Nodes whose
    model the catalog does not know (the anonymised ``G2``, ``G3``: in the 2023 trace 588 of the
    1,213 nodes) are SKIPPED unless ``unknown_models`` maps them to a catalog type, e.g.
    ``{"G2": "V100-16GB"}`` -- a guess, since Alibaba does not say what they are. Compare
    :func:`read_alibaba_nodes` with the cluster to count what was skipped.
    """
    cat = catalog or default_catalog()
    nodes = []
    for node in read_alibaba_nodes(path, cat, unknown_models):
        try:
            dev = cat.device(node.device_type)
        except CatalogError:
            continue
        types = [dev] * node.num_gpus
        nodes.append((node.name, types, node_link(types, cat)))
    if not nodes:
        raise TraceError(f"{path}: no node has a GPU model the catalog knows")
    try:
        net = cat.link(network)
    except CatalogError as err:
        raise TraceError(f"{path}: network: {err}") from err
    return build_cluster(f"alibaba-{Path(path).stem}", nodes, net, cat)


# --------------------------------------------------------------------------- registry
READERS: dict[str, Callable[[Path], Trace]] = {
    "native": read_native,
    "gavel": read_gavel,
    "philly": read_philly,
    "pollux": read_pollux,
    "tiresias": read_tiresias,
    "alibaba": read_alibaba,
}
"""Trace format name -> reader."""

_HEADERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("native", frozenset(NATIVE_REQUIRED)),
    ("philly", frozenset(PHILLY_COLUMNS)),
    ("pollux", frozenset(("name", "time", "application", "num_replicas"))),
    ("tiresias", frozenset(TIRESIAS_COLUMNS)),
    ("alibaba", frozenset(("name", "num_gpu", "gpu_milli", "creation_time"))),
)


def infer_format(path: str | Path) -> str:
    """The trace format of ``path``: by extension (``.trace``, ``.parquet``), else by CSV header."""
    path = _check_file(path)
    suffix = path.suffix.lower()
    if suffix == ".trace":
        return "gavel"
    if suffix in (".parquet", ".pq"):
        return "native"
    _check_text(path)  # unreadable or binary: the one message
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        header = {c.strip() for c in next(csv.reader([fh.readline()]), [])}
    for name, needed in _HEADERS:
        if needed <= header:
            return name
    raise TraceError(f"{path}:1: cannot tell the trace format from the extension or header; "
                     f"give it with --format (format= in Python): one of {', '.join(READERS)}")


def read_trace(path: str | Path, format: str | None = None) -> Trace:
    """Read a trace with the reader ``format`` (see :data:`READERS`), inferred when ``None``."""
    if format is None:
        format = infer_format(path)
    reader = READERS.get(format)
    if reader is None:
        raise TraceError(f"unknown trace format {format!r}; known: {', '.join(READERS)}")
    trace = reader(Path(path))
    if not len(trace):
        # An empty run has no JCT, makespan or utilisation: every metric would be NaN.
        raise TraceError(f"{path}: no jobs (a header and no rows?)")
    return trace


# --------------------------------------------------------------------------- synthetic generator
SCALE_FACTORS: tuple[int, ...] = (1, 2, 4, 8)
SCALE_FACTOR_P: tuple[float, ...] = (0.70, 0.10, 0.15, 0.05)
DEFAULT_MIX: Mapping[JobType, float] = {
    JobType.SIMULATION: 0.2, JobType.ML_TRAINING: 0.6, JobType.DATA_PROCESSING: 0.2,
}
PRIORITIES: tuple[int, ...] = (0, 1, 2)


def _normalise_mix(mix: Mapping[JobType | str, float] | None) -> tuple[list[JobType], np.ndarray]:
    items = dict(DEFAULT_MIX) if mix is None else {JobType.parse(str(getattr(k, "value", k)),
                                                                  where="mix"): v for k, v in mix.items()}
    types = list(items)
    p = np.array([float(items[t]) for t in types])
    if not len(p) or not np.all(np.isfinite(p)) or (p < 0).any() or p.sum() <= 0:
        raise TraceError(f"mix: expected non-negative weights with a positive sum, got {dict(mix or {})}")
    return types, p / p.sum()


def _exp10(x: np.ndarray) -> np.ndarray:
    """``10 ** x`` element by element through the C library's ``pow``, the same bits on every CPU: numpy's
    own ``power`` takes an AVX-512 kernel where the CPU has one, whose last bits differ, so a seeded
    trace would differ from one machine to the next."""
    return np.array([math.pow(10.0, v) for v in x.tolist()], dtype=float)


@seeded(to="generator", error=TraceError)
def generate(num_jobs: int, cluster: ClusterSpec, load: float,
             seed: int | np.random.Generator | None = None,
             mix: Mapping[JobType | str, float] | None = None) -> Trace:
    """A synthetic trace following Gavel's published job distributions (Narayanan et al., OSDI 2020, §7).

    - ``work_s``: with probability 0.8, ``10**U(1.5, 3)`` minutes, else ``10**U(3, 4)`` minutes
      (reference-device time, as Gavel's durations are V100 time).
    - ``num_gpus``: 1, 2, 4, 8 with probability 0.70, 0.10, 0.15, 0.05, capped at the largest gang
      that fits on one device type of ``cluster`` (its largest per-type GPU count).
    - ``job_type``: drawn from ``mix`` (default simulation 0.2, ml-training 0.6, data-processing 0.2;
      weights are normalised). ml-training jobs get a ``model`` drawn uniformly from the families
      with measured speeds (:func:`gpualloc.workload.speed.measured_models`); others get ``""``.
    - ``priority``: 0, 1, 2 uniformly.
    - arrivals: a Poisson process, the first job at 0, rate

      ``lambda = load * G / mean_i(num_gpus_i * work_s_i / s_i)``

      where ``G`` is the cluster's GPU count and ``s_i`` is job ``i``'s mean speed over the cluster's
      GPUs (``sum_t count_t * speed[i, t] / G``, :func:`gpualloc.workload.speed.speed_matrix`), so
      GPU-seconds offered per second are ``load`` times the cluster's GPUs. The mean is over the
      generated jobs themselves, so the offered load is ``load`` up to the arrival noise
      (``meta["arrival_rate_per_s"]`` holds ``lambda``).

    ``seed`` is normalised once (:func:`gpualloc.seeding.seeded`); global RNG state is not touched.
    """
    if isinstance(num_jobs, bool) or not isinstance(num_jobs, (int, np.integer)) or not 0 <= num_jobs <= MAX_JOBS:
        raise TraceError(f"generate: num_jobs: expected a non-negative integer <= {MAX_JOBS:,}, got {num_jobs!r}")
    if not isinstance(load, (int, float, np.floating, np.integer)) or not math.isfinite(load) or load <= 0:
        raise TraceError(f"generate: load: expected a positive number, got {load!r}")
    counts = cluster.type_counts()
    if not counts:
        raise TraceError(f"generate: cluster {cluster.name!r} has no devices")
    types, p_types = _normalise_mix(mix)
    rng = seed  # a Generator: @seeded made it
    n = int(num_jobs)
    models = measured_models()

    long = rng.random(n) >= 0.8
    minutes = np.where(long, _exp10(rng.uniform(3.0, 4.0, n)), _exp10(rng.uniform(1.5, 3.0, n)))
    work = 60.0 * minutes
    gpus = np.minimum(rng.choice(SCALE_FACTORS, size=n, p=SCALE_FACTOR_P), max(counts.values()))
    type_idx = rng.choice(len(types), size=n, p=p_types)
    model_idx = rng.integers(0, len(models), n)
    priority = rng.choice(PRIORITIES, size=n)
    gaps = rng.exponential(1.0, n)  # unit-rate gaps, scaled by 1/lambda below

    job_types = [types[k] for k in type_idx.tolist()]
    model_names = [models[m] if jt is JobType.ML_TRAINING else ""
                   for jt, m in zip(job_types, model_idx.tolist(), strict=False)]
    jobs = [Job(str(i), 0.0, jt, w, int(g), model, priority=int(pr))
            for i, (jt, w, g, model, pr) in enumerate(zip(job_types, work.tolist(), gpus.tolist(),
                                                         model_names, priority.tolist(), strict=False))]
    device_types = cluster.device_types
    n_gpus = sum(counts.values())
    rate = 0.0
    if n:
        speeds = mean_speed(speed_matrix(jobs, device_types), cluster.gpus_per_type)
        if not (speeds > 0).all():
            i = int(np.argmin(speeds))
            raise TraceError(f"generate: no device of cluster {cluster.name!r} can run "
                             f"{job_types[i].value} job {model_names[i]!r}")
        rate = float(load) * n_gpus / float(np.mean(gpus * work / speeds))
        arrivals = np.concatenate(([0.0], np.cumsum(gaps[:-1]) / rate))
        check_trace_fields({"arrival_s": arrivals}, lambda i: f"generate: load {load}: job {i}", TraceError)
        jobs = [replace(j, arrival_s=a) for j, a in zip(jobs, arrivals.tolist(), strict=False)]
    return Trace.of(jobs, source=f"synthetic(num_jobs={n}, cluster={cluster.name}, load={load})",
                    format="synthetic", load=float(load), arrival_rate_per_s=rate, cluster=cluster.name,
                    mix={t.value: float(q) for t, q in zip(types, p_types, strict=False)})
