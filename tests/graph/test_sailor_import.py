"""Sailor profile importer: known answers from the real profiles, the parser on generated profiles, and bad
input through the real entry point (one line, exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpualloc.errors import ImportFormatError
from gpualloc.graph.importers import IMPORTERS
from gpualloc.graph.ir import OpGraph
from gpualloc.graph.sailor import (
    BYTES_PER_ACTIVATION,
    BYTES_PER_PARAM,
    SAILOR_GPUS,
    SAILOR_SOURCE,
    catalog_gpu,
    import_sailor,
    parse_profile,
)
from gpualloc.hardware.catalog import default_catalog

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "sailor-profiles"
needs_data = pytest.mark.skipif(not (DATA / "profiles").is_dir(), reason=f"Sailor profiles not found at {DATA}")


def _raw(model: str, gpu: str) -> dict:
    return json.loads((DATA / "profiles" / model / gpu / "profile.json").read_text())


# ---------------------------------------------------------------------------------------- a tiny folder


def _llm_info(layers: int, seq: int) -> dict:
    table = {}
    for i in range(layers):
        table[str(i)] = {"params_floats": 1000 * (i + 1), "act_output_floats": seq * 8,
                         "act_input_floats": seq * seq + 2 * seq if i == 0 else seq * 8,
                         "act_mem_floats": seq * 30}
    return {"TINY": {"1": table, "2": table}}


def _profile(layers: int, mbs=(1, 2), tps=(1, 2), base: float = 0.001) -> dict:
    return {str(mb): {str(tp): {str(i): [base * mb * (i + 1) / tp, 2 * base * mb * (i + 1) / tp, 0.004 / tp]
                                for i in range(layers)} for tp in tps} for mb in mbs}


def _folder(root: Path, layers: int = 4, seq: int = 16, gpus: dict | None = None) -> Path:
    (root / "profiles" / "TINY").mkdir(parents=True, exist_ok=True)
    (root / "llm_info.json").write_text(json.dumps(_llm_info(layers, seq)))
    for gpu, prof in (gpus or {"A100-40": _profile(layers), "V100-16": _profile(layers, base=0.003)}).items():
        (root / "profiles" / "TINY" / gpu).mkdir(exist_ok=True)
        text = prof if isinstance(prof, str) else json.dumps(prof, indent=1)
        (root / "profiles" / "TINY" / gpu / "profile.json").write_text(text)
    return root


# ---------------------------------------------------------------------------------------- real profiles


@needs_data
def test_opt350_known_answers() -> None:
    g = import_sailor(DATA, model="OPT-350", gpus=["A100-40", "V100-16"], batch_size=1024)
    raw, info = _raw("OPT-350", "A100-40"), json.loads((DATA / "llm_info.json").read_text())["OPT-350"]["1"]
    assert g.name == "OPT-350" and g.batch_size == 1024
    assert [n.id for n in g.nodes] == [f"layer{i}" for i in range(26)]
    assert [(e.src, e.dst) for e in g.edges] == [(f"layer{i}", f"layer{i + 1}") for i in range(25)]
    layer1 = g.node("layer1")
    assert layer1.param_bytes == 12_596_224 * BYTES_PER_PARAM == info["1"]["params_bytes"]
    assert layer1.output_bytes == 2_097_152 * BYTES_PER_ACTIVATION * 1024  # 2048 tokens x 1024 hidden, fp16
    assert g.edges[1].bytes == layer1.output_bytes
    # Measured at microbatch 1, TP 1, scaled to the batch of 1024.
    assert layer1.time_ms["A100-40GB"].fwd_ms == pytest.approx(raw["1"]["1"]["1"][0] * 1000 * 1024)
    assert layer1.time_ms["A100-40GB"].bwd_ms == pytest.approx(0.005906 * 1000 * 1024)
    assert layer1.time_ms["V100-16GB"].fwd_ms > layer1.time_ms["A100-40GB"].fwd_ms
    prof = g.meta["profile"]
    assert prof["seq_len"] == 2048 and prof["model"] == "OPT-350" and prof["source"] == SAILOR_SOURCE
    assert prof["opt_step_s"] == {"A100-40GB": 0.002938, "V100-16GB": 0.004854}
    assert set(prof["gpu"]) == {"A100-40GB", "V100-16GB"}
    for mb, by_tp in raw.items():
        for tp, layers in by_tp.items():
            assert prof["gpu"]["A100-40GB"][mb][tp] == [layers[str(i)][:2] for i in range(26)]
    assert g.total_flops > 0 and g.node("layer0").flops == 0


@needs_data
@pytest.mark.parametrize(("model", "layers", "seq"),
                         [("OPT-350", 26, 2048), ("GPT-Neo-2.7", 34, 2048), ("OPT-30", 50, 2048),
                          ("LLAMA-3-8", 35, 8192)])
def test_every_model_imports_with_its_sequence_length(model: str, layers: int, seq: int) -> None:
    g = import_sailor(DATA / "profiles" / model)
    assert len(g.nodes) == layers and g.meta["profile"]["seq_len"] == seq
    assert g.batch_size == g.meta["profile"]["microbatch"]
    for cat, by_mb in g.meta["profile"]["gpu"].items():
        assert cat in default_catalog().devices
        assert all(len(rows) == layers for by_tp in by_mb.values() for rows in by_tp.values())


@needs_data
def test_gpt_neo_gh96_layer_mismatch_is_skipped_by_default_and_refused_when_named() -> None:
    g = import_sailor(DATA, model="GPT-Neo-2.7")
    assert set(g.meta["profile"]["gpu"]) == {"A100-40GB", "A100-80GB", "V100-16GB"}
    assert "GH-96" in g.meta["profile"]["skipped"]
    with pytest.raises(ImportFormatError, match=r"GH-96/profile\.json: 26 layers.*34"):
        import_sailor(DATA, model="GPT-Neo-2.7", gpus=["A100-40", "GH-96"])


@needs_data
def test_gpu_without_tp1_gets_tables_but_no_op_times() -> None:
    g = import_sailor(DATA, model="LLAMA-3-8", gpus=["GH-96", "A100-40"])
    assert g.device_types_measured() == {"GH200-96GB"}
    assert set(g.meta["profile"]["gpu"]["A100-40GB"]["1"]) == {"2", "4"}


@needs_data
def test_microbatch_option_picks_the_timed_table() -> None:
    g = import_sailor(DATA, model="OPT-350", gpus=["A100-40"], microbatch=4, batch_size=64)
    fwd = _raw("OPT-350", "A100-40")["4"]["1"]["5"][0]
    assert g.node("layer5").time_ms["A100-40GB"].fwd_ms == pytest.approx(fwd * 1000 * 64 / 4)
    with pytest.raises(ImportFormatError, match="--microbatch 3"):
        import_sailor(DATA, model="OPT-350", gpus=["A100-40"], microbatch=3)


@needs_data
def test_round_trips_through_gpualloc_graph_json(tmp_path: Path) -> None:
    g = import_sailor(DATA, model="OPT-350", batch_size=256)
    g.save(tmp_path / "g.json")
    h = OpGraph.load(tmp_path / "g.json")
    assert h.meta == g.meta and h.batch_size == 256
    assert [n.time_ms for n in h.nodes] == [n.time_ms for n in g.nodes]
    assert h.total_param_bytes == g.total_param_bytes


@needs_data
def test_cli_import_writes_the_graph(cli, tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    code, stdout, err = cli("graph", "import", DATA, "--format", "sailor", "--model", "OPT-350",
                            "--gpu", "A100-40", "--gpu", "V100-16GB", "--batch", "1024", "--seq-len", "2048",
                            "-o", out)
    assert code == 0, err
    g = OpGraph.load(out)
    assert g.batch_size == 1024 and g.device_types_measured() == {"A100-40GB", "V100-16GB"}


# ---------------------------------------------------------------------------------------- names


def test_every_sailor_gpu_is_in_the_catalog_and_names_resolve() -> None:
    cat = default_catalog()
    for sailor, name in SAILOR_GPUS.items():
        assert cat.device(name).name == name
        assert catalog_gpu(sailor) == catalog_gpu(name) == (sailor, name)
    assert catalog_gpu("A100") == ("A100-40", "A100-40GB")  # a catalog alias
    with pytest.raises(ImportFormatError, match="'T4'"):
        catalog_gpu("T4")  # in the catalog, but never profiled


def test_registry_names_the_importer() -> None:
    assert IMPORTERS["sailor"] is import_sailor


# ---------------------------------------------------------------------------------------- generated profiles

_times = st.floats(min_value=0, max_value=10, allow_nan=False, allow_infinity=False)


@st.composite
def _profiles(draw):
    layers = draw(st.integers(1, 6))
    mbs = draw(st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=3, unique=True))
    tps = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3, unique=True))
    return {str(mb): {str(tp): {str(i): [draw(_times), draw(_times), draw(_times)] for i in range(layers)}
                      for tp in tps} for mb in mbs}


@settings(max_examples=60, deadline=None)
@given(_profiles())
def test_parser_keeps_every_number(data: dict) -> None:
    out = parse_profile(data, "p.json")
    assert sorted(map(str, out)) == sorted(data)
    for mb, by_tp in out.items():
        for tp, arr in by_tp.items():
            rows = data[str(mb)][str(tp)]
            assert arr.shape == (len(rows), 3)
            assert np.array_equal(arr, np.asarray([rows[str(i)] for i in range(len(rows))]))


@settings(max_examples=60, deadline=None)
@given(_profiles(), st.sampled_from(["neg", "nan", "inf", "huge", "str", "short", "gap", "key", "ragged"]))
def test_parser_names_the_bad_entry(data: dict, fault: str) -> None:
    mb = next(iter(data))
    tp = next(iter(data[mb]))
    layers = data[mb][tp]
    last = str(len(layers) - 1)
    if fault in ("neg", "nan", "inf", "huge", "str"):
        layers[last][1] = {"neg": -1e-3, "nan": math.nan, "inf": math.inf, "huge": 1e300, "str": "1.0"}[fault]
        pattern = rf"\['{mb}'\]\['{tp}'\]\['{last}'\]: bwd_s"
    elif fault == "short":
        layers[last] = layers[last][:2]
        pattern = rf"\['{last}'\]: expected \[fwd_s, bwd_s, opt_step_s\]"
    elif fault == "gap":
        layers[str(len(layers) + 1)] = [0.1, 0.1, 0.1]
        pattern = "is missing"
    elif fault == "key":
        data["one"] = data.pop(mb)
        pattern = "microbatch key 'one'"
    else:  # a second table with one more layer
        data[mb]["64"] = {**layers, str(len(layers)): [0.1, 0.1, 0.1]}
        pattern = "layers, but"
    with pytest.raises(ImportFormatError, match=pattern):
        parse_profile(data, "p.json")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 5), seq=st.integers(1, 64), batch=st.integers(1, 512), data=st.data())
def test_imported_times_are_the_profile_scaled_to_the_batch(tmp_path_factory, layers, seq, batch, data) -> None:
    a100, v100 = data.draw(_profiles_with(layers)), data.draw(_profiles_with(layers))
    root = _folder(tmp_path_factory.mktemp("sailor"), layers, seq, {"A100-40": a100, "V100-16": v100})
    g = import_sailor(root, model="TINY", batch_size=batch)
    mb = g.meta["profile"]["microbatch"]
    assert g.meta["profile"]["seq_len"] == seq and len(g.nodes) == layers and len(g.edges) == layers - 1
    for name, prof in (("A100-40GB", a100), ("V100-16GB", v100)):
        timed = "1" in prof.get(str(mb), {})
        assert (name in g.nodes[0].time_ms) == timed
        for i, node in enumerate(g.nodes):
            assert node.output_bytes == seq * 8 * BYTES_PER_ACTIVATION * batch
            if timed:
                fwd, bwd, _ = prof[str(mb)]["1"][str(i)]
                assert node.time_ms[name].fwd_ms == pytest.approx(fwd * 1000 * batch / mb)
                assert node.time_ms[name].bwd_ms == pytest.approx(bwd * 1000 * batch / mb)


@st.composite
def _profiles_with(draw, layers: int):
    mbs = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3, unique=True))
    tps = draw(st.lists(st.sampled_from([1, 2]), min_size=1, max_size=2, unique=True))
    return {str(mb): {str(tp): {str(i): [draw(_times), draw(_times), 0.01] for i in range(layers)}
                      for tp in tps} for mb in mbs}


# ---------------------------------------------------------------------------------------- bad input


def _bad(root: Path) -> dict[str, tuple[list[str], str]]:
    """Case -> (CLI arguments, text the one-line error must contain)."""
    tiny = root / "profiles" / "TINY"
    return {
        "no model": (["--model", "NOPE"], "no model 'NOPE'"),
        "model needed": ([], "--model is needed"),
        "unknown gpu": (["--model", "TINY", "--gpu", "H800"], "--gpu 'H800'"),
        "other sequence": (["--model", "TINY", "--seq-len", "32"], "sequence 16 only"),
        "unprofiled microbatch": (["--model", "TINY", "--gpu", "A100-40", "--microbatch", "8"], "--microbatch 8"),
        "malformed json": (["--model", "TINY", "--gpu", "RTX-3090"], f"{tiny / 'RTX-3090' / 'profile.json'}:3"),
        "negative time": (["--model", "TINY", "--gpu", "RTX-2080"], "['1']['1']['2']: fwd_s is -0.5"),
        "nan time": (["--model", "TINY", "--gpu", "Titan-RTX"], "['2']['1']['0']: bwd_s is nan"),
        "layer count": (["--model", "TINY", "--gpu", "A100-40", "--gpu", "A100-80"], "3 layers, but"),
        "binary": (["--model", "TINY", "--gpu", "GH200"], "not UTF-8"),
    }


@pytest.fixture
def bad_root(tmp_path: Path) -> Path:
    root = _folder(tmp_path, layers=4, seq=16)
    tiny = root / "profiles" / "TINY"
    for gpu in ("RTX-3090", "RTX-2080", "Titan-RTX", "A100-80", "GH-96"):
        (tiny / gpu).mkdir()
    (tiny / "RTX-3090" / "profile.json").write_text('{\n "1": {\n  "1": {"0": [0.1, 0.2, 0.3],,}}}\n')
    neg = _profile(4)
    neg["1"]["1"]["2"][0] = -0.5
    (tiny / "RTX-2080" / "profile.json").write_text(json.dumps(neg))
    nan = _profile(4)
    nan["2"]["1"]["0"][1] = math.nan
    (tiny / "Titan-RTX" / "profile.json").write_text(json.dumps(nan))  # Python's json writes and reads NaN
    (tiny / "A100-80" / "profile.json").write_text(json.dumps(_profile(3)))
    (tiny / "GH-96" / "profile.json").write_bytes(bytes(range(256)))
    return root


@pytest.mark.parametrize("case", list(_bad(Path("/x"))))
def test_bad_input_is_one_line_and_exit_2(cli, bad_root: Path, case: str) -> None:
    args, expected = _bad(bad_root)[case]
    code, _, err = cli("graph", "import", bad_root, "--format", "sailor", *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err


def test_bad_folders_are_one_line(cli, tmp_path: Path) -> None:
    root = _folder(tmp_path / "s")
    (tmp_path / "empty").mkdir()
    (root / "llm_info.json").write_text(json.dumps({"TINY": {"2": {}}}))
    for args, expected in [
        ([tmp_path / "empty"], "not a sailor-profiles folder"),
        ([root / "llm_info.json"], "not a folder"),
        ([root, "--model", "TINY"], "no TP-1 sizes"),
        ([root / "profiles" / "TINY", "--model", "OTHER"], "not --model 'OTHER'"),
        ([_folder(tmp_path / "t") / "profiles" / "TINY", "--gpu", "GH-96"], "GH-96/profile.json: no such profile"),
    ]:
        code, _, err = cli("graph", "import", *args, "--format", "sailor")
        assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err


def test_tiny_folder_imports_as_a_chain(tmp_path: Path) -> None:
    g = import_sailor(_folder(tmp_path) / "profiles" / "TINY", batch_size=8)
    assert [n.id for n in g.nodes] == ["layer0", "layer1", "layer2", "layer3"]
    assert g.meta["profile"]["microbatch"] == 1 and g.meta["profile"]["seq_len"] == 16
    assert g.node("layer2").param_bytes == 3000 * BYTES_PER_PARAM
    assert g.node("layer2").time_ms["A100-40GB"].fwd_ms == pytest.approx(0.003 * 1000 * 8)
    assert g.meta["profile"]["opt_step_s"] == {"A100-40GB": 0.004, "V100-16GB": 0.004}


@needs_data
def test_hybrid_planner_reads_the_imported_tables() -> None:
    from gpualloc.hardware.cluster import load_cluster
    from gpualloc.placement.hybrid.problem import HybridProblem

    g = import_sailor(DATA, model="OPT-350", gpus=["A100-40"], batch_size=64)
    problem = HybridProblem(g, load_cluster("4xA100"), 64)
    fwd, bwd = problem.layer_times_s(0, 4, 2)
    raw = _raw("OPT-350", "A100-40")["4"]["2"]
    assert np.allclose(fwd, [raw[str(i)][0] for i in range(26)])
    assert np.allclose(bwd, [raw[str(i)][1] for i in range(26)])
    assert np.allclose(problem.layer_act_bytes, g.meta["profile"]["act_mem_bytes"])
    assert problem.layer_param_bytes.sum() == g.total_param_bytes


def test_sailor_options_are_refused_for_other_formats(cli, tmp_path: Path) -> None:
    profile = tmp_path / "graph.txt"
    profile.write_text("node1 -- Input0() -- forward_compute_time=0.000, backward_compute_time=0.000, "
                       "activation_size=4.0, parameter_size=0.000\n")
    code, _, err = cli("graph", "import", profile, "--format", "pipedream", "--gpu", "A100-40")
    assert code == 2 and "--gpu: for --format sailor only" in err, err
    code, _, err = cli("graph", "import", profile, "--format", "pipedream", "--batch", "3", "-o", tmp_path / "g.json")
    assert code == 0, err
    assert OpGraph.load(tmp_path / "g.json").batch_size == 3


def test_unknown_gpu_folder_is_skipped_with_a_note(cli, tmp_path: Path) -> None:
    root = _folder(tmp_path, gpus={"A100-40": _profile(4), "H800": _profile(4)})
    g = import_sailor(root, model="TINY")
    assert set(g.meta["profile"]["gpu"]) == {"A100-40GB"} and "H800" in g.meta["profile"]["skipped"]
    code, _, err = cli("graph", "import", root, "--format", "sailor", "--model", "TINY", "-o", tmp_path / "g.json")
    assert code == 0 and err.startswith("note: skipped") and "'H800' is not in SAILOR_GPUS" in err, err
