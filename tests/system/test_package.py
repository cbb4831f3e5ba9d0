"""The public surface: each package's ``__all__`` pinned, every module's declared, every name
importable."""

from __future__ import annotations

import importlib

import pytest
from helpers import package_modules

import envserver
from envserver import client
from envserver.client import aio

ERRORS = [
    "BatchTypeError",
    "EnvLostError",
    "EnvNotAllowedError",
    "EnvServerError",
    "HostUnavailableError",
    "LimitError",
    "MessageTooLargeError",
    "PickleNotAllowedError",
    "ProtocolError",
    "ProtocolVersionError",
    "RemoteEnvError",
    "RequestTimeoutError",
    "StateMismatchError",
    "UnknownSessionError",
    "UnsupportedSpaceError",
    "UnsupportedStateError",
    "WaitTimeoutError",
]
#: The public surface, pinned: a name added to or dropped from it is a decision this list
#: records (ruff's RUF022 keeps each ``__all__`` sorted).
EXPORTS = {
    envserver: ["PROTOCOL_VERSION", *ERRORS, "__version__"],
    client: [
        "AsyncState",
        *ERRORS[:4],
        "FlatAgentsVectorEnv",
        *ERRORS[4:7],
        "MultiAgentVectorEnv",
        *ERRORS[7:11],
        "RemoteVectorEnv",
        *ERRORS[11:],
        "derived_seed",
        "make_vec",
    ],
    aio: ["AsyncEnv", "EnvLostError", "EnvPool", "PoolStats"],
}


@pytest.mark.parametrize("package", list(EXPORTS), ids=lambda p: p.__name__)
def test_exports_are_pinned_and_importable(package):
    assert package.__all__ == EXPORTS[package]
    for name in package.__all__:
        assert hasattr(package, name), name


@pytest.mark.parametrize(
    "module",
    sorted(
        name
        for name, path in package_modules().items()
        if path.name not in ("__init__.py", "__main__.py")
        and not name.startswith(("envserver.client", "envserver.conformance"))
    ),
)
def test_every_module_declares_all(module):
    loaded = importlib.import_module(module)
    assert loaded.__all__, module
    for name in loaded.__all__:
        assert hasattr(loaded, name), f"{module}.{name}"


def test_client_errors_are_the_envserver_errors():
    assert client.HostUnavailableError is envserver.HostUnavailableError
    assert issubclass(client.HostUnavailableError, ConnectionError)
    assert issubclass(client.WaitTimeoutError, TimeoutError)
    assert issubclass(client.RemoteEnvError, envserver.EnvServerError)


def test_protocol_module_has_no_host_imports():
    import ast
    import inspect

    from envserver.wire import messages

    tree = ast.parse(inspect.getsource(messages))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(name and ("host" in name or "worker" in name) for name in imported)


def run_python(code: str, **kwargs) -> str:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, **kwargs
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_host_side_never_imports_the_client():
    # The benchmark uses the client (a contributed command, as rollout is); of it, hosts import
    # only its envs (envserver.bench.envs:bench/Compute-v0).
    names = [
        name
        for name in package_modules()
        if not name.startswith(("envserver.client", "envserver.bench."))
        and not name.endswith("__main__")
    ] + ["envserver.bench.envs"]
    code = f"""
import importlib, sys
names = {names!r}
for name in names:
    importlib.import_module(name)
print(len(names), sorted(m for m in sys.modules
                        if m.split(".")[0] == "client" or m.startswith("envserver.client")))
"""
    count, leaked = run_python(code).split(" ", 1)
    assert int(count) > 20  # every module, conformance suite included
    assert leaked.strip() == "[]"


def test_the_built_in_commands_never_import_the_client(tmp_path):
    code = f"""
import sys
from envserver.cli.app import main
assert main(["keygen", {str(tmp_path)!r}]) == 0
assert main(["ping", "ipc://{tmp_path}/nobody.sock", "--timeout", "0.1"]) == 1
print(sorted(m for m in sys.modules
             if m.split(".")[0] == "client" or m.startswith("envserver.client")))
"""
    assert run_python(code).splitlines()[-1] == "[]"
    assert (tmp_path / "envserver.key").exists()


def test_the_version_is_declared_once():
    # Declared in envserver/__init__.py; pyproject reads it (the wheel test checks the name).
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = Path(envserver.__file__).resolve().parents[1] / "pyproject.toml"
    config = tomllib.loads(pyproject.read_text())
    assert "version" not in config["project"] and "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "envserver.__version__"}
