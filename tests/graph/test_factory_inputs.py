"""The factory protocol's example inputs (issue 35): the model's own ``example_inputs(batch)`` method, the
module's ``example_inputs(batch)`` function, or ``graph capture --input-shape``; none of them is one line
naming all three."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from gpualloc.errors import CaptureError
from gpualloc.graph.capture import build_from_factory, capture, shaped_inputs

MODELS = textwrap.dedent("""
    import torch
    from torch import nn

    class WithMethod(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(12, 3)

        def forward(self, x):
            return self.lin(x)

        def example_inputs(self, batch):
            return (torch.randn(batch, 12),)

    def with_method():
        return WithMethod()

    def plain():
        return nn.Sequential(nn.Linear(7, 5), nn.ReLU())

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 8)
            self.lin = nn.Linear(8, 8)

        def forward(self, ids, x):
            return self.emb(ids).sum(1) + self.lin(x)

    def two_inputs():
        return TwoInputs()
""")
MODULE_FUNCTION = "\ndef example_inputs(batch):\n    return (torch.randn(batch, 7),)\n"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """``factorypkg_<n>.models`` in ``tmp_path`` (a fresh name per test: imports are cached per process)."""
    made = []

    def make(source: str) -> str:
        name = f"factorypkg_{tmp_path.name.replace('-', '_')}_{len(made)}"
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "models.py").write_text(source)
        made.append(name)
        return f"{name}.models"

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield make
    for name in made:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            sys.modules.pop(key)


def test_the_models_own_method(package):
    mod = package(MODELS)
    g = capture(f"{mod}:with_method", batch=4, saved_activations=False)
    assert g.batch_size == 4 and g.total_flops == 2 * 4 * 12 * 3  # Linear(12, 3) on 4 samples


def test_the_method_comes_before_the_module_function(package):
    """The module's function gives 7 features, which Linear(12, 3) refuses: only the method traces."""
    mod = package(MODELS + MODULE_FUNCTION)
    assert capture(f"{mod}:with_method", batch=2, saved_activations=False).total_flops == 2 * 2 * 12 * 3
    module, make = build_from_factory(f"{mod}:with_method")
    assert make.__self__ is module  # the bound method, shared with gpualloc run (graph.runnable)


def test_the_module_function(package):
    mod = package(MODELS + MODULE_FUNCTION)
    assert capture(f"{mod}:plain", batch=3, saved_activations=False).total_flops >= 2 * 3 * 7 * 5


def test_a_factory_with_no_inputs_names_the_three_ways(package, cli, tmp_path):
    mod = package(MODELS)
    code, _, err = cli("graph", "capture", f"{mod}:plain", "-o", tmp_path / "g.json")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "example_inputs(batch) method" in lines[0] and f"example_inputs(batch) in '{mod}'" in lines[0]
    assert "--input-shape" in lines[0]
    with pytest.raises(CaptureError, match="no example inputs"):
        capture(f"{mod}:plain")


def test_input_shape_on_the_command_line(package, cli, tmp_path):
    mod = package(MODELS + MODULE_FUNCTION)
    out = tmp_path / "g.json"
    code, _, err = cli("graph", "capture", f"{mod}:plain", "--input-shape", "7", "--batch", "5", "-o", out)
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["batch_size"] == 5 and sum(n.get("flops", 0) for n in doc["nodes"]) >= 2 * 5 * 7 * 5
    # overrides the model's own inputs; several inputs, each with its dtype (token ids must be integers)
    code, _, err = cli("graph", "capture", f"{mod}:two_inputs", "--input-shape", "16", "--input-shape", "8",
                       "--input-dtype", "int64", "--input-dtype", "float32", "-o", out)
    assert code == 0, err
    code, _, err = cli("graph", "capture", f"{mod}:two_inputs", "--input-shape", "16", "--input-shape", "8",
                       "-o", out)  # float token ids: torch refuses, one line
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot trace" in err, err


@pytest.mark.parametrize("args, says", [
    (("--input-shape", "3,x"), "input shape: expected positive integers"),
    (("--input-shape", "3,0"), "input shape: expected positive integers"),
    (("--input-shape", "100000,100000"), "input shape '100000,100000': 10,000,000,000 elements per sample"),
    (("--input-shape", "3", "--input-dtype", "int9"), "input dtype: unknown 'int9'"),
    (("--input-shape", "3", "--input-shape", "4", "--input-dtype", "int64", "--input-dtype", "float32",
      "--input-dtype", "bool"), "input dtype: give one per input shape (2) or one for all, got 3"),
])
def test_bad_input_shapes_are_one_line(package, cli, tmp_path, args, says):
    mod = package(MODELS)
    code, _, err = cli("graph", "capture", f"{mod}:plain", *args, "-o", tmp_path / "g.json")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0], err


def test_shaped_inputs():
    import torch

    make = shaped_inputs(["3x4", (2,)], ["bfloat16", "int64"])
    a, b = make(2)
    assert a.shape == (2, 3, 4) and a.dtype == torch.bfloat16 and b.shape == (2, 2) and not b.any()
    with pytest.raises(CaptureError, match="elements at batch"):
        shaped_inputs(["4096,4096"])(1 << 10)


def test_the_readme_example_factory_captures_both_ways(tmp_path, monkeypatch, cli):
    """``examples/mymodel.py``, the README's factory: its method gives the inputs, and its plain network
    captures with ``--input-shape 64``, from the checkout's root as the README runs it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    for args in (["examples.mymodel:build"], ["examples.mymodel:build_plain", "--input-shape", "64"]):
        out = tmp_path / "m.json"
        code, _, err = cli("graph", "capture", *args, "--batch", "4", "-o", out)
        assert code == 0, err
        graph = json.loads(out.read_text())
        assert graph["batch_size"] == 4 and len(graph["nodes"]) == 3
