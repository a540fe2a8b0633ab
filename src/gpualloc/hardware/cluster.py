"""Clusters: nodes of devices joined by links, from presets, shorthand or TOML/YAML files.

A cluster is a tuple of nodes; each node holds some devices (global indices ``0..n-1``) and one
intra-node link; nodes are joined by one network link. :func:`load_cluster` accepts

* a preset name from :data:`PRESETS` (``"8xA100"``, ``"adlro16"``, ``"mixed-gen"``, ``"hetero8"``, ``"gavel108"``);
* shorthand ``"4xA100+4xV100"``: each ``NxTYPE`` term fills nodes of at most
  :data:`NODE_SIZE` devices of that type, joined by :data:`DEFAULT_NETWORK` or by the link named in an
  optional ``@LINK`` suffix (``"16xV100@eth-25g"``);
* a ``.toml`` / ``.yaml`` / ``.yml`` file (format in ``docs/hardware.md``);
* ``slurm:`` (or ``slurm:PARTITION``): the local Slurm cluster's nodes and typed GPU GRES
  (:func:`read_slurm_cluster`; ``sinfo``'s text is parsed by :mod:`gpualloc.hardware.slurm`).

Every problem is one :class:`~gpualloc.errors.ClusterError` line naming the file and field.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpualloc.errors import CatalogError, ClusterError, read_text
from gpualloc.hardware.catalog import Catalog, DeviceType, LinkType, default_catalog
from gpualloc.hardware.schema import DeviceRow, validated
from gpualloc.hardware.slurm import SINFO_FORMAT, SlurmNode, gres_device_type, parse_sinfo, run_slurm, slurm_cluster_arg
from gpualloc.limits import MAX_DEVICES, MAX_NODE_COUNT, check_size

NODE_SIZE = 8
"""Devices per node when shorthand fills nodes (a DGX/HGX-style 8-GPU server)."""

DEFAULT_NETWORK = "eth-100g"
"""Network between nodes when neither the shorthand nor the file names one: 100 Gb Ethernet is the
common denominator of cloud GPU instances and on-prem clusters without InfiniBand."""

MIXED_NODE_LINK = "pcie3"
"""Intra-node link of a node mixing device types none of whose links is PCIe (e.g. A100 + V100:
they cannot share NVLink, and PCIe 3 is the slowest host link such a pair may sit on)."""


@dataclass(frozen=True)
class Device:
    """One device of a cluster.

    Attributes:
        index: global index in ``ClusterSpec.devices``.
        node: index of its node in ``ClusterSpec.nodes``.
        local_index: index inside its node.
        type: its device type.
    """

    index: int
    node: int
    local_index: int
    type: DeviceType

    @property
    def label(self) -> str:
        """``"n<node>.<type>.<local_index>"``, e.g. ``"n0.A100-40GB.3"``."""
        return f"n{self.node}.{self.type.name}.{self.local_index}"


@dataclass(frozen=True)
class Node:
    """One server.

    Attributes:
        name: e.g. ``"n0"``.
        devices: global indices of its devices, in order.
        link: link between two of its devices.
    """

    name: str
    devices: tuple[int, ...]
    link: LinkType


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster: nodes, their devices, and the links between them.

    Attributes:
        name: e.g. ``"adlro16"`` or the file's ``name``.
        nodes: the servers.
        devices: every device, ``devices[i].index == i``.
        network: link between two devices on different nodes.
        catalog: the catalog the device types come from (including inline types of a file).
    """

    name: str
    nodes: tuple[Node, ...]
    devices: tuple[Device, ...]
    network: LinkType
    catalog: Catalog

    def __post_init__(self) -> None:
        for i, dev in enumerate(self.devices):
            if dev.index != i or not 0 <= dev.node < len(self.nodes) \
                    or self.nodes[dev.node].devices[dev.local_index] != i:
                raise ClusterError(f"{self.name}: device {i} is inconsistent with its node")

    def __len__(self) -> int:
        return len(self.devices)

    # Index arrays, computed once per cluster: the simulator, the service, the policies and the
    # features all index devices by type and node, and a frozen cluster never changes them.

    @cached_property
    def type_names(self) -> tuple[str, ...]:
        """Device type names in order of first appearance; ``gpu_type`` values index this."""
        return tuple(t.name for t in self.device_types)

    @cached_property
    def gpu_type(self) -> np.ndarray:
        """``[n]`` int64: index in :attr:`type_names` of each device's type (read-only)."""
        index = {name: i for i, name in enumerate(self.type_names)}
        return _frozen(np.array([index[d.type.name] for d in self.devices], dtype=np.int64))

    @cached_property
    def gpu_node(self) -> np.ndarray:
        """``[n]`` int64: node index of each device (read-only)."""
        return _frozen(np.array([d.node for d in self.devices], dtype=np.int64))

    @cached_property
    def gpus_per_type_node(self) -> np.ndarray:
        """``[types, nodes]`` int64: devices of each type on each node (read-only)."""
        counts = np.zeros((len(self.type_names), len(self.nodes)), dtype=np.int64)
        np.add.at(counts, (self.gpu_type, self.gpu_node), 1)
        return _frozen(counts)

    @cached_property
    def gpus_per_type(self) -> np.ndarray:
        """``[types]`` int64: devices of each type (read-only; :meth:`type_counts` as an array)."""
        return _frozen(np.bincount(self.gpu_type, minlength=len(self.type_names)).astype(np.int64))

    @cached_property
    def largest_node_per_type(self) -> np.ndarray:
        """``[types]`` int64: most devices of each type on one node (read-only)."""
        counts = self.gpus_per_type_node
        return _frozen(counts.max(axis=1) if counts.size else np.zeros(len(self.type_names), dtype=np.int64))

    def link_between(self, i: int, j: int) -> LinkType | None:
        """The link between devices ``i`` and ``j``; ``None`` when ``i == j``."""
        if i == j:
            return None
        a, b = self.devices[i], self.devices[j]
        return self.nodes[a.node].link if a.node == b.node else self.network

    def _pairwise(self, attr: str, diag: float) -> np.ndarray:
        node_of = self.gpu_node
        per_node = np.array([getattr(n.link, attr) for n in self.nodes], dtype=np.float64)
        same = node_of[:, None] == node_of[None, :]
        out = np.where(same, per_node[node_of][:, None], getattr(self.network, attr))
        np.fill_diagonal(out, diag)
        return out

    @cached_property
    def bandwidth(self) -> np.ndarray:
        """``[n, n]`` bytes/s per direction between devices; ``inf`` on the diagonal (read-only)."""
        return _frozen(self._pairwise("bandwidth_bytes_per_s", math.inf))

    @cached_property
    def latency(self) -> np.ndarray:
        """``[n, n]`` one-way latency in seconds between devices; ``0`` on the diagonal (read-only)."""
        return _frozen(self._pairwise("latency_s", 0.0))

    @cached_property
    def gpu_mem_bytes(self) -> np.ndarray:
        """``[n]`` float64: memory of each device in bytes (read-only)."""
        return _frozen(np.array([d.type.mem_bytes for d in self.devices], dtype=np.float64))

    @property
    def device_types(self) -> tuple[DeviceType, ...]:
        """Distinct device types, in order of first appearance."""
        return tuple({d.type.name: d.type for d in self.devices}.values())

    def type_counts(self) -> dict[str, int]:
        """Number of devices per device type name, in order of first appearance."""
        return dict(Counter(d.type.name for d in self.devices))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (device types and links in full, devices by type name)."""
        links = {n.link.name: n.link for n in self.nodes} | {self.network.name: self.network}
        return {
            "name": self.name,
            "network": self.network.name,
            "nodes": [{"name": n.name, "link": n.link.name, "devices": list(n.devices)}
                      for n in self.nodes],
            "devices": [{"index": d.index, "node": d.node, "local_index": d.local_index,
                         "type": d.type.name, "label": d.label} for d in self.devices],
            "device_types": {t.name: t.to_dict() for t in self.device_types},
            "links": {name: link.to_dict() for name, link in links.items()},
        }


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# ------------------------------------------------------------------------------------ building

def build_cluster(name: str, nodes: Sequence[tuple[str, Sequence[DeviceType], LinkType]],
                  network: LinkType, catalog: Catalog) -> ClusterSpec:
    """Number the devices of ``nodes`` (``(node name, device types, intra-node link)``) in order.

    Raises:
        ClusterError: more than :data:`~gpualloc.limits.MAX_DEVICES` devices in all.
    """
    total = sum(len(types) for _, types, _ in nodes)
    if total > MAX_DEVICES:
        raise ClusterError(f"{name}: {total:,} devices: at most {MAX_DEVICES:,} per cluster")
    out_nodes: list[Node] = []
    devices: list[Device] = []
    for k, (node_name, types, link) in enumerate(nodes):
        start = len(devices)
        devices.extend(Device(start + j, k, j, t) for j, t in enumerate(types))
        out_nodes.append(Node(node_name, tuple(range(start, len(devices))), link))
    return ClusterSpec(name, tuple(out_nodes), tuple(devices), network, catalog)


def node_link(types: Sequence[DeviceType], catalog: Catalog) -> LinkType:
    """Default intra-node link: the types' common ``link``; for mixed types the slowest PCIe link
    among theirs, else :data:`MIXED_NODE_LINK`."""
    names = {t.link for t in types}
    if len(names) == 1:
        return catalog.link(names.pop())
    pcie = [catalog.link(n) for n in names if catalog.link(n).kind == "pcie"]
    if pcie:
        return min(pcie, key=lambda link: link.bandwidth_bytes_per_s)
    return catalog.link(MIXED_NODE_LINK)


def _fill(type_name: str, count: int, catalog: Catalog, first_node: int,
          per_node: int = NODE_SIZE, link: str | None = None):
    """Nodes of at most ``per_node`` devices of one type."""
    dev = catalog.device(type_name)
    lk = catalog.link(link or dev.link)
    nodes = []
    for k in range(math.ceil(count / per_node)):
        n = min(per_node, count - k * per_node)
        nodes.append((f"n{first_node + k}", [dev] * n, lk))
    return nodes


def _preset(name: str, terms: Sequence[tuple[str, int, int, str | None]], network: str):
    """A preset factory from ``(type, count, per node, intra link or None)`` terms."""

    def factory(catalog: Catalog | None = None) -> ClusterSpec:
        cat = catalog or default_catalog()
        nodes: list = []
        for type_name, count, per_node, link in terms:
            nodes += _fill(type_name, count, cat, len(nodes), per_node, link)
        return build_cluster(name, nodes, cat.link(network), cat)

    factory.__doc__ = f"The {name!r} preset: " + " + ".join(
        f"{c}x{t} ({p}/node{', ' + lk if lk else ''})" for t, c, p, lk in terms) + f"; {network}"
    return factory


PRESETS: dict[str, Callable[..., ClusterSpec]] = {
    # One DGX A100 (40 GB): 8 GPUs over NVLink 3 / NVSwitch.
    "8xA100": _preset("8xA100", [("A100-40GB", 8, 8, None)], DEFAULT_NETWORK),
    # A small heterogeneous lab cluster: one node per type, PCIe inside nodes, 10 GbE between.
    "adlro16": _preset("adlro16", [("V100-16GB", 8, 8, "pcie3"), ("T4", 4, 4, "pcie3"),
                                   ("MI50", 4, 4, "pcie4")], "eth-10g"),
    # Four generations side by side, each an 8-GPU server on its best link, HDR InfiniBand between.
    "mixed-gen": _preset("mixed-gen", [("H100-SXM", 8, 8, None), ("A100-40GB", 8, 8, None),
                                       ("V100-16GB", 8, 8, None), ("T4", 8, 8, None)], "ib-hdr"),
    # The placement benchmark's heterogeneous server pair: 4 A100 + 4 V100, NVLink inside, HDR IB between.
    "hetero8": _preset("hetero8", [("A100-40GB", 4, 4, None), ("V100-16GB", 4, 4, None)], "ib-hdr"),
    # Gavel's simulated cluster (Narayanan et al., OSDI 2020): 36 V100 + 36 P100 + 36 K80,
    # here as 4-GPU servers over PCIe 3 and 25 GbE (Gavel itself models no links).
    "gavel108": _preset("gavel108", [("V100-16GB", 36, 4, "pcie3"), ("P100", 36, 4, "pcie3"),
                                     ("K80", 36, 4, "pcie3")], "eth-25g"),
}


@contextmanager
def _as_cluster_error(prefix: str) -> Iterator[None]:
    """A :class:`CatalogError` raised inside as one :class:`ClusterError` line: ``prefix`` + its message."""
    try:
        yield
    except CatalogError as err:
        raise ClusterError(f"{prefix}{err}") from err


# ----------------------------------------------------------------------------------- shorthand

_TERM = re.compile(r"^\s*(\d+)\s*[xX*]\s*(\S.*?)\s*$")


def parse_shorthand(spec: str, catalog: Catalog | None = None) -> ClusterSpec:
    """``"4xA100+4xV100"`` (optionally ``"...@LINK"``): nodes of at most 8 devices per term."""
    cat = catalog or default_catalog()
    body, _, network = spec.partition("@")
    network = network.strip() or DEFAULT_NETWORK
    with _as_cluster_error(f"{spec!r}: network: "):
        net = cat.link(network)
    nodes: list = []
    for term in body.split("+"):
        m = _TERM.match(term)
        if not m:
            raise ClusterError(f"{spec!r}: term {term.strip()!r}: expected NxTYPE, e.g. '4xA100'")
        count = int(m.group(1))
        if count <= 0:
            raise ClusterError(f"{spec!r}: term {term.strip()!r}: count must be positive")
        check_size(count, f"{spec!r}: term {term.strip()!r}: count", MAX_DEVICES, ClusterError)
        with _as_cluster_error(f"{spec!r}: term {term.strip()!r}: "):
            nodes += _fill(m.group(2), count, cat, len(nodes))
    return build_cluster(spec, nodes, net, cat)


# --------------------------------------------------------------------------------------- files

class _NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    devices: list[tuple[str, int]]
    count: Annotated[int, Field(gt=0, le=MAX_NODE_COUNT)] = 1
    link: str | None = None

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, v: Any) -> list[tuple[str, int]]:
        """``{A100 = 4, T4 = 2}`` or ``["A100", "A100"]`` -> ``[("A100", 4), ("T4", 2)]``."""
        if isinstance(v, Mapping):
            items = list(v.items())
            for type_name, n in items:
                if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_DEVICES:
                    raise ValueError(f"count of {type_name!r} must be a positive integer <= {MAX_DEVICES:,}, got {n!r}")
        elif isinstance(v, list):
            items = []
            if len(v) > MAX_DEVICES:
                raise ValueError(f"{len(v):,} devices: at most {MAX_DEVICES:,} per node")
            for type_name in v:
                if not isinstance(type_name, str):
                    raise ValueError(f"expected device type names, got {type_name!r}")
                items.append((type_name, 1))
        else:
            raise ValueError("expected a table {TYPE = count} or a list of type names")
        if not items:
            raise ValueError("a node needs at least one device")
        return [(str(k), n) for k, n in items]


class _ClusterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    network: str = DEFAULT_NETWORK
    device_types: dict[str, dict[str, Any]] = Field(default_factory=dict)
    nodes: Annotated[list[_NodeIn], Field(min_length=1)]


_LINE = re.compile(r"\s*\(at line (\d+), column \d+\)\s*$")


def _read(path: Path, where: str) -> Any:
    text = read_text(path, ClusterError, where)
    try:
        return _parse(path, text, where)
    except RecursionError as err:  # "[[[[...": deeper than the parsers can nest
        raise ClusterError(f"{where}: nested too deeply") from err


def _parse(path: Path, text: str, where: str) -> Any:
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            msg = str(err)
            m = _LINE.search(msg)
            if m:
                raise ClusterError(f"{where}:{m.group(1)}: {msg[:m.start()]}") from err
            raise ClusterError(f"{where}: {msg}") from err
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if mark is not None:
            raise ClusterError(f"{where}:{mark.line + 1}: {problem}") from err
        raise ClusterError(f"{where}: {problem}") from err


def _check_total(spec: _ClusterIn, where: str) -> None:
    """Refuse a file of more than MAX_DEVICES devices before any device is built."""
    total = 0
    for k, node in enumerate(spec.nodes):
        total += sum(n for _, n in node.devices) * node.count
        if total > MAX_DEVICES:
            raise ClusterError(f"{where}: nodes[{k}]: more than {MAX_DEVICES:,} devices in the cluster")


def load_cluster_file(path: str | Path, catalog: Catalog | None = None) -> ClusterSpec:
    """Load a cluster from a ``.toml``, ``.yaml`` or ``.yml`` file."""
    path = Path(path)
    where = str(path)
    if path.suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise ClusterError(f"{where}: expected a .toml, .yaml or .yml file")
    data = _read(path, where)
    if not isinstance(data, Mapping):
        raise ClusterError(f"{where}: expected a table of fields at the top level")
    spec = validated(_ClusterIn, dict(data), where, ClusterError)

    cat = catalog or default_catalog()
    inline: dict[str, DeviceType] = {}
    for type_name, row in spec.device_types.items():
        field = f"device_types.{type_name}"
        with _as_cluster_error(""):
            dev = DeviceRow.parse({"name": type_name, **row}, f"{where}: {field}",
                                  require_source=False).to_device_type()
        with _as_cluster_error(f"{where}: {field}.link: "):
            cat.link(dev.link)
        inline[dev.name] = dev
    if inline:
        with _as_cluster_error(f"{where}: device_types: "):
            cat = cat.with_devices(inline)
    with _as_cluster_error(f"{where}: network: "):
        network = cat.link(spec.network)

    _check_total(spec, where)
    nodes: list = []
    for k, node in enumerate(spec.nodes):
        with _as_cluster_error(f"{where}: nodes[{k}].devices: "):
            types = [cat.device(t) for t, n in node.devices for _ in range(n)]
        with _as_cluster_error(f"{where}: nodes[{k}].link: "):
            link = cat.link(node.link) if node.link else node_link(types, cat)
        for r in range(node.count):
            if node.name is None:
                node_name = f"n{len(nodes)}"
            else:
                node_name = node.name if node.count == 1 else f"{node.name}-{r}"
            nodes.append((node_name, types, link))
    return build_cluster(spec.name or path.stem, nodes, network, cat)


def load_cluster(spec: str | Path, catalog: Catalog | None = None) -> ClusterSpec:
    """A cluster from a preset name, shorthand (``"4xA100+4xV100@ib-hdr"``) or TOML/YAML file.

    Args:
        spec: preset name (see :data:`PRESETS`), shorthand, path to a ``.toml``/``.yaml`` file, or
            ``slurm:`` / ``slurm:PARTITION``.
        catalog: device and link types (default: the built-in catalog).

    Raises:
        ClusterError: one line naming the file, field or shorthand term at fault.
    """
    if isinstance(spec, Path) or str(spec).lower().endswith((".toml", ".yaml", ".yml")):
        return load_cluster_file(spec, catalog)
    if spec in PRESETS:
        return PRESETS[spec](catalog)
    if str(spec).strip().lower().startswith("slurm"):
        partition = slurm_cluster_arg(spec)
        if partition is not False:  # "slurm", "slurm:" or "slurm:PARTITION": the local Slurm's nodes
            return read_slurm_cluster(partition or None, catalog=catalog)
    if not re.match(r"^\s*\d", spec):
        raise ClusterError(f"unknown cluster {spec!r}: not a preset ({', '.join(PRESETS)}), "
                           f"a .toml/.yaml file, slurm:, or shorthand like '4xA100+4xV100'")
    return parse_shorthand(spec, catalog)


def cluster_from_nodes(nodes: Sequence[SlurmNode], *, name: str = "slurm", partition: str | None = None,
                       catalog: Catalog | None = None) -> ClusterSpec:
    """The cluster of ``nodes`` that hold typed GPUs (only those in ``partition`` when given), each
    node keeping its Slurm name, devices in GRES order.

    Raises:
        ClusterError: an unknown GPU type (naming the node), or no node with GPUs.
    """
    cat = catalog or default_catalog()
    built = []
    for node in nodes:
        if partition is not None and partition not in node.partitions:
            continue
        types = [gres_device_type(g, cat, f"slurm node {node.name}: Gres") for g, n in node.gpus for _ in range(n)]
        if types:
            built.append((node.name, types, node_link(types, cat)))
    if not built:
        where = f" in partition {partition!r}" if partition else ""
        raise ClusterError(f"{name}: no Slurm node{where} has typed GPU GRES (Gres=gpu:TYPE:COUNT)")
    return build_cluster(name, built, cat.link(DEFAULT_NETWORK), cat)


def read_slurm_cluster(partition: str | None = None, *, catalog: Catalog | None = None,
                       timeout_s: float = 30.0) -> ClusterSpec:
    """The cluster the local Slurm controller manages (``sinfo``), named ``slurm`` or ``slurm:PART``.

    Raises:
        ClusterError: Slurm is not installed or does not answer, or its GRES cannot be mapped.
    """
    argv = ["sinfo", "--Node", "--noheader", f"--format={SINFO_FORMAT}"]
    if partition:
        argv.append(f"--partition={partition}")
    done = run_slurm(argv, timeout_s=timeout_s)
    name = f"slurm:{partition}" if partition else "slurm"
    return cluster_from_nodes(parse_sinfo(done.stdout), name=name, partition=partition, catalog=catalog)
