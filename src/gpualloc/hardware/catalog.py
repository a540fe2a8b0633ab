"""The hardware catalog: device types and link types, loaded from ``data/devices.toml``.

Each device row cites the vendor document its numbers come from. Peaks are *dense* (no 2:4
sparsity). A device type defined only by measured times (inline in a cluster file) may leave its
peaks unset (``None``); the cost model then refuses roofline estimates for it with a clear error.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType

from gpualloc.errors import CatalogError, read_text
from gpualloc.hardware.schema import DeviceRow, LinkRow
from gpualloc.hardware.specs import TERA, DeviceType, LinkType

__all__ = ["TERA", "Catalog", "DeviceType", "LinkType", "default_catalog", "load_catalog"]

@dataclass(frozen=True)
class Catalog:
    """Device and link types by canonical name, with case-insensitive alias lookup."""

    devices: Mapping[str, DeviceType]
    links: Mapping[str, LinkType]
    _lookup: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        lookup: dict[str, str] = {}
        for dev in self.devices.values():
            for key in (dev.name, *dev.aliases):
                k = key.lower()
                if k in lookup and lookup[k] != dev.name:
                    raise CatalogError(f"device name or alias {key!r} is used by both "
                                       f"{lookup[k]!r} and {dev.name!r}")
                lookup[k] = dev.name
        object.__setattr__(self, "devices", MappingProxyType(dict(self.devices)))
        object.__setattr__(self, "links", MappingProxyType(dict(self.links)))
        object.__setattr__(self, "_lookup", MappingProxyType(lookup))

    def device(self, name: str) -> DeviceType:
        """The device type called ``name`` (canonical name or alias, any case)."""
        canonical = self._lookup.get(str(name).lower())
        if canonical is None:
            raise CatalogError(f"unknown device type {name!r}; known: {', '.join(self.devices)}")
        return self.devices[canonical]

    def link(self, name: str) -> LinkType:
        """The link type called ``name``."""
        try:
            return self.links[str(name).lower()]
        except KeyError:
            raise CatalogError(f"unknown link type {name!r}; known: {', '.join(self.links)}") from None

    def with_devices(self, extra: Mapping[str, DeviceType]) -> Catalog:
        """A catalog that also knows ``extra`` device types (e.g. defined inline in a cluster file)."""
        return Catalog({**self.devices, **extra}, self.links)


@functools.cache
def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load a catalog file (default: the built-in ``data/devices.toml``)."""
    if path is None:
        text = resources.files("gpualloc.hardware").joinpath("data/devices.toml").read_text()
        where = "devices.toml"
    else:
        where = str(path)
        text = read_text(path, CatalogError)  # missing, unreadable or binary: one line
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise CatalogError(f"{where}: {err}") from err
    devices = {}
    for name, row in data.get("device", {}).items():
        dev = DeviceRow.parse({"name": name, **row}, f"{where}: device.{name}").to_device_type()
        devices[dev.name] = dev
    links = {}
    for name, row in data.get("link", {}).items():
        link = LinkRow.parse({"name": name, **row}, f"{where}: link.{name}").to_link_type()
        links[link.name] = link
    for dev in devices.values():
        if dev.link not in links:
            raise CatalogError(f"{where}: device.{dev.name}: link: unknown link type {dev.link!r}; "
                               f"known: {', '.join(links)}")
    return Catalog(devices, links)


def default_catalog() -> Catalog:
    """The built-in catalog (cached)."""
    return load_catalog(None)
