"""The conformance suite's options and fixtures (pytest loads this file with the suite).

Options:
    ``--conformance-endpoint ENDPOINT``: the host to test; without it, a local ``envserver
    serve`` is started on a loopback TCP port (with a 1 MiB message bound, so that bound is
    tested too) and stopped afterwards.
    ``--conformance-curve-server-key FILE`` / ``--conformance-curve-client-key FILE``: CURVE.
    ``--conformance-timeout SECONDS``: how long to wait for each reply (default 30).
    ``--conformance-parallel-env SPEC``: the Parallel env the multi-agent tests make (default
    ``envserver.testing.agents``: the host must serve it as that module does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from envserver.conformance.wire import Wire, WireReply
from envserver.curve.keys import load_curve_keys
from envserver.wire.messages import Command

#: The env every test makes: registered with Gymnasium, no extra dependency.
ENV_ID = "CartPole-v1"
#: The Parallel env the multi-agent tests make: agents that leave and join, on a known script.
PARALLEL_ENV = "envserver.testing.agents"
#: The message bound of the local host started when no endpoint is given.
LOCAL_MAX_MESSAGE_BYTES = 1 << 20


def pytest_addoption(parser: pytest.Parser) -> None:
    """Adds the suite's options."""
    group = parser.getgroup("envserver-conformance")
    group.addoption("--conformance-endpoint", help="the host to test (default: start one)")
    group.addoption("--conformance-curve-server-key", help="the host's CURVE public key file")
    group.addoption("--conformance-curve-client-key", help="this client's CURVE secret key file")
    group.addoption(
        "--conformance-timeout", type=float, default=30.0, help="seconds to wait for a reply"
    )
    group.addoption(
        "--conformance-parallel-env",
        default=PARALLEL_ENV,
        help="the Parallel env of the multi-agent tests (default: %(default)s)",
    )


@pytest.fixture(scope="session")
def conformance_endpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The endpoint under test: the one given, or a local host started for the session."""
    endpoint = request.config.getoption("--conformance-endpoint")
    if endpoint:
        yield endpoint
        return
    from envserver.testing import start_host

    host = start_host(
        tmp_path_factory.mktemp("conformance-host"),
        "--max-message-bytes",
        str(LOCAL_MAX_MESSAGE_BYTES),
        bind="tcp://127.0.0.1:*",
    )
    try:
        yield host.endpoint
    finally:
        host.stop()


@pytest.fixture(scope="session")
def open_wire(request: pytest.FixtureRequest, conformance_endpoint: str) -> Callable[[], Wire]:
    """Opens a new connection to the endpoint (the caller closes it)."""
    curve = load_curve_keys(
        request.config.getoption("--conformance-curve-server-key"),
        request.config.getoption("--conformance-curve-client-key"),
    )
    timeout_s = request.config.getoption("--conformance-timeout")
    return lambda: Wire(conformance_endpoint, curve=curve, timeout_s=timeout_s)


@pytest.fixture
def wire(open_wire: Callable[[], Wire]) -> Iterator[Wire]:
    """A connection to the endpoint."""
    with open_wire() as connection:
        yield connection


@pytest.fixture(scope="session")
def host_info(open_wire: Callable[[], Wire]) -> dict[str, Any]:
    """The endpoint's PING reply."""
    with open_wire() as connection:
        return connection.request(Command.PING, {}).ok()


@dataclass
class Session:
    """A session on the endpoint, over one connection.

    Attributes:
        wire: The connection.
        session_id: The id HELLO returned.
    """

    wire: Wire
    session_id: bytes

    def request(self, command: int, body: Any = None, **kwargs: Any) -> WireReply:
        """Sends a request in this session and receives its reply."""
        return self.wire.request(command, body, session=self.session_id, **kwargs)

    def make(self, num_envs: int = 2, **body: Any) -> dict[str, Any]:
        """MAKE ``num_envs`` CartPole envs; returns the OK reply's body."""
        body = {"env_id": ENV_ID, "kwargs": None, "num_envs": num_envs, **body}
        return self.request(Command.MAKE, body).ok()


@pytest.fixture
def session(wire: Wire) -> Iterator[Session]:
    """A new session without envs; closed afterwards."""
    opened = Session(wire, wire.hello())
    yield opened
    opened.request(Command.CLOSE)


@pytest.fixture
def envs(session: Session) -> Session:
    """A session holding two CartPole envs."""
    session.make(2)
    return session
