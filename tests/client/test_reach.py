"""Hosts that cannot be reached: told apart by cause, reported while waiting, never a silent wait.

Nothing listening, a listener that accepts and closes (a proxy or port forward with no host
behind it), a name that does not resolve, and a host that is down during recovery; the CURVE
mismatches are in test_security.py.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import zmq
from helpers import keygen, refused_port

from envserver import client
from envserver.errors import HostUnavailableError
from envserver.testing import start_host
from envserver.wire import reach as reach_module
from envserver.wire.reach import Reachability, zeromq_mechanism


@contextlib.contextmanager
def accept_and_close() -> Iterator[int]:
    """A TCP port whose listener accepts every connection and closes it at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                connection, _ = listener.accept()
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def test_nothing_listening_is_named_and_progress_is_logged(caplog):
    caplog.set_level(logging.WARNING, logger="envserver.client")
    started = time.monotonic()
    with refused_port() as port, pytest.raises(HostUnavailableError) as caught:
        endpoint = f"tcp://127.0.0.1:{port}"
        client.make_vec(
            "CartPole-v1", num_envs=1, hosts=[endpoint], vector_kwargs={"connect_timeout_s": 8}
        )
    assert time.monotonic() - started < 60  # bounded by connect_timeout_s, not a hang
    assert "could not be reached for 8 s" in str(caught.value)
    assert "connections refused: no host listens there" in str(caught.value)
    progress = [r.getMessage() for r in caplog.records if "not reached after" in r.getMessage()]
    assert progress and endpoint in progress[0] and "still trying" in progress[0]
    # where the option goes: make_vec's vector_kwargs, or the constructor
    assert "vector_kwargs={'connect_timeout_s': " in progress[0]
    assert "RemoteVectorEnv(..., connect_timeout_s=" in progress[0]


@pytest.mark.slow
@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_accepted_then_closed_is_not_called_a_curve_mismatch(tmp_path, curve):
    kwargs = {"connect_timeout_s": 6}
    if curve:
        server_public, _ = keygen(tmp_path, "server")
        _, client_secret = keygen(tmp_path, "trainer")
        kwargs |= {"curve_server_key": server_public, "curve_client_key": client_secret}
    with accept_and_close() as port, pytest.raises(HostUnavailableError) as caught:
        client.make_vec(
            "CartPole-v1", num_envs=1, hosts=[f"tcp://127.0.0.1:{port}"], vector_kwargs=kwargs
        )
    message = str(caught.value)
    assert "accepted and then closed" in message
    assert "CURVE" not in message and "key" not in message


def test_a_name_that_does_not_resolve_fails_at_once():
    started = time.monotonic()
    with pytest.raises(HostUnavailableError, match="does not resolve") as caught:
        client.make_vec("CartPole-v1", num_envs=1, hosts=["tcp://no-such-host.invalid:5555"])
    assert "no-such-host.invalid" in str(caught.value)
    assert time.monotonic() - started < 30  # not the 60 s connect timeout


def test_greeting_probe(tmp_path):
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    try:
        assert zeromq_mechanism(host.endpoint) == "NULL"
        with accept_and_close() as port:
            assert zeromq_mechanism(f"tcp://127.0.0.1:{port}") == ""
        with refused_port() as port:
            assert zeromq_mechanism(f"tcp://127.0.0.1:{port}") == ""
        assert zeromq_mechanism("ipc:///tmp/x.sock") is None
    finally:
        host.stop()


@pytest.mark.slow
def test_a_host_down_during_recovery_is_reported_as_down(tmp_path, caplog):
    """Also in the log: its attempts, refused at once and tried again, warned about once."""
    caplog.set_level(logging.INFO, logger="envserver.client")
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=[host.endpoint],
        vector_kwargs={"on_host_failure": "restart", "restart_timeout_s": 4},
    )
    try:
        envs.reset(seed=0)
        host.stop(signal.SIGKILL)
        with pytest.raises(HostUnavailableError) as caught:
            envs.step(np.zeros(2, dtype=np.int64))
        message = str(caught.value)
        assert "could not be recovered within 4 s" in message
        assert "no host listens there" in message
        assert "on_host_failure" not in message  # it recovers: no hint to
        attempts = [r for r in caplog.records if r.getMessage().startswith("recovery attempt")]
        assert len(attempts) > 1 and all("no host listens there" in r.message for r in attempts)
        assert [r.levelno for r in attempts] == [logging.WARNING] + [logging.INFO] * (
            len(attempts) - 1
        )
        assert "CURVE" not in message and "handshake" not in message
    finally:
        envs.close()


def test_a_look_that_did_not_tell_is_taken_again_at_the_next_closed_handshake():
    """A host too busy to greet within the look's second is looked at again: a wrong server
    key is then told apart from a host that accepts and closes (it used to be one look)."""
    listener = socket.create_server(("127.0.0.1", 0))
    curve_greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"CURVE".ljust(20, b"\0")
    curve_greeting = curve_greeting.ljust(64, b"\0")
    looks = []

    def serve() -> None:
        listener.settimeout(2 * reach_module.PROBE_TIMEOUT_S + 1)
        for look in range(3):  # a third look would be counted
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                return
            with connection:
                looks.append(look)
                if look == 0:  # busy: no greeting within the look's second
                    connection.recv(64)
                    time.sleep(reach_module.PROBE_TIMEOUT_S + 0.5)
                else:
                    connection.sendall(curve_greeting)
                    connection.recv(64)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        endpoint = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        reach = Reachability(endpoint, uses_curve=True)
        for expected_looks in (1, 2):
            reach.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, errno.ECONNRESET)
            reach.diagnose()
            assert len(looks) == expected_looks
        assert reach.refusal is not None and "server key" in reach.refusal
        reach.on_event(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, errno.ECONNRESET)
        reach.diagnose()  # it told: no third look
        thread.join(10)
        assert len(looks) == 2
    finally:
        thread.join(10)
        listener.close()
