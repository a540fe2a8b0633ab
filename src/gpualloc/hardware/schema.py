"""Input models for catalog rows (pydantic lives here, at the input edge).

A row as written in ``devices.toml`` or a cluster file carries units in its field names
(``mem_gb``, ``mem_bandwidth_gbps``, ``latency_us``); :meth:`DeviceRow.to_device_type` and
:meth:`LinkRow.to_link_type` convert them to the SI fields of the frozen domain dataclasses.
Every validation problem becomes one :class:`~gpualloc.errors.CatalogError` line,
``"<where>: <field>: <problem>"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpualloc.errors import CatalogError, GpuallocError
from gpualloc.hardware.specs import DeviceType, LinkType

GB = 1e9
GIB = 2**30

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Lower = Annotated[str, Field(min_length=1), AfterValidator(str.lower)]
"""A name, in lower case (link names are looked up in lower case)."""
M = TypeVar("M", bound=BaseModel)


def format_validation_error(err: ValidationError) -> str:
    """``"field.path: problem"`` for the first error of ``err`` (list indices as ``[i]``)."""
    first = err.errors(include_url=False)[0]
    path = ""
    for part in first["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if first["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in first:
        msg += f" (got {first['input']!r})"
    if not path:  # model-level checks name their field in the message: "mem_gb: ..."
        return msg
    return f"{path}: {msg}"


def validated(model: type[M], data: Any, where: str, error: type[GpuallocError]) -> M:
    """``model.model_validate(data)``; a problem as one ``error`` line, ``"<where>: <field>: <problem>"``."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(f"{where}: {format_validation_error(err)}") from err


def _exactly_one(values: Mapping[str, Any], names: tuple[str, ...], *, required: bool) -> None:
    given = [n for n in names if values.get(n) is not None]
    if len(given) > 1:
        raise ValueError(f"{given[0]}: give only one of {', '.join(names)} (got {', '.join(given)})")
    if required and not given:
        raise ValueError(f"{names[0]}: required field is missing (give one of {', '.join(names)})")


class _Row(BaseModel):
    # No NaN or infinity: a peak of 1e309 (inf) would make every op take 0 s.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)

    @classmethod
    def parse(cls, row: Mapping[str, Any], where: str, *, require_source: bool = True):
        """Validate one table; raise ``CatalogError("<where>: <field>: <problem>")``.

        Args:
            row: the table, with its ``name`` key included.
            where: prefix naming the file and the row, e.g. ``"devices.toml: device.A100-40GB"``.
            require_source: the built-in catalog must cite its sources; inline cluster types need not.
        """
        if not isinstance(row, Mapping):
            raise CatalogError(f"{where}: expected a table of fields, got {type(row).__name__}")
        parsed = validated(cls, dict(row), where, CatalogError)
        if require_source and not parsed.source:
            raise CatalogError(f"{where}: source: required field is missing (cite the vendor document)")
        return parsed


class DeviceRow(_Row):
    """One device type as written in a catalog or cluster file.

    Memory is exactly one of ``mem_gb`` (1e9 bytes), ``mem_gib`` (2**30 bytes) or ``mem_bytes``;
    memory bandwidth is at most one of ``mem_bandwidth_gbps`` (GB/s) or
    ``mem_bandwidth_bytes_per_s``. Peaks (TFLOP/s) are optional but positive when given; a type without
    ``tf32_tflops`` (``bf16_tflops``) cannot train in TF32 (BF16). ``reserve_gib`` overrides the memory the
    framework keeps for itself (:func:`gpualloc.cost.memory.reserve_bytes`).
    """

    name: Annotated[str, Field(min_length=1)]
    vendor: Literal["nvidia", "amd", "intel", "other"] = "other"
    architecture: str = "unknown"
    tensor_tflops: Positive | None = None
    fp32_tflops: Positive | None = None
    fp64_tflops: Positive | None = None
    tf32_tflops: Positive | None = None
    bf16_tflops: Positive | None = None
    reserve_gib: NonNegative | None = None
    mem_gb: Positive | None = None
    mem_gib: Positive | None = None
    mem_bytes: Annotated[int, Field(gt=0)] | None = None
    mem_bandwidth_gbps: Positive | None = None
    mem_bandwidth_bytes_per_s: Positive | None = None
    tdp_w: Positive
    idle_w: NonNegative
    link: Lower = "pcie3"
    source: str = ""
    aliases: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> DeviceRow:
        fields = self.__dict__
        _exactly_one(fields, ("mem_gb", "mem_gib", "mem_bytes"), required=True)
        _exactly_one(fields, ("mem_bandwidth_gbps", "mem_bandwidth_bytes_per_s"), required=False)
        if self.idle_w >= self.tdp_w:
            raise ValueError(f"idle_w: must be less than tdp_w ({self.idle_w} >= {self.tdp_w})")
        return self

    def to_device_type(self) -> DeviceType:
        if self.mem_bytes is not None:
            mem = self.mem_bytes
        elif self.mem_gib is not None:
            mem = round(self.mem_gib * GIB)
        else:
            mem = round(self.mem_gb * GB)  # type: ignore[operator]
        if self.mem_bandwidth_bytes_per_s is not None:
            bw: float | None = float(self.mem_bandwidth_bytes_per_s)
        elif self.mem_bandwidth_gbps is not None:
            bw = self.mem_bandwidth_gbps * GB
        else:
            bw = None
        return DeviceType(
            name=self.name,
            vendor=self.vendor,
            architecture=self.architecture,
            tensor_tflops=self.tensor_tflops,
            fp32_tflops=self.fp32_tflops,
            fp64_tflops=self.fp64_tflops,
            tf32_tflops=self.tf32_tflops,
            bf16_tflops=self.bf16_tflops,
            reserve_bytes=None if self.reserve_gib is None else round(self.reserve_gib * GIB),
            mem_bytes=int(mem),
            mem_bandwidth_bytes_per_s=bw,
            tdp_w=float(self.tdp_w),
            idle_w=float(self.idle_w),
            link=self.link,
            source=self.source,
            aliases=tuple(self.aliases),
        )


class LinkRow(_Row):
    """One link type: bandwidth per direction as ``bandwidth_gbps`` (GB/s) or
    ``bandwidth_bytes_per_s``; latency as ``latency_us`` or ``latency_s`` (exactly one of each).

    ``kind`` is ``nvlink``, ``infinity-fabric``, ``pcie``, ``network``, or ``host`` (socket-to-socket
    links inside one server, e.g. Intel UPI, used between CPU devices).
    """

    name: Lower  # Catalog.link looks names up in lower case
    kind: Literal["nvlink", "infinity-fabric", "pcie", "network", "host"]
    bandwidth_gbps: Positive | None = None
    bandwidth_bytes_per_s: Positive | None = None
    latency_us: NonNegative | None = None
    latency_s: NonNegative | None = None
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> LinkRow:
        _exactly_one(self.__dict__, ("bandwidth_gbps", "bandwidth_bytes_per_s"), required=True)
        _exactly_one(self.__dict__, ("latency_us", "latency_s"), required=True)
        return self

    def to_link_type(self) -> LinkType:
        bw = self.bandwidth_bytes_per_s if self.bandwidth_bytes_per_s is not None \
            else self.bandwidth_gbps * GB  # type: ignore[operator]
        lat = self.latency_s if self.latency_s is not None else self.latency_us * 1e-6  # type: ignore[operator]
        return LinkType(name=self.name, kind=self.kind, bandwidth_bytes_per_s=float(bw),
                        latency_s=float(lat), source=self.source)
