"""The public surface: one sorted ``__all__`` per package, every name importable."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import client
import envserver


@pytest.mark.parametrize("package", [envserver, client], ids=lambda p: p.__name__)
def test_exports_are_unique_and_importable(package):
    assert len(set(package.__all__)) == len(package.__all__)
    for name in package.__all__:
        assert hasattr(package, name), name


@pytest.mark.parametrize(
    "module",
    sorted(
        m.name
        for m in pkgutil.iter_modules(envserver.__path__)
        if not m.ispkg and m.name != "__main__"
    ),
)
def test_every_module_declares_all(module):
    loaded = importlib.import_module(f"envserver.{module}")
    assert loaded.__all__, module
    for name in loaded.__all__:
        assert hasattr(loaded, name), f"envserver.{module}.{name}"


def test_client_errors_are_the_envserver_errors():
    assert client.HostUnavailableError is envserver.HostUnavailableError
    assert issubclass(client.HostUnavailableError, ConnectionError)
    assert issubclass(client.WaitTimeoutError, TimeoutError)
    assert issubclass(client.RemoteEnvError, envserver.EnvServerError)


def test_protocol_module_has_no_host_imports():
    import ast
    import inspect

    from envserver import protocol

    tree = ast.parse(inspect.getsource(protocol))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(name and ("host" in name or "worker" in name) for name in imported)
