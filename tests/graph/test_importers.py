"""PipeDream profile importer: the 14 published profiles, known FLOP counts, malformed input."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.errors import ImportFormatError
from gpualloc.graph.importers import IMPORTERS, PIPEDREAM_LICENSE, import_pipedream

PROFILES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pipedream-profiles"
MODELS = [
    "alexnet", "densenet121", "gnmt", "gnmt_large", "inception_v3", "nasnetalarge", "nasnetamobile",
    "resnet101", "resnet18", "resnet50", "resnext101", "resnext50", "squeezenet1_0", "vgg16",
]
needs_profiles = pytest.mark.skipif(not PROFILES.is_dir(), reason=f"PipeDream profiles not found at {PROFILES}")

LINE = (
    "{id} -- {layer} -- forward_compute_time={fwd}, backward_compute_time={bwd}, "
    "activation_size={act}, parameter_size={param}"
)


def _profile(model: str) -> Path:
    return PROFILES / f"{model}.txt"


def _write(tmp_path: Path, text: str, name: str = "graph.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------- real profiles


@needs_profiles
@pytest.mark.parametrize("model", MODELS)
def test_imports_published_profile(model: str) -> None:
    path = _profile(model)
    lines = path.read_text().splitlines()
    node_lines = [ln for ln in lines if ln.startswith("node")]
    edge_lines = [ln for ln in lines if ln.startswith("\t")]
    file_params = sum(float(re.search(r"parameter_size=([\d.]+)", ln).group(1)) for ln in node_lines)

    g = import_pipedream(path)

    assert g.name == model
    assert len(g.nodes) == len(node_lines)
    assert len(g.edges) == len(edge_lines)
    assert g.total_param_bytes == pytest.approx(file_params)
    assert len(g.topo_order) == len(g.nodes)  # acyclic
    assert all(n.time_ms["V100-16GB"].bwd_ms is not None for n in g.nodes)
    assert all(n.flops >= 0 and n.layer == n.id for n in g.nodes)
    assert g.meta["license"] == PIPEDREAM_LICENSE and g.meta["file"] == path.name
    assert "flops_unknown_kinds" not in g.meta
    for e in g.edges:
        assert e.bytes == g.node(e.src).output_bytes


@needs_profiles
@pytest.mark.parametrize("model", [m for m in MODELS if not m.startswith("gnmt")])
def test_inferred_batch_matches_the_input_images(model: str) -> None:
    g = import_pipedream(_profile(model))
    (inp,) = [n for n in g.nodes if n.kind == "input"]
    side = 299 if model == "inception_v3" else 224
    assert inp.output_bytes == g.batch_size * 3 * side * side * 4


@needs_profiles
@pytest.mark.parametrize(
    ("model", "gflop_per_image", "rel"),
    [("resnet50", 8.2, 0.10), ("vgg16", 31.0, 0.10), ("alexnet", 1.42, 0.15)],
)
def test_known_flops_per_image(model: str, gflop_per_image: float, rel: float) -> None:
    g = import_pipedream(_profile(model))
    assert g.total_flops / g.batch_size / 1e9 == pytest.approx(gflop_per_image, rel=rel)


@needs_profiles
def test_gnmt_batch_and_lstm_flops() -> None:
    g = import_pipedream(_profile("gnmt"))
    assert g.batch_size == 32  # h_n of LSTM(1024, 1024) is 131072 bytes = 32 x 1024 x 4
    lstm = next(n for n in g.nodes if n.kind == "lstm" and n.name == "LSTM(1024, 1024)")
    tokens = 6291456 / 4 / 1024
    # matmuls: 2 FLOPs per weight per token; biases and point-wise ops on top
    assert lstm.flops == pytest.approx(tokens * (2 * 4 * 1024 * 2048 + 8 * 1024 + 9 * 1024))
    assert import_pipedream(_profile("gnmt"), batch_size=7).batch_size == 7


@needs_profiles
@pytest.mark.parametrize("model", ["resnext50", "nasnetamobile", "inception_v3"])
def test_conv_params_agree_with_parsed_layer(model: str) -> None:
    """Conv FLOPs per output element x out channels / 2 = the parameter count, for every conv."""
    g = import_pipedream(_profile(model))
    for n in g.nodes:
        if n.kind != "conv2d" or n.output_bytes == 0:
            continue
        out_ch = int(re.match(r"Conv2d\(\d+, (\d+)", n.name).group(1))
        bias = "bias=False" not in n.name
        per_elem = n.flops / (n.output_bytes / 4) - (1 if bias else 0)
        assert per_elem * out_ch / 2 + (out_ch if bias else 0) == pytest.approx(n.param_bytes / 4), n.name


# ---------------------------------------------------------------------------------------- known answers


def test_conv_line_known_answer(tmp_path: Path) -> None:
    layer = "Conv2d(128, 128, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)"
    text = (
        LINE.format(id="node1", layer="Input", fwd=0, bwd=0, act=51380224.0, param=0.0) + "\n"
        + LINE.format(id="node2", layer=layer, fwd=1.5, bwd=3.25, act=51380224.0, param=589824.0) + "\n"
        + "\tnode1 -- node2\n"
    )
    g = import_pipedream(_write(tmp_path, text), device="A100-40GB", name="one-conv")
    conv = g.node("node2")
    assert conv.kind == "conv2d" and conv.name == layer
    assert conv.flops == 2 * 128 * 28 * 28 * 128 * 128 * 9
    assert conv.time_ms["A100-40GB"].fwd_ms == 1.5 and conv.time_ms["A100-40GB"].bwd_ms == 3.25
    assert conv.bytes_read == 51380224 + 589824 and conv.bytes_written == 51380224
    assert g.edges[0].bytes == 51380224
    assert g.name == "one-conv" and g.meta["measured_on"] == "A100-40GB"
    assert g.batch_size == 128  # nothing in the file fixes it: the default


def test_layer_kinds_and_multi_output(tmp_path: Path) -> None:
    rows = [
        ("node1", "Input0", "0.0"),
        ("node2", "LSTM(8, 4, num_layers=2, bidirectional=True)", "[320.0; 256.0; 256.0]"),
        ("node3", "__getitem__(0)", "320.0"),
        ("node4", "Linear(in_features=8, out_features=2, bias=False)", "80.0"),
        ("node5", "ReLU(inplace)", "80.0"),
        ("node6", "Add(inplace)", "(80.0, 0.0)"),
    ]
    text = "\n".join(LINE.format(id=i, layer=lay, fwd=1, bwd=1, act=a, param=0) for i, lay, a in rows)
    text += "\n" + "\n".join(f"\tnode{i} -- node{i + 1}" for i in range(1, 6)) + "\n\tnode4 -- node6\n"
    g = import_pipedream(_write(tmp_path, text))
    assert [n.kind for n in g.nodes] == ["input", "lstm", "getitem", "linear", "relu", "add"]
    assert g.node("node2").output_bytes == 832.0
    assert g.node("node6").output_bytes == 80.0
    assert g.node("node4").flops == 2 * 20 * 8
    assert g.node("node5").flops == 20
    assert g.node("node6").flops == 20  # two inputs: one add per element
    # 10 tokens; layer 0 reads 8 features, layer 1 reads 2 x 4; two directions each
    per_dir = 8 * 4 * (8 + 4) + 8 * 4 + 9 * 4
    assert g.node("node2").flops == 10 * 2 * 2 * per_dir
    assert g.batch_size == 10  # last batch-fixing layer: Linear's 20 elements / 2 features


def test_a_shape_implying_more_than_max_batch_samples_fixes_no_batch(tmp_path: Path) -> None:
    """A Linear on 3-D inputs outputs batch x sequence rows: 1,682,592 of them is no batch (found by hypothesis)."""
    text = LINE.format(id="node0", layer="Linear(in_features=16, out_features=4, bias=True)", fwd=0, bwd=0,
                       act="26921472.000", param=0) + "\n"
    assert import_pipedream(_write(tmp_path, text)).batch_size == 128  # the default, not a refused 1.7M


def test_registry() -> None:
    assert IMPORTERS["pipedream"] is import_pipedream


# ---------------------------------------------------------------------------------------- errors

GOOD1 = LINE.format(id="node1", layer="Input", fwd=0, bwd=0, act=4.0, param=0)
GOOD2 = LINE.format(id="node2", layer="ReLU()", fwd=0.1, bwd=0.2, act=4.0, param=0)


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        (f"{GOOD1}\nthis is not a profile line\n", 2, "malformed node line"),
        (f"{GOOD1}\nnode2 -- ReLU() -- forward_compute_time=fast, backward_compute_time=0, "
         "activation_size=4, parameter_size=0\n", 2, "forward_compute_time='fast'"),
        (f"{GOOD1}\n{GOOD2.replace('parameter_size=0', 'parameter_size=-3')}\n", 2, "parameter_size='-3'"),
        (f"{GOOD1}\n{GOOD2.replace('activation_size=4.0', 'activation_size=[]')}\n", 2, "empty list"),
        (f"{GOOD1}\n{GOOD2}\n\tnode1 -- node9\n", 3, "unknown node 'node9'"),
        (f"{GOOD1}\n{GOOD2}\n\tnode1 node2\n", 3, "malformed edge line"),
        (f"{GOOD1}\n{GOOD2}\n\tnode1 -- node2\n\tnode2 -- node1\n", 4, "cycle"),
        (f"{GOOD1}\n{GOOD2}\n\tnode2 -- node2\n", 3, "self loop"),
        (f"{GOOD1}\n{GOOD1}\n", 2, "duplicate node 'node1'"),
        (f"{GOOD1}\n{GOOD2}\n\tnode1 -- node2\n\tnode1 -- node2\n", 4, "duplicate edge"),
        (f"{GOOD1}\n" + LINE.format(id="node2", layer="Conv2d(3, 8)", fwd=0, bwd=0, act=4, param=0), 2,
         "kernel_size"),
        (f"{GOOD1}\n" + LINE.format(id="node2", layer="(oops)", fwd=0, bwd=0, act=4, param=0), 2,
         "class name"),
    ],
)
def test_malformed_input_names_file_and_line(tmp_path: Path, text: str, line: int, what: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ImportFormatError) as info:
        import_pipedream(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{line}: "), msg
    assert what in msg


@pytest.mark.parametrize("text", ["", "\n\n", "\tnode1 -- node2\n"])
def test_file_without_nodes(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ImportFormatError, match=r"(no node lines|unknown node)"):
        import_pipedream(path)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="cannot read"):
        import_pipedream(tmp_path / "missing.txt")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"node1 -- Caf\xe9 -- x\n")
    with pytest.raises(ImportFormatError, match="not UTF-8"):
        import_pipedream(bad)


# ---------------------------------------------------------------------------------------- properties

LAYERS = [
    "ReLU(inplace)",
    "Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)",
    "Conv2d(8, 8, kernel_size=(1, 1), stride=(1, 1), groups=8)",
    "BatchNorm2d(8, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)",
    "MaxPool2d(kernel_size=3, stride=2, padding=0, dilation=1, ceil_mode=False)",
    "AvgPool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0))",
    "Linear(in_features=16, out_features=4, bias=True)",
    "LSTM(16, 16)",
    "Dropout(p=0.5)",
    "Add",
    "Concat(1)",
    "View(-1)",
    "__getitem__(0)",
    "Input",
    "SomethingNew(42)",
]
_number = st.floats(min_value=0, max_value=1e9, allow_nan=False).map(lambda x: f"{x:.3f}")


@st.composite
def profiles(draw) -> tuple[str, int]:
    n = draw(st.integers(min_value=1, max_value=25))
    order = draw(st.permutations(range(n)))  # node lines need not be sorted
    lines = []
    for i in order:
        acts = draw(st.lists(_number, min_size=1, max_size=3))
        act = acts[0] if len(acts) == 1 else "[" + "; ".join(acts) + "]"
        lines.append(LINE.format(id=f"node{i}", layer=draw(st.sampled_from(LAYERS)), fwd=draw(_number),
                                 bwd=draw(_number), act=act, param=draw(_number)))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    edges = sorted({(min(a, b), max(a, b)) for a, b in pairs if a != b})  # i < j: acyclic
    lines += [f"\tnode{a} -- node{b}" for a, b in edges]
    return "\n".join(lines) + "\n", n


def _import_text(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.txt"
        path.write_text(text, encoding="utf-8")
        return import_pipedream(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiles())
def test_random_profiles_parse(profile: tuple[str, int]) -> None:
    text, n = profile
    g = _import_text(text)
    assert len(g.nodes) == n
    assert len(g.topo_order) == n
    assert all(math.isfinite(x.flops) and x.flops >= 0 for x in g.nodes)


_garbage_line = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80),
    st.sampled_from([GOOD1, GOOD2, "\tnode1 -- node2", "\tnode2 -- node1", "node3 -- Conv2d(1, 2, kernel_size=(",
                     LINE.format(id="node4", layer="Conv2d(9999999999999, 1, kernel_size=99999999)", fwd=0, bwd=0,
                                 act="1e308", param=0),
                     LINE.format(id="node5", layer="LSTM(0, 0)", fwd=0, bwd=0, act="[4; 4; 4]", param=0),
                     LINE.format(id="node6", layer="Linear(in_features=x)", fwd=0, bwd=0, act="(1, 2)", param=0)]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_garbage_line, max_size=8))
def test_garbage_raises_only_import_format_error(lines: list[str]) -> None:
    try:
        _import_text("\n".join(lines))
    except ImportFormatError as err:
        assert "\n" not in str(err)
