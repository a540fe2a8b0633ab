"""The hardware catalog and cluster specs as Rich tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from rich.console import Group, RenderableType
from rich.text import Text

from gpualloc.reports.format import gib, num
from gpualloc.reports.tables import Table

MAX_NODES_SHOWN = 24


def links_table(links: Iterable) -> Table:
    """Link types: kind, bandwidth, latency, source."""
    table = Table("name", "kind", "GB/s per direction", "latency us", "source", title="Link types")
    for lk in links:
        table.add_row(lk.name, lk.kind, f"{lk.bandwidth_bytes_per_s / 1e9:g}", f"{lk.latency_s * 1e6:g}",
                      lk.source[:60])
    return table


def devices_view(devices: Iterable) -> Group:
    """Device types with their dense peaks, memory, power and link, then where the numbers come from."""
    table = Table(title="Device types (dense peaks)", more="--json",
                  drop_first=("idle W", "link", "arch", "vendor", "FP64 TF", "TDP W", "GB/s"))
    for col, justify in (("name", "left"), ("vendor", "left"), ("arch", "left"), ("FP16/BF16 TF", "right"),
                         ("FP32 TF", "right"), ("FP64 TF", "right"), ("memory", "right"), ("GB/s", "right"),
                         ("TDP W", "right"), ("idle W", "right"), ("link", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for d in devices:
        table.add_row(d.name, d.vendor, d.architecture, num(d.tensor_tflops), num(d.fp32_tflops),
                      num(d.fp64_tflops), gib(d.mem_bytes), num(d.mem_bandwidth_bytes_per_s, 1e9),
                      f"{d.tdp_w:g}", f"{d.idle_w:g}", d.link)
    return Group(table, Text("Sources: `gpualloc hw list --json` (field `source`) or docs/hardware.md."))


def cluster_view(spec) -> Group:
    """A :class:`~gpualloc.hardware.cluster.ClusterSpec`: a headline, then a row per node (the first 24)."""
    counts = ", ".join(f"{n} x {t}" for t, n in spec.type_counts().items())
    parts: list[RenderableType] = [Text.assemble(
        (spec.name, "bold"), f": {len(spec.nodes)} node(s), {len(spec)} device(s): {counts}; "
        f"network between nodes: {spec.network.name}")]
    table = Table("node", "devices", "intra-node link", "GB/s", "latency us")
    shown = spec.nodes[:MAX_NODES_SHOWN]
    for node in shown:
        kinds = Counter(spec.devices[i].type.name for i in node.devices)
        table.add_row(node.name, ", ".join(f"{n} x {k}" for k, n in kinds.items()), node.link.name,
                      f"{node.link.bandwidth_bytes_per_s / 1e9:g}", f"{node.link.latency_s * 1e6:g}")
    parts.append(table)
    if len(spec.nodes) > len(shown):
        parts.append(Text(f"... and {len(spec.nodes) - len(shown)} more nodes"))
    return Group(*parts)
