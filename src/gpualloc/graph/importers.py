"""Published profile formats -> OpGraph.

PipeDream profiles (msr-fiddle/pipedream, ``profiler/*/profiles/<model>/graph.txt``, MIT) list one
layer per line (one line in the file, wrapped here), then the edges::

    node4 -- Conv2d(64, 64, kernel_size=(3, 3), ...) -- forward_compute_time=1.2, backward_compute_time=2.5,
        activation_size=51380224.0, parameter_size=147456.000
    \tnode3 -- node4

Times are milliseconds for one minibatch; sizes are bytes (fp32). Multi-output layers (LSTMs,
GNMT's ``RecurrentAttention``) give ``activation_size=[a; b; c]``. The profiles record neither the
GPU (treat it as V100-class) nor the batch size, and the batch is *not* 128 in every file
(alexnet 256, resnet50 64, nasnetalarge 16, gnmt 32, ...), so :func:`import_pipedream` infers it
from the layers whose shapes pin it down (see :func:`_infer_batch_size`).

FLOPs are derived from the layer strings (multiply-add = 2, for the whole profiled batch), with
``output elements = activation bytes / 4``:

- exact: ``Conv1d/2d/3d`` (``2 * out * in/groups * prod(kernel)`` + ``out`` with bias), ``Linear`` and
  GNMT's ``Classifier`` (``2 * out * in_features`` + ``out`` with bias), pooling with a known kernel
  (``out * prod(kernel)``: comparisons or adds).
- approximate: ``LSTM`` (matmuls exact given the token count; gate nonlinearities count 1 FLOP per
  element, see :data:`LSTM_POINTWISE_PER_HIDDEN`); the token count is ``output elements /
  (hidden * directions)``. ``EmuBidirLSTM`` (its ``layer1``/``layer2`` LSTMs; ``bidir`` shares their
  weights and is not run in training). ``RecurrentAttention`` (its LSTM, ``linear_q``, ``linear_k``
  and Bahdanau scoring, source length taken from its score output; see :func:`_recurrent_attention`).
- per element: the kinds in :data:`PER_ELEMENT_FLOPS` (``BatchNorm`` counts 4: mean, variance,
  normalise, affine, as in training).
- zero: data movement and bookkeeping (:data:`ZERO_FLOP_KINDS`: inputs, ``Embedding`` lookups,
  ``Concat``, ``View``, ``Size``, ``__getitem__``) and kinds we do not know (listed in
  ``meta["flops_unknown_kinds"]``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpualloc.errors import ImportFormatError, read_text
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, OpTiming
from gpualloc.graph.sailor import import_sailor
from gpualloc.limits import MAX_BATCH

__all__ = [
    "IMPORTERS",
    "PIPEDREAM_LICENSE",
    "PER_ELEMENT_FLOPS",
    "ZERO_FLOP_KINDS",
    "import_pipedream",
]

PIPEDREAM_LICENSE = "MIT, msr-fiddle/pipedream"
FP32_BYTES = 4
DEFAULT_BATCH_SIZE = 128

#: FLOPs per output element for element-wise kinds (``add`` counts one per extra input).
PER_ELEMENT_FLOPS: dict[str, float] = {
    "relu": 1.0,
    "relu6": 1.0,
    "leakyrelu": 1.0,
    "sigmoid": 1.0,
    "tanh": 1.0,
    "dropout": 1.0,  # multiply by the scaled mask
    "mul": 1.0,
    "batchnorm1d": 4.0,  # training mode: mean, variance, normalise, scale-and-shift
    "batchnorm2d": 4.0,
    "batchnorm3d": 4.0,
    "layernorm": 5.0,
    "softmax": 5.0,  # max, subtract, exp, sum, divide
    "logsoftmax": 5.0,
}

#: Kinds that move or relabel data without arithmetic.
ZERO_FLOP_KINDS = frozenset(
    {"input", "hidden", "embedding", "concat", "view", "size", "getitem", "flatten", "reshape",
     "transpose", "permute", "contiguous", "identity"}
)

#: Point-wise FLOPs per hidden unit per token of one LSTM direction: 4 gate activations,
#: ``c = f*c + i*g`` (3), ``tanh(c)`` (1), ``h = o*tanh(c)`` (1).
LSTM_POINTWISE_PER_HIDDEN = 9

_NODE_RE = re.compile(r"^(?P<id>\S+) -- (?P<layer>.*?) -- (?P<fields>forward_compute_time=.*)$")
_FIELDS_RE = re.compile(
    r"^forward_compute_time=(?P<fwd>[^,]*), backward_compute_time=(?P<bwd>[^,]*), "
    r"activation_size=(?P<act>\[[^\]]*\]|\([^)]*\)|[^,]*), parameter_size=(?P<param>[^,]*)$"
)
_EDGE_RE = re.compile(r"^\s+(?P<src>\S+) -- (?P<dst>\S+)\s*$")
_KIND_RE = re.compile(r"^(?P<cls>[A-Za-z_][A-Za-z0-9_]*)")
_NUMBER_RE = re.compile(r"^[+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class _Row:
    """One parsed node line, before FLOPs are derived."""

    lineno: int
    id: str
    layer: str
    kind: str
    fwd_ms: float
    bwd_ms: float
    activations: tuple[float, ...]
    param_bytes: float

    @property
    def out_bytes(self) -> float:
        return float(sum(self.activations))

    @property
    def out_elems(self) -> float:
        return self.out_bytes / FP32_BYTES


class _LayerArgError(ValueError):
    """A layer string's arguments could not be understood."""


