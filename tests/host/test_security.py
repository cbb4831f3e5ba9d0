"""CURVE authentication, host limits, idle-session reaping and exposure warnings."""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest
from helpers import keygen, wait_for_text

from envserver import client
from envserver.curve.keys import exposure_warnings
from envserver.errors import HostUnavailableError, LimitError
from envserver.testing import start_host
from envserver.wire.reach import zeromq_mechanism


@pytest.fixture(scope="module")
def curve_host(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys")
    authorized = tmp_path_factory.mktemp("authorized")
    server_public, server_secret = keygen(keys, "server")
    good_public, good_secret = keygen(keys, "trainer")
    _, bad_secret = keygen(keys, "stranger")
    (authorized / "trainer.key").write_bytes(good_public.read_bytes())
    host = start_host(
        tmp_path_factory.mktemp("curve-host"),
        "--curve-secret-key",
        str(server_secret),
        "--authorized-keys",
        str(authorized),
        bind="tcp://127.0.0.1:*",
    )
    yield host, server_public, good_secret, bad_secret
    host.stop()


def test_authorized_client_works(curve_host):
    host, server_public, good_secret, _ = curve_host
    envs = client.make_vec(
        "CartPole-v1",
        num_envs=2,
        hosts=[host.endpoint],
        vector_kwargs={"curve_server_key": server_public, "curve_client_key": good_secret},
    )
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 4)
        assert envs.step(np.zeros(2, dtype=np.int64))[0].shape == (2, 4)
    finally:
        envs.close()
    ping = subprocess.run(
        [sys.executable, "-m", "envserver", "ping", host.endpoint, "--curve-server-key",
         str(server_public), "--curve-client-key", str(good_secret)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ping.returncode == 0, ping.stderr


def test_keys_from_the_environment_reach_a_curve_host(curve_host, monkeypatch):
    """A script that names no hosts and no keys, as a trainer container runs it."""
    host, server_public, good_secret, _ = curve_host
    settings = {
        "ENVSERVER_HOSTS": host.endpoint,
        "ENVSERVER_CURVE_SERVER_KEY": str(server_public),
        "ENVSERVER_CURVE_CLIENT_KEY": str(good_secret),
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    envs = client.make_vec("CartPole-v1", 2)
    try:
        assert list(envs.hosts) == [host.endpoint]
        assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        envs.close()
    ping = subprocess.run(
        [sys.executable, "-m", "envserver", "ping"], capture_output=True, text=True, timeout=60
    )
    assert ping.returncode == 0, ping.stderr
    monkeypatch.delenv("ENVSERVER_CURVE_CLIENT_KEY")  # the server key alone is not enough
    with pytest.raises(ValueError, match="CURVE needs both"):
        client.make_vec("CartPole-v1", 1)


def test_unknown_key_is_refused(curve_host):
    host, server_public, _, bad_secret = curve_host
    with pytest.raises(HostUnavailableError, match="refused this client's CURVE key"):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=[host.endpoint],
            vector_kwargs={"curve_server_key": server_public, "curve_client_key": bad_secret},
        )


def test_plaintext_client_is_refused(curve_host):
    host, *_ = curve_host
    with pytest.raises(HostUnavailableError, match="uses CURVE and this client does not"):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=[host.endpoint],
            vector_kwargs={"connect_timeout_s": 30.0},
        )


def test_wrong_server_key_is_told_apart_from_a_host_that_is_down(curve_host):
    host, server_public, good_secret, _ = curve_host
    assert zeromq_mechanism(host.endpoint) == "CURVE"  # how it is told apart
    not_the_hosts = server_public.parent / "trainer.key"
    with pytest.raises(HostUnavailableError, match="server key given to this client is not"):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=[host.endpoint],
            vector_kwargs={
                "curve_server_key": not_the_hosts,
                "curve_client_key": good_secret,
                "connect_timeout_s": 30.0,
            },
        )


