"""``gpualloc serve``'s options read ServiceConfig's defaults, and ``serve --config`` reads a ServiceConfig file
(options given on the command line win). Each run stops before serving: at a port in use, or at a refusal."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import fields

import pytest
import typer
from typer.testing import CliRunner

from gpualloc.cli.main import app
from gpualloc.options import OptionsError, bounds_of, default_of
from gpualloc.service.config import ServiceConfig

runner = CliRunner()



@pytest.fixture
def busy_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def serve_params() -> dict:
    command = typer.main.get_command(app).commands["serve"]
    return {p.name: p for p in command.params}


def test_every_serve_option_of_a_config_field_shows_that_fields_default_and_range():
    names = {f.name for f in fields(ServiceConfig)}
    params = serve_params()
    shared = names & set(params)
    assert len(shared) >= 20  # every ServiceConfig field serve offers
    for name in shared:
        default = default_of(ServiceConfig, name)
        assert params[name].default == (None if default == () else default), name
        bounds = bounds_of(ServiceConfig, name)
        assert {k: getattr(params[name], k) for k in bounds} == bounds, name


def write(tmp_path, text: str):
    path = tmp_path / "service.toml"
    path.write_text(text)
    return path


def test_the_file_sets_the_port_and_a_given_option_overrides_it(tmp_path, busy_port):
    store = tmp_path / "state.db"
    conf = write(tmp_path, f'port = {busy_port}\nstore = "{store}"\ntelemetry = "none"\n')
    res = runner.invoke(app, ["serve", "--config", str(conf)])
    assert f"cannot listen on 127.0.0.1:{busy_port}: port {busy_port} is in use" in str(res.exception)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        res = runner.invoke(app, ["serve", "--config", str(conf), "--port", str(port)])
    assert f"port {port} is in use" in str(res.exception)
    assert not store.exists()


@pytest.mark.parametrize(("text", "message"), [
    ("tick = 1\n", "service.toml:1: tick: unknown key (did you mean 'tick_s'?)"),
    ("max_body_bytes = 10\n", "service.toml:1: max_body_bytes: expected a number in 1,024..inf, got 10"),
    ('port = "80"\n', "service.toml:1: port: Input should be a valid integer"),
    ('[job_users]\ndefault = "root"\n', "service.toml:1: job_users: not read from a file"),
])
def test_a_bad_file_is_refused_naming_its_line_and_field(tmp_path, text, message):
    res = runner.invoke(app, ["serve", "--config", str(write(tmp_path, text))])
    assert isinstance(res.exception, OptionsError) and message in str(res.exception)


def test_a_file_policy_is_refused_at_the_files_knowledge_unless_the_command_line_changes_it(tmp_path, busy_port):
    conf = write(tmp_path, f'policy = "srtf"\nknowledge = "blind"\nport = {busy_port}\ntelemetry = "none"\n'
                           f'store = "{tmp_path / "state.db"}"\n')
    res = runner.invoke(app, ["serve", "--config", str(conf)])
    assert "blind" in str(res.exception) and "srtf" in str(res.exception)
    res = runner.invoke(app, ["serve", "--config", str(conf), "--knowledge", "oracle"])
    assert "is in use" in str(res.exception)  # past the refusal, stopped at the port


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    conf = write(tmp_path, "tick = 1\n")
    res = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", "serve", "--config", str(conf)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"error: {conf}:1: tick: unknown key (did you mean 'tick_s'?)"]


def test_the_example_file_reads_as_a_service_config():
    from pathlib import Path

    from gpualloc.options import load_options

    cfg = load_options(ServiceConfig, Path(__file__).resolve().parents[2] / "examples" / "service.toml")
    assert (cfg.cluster, cfg.policy, cfg.tick_s, cfg.max_queued, cfg.port) == ("4xV100+2xT4", "easy-backfill", 0.25,
                                                                              10_000, 8765)
    assert cfg.store is None and cfg.job_users is None  # left at their defaults
