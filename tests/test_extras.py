"""Optional extras: a missing one is one line naming it (simulated by hiding modules, not by
uninstalling), ``_extras.EXTRAS`` agrees with ``pyproject.toml``, and every import of an extra's module
goes through the one helper."""

from __future__ import annotations

import ast
import importlib
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from gpualloc import _extras
from gpualloc._extras import EXTRAS, missing_extra, require
from gpualloc.cli.main import main
from gpualloc.errors import ExtraMissingError, GpuallocError

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "gpualloc"
SERVE = "error: gpualloc serve needs the 'service' extra: pip install 'gpualloc[service]'"


@pytest.fixture
def cli(capsys, monkeypatch):
    """``gpualloc ARGS...`` through ``main()``: ``(exit status, stderr)``."""

    def run(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["gpualloc", *args])
        with pytest.raises(SystemExit) as exc:
            main()
        return exc.value.code, capsys.readouterr().err

    return run


def hide(monkeypatch, *modules: str, reload: tuple[str, ...] = ()) -> None:
    """Make ``import m`` fail for each of ``modules`` (``None`` in ``sys.modules``) and forget the gpualloc
    modules in ``reload``, so that they are imported again (and meet the missing module)."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)
    for name in reload:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_require_returns_the_module_or_names_the_extra(monkeypatch):
    assert require("service", "httpx", by="x") is importlib.import_module("httpx")
    hide(monkeypatch, "ray", "ray.util")  # a submodule imported earlier in the session would be found as is
    with pytest.raises(ExtraMissingError) as err:
        require("ray", "ray", by="gpualloc serve --backend ray")
    assert str(err.value) == "gpualloc serve --backend ray needs the 'ray' extra: pip install 'gpualloc[ray]'"

    class Narrow(GpuallocError):
        pass

    with pytest.raises(Narrow, match="'ray' extra"):  # the caller's own error class
        require("ray", "ray.util", by="x", error=Narrow)


def test_a_broken_install_says_what_failed(monkeypatch):
    def broken(name):
        raise ImportError("libray.so: cannot open shared object file\nsecond line")

    monkeypatch.setattr(_extras.importlib, "import_module", broken)
    with pytest.raises(ExtraMissingError) as err:
        require("ray", "ray", by="reproduce --ray")
    assert str(err.value) == ("reproduce --ray needs the 'ray' extra: pip install 'gpualloc[ray]' "
                              "(ray is installed but does not import: libray.so: cannot open shared object file)")


def test_a_module_outside_the_extra_is_a_programming_error():
    with pytest.raises(ValueError, match="not in the 'ray' extra"):
        require("ray", "fastapi", by="x")
    with pytest.raises(ValueError, match="unknown extra"):
        missing_extra("gpu", by="x")


def test_serve_without_fastapi_is_one_line(cli, monkeypatch, tmp_path):
    hide(monkeypatch, "fastapi", reload=("gpualloc.service.app",))
    code, err = cli("serve", "--store", str(tmp_path / "s.db"))
    assert (code, err.strip()) == (2, SERVE)


def test_serve_without_uvicorn_is_refused_before_any_set_up(cli, monkeypatch, tmp_path):
    hide(monkeypatch, "uvicorn")
    code, err = cli("serve", "--store", str(tmp_path / "s.db"))
    assert (code, err.strip()) == (2, SERVE)
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize(("args", "module", "reload", "by"), [
    (("jobs",), "httpx", ("gpualloc.service.client",),
     "the service client (gpualloc submit, jobs, logs, cancel, policy, whoami)"),
    (("user", "list"), "sqlalchemy", ("gpualloc.service.store",),
     "the service's store (gpualloc serve, gpualloc user)"),
])
def test_client_and_store_commands_without_the_extra(cli, monkeypatch, tmp_path, args, module, reload, by):
    monkeypatch.chdir(tmp_path)
    hide(monkeypatch, module, reload=reload)
    code, err = cli(*args)
    assert (code, err.strip()) == (2, f"error: {by} needs the 'service' extra: pip install 'gpualloc[service]'")


def test_ray_executor_and_ray_backend_without_ray(monkeypatch):
    from gpualloc.parallel import RayExecutor
    from gpualloc.service.backends import RayBackend
    from gpualloc.service.errors import BackendError

    hide(monkeypatch, "ray")
    with pytest.raises(ExtraMissingError, match=r"^the Ray executor \(--ray, --ray-address\) needs the 'ray' extra"):
        RayExecutor()
    with pytest.raises(BackendError, match=r"^gpualloc serve --backend ray needs the 'ray' extra"):
        RayBackend({}, "test")


def _pyproject_extras() -> dict[str, set[str]]:
    """Each extra of pyproject.toml -> the distributions it installs, ``gpualloc[...]`` expanded."""
    raw = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        out = set()
        for req in raw[extra]:
            name = req.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()
            if name.startswith("gpualloc["):
                for sub in name[len("gpualloc["):-1].split(","):
                    out |= names(sub.strip())
            else:
                out.add(name.split("[")[0].lower().replace("_", "-"))
        return out

    return {extra: names(extra) for extra in raw}


def test_extras_agree_with_pyproject():
    declared = _pyproject_extras()
    assert set(EXTRAS) <= set(declared)
    assert set(declared["all"]) >= set().union(*(declared[e] for e in EXTRAS)) | declared["test"]
    provides = metadata.packages_distributions()  # import name -> distributions (from what is installed)
    core = {d.split(";")[0].split(">")[0].split("=")[0].strip().lower()
            for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    for extra, modules in EXTRAS.items():
        for module in modules:
            dists = {d.lower().replace("_", "-") for d in provides.get(module, [])}
            assert dists & declared[extra], f"{extra}: {module} comes from {dists}, not from the extra"
            assert not dists & core, f"{module} is in the core dependencies, not only in {extra!r}"


def test_every_import_of_an_extra_goes_through_the_helper():
    """A module importing a package of an extra also uses ``require`` or ``missing_extra``."""
    optional = {m for modules in EXTRAS.values() for m in modules}
    pattern = re.compile(rf"^\s*(?:import|from)\s+({'|'.join(optional)})\b", re.MULTILINE)
    unguarded = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        found = set(pattern.findall(text))
        names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)} if found else set()
        if found and not names & {"require", "missing_extra"}:
            unguarded.append(f"{path.relative_to(SRC.parent)}: imports {', '.join(sorted(found))}")
    assert unguarded == []
