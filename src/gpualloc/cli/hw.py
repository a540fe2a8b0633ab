"""``gpualloc hw``: the hardware catalog and cluster specs."""

from __future__ import annotations

import typer

from gpualloc.cli.common import console, print_json

app = typer.Typer(help="The hardware catalog (device and link types) and cluster specs.", no_args_is_help=True)


@app.command("list")
def list_devices(
    as_json: bool = typer.Option(False, "--json", help="Print the device types as a JSON list."),
    links: bool = typer.Option(False, "--links", help="List link types instead of device types."),
) -> None:
    """List the device types (or link types) gpualloc knows."""
    from gpualloc.hardware.catalog import default_catalog
    from gpualloc.reports.hardware import devices_view, links_table

    cat = default_catalog()
    if as_json:
        print_json([x.to_dict() for x in (cat.links if links else cat.devices).values()])
        return
    console.print(links_table(cat.links.values()) if links else devices_view(cat.devices.values()))


@app.command("show")
def show_cluster(
    cluster: str = typer.Argument(
        ..., help="Preset (8xA100, adlro16, ...), shorthand (4xA100+4xV100) or a TOML/YAML file."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster as JSON."),
) -> None:
    """Show a cluster: nodes, devices and the links between them."""
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.reports.hardware import cluster_view

    spec = load_cluster(cluster)
    if as_json:
        print_json(spec.to_dict())
        return
    console.print(cluster_view(spec))
