"""Link bandwidth as a function of message size: measured curves instead of one nominal peak.

A curve (``data/link_curves.json``: Sailor's fits, eth-easl/sailor at cf2c8e3, MIT) is one NCCL point-to-point
stream of ``nbytes``: GB/s (1e9 bytes/s) = ``c2 x^2 + c1 x + c0``, ``x = log2(nbytes / 1e6)``, capped at the largest
measured value. ``x`` is clamped to the sizes used (``min_nbytes`` to ``max_nbytes``, held constant outside) and to
the fit's vertex, so bandwidth never falls as messages grow (2S could always go as two sends of S).

The rule for a link (:func:`bus_bandwidth_bytes_per_s`): (1) a link name with a measured curve (``links``, ``use:
measured``) gets that curve in absolute numbers, never above the link's own nominal peak; (2) any other link gets its
nominal peak times the shape (curve / cap, in (0, 1]) of the curve named for it (``use: shape``: nvlink4 <- GH200)
or of its kind (``kind_shapes``: nvlink and infinity-fabric <- V100 NVLink pair, pcie and host <- RTX 2080 PCIe
pair, network <- 4-GPU A100 cloud VMs); (3) a kind with no curve keeps the nominal peak at every size.

A ring all-reduce of S bytes among n runs each step at the bandwidth of the chunk S / n, as Sailor's
``estimate_ar_time`` (:func:`ring_allreduce_s`). ``python -m gpualloc.cost.links`` prints docs/cost-model.md's tables.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from gpualloc.cost import physics
from gpualloc.errors import CostModelError, parse_json, read_text
from gpualloc.hardware.catalog import Catalog, LinkType, default_catalog
from gpualloc.hardware.schema import validated

ArrayLike = float | np.ndarray
MB, GB = 1e6, 1e9
TABLE_NBYTES = (1e6, 16e6, 256e6, 1e9)
"""Message sizes of the docs table: 1 MB, 16 MB, 256 MB, 1 GB."""


@dataclass(frozen=True)
class BandwidthCurve:
    """One measured fit, GB/s = ``c2 x^2 + c1 x + c0`` (``coeffs``) at ``x = log2(nbytes / 1e6)``, at most
    ``max_bytes_per_s``; used between ``min_nbytes`` and ``max_nbytes``; ``source`` names the file and key,
    ``measured_on`` the hardware and traffic."""

    coeffs: tuple[float, float, float]
    max_bytes_per_s: float
    source: str
    measured_on: str
    min_nbytes: float = MB
    max_nbytes: float = 2.0**30

    def __post_init__(self) -> None:
        if len(self.coeffs) != 3 or not all(map(math.isfinite, self.coeffs)):
            raise CostModelError(f"coeffs: expected 3 finite numbers, got {self.coeffs}")
        if not (math.isfinite(self.max_bytes_per_s) and self.max_bytes_per_s > 0):
            raise CostModelError(f"max_bytes_per_s: expected a positive number, got {self.max_bytes_per_s}")
        if not 0 < self.min_nbytes < self.max_nbytes < math.inf:
            raise CostModelError(f"min_nbytes: expected 0 < min_nbytes < max_nbytes, got {self.min_nbytes:g}")
        if self._fit(self.x_range()[0]) <= 0:
            raise CostModelError(f"coeffs: the fit is not positive at min_nbytes {self.min_nbytes:g}")

    def _fit(self, x):
        c2, c1, c0 = self.coeffs
        return (c2 * x + c1) * x + c0

    def x_range(self) -> tuple[float, float]:
        """The ``x`` used: the sizes' range, cut at the fit's vertex so that the fit only rises on it."""
        lo, hi = math.log2(self.min_nbytes / MB), math.log2(self.max_nbytes / MB)
        c2, c1, _ = self.coeffs
        vertex = -c1 / (2 * c2) if c2 else -math.inf
        if c2 < 0 or (c2 == 0 and c1 < 0):  # rises up to the vertex (a falling line: nowhere)
            return lo, min(hi, max(lo, vertex))
        return max(lo, min(hi, vertex)), hi  # rises from the vertex on

    def bandwidth_bytes_per_s(self, nbytes: ArrayLike) -> np.ndarray:
        """Bandwidth at ``nbytes`` (vectorised): finite, positive, rising, capped. Below 1 byte or NaN: 1 byte."""
        x = np.clip(np.log2(np.fmax(np.asarray(nbytes, dtype=np.float64), 1.0) / MB), *self.x_range())
        return np.minimum(self._fit(x) * GB, self.max_bytes_per_s)

    def shape(self, nbytes: ArrayLike) -> np.ndarray:
        """:meth:`bandwidth_bytes_per_s` as a fraction of the cap, in (0, 1]."""
        return self.bandwidth_bytes_per_s(nbytes) / self.max_bytes_per_s


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _CurveDoc(_Strict):
    kind: str
    coeffs: tuple[float, float, float]
    max_bytes_per_s: float = Field(gt=0)
    min_nbytes: float = Field(gt=0)
    max_nbytes: float = Field(gt=0)
    source: str
    measured_on: str
    note: str = ""


class _LinkDoc(_Strict):
    curve: str
    use: Literal["measured", "shape"]


class _Doc(_Strict):
    about: str = ""
    provenance: dict[str, str | list[str]]
    curves: dict[str, _CurveDoc]
    links: dict[str, _LinkDoc]
    kind_shapes: dict[str, str]


@dataclass(frozen=True)
class LinkCurves:
    """The curves by name; ``links``: link name -> (curve name, used measured?); ``kind_shapes``: kind -> curve."""

    curves: Mapping[str, BandwidthCurve]
    links: Mapping[str, tuple[str, bool]]
    kind_shapes: Mapping[str, str]

    def curve_name(self, link: LinkType) -> tuple[str | None, bool]:
        """The name of ``link``'s curve (None: none) and whether it is used in absolute numbers."""
        return self.links.get(link.name.lower(), (self.kind_shapes.get(link.kind), False))


