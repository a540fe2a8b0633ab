"""The one options convention (gpualloc.options): frozen dataclasses, TOML files, CLI defaults and overrides."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass

import pytest
import typer
from typer.testing import CliRunner

from gpualloc.errors import GpuallocError
from gpualloc.options import (OptionsError, bounds_of, check_options, default_of, given, load_options, option,
                              options_dict, parse_options, with_overrides)


@dataclass(frozen=True)
class Inner:
    lr: float = option(1e-3, min=0.0)
    layers: tuple[int, ...] = (64, 64)


@dataclass(frozen=True)
class Opts:
    name: str = "fcfs"
    tick_s: float = option(0.5, min=0.01)
    count: int = option(3, min=1, max=10)
    port: int | None = None
    extra: dict = option(factory=dict)
    inner: Inner = option(factory=Inner)
    secret: str | None = option(None, file=False)

    def __post_init__(self) -> None:
        check_options(self)


def write(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_defaults_are_read_from_the_fields():
    assert default_of(Opts, "tick_s") == 0.5
    assert default_of(Opts, "extra") == {}
    assert default_of(Opts, "inner") == Inner()
    assert bounds_of(Opts, "count") == {"min": 1, "max": 10}
    assert bounds_of(Opts, "tick_s") == {"min": 0.01}
    assert bounds_of(Opts, "name") == {}
    with pytest.raises(OptionsError, match="no field 'nope'"):
        default_of(Opts, "nope")


def test_a_file_sets_its_keys_and_leaves_the_rest_at_their_defaults(tmp_path):
    path = write(tmp_path, 'name = "sjf"\ntick_s = 1\n\n[inner]\nlayers = [32, 16]\n')
    got = load_options(Opts, path)
    assert got == Opts(name="sjf", tick_s=1.0, inner=Inner(layers=(32, 16)))
    assert isinstance(got.tick_s, float) and got.inner.layers == (32, 16)
    with pytest.raises(FrozenInstanceError):
        got.name = "x"  # type: ignore[misc]
    # a base supplies the keys the file leaves out
    assert load_options(Opts, path, base=Opts(count=7)).count == 7
    # the whole configuration round-trips through a plain dict (what a checkpoint saves)
    assert parse_options(Opts, options_dict(got), "ckpt") == got


@pytest.mark.parametrize(("text", "message"), [
    ('name = "x"\ntick = 1\n', r"run.toml:2: tick: unknown key \(did you mean 'tick_s'\?\)"),
    ('count = "3"\n', r"run.toml:1: count: Input should be a valid integer, got '3'"),
    ('count = 3.0\n', r"run.toml:1: count: Input should be a valid integer"),
    ('count = true\n', r"run.toml:1: count: Input should be a valid integer"),
    ('count = 11\n', r"run.toml:1: count: expected a number in 1..10, got 11"),
    ('tick_s = nan\n', r"run.toml:1: tick_s: expected a number in 0.01..inf, got nan"),
    ('\n[inner]\nlr = -1.0\n', r"run.toml:3: inner.lr: expected a number in 0.0..inf, got -1.0"),
    ('[inner]\nlayers = [1, "a"]\n', r"run.toml:2: inner.layers\[1\]: Input should be a valid integer"),
    ('[inner]\nwidth = 3\n', r"run.toml:2: inner.width: unknown key"),
    ('inner = 3\n', r"run.toml:1: inner: expected a table, got 3"),
    ('name = 1979-05-27\n', r"run.toml:1: name: a date is not allowed here"),
    ('name = \n', r"run.toml: not valid TOML"),
    ('secret = "x"\n', r"run.toml:1: secret: not read from a file"),
])
def test_a_bad_file_is_one_line_naming_the_file_line_and_field(tmp_path, text, message):
    with pytest.raises(OptionsError, match=message) as err:
        load_options(Opts, write(tmp_path, text))
    assert "\n" not in str(err.value) and isinstance(err.value, GpuallocError)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(OptionsError, match="cannot read"):
        load_options(Opts, tmp_path / "absent.toml")


def test_the_python_api_refuses_what_a_file_refuses():
    with pytest.raises(OptionsError, match="count: expected a number in 1..10, got 0"):
        Opts(count=0)


def test_overrides_replace_only_the_given_fields_and_are_checked():
    base = Opts(name="sjf", count=5)
    assert with_overrides(base) is base
    assert with_overrides(base, count=2) == Opts(name="sjf", count=2)
    with pytest.raises(OptionsError, match="count: expected"):
        with_overrides(base, count=99)
    with pytest.raises(OptionsError, match="no field 'cnt'"):
        with_overrides(base, cnt=2)


def test_only_options_given_on_the_command_line_override_the_file(tmp_path):
    path = write(tmp_path, 'name = "sjf"\ncount = 7\n')
    app = typer.Typer()
    seen = {}

    @app.command()
    def run(ctx: typer.Context,
            config: str | None = typer.Option(None, "--config"),
            name: str = typer.Option(default_of(Opts, "name"), "--name"),
            count: int = typer.Option(default_of(Opts, "count"), "--count", **bounds_of(Opts, "count"))) -> None:
        base = load_options(Opts, config) if config else Opts()
        seen["opts"] = with_overrides(base, **given(ctx, name=name, count=count))

    runner = CliRunner()
    assert runner.invoke(app, ["--config", str(path)]).exit_code == 0
    assert seen["opts"] == Opts(name="sjf", count=7)  # the defaults of the CLI options do not override the file
    assert runner.invoke(app, ["--config", str(path), "--count", "2"]).exit_code == 0
    assert seen["opts"] == Opts(name="sjf", count=2)
    assert runner.invoke(app, []).exit_code == 0
    assert seen["opts"] == Opts()
    assert runner.invoke(app, ["--count", "11"]).exit_code == 2  # the field's range, as the CLI's range