# ---------------------------------------------------------------------------------------- public API


def import_pipedream(
    path: str | Path,
    *,
    device: str = "V100-16GB",
    batch_size: int | None = None,
    name: str | None = None,
) -> OpGraph:
    """Read a PipeDream per-layer profile (``graph.txt``) into an :class:`OpGraph`.

    Args:
        path: the profile.
        device: device-type name the measured times are filed under (kept as given).
        batch_size: minibatch the profile was measured at; ``None`` infers it from layers whose
            shapes fix it (LSTM hidden states, ``Linear`` outputs) and falls back to 128.
        name: graph name; defaults to the file's stem.

    Returns:
        The graph: one node per layer (``id`` and ``layer`` = ``nodeN``), edges carrying the
        producer's activation bytes, FLOPs derived from the layer strings.

    Raises:
        ImportFormatError: unreadable file, malformed line or number, unknown or duplicate node,
            self loop or cycle, no nodes. The message is one line naming ``file:line``.
    """
    path = Path(path)
    text = read_text(path, ImportFormatError)

    rows, edges = _parse_lines(path, text)
    preds: dict[str, list[str]] = {r.id: [] for r in rows}
    for src, dst, _ in edges:
        preds[dst].append(src)
    by_id = {r.id: r for r in rows}
    if batch_size is None:
        batch_size = _infer_batch_size(rows) or DEFAULT_BATCH_SIZE
    elif int(batch_size) != batch_size or not 1 <= batch_size <= MAX_BATCH:
        raise ImportFormatError(f"{path}: batch_size must be a positive integer <= {MAX_BATCH:,}, "
                                f"got {batch_size!r}")

    unknown: set[str] = set()
    nodes = []
    for r in rows:
        in_bytes = sum(by_id[p].out_bytes for p in preds[r.id])
        try:
            flops = _flops(r, in_bytes / FP32_BYTES, len(preds[r.id]), unknown)
        except (_LayerArgError, ValueError, OverflowError, ZeroDivisionError) as err:
            raise ImportFormatError(f"{path}:{r.lineno}: cannot derive FLOPs of {r.layer!r}: {err}") from err
        if not math.isfinite(flops) or flops < 0:
            raise ImportFormatError(f"{path}:{r.lineno}: derived FLOPs of {r.layer!r} are {flops!r}")
        nodes.append(
            OpNode(
                id=r.id,
                name=r.layer,
                kind=r.kind,
                flops=float(flops),
                bytes_read=float(in_bytes + r.param_bytes),
                bytes_written=r.out_bytes,
                param_bytes=r.param_bytes,
                output_bytes=r.out_bytes,
                time_ms={device: OpTiming(r.fwd_ms, r.bwd_ms)},
                layer=r.id,
            )
        )
    meta = {
        "source": "pipedream",
        "file": path.name,
        "license": PIPEDREAM_LICENSE,
        "measured_on": device,
        "flops": "derived from layer strings",
    }
    if unknown:
        meta["flops_unknown_kinds"] = sorted(unknown)
    return OpGraph(
        name or path.stem,
        nodes,
        [OpEdge(src, dst, by_id[src].out_bytes) for src, dst, _ in edges],
        batch_size=int(batch_size),
        meta=meta,
    )


