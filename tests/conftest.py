"""pytest's hooks for this suite, and the fixtures every file may use: real env-host processes.

Helpers that tests import live in ``tests/helpers.py``: a conftest is pytest's, not a module
to import.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import message_faults, running_hosts

import envserver.client._transport.error_replies as replies_module
import envserver.client._transport.raw_step as raw_step_module
import envserver.testing  # noqa: F401  (registers the test envs)
from envserver.errors import EnvServerError


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


@pytest.fixture(autouse=True, scope="session")
def sb3_logs_in_the_sessions_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Stable-Baselines3's logger folder: a directory of the session's, not ``$TMPDIR/SB3-*``.

    ``learn`` configures a logger in ``$SB3_LOGDIR``, or when it is unset in a new directory
    ``SB3-<date and time>`` of the system's temporary one, left behind (empty: the suite's
    models log to stdout at most). Set for the whole session, it reaches the trainer scripts
    and documentation examples the tests run, which inherit the environment. Yields it.
    """
    directory = tmp_path_factory.mktemp("sb3-logs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SB3_LOGDIR", str(directory))
        yield directory


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


@pytest.fixture
def lean_sends(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each lockstep step of the test was sent the lean way (STEP_RAW), in order."""
    sends: list[bool] = []
    original = raw_step_module.RawStep.prepare

    def prepare(self: raw_step_module.RawStep, *args: object) -> object:
        requests = original(self, *args)
        sends.append(requests is not None)
        return requests

    monkeypatch.setattr(raw_step_module.RawStep, "prepare", prepare)
    return sends


@pytest.fixture(autouse=True, scope="session")
def error_messages_name_hosts_once() -> Iterator[list[str]]:
    """Scans the client's error messages of the whole run: none repeats its endpoint, none
    names a local host's socket.

    Each is recorded where it is made: an error of envserver's (``EnvServerError.__init__``), or an
    env's error rebuilt on the trainer (``rebuild_exception`` as the client's
    ``_transport.error_replies`` module calls it). Both are set with ``MonkeyPatch``, which raises
    if the name is gone, and test_errors.py checks that a rebuilt env error is seen: a rename cannot
    turn the scan off unnoticed. Yields the messages recorded so far.
    """
    made: list[str] = []
    original_init = EnvServerError.__init__
    original_rebuild = replies_module.rebuild_exception

    def recording_init(self: EnvServerError, *args: object) -> None:
        made.append(str(args[0]) if args else "")
        original_init(self, *args)

    def recording_rebuild(module: str, name: str, message: str, remote_tb: str) -> BaseException:
        made.append(message)
        return original_rebuild(module, name, message, remote_tb)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EnvServerError, "__init__", recording_init)
        patch.setattr(replies_module, "rebuild_exception", recording_rebuild)
        yield made
    faulty = {message: message_faults(message) for message in made if message_faults(message)}
    assert not faulty, f"error messages that name a host badly: {faulty}"
