"""Sailor per-layer profiles -> OpGraph (one node per layer, a chain, measured times per GPU type).

The profiles come from Sailor (Strati et al., "Sailor: Automating Distributed Training over Dynamic,
Heterogeneous, and Geo-distributed Clusters", SOSP 2025; eth-easl/sailor, MIT). A profile folder holds

- ``profiles/<MODEL>/<GPU>/profile.json``: ``{microbatch: {tp: {layer: [fwd_s, bwd_s, opt_step_s]}}}``,
  seconds per microbatch; layer 0 is the embedding, then the transformer layers, the last one head + loss;
  ``opt_step_s`` is one model-wide optimizer-step time repeated on every layer;
- ``llm_info.json``: ``{model: {tp: {layer: {params_floats, act_output_floats, act_input_floats,
  act_mem_floats, ...}}}}`` per sample.

Precision. The profiles were measured in fp32: ``llm_info.json``'s ``*_bytes`` fields are 4 bytes a float,
and Sailor's planner counts ``float_size = 4`` unless told the run is fp16. So activations and parameters
here are 4 bytes a value, and the graph and its profile carry ``precision: "fp32"``. Planning these times
in another precision is refused (:class:`gpualloc.placement.hybrid.problem.HybridProblem`): a time measured
without tensor cores says nothing of one with them. The memory a plan needs in fp32 follows
:mod:`gpualloc.cost.memory` (weights, gradients, Adam state: 16 bytes a parameter; activations saved for
backward: ``act_mem_floats`` x 4 bytes a sample).

Sequence length. The profiles are measured at one sequence length, which ``llm_info`` fixes: layer 0's
input is the token ids, the position ids and the ``s x s`` attention mask, ``s**2 + 2*s`` floats a sample
(2048 for OPT-350, GPT-Neo-2.7 and OPT-30, 8192 for LLAMA-3-8). Another length is refused, not scaled:
attention time is not linear in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpualloc.errors import CatalogError, ImportFormatError, read_json
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming
from gpualloc.limits import MAX_BATCH, check_size

__all__ = [
    "BYTES_PER_ACTIVATION",
    "BYTES_PER_PARAM",
    "SAILOR_GPUS",
    "SAILOR_SOURCE",
    "LayerSizes",
    "catalog_gpu",
    "import_sailor",
    "parse_llm_info",
    "parse_profile",
    "profile_gpus",
]

SAILOR_SOURCE = "sailor-profiles (eth-easl/sailor cf2c8e3, MIT)"
SAILOR_LICENSE = "MIT, eth-easl/sailor"

#: Sailor's GPU folder names -> gpualloc catalog device types (the one alias table).
SAILOR_GPUS: dict[str, str] = {
    "A100-40": "A100-40GB",
    "A100-80": "A100-80GB",
    "GH-96": "GH200-96GB",
    "V100-16": "V100-16GB",
    "RTX-2080": "RTX-2080",
    "RTX-3090": "RTX-3090",
    "Titan-RTX": "Titan-RTX",
}

PRECISION = "fp32"
"""The precision the profiles were measured in."""

BYTES_PER_PARAM = 4
"""Bytes per parameter in ``param_bytes`` (fp32)."""

BYTES_PER_ACTIVATION = 4
"""Bytes per activation float (fp32, the profiles' precision)."""

MAX_TP = 1024
"""Largest tensor-parallel degree a profile may name."""

MAX_LAYERS = 100_000
"""Most layers a profile may hold."""

MAX_SECONDS = 1e6
"""Longest time a profile may give one layer for one microbatch (11 days: anything longer is corrupt)."""

MAX_FLOATS = 1e15
"""Largest per-sample size ``llm_info.json`` may give one layer (floats)."""

_LABELS = ("fwd_s", "bwd_s", "opt_step_s")


@dataclass(frozen=True)
class LayerSizes:
    """Per-layer sizes of one model at TP 1, from ``llm_info.json`` (floats per sample).

    Attributes:
        params: parameters of each layer.
        act_output: activation each layer sends to the next.
        act_input: activation each layer receives.
        act_mem: activation each layer keeps for its backward pass.
        seq_len: the sequence length the sizes (and the profiles) are for, or ``None`` if layer 0's
            input does not pin it.
    """

    params: np.ndarray
    act_output: np.ndarray
    act_input: np.ndarray
    act_mem: np.ndarray
    seq_len: int | None

    def __len__(self) -> int:
        return len(self.params)


# ---------------------------------------------------------------------------------------- parsing


def _int_key(key: Any, what: str, maximum: int, where: str) -> int:
    """A JSON object key that must be a decimal integer in ``1..maximum`` (``0..`` for layers)."""
    minimum = 0 if what == "layer" else 1
    if not isinstance(key, str) or not key.isdigit() or len(key) > 12 or not minimum <= int(key) <= maximum:
        raise ImportFormatError(f"{where}: {what} key {key!r} is not an integer in {minimum}..{maximum:,}")
    return int(key)


def _object(value: Any, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not value:
        raise ImportFormatError(f"{where}: expected a non-empty object of {what}, got {type(value).__name__}")
    return value


def _layers(table: Any, where: str) -> np.ndarray:
    """``{layer: [fwd_s, bwd_s, opt_step_s]}`` -> a ``(layers, 3)`` array; keys must be ``0..L-1``."""
    table = _object(table, where, "layers")
    if len(table) > MAX_LAYERS:
        raise ImportFormatError(f"{where}: {len(table):,} layers: at most {MAX_LAYERS:,}")
    rows: dict[int, list[float]] = {}
    for key, value in table.items():
        at = f"{where}[{key!r}]"
        layer = _int_key(key, "layer", MAX_LAYERS - 1, where)
        if not isinstance(value, list) or len(value) != 3:
            raise ImportFormatError(f"{at}: expected [fwd_s, bwd_s, opt_step_s], got {value!r:.80}")
        row = []
        for label, x in zip(_LABELS, value, strict=True):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= MAX_SECONDS:
                raise ImportFormatError(f"{at}: {label} is {x!r}, expected seconds in 0..{MAX_SECONDS:g}")
            row.append(float(x))
        rows[layer] = row
    missing = next((i for i in range(len(rows)) if i not in rows), None)
    if missing is not None:
        raise ImportFormatError(f"{where}: layer {missing} is missing (layers must be numbered 0..{len(rows) - 1})")
    return np.asarray([rows[i] for i in range(len(rows))], dtype=np.float64)


def parse_profile(data: Any, where: str = "profile.json") -> dict[int, dict[int, np.ndarray]]:
    """Validate a decoded ``profile.json``.

    Args:
        data: ``{microbatch: {tp: {layer: [fwd_s, bwd_s, opt_step_s]}}}`` as decoded JSON.
        where: the file, for messages.

    Returns:
        ``{microbatch: {tp: array (layers, 3)}}`` in seconds per microbatch, keys ascending.

    Raises:
        ImportFormatError: one line naming the file and the microbatch/tp/layer key at fault: a non-integer
            key, a missing layer, a value that is not three finite seconds >= 0, or layer counts that differ.
    """
    out: dict[int, dict[int, np.ndarray]] = {}
    first: tuple[str, int] | None = None
    for mb_key, by_tp in _object(data, where, "microbatch sizes").items():
        mb = _int_key(mb_key, "microbatch", MAX_BATCH, where)
        for tp_key, layers in _object(by_tp, f"{where}[{mb_key!r}]", "TP degrees").items():
            at = f"{where}[{mb_key!r}][{tp_key!r}]"
            tp = _int_key(tp_key, "tp", MAX_TP, f"{where}[{mb_key!r}]")
            table = _layers(layers, at)
            if first is None:
                first = (at, len(table))
            elif len(table) != first[1]:
                raise ImportFormatError(f"{at}: {len(table)} layers, but {first[0]} has {first[1]}")
            out.setdefault(mb, {})[tp] = table
    return {mb: dict(sorted(out[mb].items())) for mb in sorted(out)}


def _seq_len(mask_floats: float) -> int | None:
    """``s`` with ``s**2 + 2*s == mask_floats`` (token ids, position ids, ``s x s`` mask), else None."""
    s = math.isqrt(int(mask_floats) + 1) - 1
    return s if s > 0 and s * s + 2 * s == mask_floats else None


def parse_llm_info(data: Any, model: str, where: str = "llm_info.json") -> LayerSizes:
    """The TP-1 per-layer sizes of ``model`` from a decoded ``llm_info.json``.

    Raises:
        ImportFormatError: the model or its TP-1 table is missing, a layer is missing, or a size is
            not a finite number >= 0 (the message names the key).
    """
    models = _object(data, where, "models")
    if model not in models:
        raise ImportFormatError(f"{where}: no model {model!r}; it has {', '.join(sorted(models))}")
    by_tp = _object(models[model], f"{where}[{model!r}]", "TP degrees")
    if "1" not in by_tp:
        raise ImportFormatError(f"{where}[{model!r}]: no TP-1 sizes (has tp {', '.join(sorted(by_tp))})")
    at = f"{where}[{model!r}]['1']"
    table = _object(by_tp["1"], at, "layers")
    fields = ("params_floats", "act_output_floats", "act_input_floats", "act_mem_floats")
    rows: dict[int, list[float]] = {}
    for key, sizes in table.items():
        layer = _int_key(key, "layer", MAX_LAYERS - 1, at)
        sizes = _object(sizes, f"{at}[{key!r}]", "sizes")
        row = []
        for f in fields:
            x = sizes.get(f)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x <= MAX_FLOATS:
                raise ImportFormatError(f"{at}[{key!r}].{f}: {x!r} is not a number of floats in 0..{MAX_FLOATS:g}")
            row.append(float(x))
        rows[layer] = row
    missing = next((i for i in range(len(rows)) if i not in rows), None)
    if missing is not None:
        raise ImportFormatError(f"{at}: layer {missing} is missing (layers must be numbered 0..{len(rows) - 1})")
    arr = np.asarray([rows[i] for i in range(len(rows))], dtype=np.float64)
    return LayerSizes(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], _seq_len(arr[0, 2]))


# ---------------------------------------------------------------------------------------- names and files


def catalog_gpu(name: str) -> tuple[str, str]:
    """``(Sailor folder name, catalog device type)`` for a Sailor name (``A100-40``) or any catalog name or
    alias of a profiled type (``A100-40GB``, ``A100``).

    Raises:
        ImportFormatError: a name that is neither.
    """
    from gpualloc.hardware.catalog import default_catalog

    for sailor, cat in SAILOR_GPUS.items():
        if name.lower() == sailor.lower():
            return sailor, cat
    try:
        canonical = default_catalog().device(name).name
    except CatalogError:
        canonical = None
    for sailor, cat in SAILOR_GPUS.items():
        if canonical == cat:
            return sailor, cat
    raise ImportFormatError(f"--gpu {name!r}: not a Sailor GPU ({', '.join(SAILOR_GPUS)}) "
                            "nor a catalog name of one")


def _locate(path: Path, model: str | None) -> tuple[Path, Path, str]:
    """``(model folder, llm_info.json, model)`` from a sailor-profiles folder or a ``profiles/<MODEL>`` one."""
    path = Path(path)
    if not path.is_dir():
        raise ImportFormatError(f"{path}: not a folder (expected a sailor-profiles folder or profiles/<MODEL>)")
    if (path / "profiles").is_dir():
        models = sorted(p.name for p in (path / "profiles").iterdir() if p.is_dir())
        if model is None:
            raise ImportFormatError(f"{path}: --model is needed: one of {', '.join(models) or '(none)'}")
        if model not in models:
            raise ImportFormatError(f"{path / 'profiles'}: no model {model!r}; it has {', '.join(models) or '(none)'}")
        return path / "profiles" / model, path / "llm_info.json", model
    if path.resolve().parent.name == "profiles":
        name = path.resolve().name
        if model is not None and model != name:
            raise ImportFormatError(f"{path}: this is the folder of {name!r}, not --model {model!r}")
        return path, path.resolve().parent.parent / "llm_info.json", name
    raise ImportFormatError(f"{path}: not a sailor-profiles folder (no profiles/ inside) nor a profiles/<MODEL> one")


def profile_gpus(model_dir: Path) -> list[str]:
    """The Sailor GPU folders of a model folder that hold a ``profile.json``, in :data:`SAILOR_GPUS` order."""
    return [g for g in SAILOR_GPUS if (Path(model_dir) / g / "profile.json").is_file()]


def _select(model_dir: Path, gpus: Sequence[str] | None) -> list[tuple[str, str]]:
    available = profile_gpus(model_dir)
    if gpus:
        chosen = list(dict.fromkeys(catalog_gpu(g) for g in gpus))
        for sailor, _ in chosen:
            if sailor not in available:
                raise ImportFormatError(f"{model_dir / sailor / 'profile.json'}: no such profile; this model is "
                                        f"profiled on {', '.join(available) or '(none)'}")
        return chosen
    if not available:
        raise ImportFormatError(f"{model_dir}: no <GPU>/profile.json inside (GPUs: {', '.join(SAILOR_GPUS)})")
    return [(g, SAILOR_GPUS[g]) for g in available]


# ---------------------------------------------------------------------------------------- the graph


def _default_microbatch(tables: Mapping[str, dict[int, dict[int, np.ndarray]]]) -> int:
    """The smallest microbatch profiled at TP 1 on the most GPUs (the smallest profiled if none has TP 1)."""
    counts: dict[int, int] = {}
    for table in tables.values():
        for mb, by_tp in table.items():
            counts[mb] = counts.get(mb, 0) + (1 in by_tp)
    return min(counts, key=lambda mb: (-counts[mb], mb))


def _opt_step_s(table: dict[int, dict[int, np.ndarray]], mb: int) -> float:
    """One model-wide optimizer step on one GPU: at (``mb``, TP 1) if profiled, else the smallest TP of the
    smallest microbatch times that TP (the step is sharded over the TP group)."""
    if 1 in table.get(mb, {}):
        return float(table[mb][1][:, 2].max())
    first = table[min(table)]
    tp = min(first)
    return float(first[tp][:, 2].max()) * tp


def _nodes(sizes: LayerSizes, seq_len: int, batch: int, times_ms: Mapping[str, np.ndarray]) -> list[OpNode]:
    nodes = []
    for i in range(len(sizes)):
        out_bytes = float(sizes.act_output[i]) * BYTES_PER_ACTIVATION * batch
        params = float(sizes.params[i])
        # Layer 0 is an embedding lookup (no arithmetic); the others are dominated by their matmuls.
        flops = 0.0 if i == 0 else 2.0 * params * seq_len * batch
        nodes.append(OpNode(
            id=f"layer{i}",
            name=f"layer{i}",
            kind="embedding" if i == 0 else ("head" if i == len(sizes) - 1 else "transformer_layer"),
            flops=flops,
            bytes_read=float(sizes.act_input[i]) * BYTES_PER_ACTIVATION * batch + params * BYTES_PER_ACTIVATION,
            bytes_written=out_bytes,
            param_bytes=params * BYTES_PER_PARAM,
            output_bytes=out_bytes,
            time_ms={dev: OpTiming(float(t[i, 0]), float(t[i, 1])) for dev, t in times_ms.items()},
            layer=f"layer{i}",
        ))
    return nodes


def _read_tables(model_dir: Path, chosen: Iterable[tuple[str, str]], n_layers: int, explicit: bool,
                 info_path: Path) -> tuple[dict[str, dict[int, dict[int, np.ndarray]]], dict[str, str]]:
    """Parsed profiles by catalog name; GPUs whose layer count differs from ``llm_info`` are refused when
    named with ``--gpu`` and skipped (with the reason) otherwise."""
    tables: dict[str, dict[int, dict[int, np.ndarray]]] = {}
    skipped: dict[str, str] = {}
    for sailor, cat in chosen:
        path = model_dir / sailor / "profile.json"
        table = parse_profile(read_json(path, ImportFormatError), str(path))
        layers = len(next(iter(next(iter(table.values())).values())))
        if layers != n_layers:
            reason = f"{path}: {layers} layers, but {info_path} gives {model_dir.name!r} {n_layers}"
            if explicit:
                raise ImportFormatError(reason)
            skipped[sailor] = reason
            continue
        tables[cat] = table
    if not tables:
        raise ImportFormatError(next(iter(skipped.values())))
    return tables, skipped


def import_sailor(
    path: str | Path,
    *,
    model: str | None = None,
    gpus: Sequence[str] | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    microbatch: int | None = None,
    name: str | None = None,
) -> OpGraph:
    """Read Sailor per-layer profiles of one model on one or more GPU types into an :class:`OpGraph`.

    Args:
        path: a sailor-profiles folder (``profiles/`` and ``llm_info.json`` inside; needs ``model``) or
            one ``profiles/<MODEL>`` folder of it.
        model: the model folder name (``OPT-350``, ``GPT-Neo-2.7``, ``LLAMA-3-8``, ``OPT-30``).
        gpus: Sailor or catalog GPU names; ``None`` takes every GPU profiled for the model whose layer
            count agrees with ``llm_info.json`` (the others are listed in ``meta["profile"]["skipped"]``).
        batch_size: the global batch, stored as ``graph.batch_size``; default the microbatch.
        seq_len: must equal the profiled sequence length when given (another one is refused).
        microbatch: the profiled microbatch whose TP-1 times fill ``time_ms``; default the smallest one
            profiled at TP 1 on the most of the GPUs.
        name: graph name; default the model.

    Returns:
        A chain ``layer0 -> layer1 -> ...``: one node per layer with ``param_bytes``, ``output_bytes`` (edge
        bytes the same) for the batch, estimated FLOPs and, per GPU with a TP-1 profile at ``microbatch``,
        ``time_ms`` = measured seconds x 1000 x ``batch_size / microbatch``. ``meta["profile"]`` holds every
        measured table: ``gpu`` (catalog name -> microbatch -> tp -> ``[[fwd_s, bwd_s], ...]`` per layer),
        ``opt_step_s``, ``seq_len``, ``source``, ``model``, ``microbatch``, the byte sizes used and
        ``act_mem_bytes`` (bytes a sample each layer keeps for backward, at TP 1).

    Raises:
        ImportFormatError: one line naming the file and key: a missing model, GPU or file, malformed JSON,
            negative or non-finite times, layer counts that differ, an unprofiled microbatch or sequence.
    """
    model_dir, info_path, model = _locate(Path(path), model)
    sizes = parse_llm_info(read_json(info_path, ImportFormatError), model, str(info_path))
    if seq_len is not None:
        check_size(seq_len, "--seq-len", MAX_BATCH, ImportFormatError)
        if sizes.seq_len is not None and seq_len != sizes.seq_len:
            raise ImportFormatError(f"--seq-len {seq_len}: {info_path} profiles {model} at sequence {sizes.seq_len} "
                                    "only (attention time is not linear in it: profile that length)")
    seq = sizes.seq_len or seq_len
    if seq is None:
        raise ImportFormatError(f"{info_path}[{model!r}]['1']['0'].act_input_floats does not give the sequence "
                                "length: pass --seq-len")
    tables, skipped = _read_tables(model_dir, _select(model_dir, gpus), len(sizes), bool(gpus), info_path)
    if not gpus:  # a GPU folder the name table does not know cannot be filed under a catalog type
        for d in sorted(p for p in model_dir.iterdir() if (p / "profile.json").is_file() and p.name not in SAILOR_GPUS):
            skipped[d.name] = f"{d / 'profile.json'}: GPU {d.name!r} is not in SAILOR_GPUS ({', '.join(SAILOR_GPUS)})"

    if microbatch is None:
        microbatch = _default_microbatch(tables)
    else:
        check_size(microbatch, "--microbatch", MAX_BATCH, ImportFormatError)
        if not any(1 in t.get(microbatch, {}) for t in tables.values()):
            profiled = sorted({mb for t in tables.values() for mb, by_tp in t.items() if 1 in by_tp})
            raise ImportFormatError(f"--microbatch {microbatch}: no GPU is profiled at it with TP 1 "
                                    f"(TP-1 microbatches: {', '.join(map(str, profiled)) or 'none'})")
    batch = microbatch if batch_size is None else check_size(batch_size, "--batch", MAX_BATCH, ImportFormatError)
    scale_ms = 1000.0 * batch / microbatch
    times_ms = {cat: t[microbatch][1][:, :2] * scale_ms for cat, t in tables.items() if 1 in t.get(microbatch, {})}

    profile: dict[str, Any] = {
        "gpu": {cat: {str(mb): {str(tp): arr[:, :2].tolist() for tp, arr in by_tp.items()}
                      for mb, by_tp in t.items()} for cat, t in tables.items()},
        "opt_step_s": {cat: _opt_step_s(t, microbatch) for cat, t in tables.items()},
        "seq_len": int(seq),
        "source": SAILOR_SOURCE,
        "model": model,
        "microbatch": int(microbatch),
        "sailor_gpu": {cat: s for s, cat in SAILOR_GPUS.items() if cat in tables},
        "bytes_per_param": BYTES_PER_PARAM,
        "bytes_per_activation": BYTES_PER_ACTIVATION,
        "precision": PRECISION,
        "act_mem_bytes": (sizes.act_mem * BYTES_PER_ACTIVATION).tolist(),
    }
    if skipped:
        profile["skipped"] = skipped
    nodes = _nodes(sizes, seq, batch, times_ms)
    edges = [OpEdge(a.id, b.id, a.output_bytes) for a, b in zip(nodes, nodes[1:], strict=False)]
    meta = {"source": "sailor", "license": SAILOR_LICENSE, "model": model, "precision": PRECISION,
            "flops": "estimated: 2 x params x tokens per layer, 0 for the embedding", "profile": profile}
    return OpGraph(name or model, nodes, edges, batch_size=batch, meta=meta)