#: Name -> reader of a foreign format.
IMPORTERS: dict[str, Callable[..., OpGraph]] = {
    "pipedream": import_pipedream,
    "sailor": import_sailor,  # a folder, not a file: see gpualloc.graph.sailor
}


# ---------------------------------------------------------------------------------------- parsing


def _parse_edge(where: str, lineno: int, line: str, edge_seen: dict[tuple[str, str], int]) -> tuple[str, str, int]:
    """One indented edge line ``<TAB>nodeA -- nodeB``; ``edge_seen`` (edge -> first line) is updated."""
    m = _EDGE_RE.match(line)
    if m is None:
        raise ImportFormatError(f"{where}: malformed edge line, expected '<TAB>nodeA -- nodeB'")
    key = (m["src"], m["dst"])
    if key[0] == key[1]:
        raise ImportFormatError(f"{where}: edge {key[0]} -- {key[1]} is a self loop")
    if key in edge_seen:
        raise ImportFormatError(
            f"{where}: duplicate edge {key[0]} -- {key[1]} (first at line {edge_seen[key]})"
        )
    edge_seen[key] = lineno
    return key[0], key[1], lineno


def _parse_activations(act_text: str, where: str) -> tuple[float, ...]:
    """``activation_size``: one number, or a ``[a; b; c]`` list for a multi-output layer."""
    if act_text[:1] not in "[(":
        return (_number(act_text, "activation_size", where),)
    parts = [p for p in re.split(r"[;,]", act_text[1:-1]) if p.strip()]
    if not parts:
        raise ImportFormatError(f"{where}: activation_size {act_text!r} is an empty list")
    return tuple(_number(p, "activation_size", where) for p in parts)


def _parse_node(where: str, lineno: int, line: str, seen: dict[str, int]) -> _Row:
    """One node line ``nodeN -- Layer(...) -- fields``; ``seen`` (node id -> first line) is checked, not updated."""
    m = _NODE_RE.match(line)
    if m is None:
        raise ImportFormatError(
            f"{where}: malformed node line, expected 'nodeN -- Layer(...) -- forward_compute_time=...'"
        )
    node_id, layer = m["id"], m["layer"].strip()
    if node_id in seen:
        raise ImportFormatError(f"{where}: duplicate node {node_id!r} (first at line {seen[node_id]})")
    k = _KIND_RE.match(layer)
    if k is None:
        raise ImportFormatError(f"{where}: layer {layer!r} does not start with a class name")
    f = _FIELDS_RE.match(m["fields"])
    if f is None:
        raise ImportFormatError(
            f"{where}: malformed fields, expected 'forward_compute_time=MS, backward_compute_time=MS, "
            "activation_size=BYTES, parameter_size=BYTES'"
        )
    activations = _parse_activations(f["act"].strip(), where)
    return _Row(
        lineno=lineno,
        id=node_id,
        layer=layer,
        kind=_kind(k["cls"]),
        fwd_ms=_number(f["fwd"], "forward_compute_time", where),
        bwd_ms=_number(f["bwd"], "backward_compute_time", where),
        activations=activations,
        param_bytes=_number(f["param"], "parameter_size", where),
    )


