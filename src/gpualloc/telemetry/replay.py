"""Recording telemetry to a file and playing it back as a backend.

A recording is a table with one row per device per sample: a ``sample`` column (0, 1, 2, ... in
recording order) followed by the fields of :class:`~gpualloc.telemetry.base.DeviceRecord`, with
units in the column names and null where a reading is unknown. ``throttle_reasons`` is a
comma-separated string (``""`` = no reason, null = unknown). The format follows the file's
extension: ``.parquet`` / ``.pq`` (Apache Parquet) or ``.csv`` (header row, strings quoted, null as
an empty unquoted cell).

:func:`record` samples any backend into a file; :class:`ReplayTelemetry` plays a file back, one
recorded sample per :meth:`~ReplayTelemetry.sample`, with the recorded timestamps.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from gpualloc.errors import atomic_output, not_utf8
from gpualloc.telemetry.base import (RECORD_FIELDS, Backend, DeviceInfo, DeviceRecord, DeviceTelemetry, TelemetryError,
                                     TelemetryExhausted)

__all__ = ["SCHEMA", "ReplayTelemetry", "read_records", "record", "write_records"]

SCHEMA = pa.schema([
    ("sample", pa.int64()),
    ("index", pa.int64()),
    ("name", pa.string()),
    ("uuid", pa.string()),
    ("time_s", pa.float64()),
    ("utilization", pa.float64()),
    ("mem_utilization", pa.float64()),
    ("mem_used_bytes", pa.int64()),
    ("mem_total_bytes", pa.int64()),
    ("power_w", pa.float64()),
    ("energy_j", pa.float64()),
    ("temperature_c", pa.float64()),
    ("sm_clock_mhz", pa.float64()),
    ("mem_clock_mhz", pa.float64()),
    ("sm_clock_ratio", pa.float64()),
    ("pcie_tx_bytes_per_s", pa.float64()),
    ("pcie_rx_bytes_per_s", pa.float64()),
    ("throttle_reasons", pa.string()),
    ("processes", pa.int64()),
])
"""Columns of a recording: ``sample``, then :data:`~gpualloc.telemetry.base.RECORD_FIELDS`."""

FLUSH_SAMPLES = 256
"""Samples buffered before a write (one Parquet row group per flush, not per sample)."""


def _format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    raise TelemetryError(f"{path}: unknown recording format {suffix or '(no extension)'!r} "
                         "(use .parquet, .pq or .csv)")


def _batch(samples: list[tuple[int, list[DeviceRecord]]]) -> pa.RecordBatch:
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for i, records in samples:
        for r in records:
            cols["sample"].append(i)
            for name in RECORD_FIELDS:
                cols[name].append(getattr(r, name))
    cols["throttle_reasons"] = [None if t is None else ",".join(t) for t in cols["throttle_reasons"]]
    return pa.RecordBatch.from_pydict(cols, schema=SCHEMA)


class _Writer:
    """Streams batches of samples to a Parquet or CSV file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kind = _format(path)
        try:
            if self.kind == "parquet":
                import pyarrow.parquet as pq

                self._w = pq.ParquetWriter(str(path), SCHEMA)
            else:
                import pyarrow.csv as pcsv

                self._w = pcsv.CSVWriter(str(path), SCHEMA)
        except OSError as err:
            raise TelemetryError(f"{path}: cannot write: {err}") from err

    def write(self, samples: list[tuple[int, list[DeviceRecord]]]) -> None:
        if samples:
            batch = _batch(samples)
            if self.kind == "parquet":
                self._w.write_table(pa.Table.from_batches([batch]))
            else:
                self._w.write_batch(batch)

    def close(self) -> None:
        self._w.close()


def write_records(samples: Iterable[list[DeviceRecord]], path: str | Path) -> int:
    """Write samples (each a list of per-device records) to ``path``; returns the samples written."""
    path = Path(path)
    _format(path)  # an unknown suffix is refused before anything is created
    # Into a temporary file that replaces ``path`` at the end: an interrupted recording keeps the previous one.
    with atomic_output(path, TelemetryError) as tmp:
        writer = _Writer(tmp)
        n, buffer = 0, []
        try:
            for records in samples:
                buffer.append((n, list(records)))
                n += 1
                if len(buffer) >= FLUSH_SAMPLES:
                    writer.write(buffer)
                    buffer = []
            writer.write(buffer)
        finally:
            writer.close()
    return n


