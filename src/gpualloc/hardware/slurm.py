"""A Slurm cluster's nodes and typed GPU GRES, read from ``sinfo``.

``sinfo --Node --noheader --format=%N|%G|%T|%P`` gives one line per node and partition with its
GRES (``gpu:v100:4,gpu:t4:2(S:0-1)``) and state; :func:`parse_sinfo` reads that text,
:func:`gres_device_type` maps a GRES type to a catalog device type (any case, vendor prefixes such
as ``nvidia_`` or ``tesla_`` dropped, ``_`` read as ``-``, then the catalog's names and aliases and
:data:`GRES_ALIASES`). :func:`gpualloc.hardware.cluster.cluster_from_nodes` builds the
:class:`~gpualloc.hardware.cluster.ClusterSpec` (this module does not import the cluster module, which
reads ``slurm:`` specs through it). The parsers take text, so they are tested without Slurm;
:func:`gpualloc.hardware.cluster.read_slurm_cluster` is the one place that runs ``sinfo``.

Only typed GPU GRES count: an untyped ``gpu:4`` or an unknown type is one error naming the node and
the field; other GRES (``mps``, ``shard``, ``nic``) are ignored.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from gpualloc.errors import CatalogError, ClusterError, GpuallocError
from gpualloc.hardware.catalog import Catalog, DeviceType
from gpualloc.limits import MAX_DEVICES

__all__ = ["GRES_ALIASES", "SINFO_FORMAT", "SlurmNode", "gres_device_type", "parse_gres",
           "parse_sinfo", "run_slurm", "slurm_cluster_arg"]

SINFO_FORMAT = "%N|%G|%T|%P"
"""``sinfo --format`` of :func:`parse_sinfo`: node, GRES, long state, partition (``|`` cannot occur in them)."""

GRES_ALIASES: dict[str, str] = {
    "v100-pcie-16gb": "V100-16GB", "v100-pcie-32gb": "V100-32GB", "v100s": "V100-32GB",
    "a100-pcie-40gb": "A100-40GB", "a100-pcie-80gb": "A100-80GB", "a100-80gb-pcie": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB", "h100-80gb-hbm3": "H100-SXM", "h100-sxm5-80gb": "H100-SXM",
    "geforce-rtx-2080-ti": "RTX-2080Ti", "instinct-mi50": "MI50", "instinct-mi100": "MI100",
}
"""GRES type spellings (after normalisation) that the catalog's names and aliases miss."""

_VENDOR_PREFIXES = ("nvidia-", "tesla-", "amd-", "radeon-", "instinct-", "geforce-")
_GRES_ITEM = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?::(?P<type>[^:()]+))?(?::(?P<count>\d+[KMG]?))?(?:\(.*\))?$")
_MULT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


@dataclass(frozen=True)
class SlurmNode:
    """One Slurm node as ``sinfo`` reports it.

    Attributes:
        name: the node name (what ``--nodelist`` takes).
        gpus: ``(GRES type, count)`` of each typed GPU GRES, in the order listed.
        state: Slurm's long state, lower case (``idle``, ``mixed``, ``drained``, ``down*``...).
        partitions: partitions the node is in (the default one without its ``*``).
    """

    name: str
    gpus: tuple[tuple[str, int], ...]
    state: str
    partitions: tuple[str, ...]

    @property
    def usable(self) -> bool:
        """False when Slurm will not start jobs on it (down, drained or draining, failing, ...)."""
        bad = ("down", "drain", "fail", "maint", "reboot", "power", "inval", "future", "unknown", "not_responding")
        return not self.state.endswith("*") and not any(b in self.state for b in bad)


