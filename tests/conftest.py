"""Shared fixtures: real env-host processes on private endpoints, and exact comparisons."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envserver.testing import HostProcess, start_host  # also registers the test envs


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start as it does in a terminal.

    A shell starts a background job (``make test &``, some CI runners) with SIGINT ignored, and
    an ignored signal stays ignored across exec: the trainers and hosts that tests interrupt with
    SIGINT would never see it. A handler of ours is reset to the default in every child instead.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How make test's xdist workers (``--dist loadgroup``) share the tests.

    A file's tests run on one worker, in file order, as in a plain run (its module fixtures
    and its tests' order stay what they were written for), unless an ``xdist_group`` mark says
    otherwise. A test marked slow is a unit of its own and goes first: a minute-long benchmark
    or trainer run that came last would leave the other worker idle at the end, and started
    first the slow tests spread over the workers while the files fill in around them. A plain
    run is left as it is.
    """
    if not hasattr(config, "workerinput"):  # set in xdist workers only
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@contextlib.contextmanager
def running_hosts(
    directory: Path, count: int, *args: str, **kwargs: Any
) -> Iterator[list[HostProcess]]:
    hosts: list[HostProcess] = []
    try:
        for _ in range(count):
            hosts.append(start_host(directory, *args, **kwargs))
        yield hosts
    finally:
        for host in hosts:
            host.stop()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback TCP port that refuses connections, for as long as the block runs.

    A socket holds the port bound without listening: the kernel refuses connections to it, and
    no other process (another test worker) can bind it meanwhile, as it could a port found free
    and let go.
    """
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture(scope="session")
def pickle_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Three hosts that accept pickled factories, shared by the whole session."""
    with running_hosts(tmp_path_factory.mktemp("pickle-hosts"), 3, "--allow-pickle") as hosts:
        yield [h.endpoint for h in hosts]


@pytest.fixture(scope="session")
def plain_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Three hosts started without --allow-pickle (the secure default), one over TCP."""
    directory = tmp_path_factory.mktemp("plain-hosts")
    with (
        running_hosts(directory, 2) as ipc_hosts,
        running_hosts(directory, 1, bind="tcp://127.0.0.1:*") as tcp_hosts,
    ):
        yield [h.endpoint for h in ipc_hosts + tcp_hosts]


def assert_same(actual: Any, expected: Any, path: str = "value") -> None:
    """Exact equality: same types (bool is not int, tuple is not list), dtypes, shapes, values."""
    assert type(actual) is type(expected), f"{path}: {type(actual)} is not {type(expected)}"
    if isinstance(expected, np.ndarray):
        assert actual.dtype.str == expected.dtype.str, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{path}: {actual.shape} != {expected.shape}"
        if expected.dtype == object:
            for index in np.ndindex(expected.shape):
                assert_same(actual[index], expected[index], f"{path}[{index}]")
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=path)
    elif isinstance(expected, np.generic):
        assert actual.dtype.str == expected.dtype.str, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.tobytes() == expected.tobytes(), f"{path}: {actual!r} != {expected!r}"
    elif isinstance(expected, dict):
        assert len(actual) == len(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for (akey, avalue), (ekey, evalue) in zip(actual.items(), expected.items()):
            assert_same(akey, ekey, f"{path} key {ekey!r}")
            assert_same(avalue, evalue, f"{path}[{ekey!r}]")
    elif isinstance(expected, (list, tuple)):  # GraphInstance is a tuple too
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
