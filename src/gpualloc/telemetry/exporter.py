"""Prometheus exporter with NVIDIA DCGM exporter names, so existing Grafana dashboards work.

Metric names, units and labels follow ``dcgm-exporter``'s default counters
(``etc/default-counters.csv``): ``DCGM_FI_DEV_GPU_UTIL`` in percent, framebuffer memory in MiB,
power in W, energy in mJ, clocks in MHz, PCIe in bytes per second; every series carries the labels
``gpu`` (index), ``UUID``, ``device`` (``nvidia<index>``), ``modelName`` and ``Hostname``. A reading
that is None is left out of its metric for that device, never exported as 0.

``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` is declared a gauge although it only grows: a
``prometheus_client`` counter would be renamed ``..._total`` and no longer match the dashboards,
and PromQL's ``rate()`` / ``increase()`` read a gauge the same way.

The exporter uses its own :class:`~prometheus_client.CollectorRegistry` (nothing is added to the
process-wide default registry) and serves either the latest records pushed with
:meth:`Exporter.update` or, given a source, a fresh sample per scrape.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from gpualloc.telemetry.base import DeviceRecord, DeviceTelemetry, throttle_mask

__all__ = ["LABELS", "METRICS", "DcgmCollector", "DcgmMetric", "Exporter", "start_exporter"]

_MIB = float(1 << 20)

LABELS: tuple[str, ...] = ("gpu", "UUID", "device", "modelName", "Hostname")
"""Labels of every series, as dcgm-exporter sets them."""


def _scaled(field: str, scale: float) -> Callable[[DeviceRecord], float | None]:
    def read(r: DeviceRecord) -> float | None:
        v = getattr(r, field)
        return None if v is None else float(v) * scale

    return read


def _fb_free(r: DeviceRecord) -> float | None:
    if r.mem_used_bytes is None or r.mem_total_bytes is None:
        return None
    return max(r.mem_total_bytes - r.mem_used_bytes, 0) / _MIB


def _throttle(r: DeviceRecord) -> float | None:
    return None if r.throttle_reasons is None else float(throttle_mask(r.throttle_reasons))


@dataclass(frozen=True)
class DcgmMetric:
    """One exported metric: its DCGM name, its help text (dcgm-exporter's) and its reading."""

    name: str
    help: str
    read: Callable[[DeviceRecord], float | None]


METRICS: tuple[DcgmMetric, ...] = (
    DcgmMetric("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", _scaled("utilization", 100.0)),
    DcgmMetric("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", _scaled("mem_utilization", 100.0)),
    DcgmMetric("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", _scaled("mem_used_bytes", 1 / _MIB)),
    DcgmMetric("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    DcgmMetric("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", _scaled("power_w", 1.0)),
    DcgmMetric("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).",
               _scaled("energy_j", 1000.0)),
    DcgmMetric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", _scaled("temperature_c", 1.0)),
    DcgmMetric("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", _scaled("sm_clock_mhz", 1.0)),
    DcgmMetric("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", _scaled("mem_clock_mhz", 1.0)),
    DcgmMetric("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).", _throttle),
    DcgmMetric("DCGM_FI_PROF_PCIE_TX_BYTES",
               "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
               "payloads - in bytes per second.", _scaled("pcie_tx_bytes_per_s", 1.0)),
    DcgmMetric("DCGM_FI_PROF_PCIE_RX_BYTES",
               "The rate of data received over the PCIe bus - including both protocol headers and data "
               "payloads - in bytes per second.", _scaled("pcie_rx_bytes_per_s", 1.0)),
)
"""What is exported, in exposition order."""


class DcgmCollector:
    """A ``prometheus_client`` collector that turns device records into DCGM-named gauges.

    Args:
        source: sampled at every scrape; None: serve the records last passed to :meth:`update`.
        hostname: the ``Hostname`` label (default: this machine's name).
    """

    def __init__(self, source: DeviceTelemetry | None = None, *, hostname: str | None = None) -> None:
        self.source = source
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self._lock = threading.Lock()
        self._records: list[DeviceRecord] = []

    def update(self, records: Sequence[DeviceRecord]) -> None:
        """Serve ``records`` from now on (when there is no ``source``)."""
        with self._lock:
            self._records = list(records)

    def _current(self) -> list[DeviceRecord]:
        with self._lock:  # scrapes run on server threads; a backend is not thread-safe
            if self.source is not None:
                self._records = self.source.sample()
            return self._records

    def collect(self) -> Iterator[Metric]:
        records = self._current()
        labels = [[str(r.index), r.uuid or "", f"nvidia{r.index}", r.name, self.hostname] for r in records]
        for metric in METRICS:
            family = GaugeMetricFamily(metric.name, metric.help, labels=LABELS)
            for r, values in zip(records, labels, strict=False):
                v = metric.read(r)
                if v is not None:
                    family.add_metric(values, v)
            if family.samples:
                yield family

    def scrape(self) -> bytes:
        """The text exposition, as a scrape would get it (without HTTP)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)


class Exporter:
    """A running exporter: an HTTP server thread serving ``/metrics`` from one collector.

    Attributes:
        collector: the collector it serves.
        registry: its own registry (holding only ``collector``).
        address: the bound host.
        port: the bound port (the real one when 0 was asked for).
    """

    def __init__(self, collector: DcgmCollector, registry: CollectorRegistry, server, thread: threading.Thread) -> None:
        self.collector = collector
        self.registry = registry
        self._server = server
        self._thread = thread
        self.address, self.port = server.server_address[:2]

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def update(self, records: Sequence[DeviceRecord]) -> None:
        """Serve these records (see :meth:`DcgmCollector.update`)."""
        self.collector.update(records)

    def close(self) -> None:
        """Stop serving, close the socket and join the thread (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_exporter(source: DeviceTelemetry | None, port: int, addr: str = "127.0.0.1", *,
                   hostname: str | None = None) -> Exporter:
    """Serve DCGM-named metrics over HTTP on ``addr:port`` (port 0: any free port).

    Args:
        source: sampled at each scrape; None: serve what :meth:`Exporter.update` was last given (a
            monitor that samples on its own clock pushes each sample, so a scrape does not move a
            simulated clock or sample a GPU twice).
        port: TCP port.
        addr: address to bind; loopback by default, ``"0.0.0.0"`` to accept remote scrapers.
        hostname: the ``Hostname`` label.

    Returns:
        The running :class:`Exporter`; ``close()`` it (or use it as a context manager).
    """
    collector = DcgmCollector(source, hostname=hostname)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return Exporter(collector, registry, server, thread)