def _parse_lines(path: Path, text: str) -> tuple[list[_Row], list[tuple[str, str, int]]]:
    rows: list[_Row] = []
    seen: dict[str, int] = {}
    edges: list[tuple[str, str, int]] = []
    edge_seen: dict[tuple[str, str], int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        if line[0].isspace():
            edges.append(_parse_edge(where, lineno, line, edge_seen))
            continue
        row = _parse_node(where, lineno, line, seen)
        seen[row.id] = lineno
        rows.append(row)
    if not rows:
        raise ImportFormatError(f"{path}: no node lines (expected 'nodeN -- Layer(...) -- forward_compute_time=...')")
    for src, dst, lineno in edges:
        for end in (src, dst):
            if end not in seen:
                raise ImportFormatError(f"{path}:{lineno}: edge {src} -- {dst} names unknown node {end!r}")
    _check_acyclic(path, [r.id for r in rows], edges)
    return rows, edges


def _number(text: str, field: str, where: str) -> float:
    s = text.strip()
    if not _NUMBER_RE.match(s):
        raise ImportFormatError(f"{where}: {field}={s!r} is not a non-negative number")
    value = float(s)
    if not math.isfinite(value):
        raise ImportFormatError(f"{where}: {field}={s!r} is not finite")
    return value


def _kind(cls: str) -> str:
    """``Conv2d`` -> ``conv2d``; ``Input0`` -> ``input``; ``__getitem__`` -> ``getitem``."""
    kind = cls.strip("_").lower() or cls.lower()
    if re.fullmatch(r"input\d*", kind):
        return "input"
    return kind


def _check_acyclic(path: Path, ids: list[str], edges: list[tuple[str, str, int]]) -> None:
    """Kahn's algorithm; on a cycle, walk back through unfinished nodes to name an edge on it."""
    indeg = dict.fromkeys(ids, 0)
    succ: dict[str, list[str]] = {i: [] for i in ids}
    for src, dst, _ in edges:
        succ[src].append(dst)
        indeg[dst] += 1
    stack = [i for i in ids if indeg[i] == 0]
    done = 0
    while stack:
        i = stack.pop()
        done += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if done == len(ids):
        return
    # Every unfinished node has an unfinished predecessor, so walking back must revisit a node.
    pred_edge: dict[str, tuple[str, int]] = {}
    for src, dst, lineno in edges:
        if indeg[src] > 0 and indeg[dst] > 0:
            pred_edge.setdefault(dst, (src, lineno))
    node = next(i for i in ids if indeg[i] > 0)
    visited: set[str] = set()
    while node not in visited:
        visited.add(node)
        node = pred_edge[node][0]
    src, lineno = pred_edge[node]
    raise ImportFormatError(f"{path}:{lineno}: edge {src} -- {node} closes a cycle")


# ---------------------------------------------------------------------------------------- layer strings


def _split_top(s: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _args(layer: str) -> tuple[list[str], dict[str, str]]:
    """Positional and keyword arguments of ``Cls(a, b, k=v)`` (as strings)."""
    open_ = layer.find("(")
    if open_ < 0:
        return [], {}
    if not layer.endswith(")"):
        raise _LayerArgError("unbalanced parentheses")
    pos: list[str] = []
    kw: dict[str, str] = {}
    for part in _split_top(layer[open_ + 1 : -1]):
        key, eq, value = part.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]\w*", key.strip()):
            kw[key.strip()] = value.strip()
        else:
            pos.append(part)
    return pos, kw


def _int(value: str, what: str) -> int:
    if not re.fullmatch(r"\d{1,12}", value.strip()):
        raise _LayerArgError(f"{what}={value!r} is not an integer")
    return int(value)


def _ints(value: str, what: str) -> tuple[int, ...]:
    """``3`` or ``(3, 3)`` -> a tuple of ints."""
    v = value.strip()
    if v.startswith("(") and v.endswith(")"):
        items = [x for x in v[1:-1].split(",") if x.strip()]
        if not items:
            raise _LayerArgError(f"{what}={value!r} is empty")
        return tuple(_int(x, what) for x in items)
    return (_int(v, what),)


def _flag(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    if value.strip() in ("True", "true", "1"):
        return True
    if value.strip() in ("False", "false", "0", "None"):
        return False
    raise _LayerArgError(f"{value!r} is not a boolean")


def _positional_or_kw(pos: list[str], kw: dict[str, str], index: int, key: str, what: str) -> int:
    if key in kw:
        return _int(kw[key], key)
    if index < len(pos):
        return _int(pos[index], key)
    raise _LayerArgError(f"{what} lacks {key}")


def _conv(r: _Row) -> float:
    pos, kw = _args(r.layer)
    in_ch = _positional_or_kw(pos, kw, 0, "in_channels", r.kind)
    kernel = _ints(kw["kernel_size"] if "kernel_size" in kw else (pos[2] if len(pos) > 2 else ""), "kernel_size")
    groups = _int(kw.get("groups", "1"), "groups")
    if groups < 1:
        raise _LayerArgError("groups must be >= 1")
    flops = 2.0 * r.out_elems * (in_ch / groups) * math.prod(kernel)
    return flops + (r.out_elems if _flag(kw.get("bias"), True) else 0.0)


def _linear_flops(layer: str, out_elems: float) -> float:
    pos, kw = _args(layer)
    in_f = _positional_or_kw(pos, kw, 0, "in_features", "Linear")
    return 2.0 * out_elems * in_f + (out_elems if _flag(kw.get("bias"), True) else 0.0)


def _pool(r: _Row) -> float:
    pos, kw = _args(r.layer)
    text = kw.get("kernel_size") or (pos[0] if pos else None)
    if text is None:
        raise _LayerArgError("pooling lacks kernel_size")
    return r.out_elems * math.prod(_ints(text, "kernel_size"))


@dataclass(frozen=True)
class _Lstm:
    input_size: int
    hidden: int
    layers: int
    directions: int
    bias: bool

    @classmethod
    def parse(cls, layer: str) -> _Lstm:
        pos, kw = _args(layer)
        return cls(
            input_size=_positional_or_kw(pos, kw, 0, "input_size", "LSTM"),
            hidden=_positional_or_kw(pos, kw, 1, "hidden_size", "LSTM"),
            layers=_int(kw["num_layers"], "num_layers") if "num_layers" in kw
            else (_int(pos[2], "num_layers") if len(pos) > 2 else 1),
            directions=2 if _flag(kw.get("bidirectional"), False) else 1,
            bias=_flag(kw.get("bias"), True),
        )

    def flops(self, tokens: float) -> float:
        """Forward FLOPs over ``tokens`` (sequence x batch) positions, all layers and directions."""
        h, total = self.hidden, 0.0
        for layer in range(self.layers):
            width = self.input_size if layer == 0 else h * self.directions
            per_token = 8.0 * h * (width + h) + (8.0 * h if self.bias else 0.0) + LSTM_POINTWISE_PER_HIDDEN * h
            total += self.directions * tokens * per_token
        return total


def _lstm(r: _Row) -> float:
    """Tokens (sequence x batch) = output elements / (hidden x directions): PyTorch's LSTM output
    is ``(seq, batch, directions * hidden)``, the first entry of a list-valued activation."""
    spec = _Lstm.parse(r.layer)
    tokens = r.activations[0] / FP32_BYTES / (spec.hidden * spec.directions)
    return spec.flops(tokens)


_SUBMODULE_RE = re.compile(r"\((?P<name>\w+)\): (?P<cls>\w+)\(")


def _submodules(layer: str) -> dict[str, str]:
    """``(name): Cls(args)`` children of a printed composite module -> their ``Cls(args)`` text."""
    out: dict[str, str] = {}
    for m in _SUBMODULE_RE.finditer(layer):
        start, depth = m.start("cls"), 0
        for end in range(m.end() - 1, len(layer)):
            depth += {"(": 1, ")": -1}.get(layer[end], 0)
            if depth == 0:
                out.setdefault(m["name"], layer[start : end + 1])
                break
        else:
            raise _LayerArgError(f"unbalanced parentheses after ({m['name']})")
    return out


def _emu_bidir_lstm(r: _Row) -> float:
    """GNMT's encoder: ``layer1`` forward and ``layer2`` reversed, outputs concatenated (training
    path; ``bidir`` shares their weights and only runs in inference)."""
    subs = _submodules(r.layer)
    lstms = [_Lstm.parse(subs[k]) for k in ("layer1", "layer2") if k in subs]
    if not lstms:
        raise _LayerArgError("no layer1/layer2 LSTM inside")
    width = sum(s.hidden * s.directions for s in lstms)
    tokens = r.out_elems / width
    return sum(s.flops(tokens) for s in lstms)


def _recurrent_attention(r: _Row) -> float:
    """GNMT's decoder attention layer. Outputs ``[rnn_out; h; c; context; scores]``:
    batch = h / hidden, target tokens = rnn_out / hidden, source length = scores / (batch x target).
    FLOPs: the LSTM, ``linear_q`` over target tokens, ``linear_k`` over source tokens, Bahdanau
    scoring ``v . tanh(q + k)`` (4 per hidden unit per score), softmax (5 per score) and the
    context ``scores @ keys`` (2 per hidden unit per score)."""
    subs = _submodules(r.layer)
    if "rnn" not in subs:
        raise _LayerArgError("no rnn LSTM inside")
    spec = _Lstm.parse(subs["rnn"])
    h = spec.hidden
    tokens_q = r.activations[0] / FP32_BYTES / (h * spec.directions)
    flops = spec.flops(tokens_q)
    if len(r.activations) < 5:
        return flops + (_linear_flops(subs["linear_q"], tokens_q * h) if "linear_q" in subs else 0.0)
    batch = r.activations[1] / FP32_BYTES / (h * spec.layers * spec.directions)
    scores = r.activations[4] / FP32_BYTES
    tokens_k = scores / tokens_q * batch if tokens_q else 0.0  # batch x source length
    if "linear_q" in subs:
        flops += _linear_flops(subs["linear_q"], tokens_q * h)
    if "linear_k" in subs:
        flops += _linear_flops(subs["linear_k"], tokens_k * h)
    return flops + scores * (6.0 * h + 5.0)


def _classifier(r: _Row) -> float:
    subs = _submodules(r.layer)
    linear = next((v for v in subs.values() if v.startswith("Linear(")), None)
    if linear is None:
        raise _LayerArgError("no Linear inside")
    return _linear_flops(linear, r.out_elems)


_FLOP_RULES: dict[str, Callable[[_Row], float]] = {
    "conv1d": _conv,
    "conv2d": _conv,
    "conv3d": _conv,
    "linear": lambda r: _linear_flops(r.layer, r.out_elems),
    "classifier": _classifier,
    "maxpool1d": _pool,
    "maxpool2d": _pool,
    "maxpool3d": _pool,
    "avgpool1d": _pool,
    "avgpool2d": _pool,
    "avgpool3d": _pool,
    "lstm": _lstm,
    "emubidirlstm": _emu_bidir_lstm,
    "recurrentattention": _recurrent_attention,
}


def _flops(r: _Row, in_elems: float, n_inputs: int, unknown: set[str]) -> float:
    rule = _FLOP_RULES.get(r.kind)
    if rule is not None:
        return rule(r)
    if r.kind in PER_ELEMENT_FLOPS:
        return PER_ELEMENT_FLOPS[r.kind] * r.out_elems
    if r.kind == "add":
        return r.out_elems * max(1, n_inputs - 1)
    if r.kind.startswith("adaptive") and "pool" in r.kind:
        return in_elems  # each input element is read into exactly one window
    if r.kind in ZERO_FLOP_KINDS:
        return 0.0
    unknown.add(r.kind)
    return 0.0


def _infer_batch_size(rows: list[_Row]) -> int | None:
    """The profiled minibatch, from layers whose shapes fix it.

    An LSTM's hidden state ``h_n`` is ``(layers * directions, batch, hidden)``; a plain ``Linear``
    on a 2-D input (CNN heads) outputs ``(batch, out_features)``; ``View(n)`` (squeezenet's,
    alexnet's flatten) outputs ``(batch, n)``. The last such layer in the file wins; ``None`` when
    none gives an integer in ``1..MAX_BATCH``.
    """
    for r in reversed(rows):
        try:
            if r.kind in ("lstm", "recurrentattention") and len(r.activations) >= 2:
                layer = _submodules(r.layer)["rnn"] if r.kind == "recurrentattention" else r.layer
                s = _Lstm.parse(layer)
                batch = r.activations[1] / FP32_BYTES / (s.layers * s.directions * s.hidden)
            elif r.kind == "linear":
                pos, kw = _args(r.layer)
                batch = r.out_elems / _positional_or_kw(pos, kw, 1, "out_features", "Linear")
            elif r.kind == "view" and re.fullmatch(r"View\(\d+\)", r.layer):
                batch = r.out_elems / _int(r.layer[5:-1], "size")
            else:
                continue
        except (_LayerArgError, KeyError, ValueError, ZeroDivisionError):
            continue
        if 1 <= batch <= MAX_BATCH and float(batch).is_integer():  # more is no batch (a Linear on 3-D inputs)
            return int(batch)
    return None
