"""The README's commands stay true: every ``gpualloc ...`` line in its code blocks parses against the real
CLI (sub-commands, options, arguments and their types), and the README stays short.

Parsing is click's own (``make_context`` down the command tree), so a renamed option, a removed
sub-command or a wrong argument count fails here without running anything expensive.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.main

from gpualloc.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def _commands(path: Path) -> list[str]:
    """The ``gpualloc ...`` lines of the file's bash/sh code blocks (continuation lines joined); lines
    with placeholders (``[--agent FILE]``, ``<it>``, ``...``) are left out."""
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", path.read_text(), flags=re.S)
    lines = []
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split("  #")[0].strip().rstrip("&").strip()
            if line.startswith("gpualloc ") and not re.search(r"\[|<|\.\.\.", line):
                lines.append(line)
    return lines


def _readme_commands() -> list[str]:
    return _commands(README)


# Typer vendors its own click: take the exception type from the exception Typer re-exports.
UsageError = typer.BadParameter.__mro__[1]


def _parse(command, args: list[str], parent, name: str) -> None:
    ctx = command.make_context(name, list(args), parent=parent)
    if hasattr(command, "resolve_command"):  # a group
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if rest:
            sub_name, sub, sub_args = command.resolve_command(ctx, rest)
            assert sub is not None, f"no sub-command {rest[0]!r}"
            _parse(sub, sub_args, ctx, sub_name)


COMMANDS = _readme_commands()
DOC_COMMANDS = [(str(path.relative_to(ROOT)), line) for path in sorted((ROOT / "docs").rglob("*.md"))
                for line in _commands(path)]


def test_readme_is_short_and_has_commands():
    assert len(README.read_text()) < 12_000
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("line", COMMANDS)
def test_readme_command_parses(line, monkeypatch):
    _check_parses(line, monkeypatch)


@pytest.mark.parametrize(("doc", "line"), DOC_COMMANDS)
def test_docs_command_parses(doc, line, monkeypatch):
    """The same for the commands in docs/ (the long tables' regeneration commands among them)."""
    _check_parses(line, monkeypatch)


def _check_parses(line: str, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    args = shlex.split(line)[1:]
    if "--install-completion" in args:
        pytest.skip("installs into the user's shell")
    root = typer.main.get_command(app)
    try:
        _parse(root, args, None, "gpualloc")
    except typer.Exit as done:  # eager options such as --version
        assert done.exit_code == 0
    except UsageError as err:
        pytest.fail(f"command does not parse: {line}\n{err.format_message()}")


def test_readme_files_exist():
    """Files the README points to ship with the repository."""
    text = README.read_text()
    for rel in re.findall(r"\]\(((?:docs|examples)/[^)#]+)\)", text) + re.findall(r"(examples/[\w./-]+)", text):
        assert (ROOT / rel).exists(), rel


def test_readme_bad_input_example_is_what_the_cli_prints():
    """The README's sample error is the real entry point's one stderr line (up to its ``...``), exit status 2."""
    sample = re.search(r"```\n\$ gpualloc (.+)\n(error: .+)\n```", README.read_text())
    assert sample, "the README's bad-input example is gone"
    proc = subprocess.run([sys.executable, "-m", "gpualloc.cli.main", *shlex.split(sample.group(1))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    shown = sample.group(2).removesuffix("...")
    assert proc.stderr.startswith(shown) and len(proc.stderr.strip().splitlines()) == 1, (shown, proc.stderr)
