"""Trace a PyTorch model into an :class:`~gpualloc.graph.ir.OpGraph`.

This is the only module that traces torch. A model is exported with ``torch.export.export`` (which
sees inside ``nn.TransformerEncoderLayer`` and other fused modules); if that fails, the model is first
traced with ``torch.fx.symbolic_trace`` and the resulting ``GraphModule`` is exported instead. Nothing
is computed on real data: zoo models are built on the ``meta`` device, ``torch.export`` propagates fake
tensors, and FLOPs come from running each ATen op once on ``meta`` tensors of the traced shapes under
``torch.utils.flop_counter.FlopCounterMode`` (results are cached per op and shape signature, so the
12 identical blocks of a Transformer cost one evaluation).

What becomes a node (``granularity="op"``):
    every ATen call in the exported graph, except layout-only ops that alias their input (views,
    reshapes, transposes, splits, ``getitem``, ``contiguous``, eval-mode ``dropout``). Those are folded:
    a consumer of a view depends on the op that produced the viewed tensor. Node ids are the fx node
    names (``conv2d_3``, ``linear_12``), unique and stable for a given model and torch version.

Sizes per node:
    ``flops``: forward FLOPs for the whole batch as ``FlopCounterMode`` counts them (matmuls,
    convolutions and attention; elementwise ops, norms and softmax count 0, as in most published
    figures). ``output_bytes`` / ``bytes_written``: bytes of the op's output tensors (tuples summed).
    ``bytes_read``: bytes of the tensors it consumes (activations, inputs, parameters, buffers).
    ``param_bytes``: each ``nn.Parameter`` is attributed in full to the *first* op (in execution order)
    that consumes it; later consumers (e.g. a tied LM head) read it but do not own it, so the graph's
    total equals ``sum(p.numel() * p.element_size() for p in model.parameters())``. Buffers (BatchNorm
    statistics, masks) are read but are not parameters.

Edges:
    producer -> consumer for every activation actually consumed, carrying the bytes the consumer
    reads from that producer (a view's size when it reads a slice; at most the producer's output).
    An in-place op (``relu_``) becomes the producer of the tensor it mutates for later readers.

Saved activations (``meta["saved_act_bytes_per_sample"]``, one float per layer in the order of
:func:`gpualloc.graph.layers.layer_of_node`; ``meta["saved_act_source"]`` says how):
    the bytes autograd saves for backward, per sample, measured by one train-mode forward pass and a
    cross-entropy loss of the real model on the CPU (:mod:`gpualloc.graph.activations`). A zoo model gets
    real zero-filled weights (the count depends on shapes only). The pass runs at a batch of at most 8 and
    at most 10 GFLOPs (at least one sample: ResNet-50, BERT-base and GPT-2 small run one) and is divided
    by it, so a part that does not grow with the batch (BatchNorm's statistics) counts in every sample.
    Models whose pass would exceed 400 GFLOPs or whose weights exceed 4 GiB, or that fail in train mode,
    are skipped with ``meta["saved_act_skipped"]`` saying why.

``granularity="layer"`` groups ops by ``layer`` (the deepest module in ``nn_module_stack``, e.g.
``layer1.0.conv1`` or ``encoder.layer.3.attention``); ops at the model's top level stay single.
Sizes are summed (so totals are preserved), edges between groups are merged (bytes from one producer
counted once per destination group), and intra-group edges are dropped. A group that would close a
cycle (ResNet's shared ``relu`` runs after ``bn1``, ``bn2`` and the residual add) is split: an op
joins its layer's latest group only if none of its inputs depends on that group through an op outside
it; otherwise it starts a new group ``<layer>#<k>``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import operator
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import FlopCounterMode

from gpualloc.errors import CaptureError
from gpualloc.graph.activations import SavedActivations, measure_saved_bytes
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, TiedWeight
from gpualloc.graph.zoo import get_model
from gpualloc.registry import import_user_module

__all__ = ["ExampleInputs", "Granularity", "capture"]

Granularity = Literal["op", "layer"]
ExampleInputs = Callable[[int], Sequence[torch.Tensor]] | Sequence[torch.Tensor]

# Layout-only ATen ops (by overload-packet name): they alias or re-lay out their first tensor argument.
_ALIAS_OPS = frozenset({
    "alias", "as_strided", "chunk", "contiguous", "detach", "expand", "expand_as", "flatten", "lift_fresh",
    "lift_fresh_copy", "movedim", "narrow", "permute", "reshape", "select", "slice", "split",
    "split_with_sizes", "squeeze", "swapaxes", "t", "transpose", "unbind", "unflatten", "unsqueeze",
    "view", "view_as", "_unsafe_view", "tensor_split",
})


@dataclass(frozen=True)
class _Ref:
    """Where a traced value comes from: an op node, a parameter, a buffer/constant, or a model input."""

    kind: Literal["op", "param", "buffer", "input"]
    key: str  # op node id, or parameter identity
    nbytes: int  # bytes of the value as seen by its consumer (a view's size)


@dataclass
class _Op:
    """A compute op while the graph is being built (mutable; frozen into an OpNode at the end)."""

    id: str
    kind: str
    layer: str | None
    module_type: str | None
    flops: float
    bytes_read: float
    output_bytes: float
    param_bytes: float
    output_shape: tuple[int, ...] | None
    in_bytes: dict[str, float]  # producer op id -> bytes read from it
    reads: dict[str, float] = field(default_factory=dict)  # parameter identity -> its bytes, every one it reads
    owns: list[str] = field(default_factory=list)  # the parameters it is the first reader of


# ------------------------------------------------------------------------------------------ loading
def _load_model(
    model: nn.Module | str, example_inputs: ExampleInputs | None = None
) -> tuple[nn.Module, Callable[[int], Sequence[torch.Tensor]] | Sequence[torch.Tensor], str, bool]:
    """Resolve ``model`` to (module, example inputs, default name, built_on_meta).

    ``model`` is an ``nn.Module``, a zoo name (see :data:`gpualloc.graph.zoo.ZOO`), or
    ``"package.module:factory"``: the module is imported and ``factory()`` called with no arguments;
    example inputs come from ``example_inputs`` or, failing that, the module's ``example_inputs(batch)``.
    """
    if isinstance(model, nn.Module):
        if example_inputs is None:
            raise CaptureError(f"cannot trace {type(model).__name__}: pass example_inputs (a tuple of tensors "
                               "or a function batch -> tuple)")
        return model, example_inputs, type(model).__name__, False
    if not isinstance(model, str):
        raise CaptureError(f"model must be an nn.Module, a zoo name or 'module:factory', got {type(model).__name__}")
    if ":" not in model:
        entry = get_model(model)
        if example_inputs is not None:  # the caller's tensors are real: so must the weights be
            return entry.factory(), example_inputs, model, False
        with torch.device("meta"):  # no weights allocated, no initialisation computed
            module = entry.factory()
        return module, entry.example_inputs, model, True
    module, own_inputs = build_from_factory(model)
    inputs = example_inputs if example_inputs is not None else own_inputs
    if inputs is None:
        raise CaptureError(no_example_inputs(model))
    return module, inputs, model, False


def no_example_inputs(model: str) -> str:
    """The one message for a factory whose model has no example inputs: it names the three ways to give them."""
    attr = model.rsplit(":", 1)[-1]
    return (f"{model!r}: no example inputs: give the module {attr}() returns an example_inputs(batch) method, "
            f"define example_inputs(batch) in {model.split(':')[0]!r}, or pass the input shapes "
            "(--input-shape 3,224,224, repeated per input; example_inputs= in Python)")


def build_from_factory(model: str) -> tuple[nn.Module, Callable[[int], Sequence[torch.Tensor]] | None]:
    """Import ``"package.module:factory"``, call ``factory()``, and return the module with its example inputs:
    the returned module's own ``example_inputs(batch)`` method, else the package module's ``example_inputs``
    function, else None. The one factory protocol of capture and run.
    """
    mod, attr = import_user_module(model, CaptureError)  # the current folder is on the import path
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise CaptureError(f"{model!r}: module {mod.__name__!r} has no callable {attr!r}")
    try:
        module = factory()
    except Exception as err:  # noqa: BLE001
        raise CaptureError(f"{model!r}: {attr}() failed: {_one_line(err)}") from err
    if not isinstance(module, nn.Module):
        raise CaptureError(f"{model!r}: {attr}() returned {type(module).__name__}, not an nn.Module")
    own = getattr(module, "example_inputs", None)  # a method of the model (nn.Module has none of its own)
    if callable(own):
        return module, own
    make = getattr(mod, "example_inputs", None)
    return module, make if callable(make) else None


_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64, "int64": torch.int64,
           "long": torch.int64, "int32": torch.int32, "int": torch.int32, "bool": torch.bool}


def shaped_inputs(shapes: Sequence[str | Sequence[int]], dtypes: Sequence[str] = ()
                  ) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """Example inputs from shapes without the batch (``"3,224,224"`` or ``(3, 224, 224)``): ``batch -> tuple``
    of one tensor per shape, the batch prepended; floating dtypes hold ``randn`` values, integer ones zeros
    (valid token ids for any vocabulary), bool ``False``.

    Args:
        shapes: one shape per positional input of ``forward``.
        dtypes: one dtype name per shape (``float32``, ``bfloat16``, ``int64``, ...), or one for all;
            default ``float32``.

    Raises:
        CaptureError: a malformed shape, an unknown dtype, a count mismatch, or inputs of more than
            ``limits.MAX_INPUT_ELEMENTS`` elements (one line).
    """
    from gpualloc.limits import MAX_INPUT_ELEMENTS

    if not shapes:
        raise CaptureError("input shape: give at least one (e.g. 3,224,224)")
    parsed = [_parse_shape(s) for s in shapes]
    names = list(dtypes) or ["float32"]
    if len(names) == 1:
        names *= len(parsed)
    if len(names) != len(parsed):
        raise CaptureError(f"input dtype: give one per input shape ({len(parsed)}) or one for all, got {len(names)}")
    unknown = [n for n in names if n.strip().lower() not in _DTYPES]
    if unknown:
        raise CaptureError(f"input dtype: unknown {unknown[0]!r}; expected one of {', '.join(_DTYPES)}")
    kinds = [_DTYPES[n.strip().lower()] for n in names]

    def make(batch: int) -> tuple[torch.Tensor, ...]:
        total = sum(batch * math.prod(shape) for shape in parsed)
        if total > MAX_INPUT_ELEMENTS:
            raise CaptureError(f"input shape: {total:,} elements at batch {batch} (at most {MAX_INPUT_ELEMENTS:,})")
        return tuple(torch.randn(batch, *shape, dtype=kind) if kind.is_floating_point
                     else torch.zeros(batch, *shape, dtype=kind) for shape, kind in zip(parsed, kinds, strict=True))

    return make


def _parse_shape(shape: str | Sequence[int]) -> tuple[int, ...]:
    from gpualloc.limits import MAX_INPUT_ELEMENTS

    try:
        if isinstance(shape, str):
            dims = tuple(int(d) for d in shape.replace("x", ",").split(","))
        else:
            dims = tuple(operator.index(d) for d in shape)
    except (TypeError, ValueError):
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise CaptureError(f"input shape: expected positive integers separated by commas, without the batch "
                           f"(e.g. 3,224,224), got {shape!r}")
    if math.prod(dims) > MAX_INPUT_ELEMENTS:
        raise CaptureError(f"input shape {shape!r}: {math.prod(dims):,} elements per sample (at most "
                           f"{MAX_INPUT_ELEMENTS:,})")
    return dims


# ------------------------------------------------------------------------------------------ capture
def capture(
    model: nn.Module | str,
    *,
    batch: int = 1,
    granularity: Granularity = "op",
    example_inputs: ExampleInputs | None = None,
    name: str | None = None,
    saved_activations: bool | None = None,
) -> OpGraph:
    """Trace ``model`` for one forward pass of ``batch`` samples into an OpGraph.

    Args:
        model: an ``nn.Module`` (needs ``example_inputs``), a zoo name such as ``"resnet50"``, or
            ``"package.module:factory"``.
        batch: batch size passed to ``example_inputs``; recorded as the graph's ``batch_size``.
        granularity: ``"op"`` (one node per ATen op) or ``"layer"`` (ops grouped by module).
        example_inputs: ``batch -> tuple of tensors``, or a tuple of tensors used as given.
        name: graph name (default: the zoo name, the ``module:factory`` string or the class name).
        saved_activations: measure the bytes autograd saves for backward on the CPU into
            ``meta["saved_act_bytes_per_sample"]`` (see the module docstring): None when it is quick (a
            skipped or failed measurement says why in ``meta["saved_act_skipped"]``), True past the time
            limits (a failure raises CaptureError), False never.

    Raises:
        CaptureError: unknown model, missing example inputs, or a model torch cannot trace (one line).
    """
    if granularity not in ("op", "layer"):
        raise CaptureError(f"granularity must be 'op' or 'layer', got {granularity!r}")
    if int(batch) != batch or batch < 1:
        raise CaptureError(f"batch must be a positive integer, got {batch!r}")
    module, inputs, default_name, on_meta = _load_model(model, example_inputs)
    name = name or default_name
    args = _example_args(inputs, batch, name, on_meta)

    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            exported, source = _export(module, args, name)
        ops, uncounted = _build_ops(exported)
    finally:
        for m, training in modes:
            m.training = training

    if not ops:
        raise CaptureError(f"cannot trace {name}: no operators between its inputs and its output "
                           "(does forward return a tensor computed from its inputs?)")
    graph_ops = ops if granularity == "op" else _coarsen_by_layer(ops)
    nodes = [
        OpNode(id=o.id, name=(o.layer or o.id) if granularity == "layer" else _op_name(o), kind=o.kind,
               flops=o.flops, bytes_read=o.bytes_read, bytes_written=o.output_bytes, param_bytes=o.param_bytes,
               output_bytes=o.output_bytes, layer=o.layer, output_shape=o.output_shape)
        for o in graph_ops
    ]
    edges = [OpEdge(src, o.id, b) for o in graph_ops for src, b in o.in_bytes.items()]
    meta: dict[str, Any] = {"source": source, "model": name, "granularity": granularity,
                            "param_tensors": [len(o.owns) for o in graph_ops]}
    if uncounted:
        meta["flops_unknown_ops"] = uncounted  # ops that could not run on meta tensors: counted as 0
    tied = _tied_weights(graph_ops)
    graph = OpGraph(name, nodes, edges, batch_size=int(batch), meta=meta, tied=tied)
    if saved_activations is False:
        return graph
    zoo_name = model if isinstance(model, str) and ":" not in model and example_inputs is None else None
    meta.update(_record_saved_activations(graph, module, inputs, on_meta, force=bool(saved_activations),
                                          zoo_name=zoo_name))
    return OpGraph(name, nodes, edges, batch_size=int(batch), meta=meta, tied=tied)


def _tied_weights(graph_ops: list[_Op]) -> list[TiedWeight]:
    """The parameters more than one node reads (a tied embedding), each with its owner (its first reader)
    first, then its other readers in graph order."""
    owner = {k: o.id for o in graph_ops for k in o.owns}
    readers: dict[str, list[str]] = {}
    nbytes: dict[str, float] = {}
    for o in graph_ops:
        for k, b in o.reads.items():
            readers.setdefault(k, []).append(o.id)
            nbytes[k] = b
    return [TiedWeight(k, float(nbytes[k]), (owner[k], *(r for r in rs if r != owner[k])))
            for k, rs in readers.items() if len(rs) > 1]


# Measured saved activations: the forward pass runs at the largest batch (at most the graph's, and at most
# _SAVED_ACT_BATCH) whose FLOPs stay under _SAVED_ACT_FLOPS, at least one sample (ResNet-50: 1 sample, about
# 1 s on 2 cores); a model whose pass exceeds _SAVED_ACT_MAX_FLOPS, or whose weights exceed
# _SAVED_ACT_MAX_PARAM_BYTES, is skipped.
_SAVED_ACT_BATCH = 8
_SAVED_ACT_FLOPS = 10e9
_SAVED_ACT_MAX_FLOPS = 4e11
_SAVED_ACT_MAX_PARAM_BYTES = 4 * 2**30
_PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_ZOO_SAVED: dict[tuple[str, int], SavedActivations] = {}  # (zoo name, batch): a zoo model is measured once


def _record_saved_activations(graph: OpGraph, module: nn.Module, inputs: Any, on_meta: bool, force: bool,
                              zoo_name: str | None = None) -> dict[str, Any]:
    """The meta keys of the activations autograd saves (:func:`gpualloc.graph.activations.measure_saved_bytes`).

    ``saved_act_bytes_per_sample``: per layer (the order of ``layer_of_node``), bytes per sample measured at
    the batch of ``saved_act_source`` (fp32 and the CPU's kernels for a zoo model);
    ``saved_act_unscaled_bytes_per_sample``, the part of them a lower precision keeps at these bytes, and
    ``saved_act_mask_bytes_per_sample``, the dropout masks' (see :mod:`gpualloc.graph.activations`); a zoo model
    built on the
    meta device gets real, zero-filled weights (the count depends on shapes, not values). Or, when the
    measurement is skipped or fails (and ``force`` is False), ``saved_act_skipped``: why. A zoo model's
    measurement is kept for the process (captures at both granularities, or several batches, share it).
    """
    batch = int(graph.batch_size or 1)
    sample_flops = graph.total_flops / batch
    m = batch
    if callable(inputs):
        m = max(1, min(batch, _SAVED_ACT_BATCH, int(_SAVED_ACT_FLOPS // sample_flops) if sample_flops else batch))
    tensors = [*module.parameters(), *module.buffers()]
    reason = None
    if any(t.device.type != ("meta" if on_meta else "cpu") for t in tensors):
        reason = "the model is not on the CPU"
    elif not force and m * sample_flops > _SAVED_ACT_MAX_FLOPS:
        reason = f"a forward pass of {m} samples is {m * sample_flops:.3g} FLOPs, over {_SAVED_ACT_MAX_FLOPS:.3g}"
    elif not force and sum(t.numel() * t.element_size() for t in tensors) > _SAVED_ACT_MAX_PARAM_BYTES:
        reason = f"its weights exceed {_SAVED_ACT_MAX_PARAM_BYTES / 2**30:g} GiB"
    if reason is not None:
        if force:
            raise CaptureError(f"cannot measure saved activations of {graph.name}: {reason}")
        return {"saved_act_skipped": reason}
    saved = _ZOO_SAVED.get((zoo_name, m)) if zoo_name else None
    if saved is None:
        if on_meta:
            module = module.to_empty(device="cpu")
            with torch.no_grad():
                for t in (*module.parameters(), *module.buffers()):
                    t.zero_()
        try:
            with torch.random.fork_rng(devices=[]):
                args = _example_args(inputs, m, graph.name, on_meta=False)
            if any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in tree_flatten(args)[0]):
                raise CaptureError("saved activations: the example inputs are not on the CPU")
            saved = measure_saved_bytes(module, args, batch=m)
        except CaptureError as err:
            if force:
                raise
            return {"saved_act_skipped": str(err)}
        if zoo_name:
            _ZOO_SAVED[zoo_name, m] = saved
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    return {
        "saved_act_bytes_per_sample": [float(x) for x in saved.per_sample(graph)],
        "saved_act_unscaled_bytes_per_sample": [float(x) for x in saved.per_sample(graph, only="unscaled")],
        "saved_act_mask_bytes_per_sample": [float(x) for x in saved.per_sample(graph, only="masks")],
        "saved_act_source": {
            "method": "torch.autograd.graph.saved_tensors_hooks: one train-mode forward pass and "
                      "cross-entropy loss on the CPU, storages counted once, weights excluded",
            "torch": torch.__version__, "device": "cpu", "batch": m, "precision": _PRECISION.get(dtype, str(dtype)),
            "loss_bytes_per_sample": saved.loss_nbytes / m,
        },
    }


def _op_name(op: _Op) -> str:
    return f"{op.layer}/{op.id}" if op.layer else op.id


def _example_args(inputs: Any, batch: int, name: str, on_meta: bool) -> tuple[Any, ...]:
    try:
        if callable(inputs):
            if on_meta:
                with torch.device("meta"):
                    args = inputs(batch)
            else:
                args = inputs(batch)
        else:
            args = inputs
    except Exception as err:  # noqa: BLE001
        raise CaptureError(f"cannot trace {name}: example_inputs({batch}) failed: {_one_line(err)}") from err
    if isinstance(args, torch.Tensor):
        return (args,)
    if not isinstance(args, (tuple, list)):
        raise CaptureError(f"cannot trace {name}: example_inputs must give a tuple of tensors, "
                           f"got {type(args).__name__}")
    return tuple(args)


def _export(module: nn.Module, args: tuple[Any, ...], name: str) -> tuple[torch.export.ExportedProgram, str]:
    """``torch.export.export``; on failure, export the ``torch.fx.symbolic_trace`` of the module."""
    with _quiet_torch_logs():
        try:
            return torch.export.export(module, args, strict=False), "torch.export"
        except Exception as export_err:  # noqa: BLE001 - every tracing failure becomes one CaptureError line
            try:
                traced = torch.fx.symbolic_trace(module)
                return torch.export.export(traced, args, strict=False), "torch.fx+torch.export"
            except Exception:  # noqa: BLE001 - the export error is the informative one
                raise CaptureError(f"cannot trace {name}: {_one_line(export_err)}") from export_err


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Hold back what a failing trace dumps (warnings, a partial graph printed to stderr): the
    CaptureError says it in one line. On success, whatever was printed is passed on."""
    # Every torch logger, not a fixed list: a failing export logs hundreds of ERROR lines from
    # torch._subclasses, torch._dynamo, ... through handlers bound to the real stderr.
    names = {"torch", *_NOISY_LOGGERS, *(n for n in logging.root.manager.loggerDict if n.startswith("torch."))}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        raise
    else:
        sys.stderr.write(held.getvalue())
    finally:
        for lg, level in zip(loggers, levels, strict=False):
            lg.setLevel(level)


_NOISY_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export")
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(.+)')


def _one_line(err: BaseException) -> str:
    """``Type: first line of the message`` plus, when torch names it, the user code that failed."""
    message = str(err)
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    if len(text) > 200:
        text = text[:197] + "..."
    frames = _USER_FRAME.findall(message)
    if frames:
        path, line, code = frames[-1]
        text += f" (at {path}:{line}: {code.strip()[:80]})"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# ------------------------------------------------------------------------------------------ graph building
def _tensor_bytes(value: Any) -> int:
    leaves, _ = tree_flatten(value)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _first_shape(value: Any) -> tuple[int, ...] | None:
    leaves, _ = tree_flatten(value)
    for t in leaves:
        if isinstance(t, torch.Tensor):
            return tuple(int(s) for s in t.shape)
    return None


def _packet_name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


def _is_alias(node: torch.fx.Node) -> bool:
    if node.target is operator.getitem:
        return True
    op = _packet_name(node.target)
    if op in _ALIAS_OPS:
        return True
    # eval-mode dropout is the identity
    return op in ("dropout", "feature_dropout", "alpha_dropout") and len(node.args) > 2 and node.args[2] is False


def _deepest_module(node: torch.fx.Node) -> tuple[str | None, str | None]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None, None
    path, mod_type = list(stack.values())[-1]
    path = str(path)
    if not path:  # the root module itself
        return None, None
    type_name = mod_type.__name__ if isinstance(mod_type, type) else str(mod_type).rsplit(".", 1)[-1]
    return path, type_name


class _FlopCounter:
    """FLOPs of one ATen call on ``meta`` tensors of the traced shapes, cached by call signature."""

    def __init__(self) -> None:
        self.cache: dict[Any, int] = {}
        self.failed: set[str] = set()

    def __call__(self, node: torch.fx.Node) -> int:
        def to_meta(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                a = a.meta.get("val")
            if isinstance(a, torch.Tensor):
                return torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="meta")
            if isinstance(a, torch.device):
                return torch.device("meta")
            return a

        def signature(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return ("T", tuple(a.shape), tuple(a.stride()), a.dtype)
            return a if isinstance(a, (int, float, bool, str, type(None), torch.dtype, torch.device)) else repr(a)

        args, kwargs = tree_map(to_meta, (node.args, node.kwargs))
        try:
            flat, _ = tree_flatten((args, kwargs))
            key = (node.target, tuple(signature(a) for a in flat))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self.cache:
            return self.cache[key]
        counter = FlopCounterMode(display=False)
        try:
            with counter:
                node.target(*args, **kwargs)
            flops = int(counter.get_total_flops())
        except Exception:  # noqa: BLE001 - an op without a meta kernel: FLOPs unknown, recorded below
            self.failed.add(_packet_name(node.target))
            flops = 0
        if key is not None:
            self.cache[key] = flops
        return flops


def _param_identity(ep: torch.export.ExportedProgram, param_fqn: dict[str, str]) -> dict[str, str]:
    """Map each parameter name to one canonical name per tensor (tied parameters are lifted once per name)."""
    state = ep.state_dict
    identity: dict[str, str] = {}
    seen_tensors: dict[int, str] = {}
    for fqn in param_fqn.values():
        tensor = state.get(fqn)
        identity[fqn] = fqn if tensor is None else seen_tensors.setdefault(id(tensor), fqn)
    return identity


def _input_ref(node: torch.fx.Node, param_fqn: dict[str, str], buffer_fqn: dict[str, str],
               identity: dict[str, str]) -> _Ref:
    """The reference of a ``placeholder`` or ``get_attr`` node: a parameter, a buffer/constant or a model input."""
    nbytes = _tensor_bytes(node.meta.get("val"))
    if node.op == "get_attr":
        return _Ref("buffer", str(node.target), nbytes)
    if node.name in param_fqn:
        return _Ref("param", identity[param_fqn[node.name]], nbytes)
    if node.name in buffer_fqn:
        return _Ref("buffer", buffer_fqn[node.name], nbytes)
    return _Ref("input", node.name, nbytes)


def _alias_ref(node: torch.fx.Node, refs: dict[str, _Ref]) -> _Ref | None:
    """The reference a layout-only node aliases (its base, with the view's size), or None without a base."""
    base = next((r for r in (refs.get(a.name) for a in node.all_input_nodes) if isinstance(r, _Ref)), None)
    if base is None:
        return None
    val = node.meta.get("val")
    if node.target is operator.getitem and base.kind == "op":
        nbytes = _tensor_bytes(val)  # one element of a multi-output op
    else:
        nbytes = min(_tensor_bytes(val), base.nbytes) if isinstance(val, torch.Tensor) else base.nbytes
    return _Ref(base.kind, base.key, nbytes)


def _build_ops(ep: torch.export.ExportedProgram) -> tuple[list[_Op], list[str]]:
    """Compute ops of an exported program, in execution order, and the op kinds whose FLOPs are unknown."""
    sig = ep.graph_signature
    param_fqn = dict(sig.inputs_to_parameters)
    buffer_fqn = {**sig.inputs_to_buffers, **getattr(sig, "inputs_to_lifted_tensor_constants", {})}
    identity = _param_identity(ep, param_fqn)
    state = ep.state_dict

    refs: dict[str, _Ref] = {}  # fx node name -> where its value comes from
    ops: list[_Op] = []
    op_by_id: dict[str, _Op] = {}
    owned: set[str] = set()
    flop_counter = _FlopCounter()

    for node in ep.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            refs[node.name] = _input_ref(node, param_fqn, buffer_fqn, identity)
            continue
        if node.op != "call_function":
            continue
        if _is_alias(node):
            alias = _alias_ref(node, refs)
            if alias is not None:
                refs[node.name] = alias
            continue
        val = node.meta.get("val")
        out_bytes = _tensor_bytes(val)
        if out_bytes == 0 and _first_shape(val) is None:
            continue  # assertions, symbolic-size helpers: no tensor produced
        layer, module_type = _deepest_module(node)
        op = _Op(id=node.name, kind=_packet_name(node.target).strip("_") or "op", layer=layer,
                 module_type=module_type, flops=float(flop_counter(node)), bytes_read=0.0,
                 output_bytes=float(out_bytes), param_bytes=0.0, output_shape=_first_shape(val), in_bytes={})
        for ref in _consumed_refs(node, refs):
            op.bytes_read += ref.nbytes
            if ref.kind == "op":
                producer = op_by_id[ref.key]
                op.in_bytes[ref.key] = min(op.in_bytes.get(ref.key, 0.0) + ref.nbytes, producer.output_bytes)
            elif ref.kind == "param":
                nbytes = _tensor_bytes(state.get(ref.key)) if ref.key in state else ref.nbytes
                op.reads.setdefault(ref.key, nbytes)
                if ref.key not in owned:
                    owned.add(ref.key)
                    op.owns.append(ref.key)
                    op.param_bytes += nbytes
        refs[node.name] = _Ref("op", op.id, out_bytes)
        mutated = node.args[0] if node.args else None
        if _packet_name(node.target).endswith("_") and isinstance(mutated, torch.fx.Node) and mutated.name in refs:
            # an in-place op: later readers of the mutated tensor depend on it
            refs[mutated.name] = _Ref("op", op.id, refs[mutated.name].nbytes)
        ops.append(op)
        op_by_id[op.id] = op

    return ops, sorted(flop_counter.failed)


def _consumed_refs(node: torch.fx.Node, refs: dict[str, Any]) -> Iterable[_Ref]:
    """The traced values a node reads, one per tensor argument occurrence (a tensor used twice counts twice)."""
    flat, _ = tree_flatten((node.args, node.kwargs))
    for a in flat:
        if isinstance(a, torch.fx.Node):
            ref = refs.get(a.name)
            if isinstance(ref, _Ref):
                yield ref


# ------------------------------------------------------------------------------------------ coarsening
def _group_ops(ops: list[_Op]) -> tuple[list[list[_Op]], list[str | None], dict[str, int]]:
    """Assign ops (in execution order) to acyclic layer groups.

    Returns the groups, each group's layer (None for an op outside any layer) and op id -> group index.
    """
    group_of: dict[str, int] = {}  # op id -> group index
    groups: list[list[_Op]] = []
    group_label: list[str | None] = []
    latest: dict[str, int] = {}  # layer -> its most recent group
    # ancestors[g] as an int bitset over groups: every group g (transitively) depends on, and g itself
    anc_of_op: dict[str, int] = {}
    for op in ops:
        preds = [group_of[p] for p in op.in_bytes]
        pred_anc = [anc_of_op[p] for p in op.in_bytes]
        target = latest.get(op.layer) if op.layer is not None else None
        if target is not None:
            bit = 1 << target
            # Joining ``target`` closes a cycle iff some input outside it already depends on it.
            if any(g != target and a & bit for g, a in zip(preds, pred_anc, strict=False)):
                target = None
        if target is None:
            target = len(groups)
            groups.append([])
            group_label.append(op.layer)
            if op.layer is not None:
                latest[op.layer] = target
        groups[target].append(op)
        group_of[op.id] = target
        anc = 1 << target
        for a in pred_anc:
            anc |= a
        anc_of_op[op.id] = anc
    return groups, group_label, group_of


def _group_ids(groups: list[list[_Op]], group_label: list[str | None]) -> list[str]:
    """Ids: the layer path, ``<layer>#k`` for its later groups; ungrouped ops keep their op id."""
    taken = {op.id for g, label in zip(groups, group_label, strict=False) if label is None for op in g}
    ids: list[str] = []
    count: dict[str, int] = {}
    for g, label in zip(groups, group_label, strict=False):
        if label is None:
            ids.append(g[0].id)
            continue
        k = count.get(label, 0)
        count[label] = k + 1
        gid = label if k == 0 else f"{label}#{k}"
        while gid in taken:
            gid += "~"
        taken.add(gid)
        ids.append(gid)
    return ids


def _merge_group(gi: int, g: list[_Op], label: str | None, ids: list[str], group_of: dict[str, int]) -> _Op:
    """One op for group ``gi``: sizes summed, inputs from other groups merged by producer group."""
    # bytes from one producer op count once per destination group (the largest read of it)
    from_producer: dict[str, float] = {}
    for op in g:
        for src, b in op.in_bytes.items():
            if group_of[src] != gi:
                from_producer[src] = max(from_producer.get(src, 0.0), b)
    in_bytes: dict[str, float] = {}
    for src, b in from_producer.items():
        sid = ids[group_of[src]]
        in_bytes[sid] = in_bytes.get(sid, 0.0) + b
    kind = g[0].kind if len(g) == 1 else (g[0].module_type or "layer").lower()
    return _Op(
        id=ids[gi], kind=kind, layer=label, module_type=g[0].module_type,
        flops=sum(op.flops for op in g), bytes_read=sum(op.bytes_read for op in g),
        output_bytes=sum(op.output_bytes for op in g), param_bytes=sum(op.param_bytes for op in g),
        output_shape=g[-1].output_shape, in_bytes=in_bytes,
        reads={k: b for op in g for k, b in op.reads.items()}, owns=[k for op in g for k in op.owns],
    )


def _coarsen_by_layer(ops: list[_Op]) -> list[_Op]:
    """Group ops (in execution order) by ``layer`` without creating cycles; see the module docstring."""
    groups, group_label, group_of = _group_ops(ops)
    if all(len(g) == 1 for g in groups) and all(label is None for label in group_label):
        return list(ops)
    ids = _group_ids(groups, group_label)
    return [_merge_group(gi, g, label, ids, group_of)
            for gi, (g, label) in enumerate(zip(groups, group_label, strict=False))]

