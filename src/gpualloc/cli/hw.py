"""``gpualloc hw``: the hardware catalog and cluster specs."""

from __future__ import annotations

import typer
from rich.table import Table

from gpualloc.cli.common import console, gib, num, print_json
from gpualloc.hardware.catalog import default_catalog
from gpualloc.hardware.cluster import load_cluster

app = typer.Typer(help="The hardware catalog (device and link types) and cluster specs.", no_args_is_help=True)


@app.command("list")
def list_devices(
    as_json: bool = typer.Option(False, "--json", help="Print the device types as a JSON list."),
    links: bool = typer.Option(False, "--links", help="List link types instead of device types."),
) -> None:
    """List the device types (or link types) gpualloc knows."""
    cat = default_catalog()
    if links:
        if as_json:
            print_json([lk.to_dict() for lk in cat.links.values()])
            return
        table = Table(title="Link types")
        for col in ("name", "kind", "GB/s per direction", "latency us", "source"):
            table.add_column(col)
        for lk in cat.links.values():
            table.add_row(lk.name, lk.kind, f"{lk.bandwidth_bytes_per_s / 1e9:g}", f"{lk.latency_s * 1e6:g}",
                          lk.source[:60])
        console.print(table)
        return
    if as_json:
        print_json([d.to_dict() for d in cat.devices.values()])
        return
    table = Table(title="Device types (dense peaks)")
    for col, justify in (("name", "left"), ("vendor", "left"), ("arch", "left"), ("FP16/BF16 TF", "right"),
                         ("FP32 TF", "right"), ("FP64 TF", "right"), ("memory", "right"), ("GB/s", "right"),
                         ("TDP W", "right"), ("idle W", "right"), ("link", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for d in cat.devices.values():
        table.add_row(d.name, d.vendor, d.architecture, num(d.tensor_tflops), num(d.fp32_tflops),
                      num(d.fp64_tflops), gib(d.mem_bytes), num(d.mem_bandwidth_bytes_per_s, 1e9),
                      f"{d.tdp_w:g}", f"{d.idle_w:g}", d.link)
    console.print(table)
    console.print("Sources: `gpualloc hw list --json` (field `source`) or docs/hardware.md.")


@app.command("show")
def show_cluster(
    cluster: str = typer.Argument(..., help="Preset (8xA100, adlro16, ...), shorthand (4xA100+4xV100) or a TOML/YAML file."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster as JSON."),
) -> None:
    """Show a cluster: nodes, devices and the links between them."""
    spec = load_cluster(cluster)
    if as_json:
        print_json(spec.to_dict())
        return
    counts = ", ".join(f"{n} x {t}" for t, n in spec.type_counts().items())
    console.print(f"[bold]{spec.name}[/]: {len(spec.nodes)} node(s), {len(spec)} device(s): {counts}; "
                  f"network between nodes: {spec.network.name}")
    table = Table()
    for col in ("node", "devices", "intra-node link", "GB/s", "latency us"):
        table.add_column(col)
    shown = spec.nodes if len(spec.nodes) <= 24 else spec.nodes[:24]
    for node in shown:
        kinds: dict[str, int] = {}
        for i in node.devices:
            kinds[spec.devices[i].type.name] = kinds.get(spec.devices[i].type.name, 0) + 1
        table.add_row(node.name, ", ".join(f"{n} x {k}" for k, n in kinds.items()), node.link.name,
                      f"{node.link.bandwidth_bytes_per_s / 1e9:g}", f"{node.link.latency_s * 1e6:g}")
    console.print(table)
    if len(spec.nodes) > len(shown):
        console.print(f"... and {len(spec.nodes) - len(shown)} more nodes")