@functools.cache
def load_link_curves(path: str | Path | None = None) -> LinkCurves:
    """The curves of ``path`` (default: the shipped ``data/link_curves.json``), read once."""
    where = str(path or "link_curves.json")
    text = (resources.files("gpualloc.cost").joinpath("data/link_curves.json").read_text() if path is None
            else read_text(path, CostModelError))
    doc = validated(_Doc, parse_json(text, CostModelError, where), where, CostModelError)
    curves = {}
    for k, c in doc.curves.items():
        try:
            curves[k] = BandwidthCurve(c.coeffs, c.max_bytes_per_s, c.source, c.measured_on, c.min_nbytes,
                                       c.max_nbytes)
        except CostModelError as err:
            raise CostModelError(f"{where}: curves.{k}.{err}") from err
    refs = {**{f"links.{k}.curve": v.curve for k, v in doc.links.items()},
            **{f"kind_shapes.{k}": v for k, v in doc.kind_shapes.items()}}
    for field, name in refs.items():
        if name not in curves:
            raise CostModelError(f"{where}: {field}: unknown curve {name!r}; known: {', '.join(curves)}")
    return LinkCurves(curves, {k.lower(): (v.curve, v.use == "measured") for k, v in doc.links.items()},
                      dict(doc.kind_shapes))


def bus_bandwidth_bytes_per_s(link: LinkType, nbytes: ArrayLike, curves: LinkCurves | None = None) -> np.ndarray:
    """Bandwidth of one stream of ``nbytes`` over ``link`` (vectorised) by the module's rule; at most its peak."""
    table = curves or load_link_curves()
    name, measured = table.curve_name(link)
    peak = link.bandwidth_bytes_per_s
    if name is None:
        return np.full(np.shape(nbytes), peak, dtype=np.float64)
    curve = table.curves[name]
    return np.minimum(curve.bandwidth_bytes_per_s(nbytes), peak) if measured else peak * curve.shape(nbytes)


def transfer_time_s(nbytes: ArrayLike, link: LinkType) -> np.ndarray:
    """:func:`gpualloc.cost.physics.transfer_time_s` of ``nbytes`` over ``link`` at that size's bandwidth."""
    return physics.transfer_time_s(nbytes, link.latency_s, bus_bandwidth_bytes_per_s(link, nbytes))


def ring_allreduce_s(nbytes: ArrayLike, participants: ArrayLike, link: LinkType) -> np.ndarray:
    """:func:`gpualloc.cost.physics.ring_allreduce_s` over ``link``, at the bandwidth of the chunk ``nbytes / n``."""
    chunk = np.asarray(nbytes, dtype=np.float64) / np.maximum(np.asarray(participants, dtype=np.float64), 1.0)
    return physics.ring_allreduce_s(nbytes, participants, link.latency_s, bus_bandwidth_bytes_per_s(link, chunk))


def curve_table(catalog: Catalog | None = None) -> list[tuple[LinkType, str, str, np.ndarray]]:
    """Each catalog link's (link, rule, curve name, bandwidth in bytes/s at :data:`TABLE_NBYTES` and at 2^30 B)."""
    table, rows = load_link_curves(), []
    for link in (catalog or default_catalog()).links.values():
        name, measured = table.curve_name(link)
        rule = "nominal" if name is None else "measured" if measured else "shape x peak"
        rows.append((link, rule, name or "", bus_bandwidth_bytes_per_s(link, np.array([*TABLE_NBYTES, 2.0**30]))))
    return rows


def format_tables(catalog: Catalog | None = None) -> str:
    """:func:`curve_table` in GB/s (cap: at 2^30 B, the largest size used), then each curve's provenance."""
    out = ["| link | rule | curve | 1 MB | 16 MB | 256 MB | 1 GB | cap | nominal |", "|---|---|---|" + "---:|" * 6]
    out += [f"| {link.name} | {rule} | {name} | " + " | ".join(f"{b / GB:.1f}" for b in bw)
            + f" | {link.bandwidth_bytes_per_s / GB:.1f} |" for link, rule, name, bw in curve_table(catalog)]
    out += ["", "| curve | measured on | source |", "|---|---|---|"]
    out += [f"| {k} | {c.measured_on} | {c.source} |" for k, c in load_link_curves().curves.items()]
    return "\n".join(out)


if __name__ == "__main__":
    print(format_tables())
