"""The built-in model zoo: registry, shapes, and parameter counts of the reference models."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpualloc.errors import CaptureError
from gpualloc.graph.zoo import ZOO, ZooEntry, get_model

FULL = {"resnet50": 25_557_032, "bert-base": 109_482_240, "gpt2-small": 124_439_808}
TINY = ("resnet-tiny", "bert-tiny", "gpt-tiny")


def _on_meta(name: str) -> torch.nn.Module:
    with torch.device("meta"):
        return ZOO[name].factory()


def test_registry_names_and_entries() -> None:
    assert set(FULL) | set(TINY) <= set(ZOO)
    for entry in ZOO.values():
        assert isinstance(entry, ZooEntry)
        assert entry.description
    with pytest.raises(dataclasses.FrozenInstanceError):
        ZOO["resnet50"].description = "x"  # type: ignore[misc]


def test_get_model_unknown_names_the_known_ones() -> None:
    assert get_model("resnet50") is ZOO["resnet50"]
    with pytest.raises(CaptureError, match=r"unknown zoo model 'resnet-51'; known: .*resnet50"):
        get_model("resnet-51")


@pytest.mark.parametrize("name, params", FULL.items())
def test_full_size_parameter_counts_match_the_references(name: str, params: int) -> None:
    model = _on_meta(name)
    assert sum(p.numel() for p in model.parameters()) == params


def test_gpt_lm_head_is_tied_to_the_token_embedding() -> None:
    model = _on_meta("gpt2-small")
    assert model.lm_head.weight is model.wte.weight


@pytest.mark.parametrize(
    "name, shape, dtype",
    [
        ("resnet50", (4, 3, 224, 224), torch.float32),
        ("bert-base", (4, 128), torch.int64),
        ("gpt2-small", (4, 1024), torch.int64),
    ],
)
def test_example_inputs_shapes(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    with torch.device("meta"):
        (x,) = ZOO[name].example_inputs(4)
    assert tuple(x.shape) == shape and x.dtype == dtype


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_run_forward(name: str) -> None:
    torch.manual_seed(0)
    model = ZOO[name].factory().eval()
    with torch.no_grad():
        out = model(*ZOO[name].example_inputs(2))
    first = out[0] if isinstance(out, tuple) else out
    assert first.shape[0] == 2 and torch.isfinite(first).all()


def test_reference_flops_are_per_sample_and_plausible() -> None:
    assert ZOO["resnet50"].flops_per_sample == pytest.approx(8.2e9, rel=0.01)
    assert ZOO["bert-base"].flops_per_sample == pytest.approx(22e9, rel=0.05)
    assert ZOO["gpt2-small"].flops_per_sample == pytest.approx(2.9e11, rel=0.05)
