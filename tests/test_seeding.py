"""The one ``seed`` check (gpualloc.seeding.seeded): accepted seeds, normalisation, and one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from gpualloc.errors import TraceError
from gpualloc.limits import MAX_SEED
from gpualloc.seeding import SeedError, check_seed, seeded


@seeded()
def as_given(n: int, seed=0):
    return seed


@seeded(to="generator")
def draw(n: int, *, seed=None):
    return seed.integers(1_000_000, size=n)


@seeded(to="int")
def as_int(seed=0):
    return seed


def test_to_int_gives_an_int_drawn_from_a_generator():
    assert as_int() == 0 and as_int(5) == 5 and type(as_int(np.int64(5))) is int
    assert as_int(np.random.default_rng(3)) == int(np.random.default_rng(3).integers(MAX_SEED + 1))
    assert 0 <= as_int(None) <= MAX_SEED


class Thing:
    @seeded(error=TraceError)
    def __init__(self, seed=7) -> None:
        self.seed = seed


@pytest.mark.parametrize("seed", [0, 3, MAX_SEED, np.int64(5), np.uint32(9), None])
def test_accepted_seeds_pass_as_python_ints_or_none(seed):
    got = as_given(1, seed)
    assert got == (None if seed is None else int(seed)) and (got is None or type(got) is int)
    assert as_given(1, seed=seed) == got


def test_a_generator_passes_through_unchanged():
    rng = np.random.default_rng(1)
    assert as_given(1, rng) is rng
    # to="generator": the same stream as the caller's own default_rng, and a Generator is used as it is
    assert draw(3, seed=4).tolist() == np.random.default_rng(4).integers(1_000_000, size=3).tolist()
    rng = np.random.default_rng(2)
    first = draw(2, seed=rng)
    assert first.tolist() == np.random.default_rng(2).integers(1_000_000, size=2).tolist()
    assert draw(2, seed=rng).tolist() != first.tolist()  # the caller's stream moved on
    assert len(draw(2)) == 2  # the default (None) still becomes a Generator


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 2**70, 1.0, 3.5, float("nan"), True, "3", np.float64(2.0), [1]])
def test_bad_seeds_are_one_line_naming_the_function_and_argument(seed):
    with pytest.raises(SeedError) as err:
        as_given(1, seed)
    assert str(err.value) == (f"as_given: seed: expected an integer in 0..{MAX_SEED:,}, None or a numpy Generator, "
                              f"got {seed!r}")
    with pytest.raises(SeedError, match="^draw: seed: "):
        draw(1, seed=seed)


def test_a_method_names_its_class_and_raises_the_domain_error():
    assert Thing().seed == 7 and Thing(seed=np.int32(2)).seed == 2
    with pytest.raises(TraceError, match="^Thing: seed: expected an integer"):
        Thing(seed=-5)


def test_a_misdeclared_function_fails_at_import():
    with pytest.raises(TypeError, match="no argument 'seed'"):
        seeded()(lambda n: n)
    with pytest.raises(TypeError, match="expected an integer"):
        seeded()(lambda seed=-1: seed)


def test_check_seed_alone():
    assert check_seed(None) is None and check_seed(np.int16(4)) == 4
    with pytest.raises(TraceError, match="^generate: seed: "):
        check_seed(-1, "generate: seed", TraceError)


def _unchecked() -> set[str]:
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "gpualloc"
    found = set()
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("cli/") or rel in ("seeding.py", "limits.py"):
            continue  # the CLI's seeds are Typer options with the range 0..MAX_SEED
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_") and node.name != "__init__":
                continue
            names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
            decorated = any("seeded" in ast.unparse(d) for d in node.decorator_list)
            if "seed" in names and not decorated:
                found.add(f"{rel}:{node.name}")
    return found


def test_every_public_seed_argument_is_checked_by_the_decorator():
    unchecked = _unchecked()
    assert sorted(unchecked) == [], "decorate these with @seeded (gpualloc.seeding)"