def parse_gres(text: str, where: str) -> tuple[tuple[str, int], ...]:
    """Typed GPU GRES of one ``Gres=`` value: ``"gpu:v100:4,gpu:t4:2(S:0-1)"`` -> ``(("v100", 4), ("t4", 2))``.

    Args:
        text: the value (``(null)`` or empty: none).
        where: names the node and field in errors.

    Raises:
        ClusterError: an untyped or malformed GPU item, or an absurd count.
    """
    text = text.strip()
    if text in ("", "(null)", "N/A"):
        return ()
    out: list[tuple[str, int]] = []
    # Commas separate items, but a socket list "(S:0,1)" holds commas too: split outside parentheses.
    for item in re.split(r",(?![^()]*\))", text):
        item = item.strip()
        m = _GRES_ITEM.match(item)
        if m is None:
            raise ClusterError(f"{where}: cannot read GRES item {item!r} (expected NAME:TYPE:COUNT)")
        if m["name"].lower() != "gpu":
            continue
        gtype, count = m["type"], m["count"]
        if count is None and gtype is not None and gtype.isdigit():  # "gpu:4": the count, no type
            gtype, count = None, gtype
        if gtype is None:
            raise ClusterError(f"{where}: GRES {item!r} has no GPU type: gpualloc needs typed GRES "
                               f"(gpu:TYPE:COUNT, e.g. gpu:v100:4)")
        n = 1 if count is None else int(count[:-1] if count[-1] in _MULT else count) * _MULT.get(count[-1], 1)
        if not 0 < n <= MAX_DEVICES:
            raise ClusterError(f"{where}: GRES {item!r}: count {n:,} is not in 1..{MAX_DEVICES:,}")
        out.append((gtype, n))
    return tuple(out)


def parse_sinfo(text: str) -> tuple[SlurmNode, ...]:
    """Nodes of ``sinfo --Node --noheader --format=%N|%G|%T|%P`` output, one per node name (a node
    listed once per partition is merged), in first-seen order.

    Raises:
        ClusterError: a line without four ``|``-separated fields (``sinfo line N``), or a bad GRES.
    """
    nodes: dict[str, SlurmNode] = {}
    for k, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 4 or not parts[0].strip():
            raise ClusterError(f"sinfo line {k}: expected NODE|GRES|STATE|PARTITION, got {line[:200]!r}")
        name, gres, state, partition = (p.strip() for p in parts)
        gpus = parse_gres(gres, f"slurm node {name}: Gres")
        partition = partition.rstrip("*")
        old = nodes.get(name)
        if old is None:
            nodes[name] = SlurmNode(name, gpus, state.lower(), (partition,) if partition else ())
        elif partition and partition not in old.partitions:
            nodes[name] = SlurmNode(name, old.gpus, old.state, (*old.partitions, partition))
    return tuple(nodes.values())


def _normalised(gres_type: str) -> str:
    key = gres_type.strip().lower().replace("_", "-").replace(" ", "-")
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix):]
    return key


def gres_device_type(gres_type: str, catalog: Catalog, where: str) -> DeviceType:
    """The catalog device type of a GRES type (``v100``, ``nvidia_a100-sxm4-40gb``, ``Tesla_T4``).

    Raises:
        ClusterError: a type the catalog does not know, naming ``where``.
    """
    for key in (gres_type, _normalised(gres_type)):
        try:
            return catalog.device(GRES_ALIASES.get(key.lower(), key))
        except CatalogError:
            continue
    raise ClusterError(f"{where}: unknown GPU type {gres_type!r} (known: {', '.join(catalog.devices)}; "
                       f"or a GRES alias: {', '.join(GRES_ALIASES)})")


def run_slurm(argv: Sequence[str], *, timeout_s: float = 30.0, error: type[GpuallocError] = ClusterError,
              check: bool = True) -> subprocess.CompletedProcess:
    """Run one Slurm command (never through a shell) and return its result.

    Raises:
        ``error``: the command is not installed, timed out, or (``check``) exited non-zero, as one
        line with its first line of stderr.
    """
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise error(f"{argv[0]}: not found (is Slurm installed and on PATH?)") from None
    except subprocess.TimeoutExpired:
        raise error(f"{argv[0]}: no answer within {timeout_s:g} s (is slurmctld up?)") from None
    except OSError as err:
        raise error(f"{argv[0]}: cannot run: {err.strerror}") from err
    if check and done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        first = lines[-1] if lines else f"exit status {done.returncode}"
        raise error(f"{argv[0]} failed: {first.strip()[:300]}")
    return done


def slurm_cluster_arg(spec: str) -> str | None | bool:
    """For ``"slurm"`` / ``"slurm:"`` -> None (every partition), ``"slurm:PART"`` -> ``"PART"``, anything
    else -> False (not a Slurm spec)."""
    s = spec.strip()
    if s.lower() == "slurm":
        return None
    if s.lower().startswith("slurm:"):
        return s[len("slurm:"):].strip() or None
    return False
