"""The hardware catalog: device types and link types, loaded from ``data/devices.toml``.

Each device row cites the vendor document its numbers come from. Peaks are *dense* (no 2:4
sparsity). A device type defined only by measured times (inline in a cluster file) may leave its
peaks unset (``None``); the cost model then refuses roofline estimates for it with a clear error.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpualloc.errors import CatalogError, read_text

TERA = 1e12


@dataclass(frozen=True)
class DeviceType:
    """One kind of accelerator (or the host CPU).

    Attributes:
        name: canonical name, e.g. ``"A100-80GB"``.
        vendor: ``"nvidia"``, ``"amd"``, ``"intel"`` or ``"other"``.
        architecture: e.g. ``"ampere"``, ``"cdna2"``.
        tensor_tflops: dense FP16/BF16 tensor-core peak, TFLOP/s.
        fp32_tflops: FP32 (non-tensor) peak, TFLOP/s.
        fp64_tflops: FP64 peak, TFLOP/s.
        tf32_tflops: dense TF32 tensor peak, TFLOP/s (None: no TF32, training in TF32 is refused).
        bf16_tflops: dense BF16 peak, TFLOP/s (None: no BF16 support, training in BF16 is refused).
        reserve_bytes: device memory the framework keeps for itself (CUDA context, communication buffers,
            allocator cache); None: the default of :func:`gpualloc.cost.memory.reserve_bytes`.
        mem_bytes: device memory.
        mem_bandwidth_bytes_per_s: device memory bandwidth.
        tdp_w: board power limit.
        idle_w: power drawn when idle.
        link: name of the best link between two devices of this type inside one node.
        source: where the numbers come from (vendor datasheet or whitepaper).
        aliases: other names accepted on input, e.g. ``("A100",)``.
    """

    name: str
    vendor: str
    architecture: str
    tensor_tflops: float | None
    fp32_tflops: float | None
    fp64_tflops: float | None
    mem_bytes: int
    mem_bandwidth_bytes_per_s: float | None
    tdp_w: float
    idle_w: float
    link: str = "pcie3"
    source: str = ""
    aliases: tuple[str, ...] = ()
    tf32_tflops: float | None = None
    bf16_tflops: float | None = None
    reserve_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aliases"] = list(self.aliases)
        return d


@dataclass(frozen=True)
class LinkType:
    """A kind of interconnect. Bandwidth is per direction, for one device pair.

    What a transfer over it costs is :func:`gpualloc.cost.physics.transfer_time_s` (the hardware layer
    describes links; the formula lives with the other costs).

    Attributes:
        name: e.g. ``"nvlink3"``, ``"pcie4"``, ``"ib-hdr"``.
        kind: ``"nvlink"``, ``"infinity-fabric"``, ``"pcie"`` or ``"network"``.
        bandwidth_bytes_per_s: usable bandwidth per direction.
        latency_s: one-way latency of a small message.
        source: where the numbers come from.
    """

    name: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def _device_from_row(row: Mapping[str, Any], where: str) -> DeviceType:
    """Build a DeviceType from one TOML/YAML table, with unit-bearing input fields.

    Input fields: ``tensor_tflops``, ``fp32_tflops``, ``fp64_tflops``, ``mem_gb`` (GB = 1e9 bytes) or
    ``mem_gib`` or ``mem_bytes``, ``mem_bandwidth_gbps`` (GB/s) or ``mem_bandwidth_bytes_per_s``,
    ``tdp_w``, ``idle_w``, ``link``, ``source``, ``aliases``, ``vendor``, ``architecture``.
    """
    from gpualloc.hardware.schema import DeviceRow  # pydantic lives at the input edge

    return DeviceRow.parse(row, where).to_device_type()


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
        dev = _device_from_row({"name": name, **row}, f"{where}: device.{name}")
        devices[dev.name] = dev
    links = {}
    for name, row in data.get("link", {}).items():
        from gpualloc.hardware.schema import LinkRow

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