def test_curve_client_of_a_plain_host_is_refused(plain_hosts, curve_host):
    _, server_public, good_secret, _ = curve_host
    with pytest.raises(HostUnavailableError, match="does not use CURVE, but this client does"):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=[plain_hosts[2]],  # the TCP one
            vector_kwargs={
                "curve_server_key": server_public,
                "curve_client_key": good_secret,
                "connect_timeout_s": 30.0,
            },
        )


def test_curve_needs_authorized_keys(tmp_path):
    _, secret = keygen(tmp_path, "server")
    result = subprocess.run(
        [sys.executable, "-m", "envserver", "serve", "--curve-secret-key", str(secret)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "authorized" in result.stderr


@pytest.mark.parametrize(
    ("bind", "curve", "pickle", "count"),
    [
        ("tcp://127.0.0.1:5555", False, True, 0),
        ("ipc:///tmp/x.sock", False, True, 0),
        ("tcp://0.0.0.0:5555", True, True, 0),
        ("tcp://0.0.0.0:5555", False, False, 1),
        ("tcp://*:5555", False, True, 2),
        ("tcp://10.1.2.3:5555", False, True, 2),
    ],
)
def test_exposure_warnings(bind, curve, pickle, count):
    assert len(exposure_warnings(bind, curve, pickle)) == count


@pytest.mark.xdist_group("loopback-port")  # an ephemeral port on every address: see test_discovery
def test_serve_warns_loudly_on_exposed_pickle(tmp_path):
    host = start_host(tmp_path, "--allow-pickle", bind="tcp://0.0.0.0:*")
    try:
        log = host.log_text()
        assert "WARNING" in log and "run any code" in log
    finally:
        host.stop()


def test_host_limits(tmp_path):
    host = start_host(tmp_path, "--max-sessions", "2", "--max-envs-per-session", "3",
                      "--max-envs", "4")  # fmt: skip
    opened = []
    try:
        with pytest.raises(LimitError, match="at most 3 per session"):
            client.make_vec("CartPole-v1", num_envs=4, hosts=[host.endpoint])
        opened.append(client.make_vec("CartPole-v1", num_envs=3, hosts=[host.endpoint]))
        with pytest.raises(LimitError, match="maximum of 4"):
            client.make_vec("CartPole-v1", num_envs=2, hosts=[host.endpoint])
        opened.append(client.make_vec("CartPole-v1", num_envs=1, hosts=[host.endpoint]))
        with pytest.raises(LimitError, match="sessions") as caught:
            client.make_vec("CartPole-v1", num_envs=1, hosts=[host.endpoint])
        assert str(caught.value).count(host.endpoint) == 1  # named once, by the client
        for envs in opened:
            assert envs.reset(seed=0)[0].shape[1] == 4  # the others keep working
    finally:
        for envs in opened:
            envs.close()
        host.stop()


def test_idle_sessions_are_reaped(tmp_path):
    host = start_host(tmp_path, "--session-idle-timeout", "0.5", "--max-sessions", "1")
    try:
        abandoned = client.make_vec("CartPole-v1", num_envs=1, hosts=[host.endpoint])
        abandoned._hosts.pool.connections[0].close()  # a client that vanished without closing
        wait_for_text(host.log_text, "idle for")  # the idle session is reaped
        fresh = client.make_vec("CartPole-v1", num_envs=1, hosts=[host.endpoint])
        assert fresh.reset(seed=0)[0].shape == (1, 4)
        fresh.close()
    finally:
        host.stop()


# ------------------------------------------------ diagnostics: ping, and the host's log


def ping(endpoint, *args):
    return subprocess.run(
        [sys.executable, "-m", "envserver", "ping", endpoint, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ping_says_why_a_curve_host_stays_silent(curve_host, tmp_path):
    host, server_public, good_secret, bad_secret = curve_host
    not_the_server_key, _ = keygen(tmp_path, "impostor")
    cases = [
        (
            (),
            "uses CURVE and this client does not (give both sides keys, or neither); "
            "pass --curve-server-key",
        ),
        (
            ("--curve-server-key", server_public, "--curve-client-key", bad_secret),
            "refused this client's CURVE key (it is not in the host's authorized keys)",
        ),
        (
            ("--curve-server-key", not_the_server_key, "--curve-client-key", good_secret),
            "closed the CURVE handshake: the server key given to this client is not the host's",
        ),
    ]
    for args, reason in cases:
        result = ping(host.endpoint, "--timeout", 60, *args)  # a refusal ends the wait early
        assert result.returncode == 1
        line = f"envserver ping: {host.endpoint}: the host {reason}"
        assert result.stderr.startswith(line) and result.stderr.count("\n") == 1, result.stderr


def test_ping_with_curve_against_a_plain_host(plain_hosts, curve_host):
    _, server_public, good_secret, _ = curve_host
    result = ping(plain_hosts[2], "--timeout", 60, "--curve-server-key", server_public,
                  "--curve-client-key", good_secret)  # fmt: skip
    assert result.returncode == 1
    assert "does not use CURVE, but this client does" in result.stderr, result.stderr


def test_ping_a_host_that_accepts_but_never_answers():
    import zmq

    context = zmq.Context()
    silent = context.socket(zmq.ROUTER)
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        result = ping(f"tcp://127.0.0.1:{port}", "--timeout", 0.5)
    finally:
        silent.close(linger=0)
        context.term()
    assert result.returncode == 1
    assert "within 0.5 s: the host accepted the connection but has not answered" in result.stderr


def test_ping_nobody_says_nothing_listens():
    result = ping("ipc:///nonexistent/envserver.sock", "--timeout", 0.3)
    assert result.returncode == 1
    assert "no host listens there" in result.stderr


def test_host_logs_refused_clients_once_per_key_and_kind(tmp_path):
    keys = tmp_path / "keys"
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    server_public, server_secret = keygen(keys, "server")
    stranger_public, stranger_secret = keygen(keys, "stranger")
    host = start_host(tmp_path, "--curve-secret-key", str(server_secret),
                      "--authorized-keys", str(authorized), bind="tcp://127.0.0.1:*")  # fmt: skip
    try:
        for _ in range(3):
            assert ping(host.endpoint, "--curve-server-key", server_public,
                        "--curve-client-key", stranger_secret).returncode == 1  # fmt: skip
            assert ping(host.endpoint, "--timeout", 30).returncode == 1
        stranger_key = zmq_public_key(stranger_public)
        log = wait_for_text(host.log_text, "without CURVE (plaintext)")  # the monitor may be last
        refused = [line for line in log.splitlines() if "refused a client" in line]
        assert len(refused) == 1, log  # rate-limited: one line per key and minute
        assert stranger_key in refused[0] and "from 127.0.0.1" in refused[0]
        assert "WARNING" in refused[0]
        # A plaintext attempt is logged as a mismatch, or, when the client saw the mismatch
        # first and closed before naming its mechanism, as a connection closed in the
        # handshake (envserver/curve/guard.py); each kind at most once a minute.
        plaintext = log.count("a client without CURVE (plaintext) tried to connect")
        closed = log.count("a client closed the connection during the handshake")
        assert plaintext <= 1 and closed <= 1 and plaintext + closed >= 1, log
    finally:
        host.stop()


def test_host_logs_a_client_that_closes_during_the_handshake(tmp_path):
    """What a plaintext client that saw the mismatch first looks like to a CURVE host."""
    keys = tmp_path / "keys"
    authorized = tmp_path / "authorized"
    authorized.mkdir()
    _, server_secret = keygen(keys, "server")
    host = start_host(tmp_path, "--curve-secret-key", str(server_secret),
                      "--authorized-keys", str(authorized), bind="tcp://127.0.0.1:*")  # fmt: skip
    try:
        assert plaintext_client(host.endpoint, gives_up=True)[12:17] == b"CURVE"
        log = wait_for_text(host.log_text, "closed the connection during the handshake")
        [line] = [line for line in log.splitlines() if "during the handshake" in line]
        assert "WARNING" in line and "without CURVE (plaintext)" in line, log
        assert "--curve-server-key" in line
    finally:
        host.stop()


def test_a_look_at_the_port_is_not_logged_as_a_client(tmp_path, caplog):
    """zeromq_mechanism's look resets its connection; a client that gives up closes it."""
    import logging

    import zmq

    from envserver.curve.guard import CurveGuard

    _, server_secret = keygen(tmp_path / "keys", "server")
    (tmp_path / "authorized").mkdir()
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    guard = CurveGuard(context, router, str(server_secret), str(tmp_path / "authorized"), 0.0)
    try:
        endpoint = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
        with caplog.at_level(logging.WARNING, logger="envserver.curve.guard"):
            assert zeromq_mechanism(endpoint, timeout_s=30.0) == "CURVE"
            plaintext_client(endpoint, gives_up=True)
            plaintext_client(endpoint, gives_up=False)  # its mismatch is seen last
            wait_for_text(lambda: caplog.text, "(plaintext) tried to connect")
        # Every event is logged here (no rate limit), in order: the look would come first.
        assert caplog.text.count("closed the connection during the handshake") == 1, caplog.text
    finally:
        router.close(linger=0)
        guard.close()
        context.term()


def plaintext_client(endpoint, gives_up):
    """A plaintext ZMTP 3 client, byte by byte as libzmq is; returns the host's greeting.

    It sends its signature and major version and reads the host's whole greeting. One that
    ``gives_up`` then closes (as libzmq does when that greeting came in one read: the mismatch
    found before its own mechanism was sent); the other sends the rest, naming NULL.
    """
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    greeting = b""
    with socket.create_connection((host, int(port)), timeout=30) as peer:
        peer.sendall(b"\xff" + bytes(8) + b"\x7f\x03")
        while len(greeting) < 64 and (chunk := peer.recv(64 - len(greeting))):
            greeting += chunk
        if not gives_up:
            peer.sendall(b"\x01" + b"NULL".ljust(20, b"\0") + bytes(32))
            while peer.recv(64):  # until the host closes the connection
                pass
    return greeting


def zmq_public_key(path):
    import zmq.auth

    public, _ = zmq.auth.load_certificate(path)
    return public.decode()


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_rate_limited_log_counts_what_it_leaves_out(caplog):
    import logging

    from envserver.curve.guard import MAX_TRACKED_KEYS, OVERFLOW_KEY, RateLimitedLog

    clock = FakeClock()
    log = RateLimitedLog(logging.getLogger("test.auth"), interval_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.auth"):
        assert log.warning("key-a", "refused a", client="10.0.0.1")
        assert caplog.records[-1].client == "10.0.0.1"
        for _ in range(5):
            clock.now += 1.0
            assert not log.warning("key-a", "refused a")
        assert log.warning("key-b", "refused b")  # another key has its own budget
        clock.now += 60.0
        assert log.warning("key-a", "refused a")
        assert [r.getMessage() for r in caplog.records] == [
            "refused a",
            "refused b",
            "refused a (5 more like it since the last such line)",
        ]
        # A flood of fresh keys cannot grow the state without bound: beyond the bound they share
        # one budget.
        caplog.clear()
        logged = sum(log.warning(f"scan-{i}", "refused") for i in range(MAX_TRACKED_KEYS + 50))
        assert logged == MAX_TRACKED_KEYS - 2 + 1  # 2 keys tracked already, then the shared one
        assert len(log._last) <= MAX_TRACKED_KEYS + 1 and OVERFLOW_KEY in log._last