def record(source: DeviceTelemetry, n_samples: int, path: str | Path, interval_s: float = 0.0, *,
           sleep: Callable[[float], None] = time.sleep,
           on_sample: Callable[[int, list[DeviceRecord]], None] | None = None) -> int:
    """Sample ``source`` ``n_samples`` times, ``interval_s`` apart (wall clock), into ``path``.

    Args:
        source: any backend.
        n_samples: samples to take.
        path: ``.parquet``, ``.pq`` or ``.csv``.
        interval_s: wall seconds from one sample's start to the next (0 = as fast as it samples).
        sleep: the wait (tests pass a no-op).
        on_sample: called with ``(i, records)`` after each sample (progress, a live view).

    Returns:
        The samples written.
    """
    if n_samples < 0:
        raise TelemetryError(f"record: n_samples must be >= 0, got {n_samples}")

    def samples() -> Iterator[list[DeviceRecord]]:
        for i in range(n_samples):
            start = time.perf_counter()
            records = source.sample()
            if on_sample is not None:
                on_sample(i, records)
            yield records
            wait = interval_s - (time.perf_counter() - start)
            if wait > 0 and i < n_samples - 1:
                sleep(wait)

    return write_records(samples(), path)


def read_records(path: str | Path) -> list[list[DeviceRecord]]:
    """Every sample of a recording, in order, each a list of per-device records in device order."""
    path = Path(path)
    kind = _format(path)
    if not path.is_file():
        raise TelemetryError(f"{path}: no such recording")
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(str(path))
        else:
            import pyarrow.csv as pcsv

            with path.open(newline="", encoding="utf-8") as f:
                names = set(next(csv.reader(f), []))
            types = {f.name: f.type for f in SCHEMA if f.name in names}
            table = pcsv.read_csv(str(path), convert_options=pcsv.ConvertOptions(
                column_types=types, strings_can_be_null=True, quoted_strings_can_be_null=False))
    except UnicodeDecodeError as err:
        raise TelemetryError(not_utf8(str(path), err)) from err
    except (pa.ArrowException, OSError) as err:
        raise TelemetryError(f"{path}: cannot read the recording: {' '.join(str(err).split())[:200]}") from err
    missing = [name for name in ("sample", "index", "name") if name not in table.column_names]
    if missing:
        raise TelemetryError(f"{path}: not a telemetry recording (missing column {missing[0]!r})")
    present = [name for name in RECORD_FIELDS if name in table.column_names]
    out: list[list[DeviceRecord]] = []
    last = None
    for row in table.select(["sample", *present]).to_pylist():
        sample = row.pop("sample")
        if sample != last:
            out.append([])
            last = sample
        reasons = row.get("throttle_reasons")
        if reasons is not None:
            row["throttle_reasons"] = tuple(reasons.split(",")) if reasons else ()
        out[-1].append(DeviceRecord(**row))
    return out


class ReplayTelemetry(Backend):
    """A recording played back: a :class:`~gpualloc.telemetry.base.DeviceTelemetry`.

    Each :meth:`sample` returns the next recorded sample, exactly as recorded (timestamps included).
    At the end of the recording it raises
    :class:`~gpualloc.telemetry.base.TelemetryExhausted`, or, with ``loop=True``, starts
    over from the first sample (timestamps repeat too).

    Args:
        path: a recording written by :func:`record` or :func:`write_records`.
        loop: start over at the end instead of raising.
    """

    def __init__(self, path: str | Path, *, loop: bool = False) -> None:
        self.path = Path(path)
        self.loop = loop
        self._samples = read_records(self.path)
        if not self._samples:
            raise TelemetryError(f"{self.path}: the recording holds no samples")
        self._next = 0
        self._info = [DeviceInfo(r.index, r.name, r.uuid, r.mem_total_bytes) for r in self._samples[0]]

    def __len__(self) -> int:
        return len(self._samples)

    def sample(self) -> list[DeviceRecord]:
        if self._next >= len(self._samples):
            if not self.loop:
                raise TelemetryExhausted(
                    f"replay: {self.path}: end of the recording after {len(self._samples)} samples")
            self._next = 0
        records = self._samples[self._next]
        self._next += 1
        return list(records)
