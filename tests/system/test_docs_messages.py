"""The messages the docs quote are the real ones: each test makes envserver say a message, for
real (a command, a host, a vector env), and checks that a page quotes it verbatim.

A quote may leave part of the message out with ``...`` (or ``…``), and a page wraps it as
prose (whitespace is compared as one space). Where a page's example names another address than
the test's, the test says which it puts in its place.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
import zmq
from helpers import ROOT, keygen, wait_for_text

from envserver import client
from envserver.errors import HostUnavailableError
from envserver.launch.environment import HostChoice
from envserver.testing import start_host
from envserver.wire.messages import Command, Status, decode_reply, encode_request

DOCS = ROOT / "docs"
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("ENVSERVER_")}
TIMEOUT_MS = 30_000


def one_space(text: str) -> str:
    return " ".join(text.split())


def assert_quoted(page: str, quote: str, message: str) -> None:
    """``page`` quotes ``quote``, which is ``message`` or a part of it (``...`` elides)."""
    assert one_space(quote) in one_space((DOCS / page).read_text()), f"{page} lost {quote!r}"
    parts = re.split(r"\s*(?:\.\.\.|…)\s*", one_space(quote))
    pattern = ".*?".join(re.escape(part) for part in parts)
    assert re.search(pattern, one_space(message)), (
        f"{page} quotes {quote!r}, but the message is {message!r}"
    )


def stderr_of(*args: str, **env: str) -> str:
    """What ``envserver ARGS`` (which must fail) prints on stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "envserver", *args],
        env={**CLEAN, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, result
    return result.stderr.strip()


# ------------------------------------------------------------------ the command line


@pytest.mark.parametrize("page", ["reference/environment.md", "guides/several-machines.md"])
def test_a_variable_serve_cannot_take(page):
    message = stderr_of("serve", ENVSERVER_MAX_SESSIONS="many")
    assert_quoted(page, "envserver serve: ENVSERVER_MAX_SESSIONS='many': must be an", message)
    assert_quoted(page, message, message)


def test_a_bind_address_that_is_not_one():
    message = stderr_of("serve", "--bind", "tcp://127.0.0.1:99999")
    assert_quoted("reference/cli.md", message, message)


def test_a_malformed_host_list():
    message = stderr_of("rollout", "CartPole-v1", "--hosts", "tcp://sim-a:5555,sim-b:5555")
    assert_quoted("reference/environment.md", message, message)


def test_where_the_hosts_came_from():
    """The line the vector env logs at INFO (RemoteVectorEnv logs HostChoice's description)."""
    environ = {
        "ENVSERVER_HOSTS": "dns://envhost:5555",
        "ENVSERVER_MIN_HOSTS": "3",
        "ENVSERVER_CURVE_SERVER_KEY": "keys/server.key",
    }
    message = HostChoice.of(None, environ=environ).describe()
    quote = (
        "hosts from ENVSERVER_HOSTS: dns://envhost:5555 (also from the environment: "
        "ENVSERVER_MIN_HOSTS, ...)"
    )
    assert_quoted("guides/several-machines.md", quote, message)


# ------------------------------------------------------------------ hosts and what they log


def ask(endpoint: str, *requests: tuple) -> list:
    """Sends each ``(command, body, allow_pickle)`` in turn, in the session a HELLO opened."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    replies = []
    session = None
    try:
        for request_id, (command, body, allow_pickle) in enumerate(requests, 1):
            sock.send_multipart(
                encode_request(request_id, command, session, body, allow_pickle=allow_pickle)
            )
            assert sock.poll(TIMEOUT_MS), "the host did not answer"
            replies.append(decode_reply(sock.recv_multipart(), allow_pickle=False))
            if command is Command.HELLO:
                session = replies[-1].body["session"]
    finally:
        sock.close()
        context.term()
    return replies


def test_pickled_data_sent_to_a_host_that_refuses_it(plain_hosts):
    _, made = ask(
        plain_hosts[0],
        (Command.HELLO, {"client": "test"}, False),
        (Command.MAKE, {"factories": [dict]}, True),
    )
    assert made.status == Status.ERROR and made.body["type"] == "PickleNotAllowedError"
    assert_quoted("protocol.md", "this host refuses pickled data …", made.body["message"])


def test_a_host_that_switches_its_envs_to_threads(tmp_path):
    """Envs that sleep: after a few steps the host steps them at once, and logs it."""
    host = start_host(tmp_path)
    envs = client.make_vec(
        "envserver.testing:envserver/Jitter-v0",
        8,
        hosts=[host.endpoint],
        step_s=0.002,
        slow_prob=0.0,
    )
    try:
        envs.reset(seed=0)
        for _ in range(100):
            envs.step(envs.action_space.sample())
            if "at once on threads" in host.log_text():
                break
        log = wait_for_text(host.log_text, "at once on threads")
    finally:
        envs.close()
        host.stop()
    (line,) = [line for line in log.splitlines() if "at once on threads" in line]
    quote = "session ...: its 8 envs wait: now stepped 8 at once on threads"
    assert_quoted("guides/env-threads.md", quote, line)


@pytest.fixture(scope="module")
def curve_host(tmp_path_factory):
    """A CURVE host over TCP that authorizes one key; a key it does not authorize."""
    keys = tmp_path_factory.mktemp("keys")
    authorized = tmp_path_factory.mktemp("authorized")
    server_public, server_secret = keygen(keys, "server")
    _, stranger_secret = keygen(keys, "stranger")
    trainer_public, _ = keygen(keys, "trainer")
    (authorized / "trainer.key").write_bytes(trainer_public.read_bytes())
    host = start_host(
        tmp_path_factory.mktemp("curve-host"),
        "--curve-secret-key",
        str(server_secret),
        "--authorized-keys",
        str(authorized),
        bind="tcp://127.0.0.1:*",
    )
    yield host, server_public, stranger_secret
    host.stop()


def test_a_client_whose_key_is_not_authorized(curve_host):
    host, server_public, stranger_secret = curve_host
    with pytest.raises(HostUnavailableError):
        client.make_vec(
            "CartPole-v1",
            num_envs=1,
            hosts=[host.endpoint],
            vector_kwargs={"curve_server_key": server_public, "curve_client_key": stranger_secret},
        )
    log = wait_for_text(host.log_text, "is not in the authorized keys")
    (line,) = {line.split(" WARNING ", 1)[-1] for line in log.splitlines() if "refused a" in line}
    quote = "refused a client from 10.0.3.7: its CURVE public key ... is not in the authorized keys"
    # The page's example client is at 10.0.3.7; this one is at 127.0.0.1.
    assert_quoted("guides/security.md", quote, line.replace("127.0.0.1", "10.0.3.7"))


def test_a_client_that_closes_during_the_handshake(curve_host):
    """A plaintext ZMTP client that reads the host's greeting, sees CURVE, and gives up."""
    host, *_ = curve_host
    address, port = host.endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((address, int(port)), timeout=30) as peer:
        peer.sendall(b"\xff" + bytes(8) + b"\x7f\x03")  # its signature and major version
        greeting = b""
        while len(greeting) < 64 and (chunk := peer.recv(64 - len(greeting))):
            greeting += chunk
    assert greeting[12:17] == b"CURVE"
    log = wait_for_text(host.log_text, "closed the connection during the handshake")
    (line,) = [line for line in log.splitlines() if "during the handshake" in line]
    quote = (
        "a client closed the connection during the handshake ... most likely a client without "
        "CURVE (plaintext)"
    )
    assert_quoted("guides/security.md", quote, line)


# ------------------------------------------------------------------ what the trainer shows


def test_env_output_cut_to_stay_within_bounds(capfd):
    """More distinct lines in one call than a reply carries: the cut is said."""
    envs = client.make_vec("envserver.testing:envserver/Chatty-v0", 1)
    try:
        capfd.readouterr()
        with pytest.raises(ZeroDivisionError):
            envs.call("shout", "\n".join(f"line {i}" for i in range(212)))
    finally:
        envs.close()
    (line,) = [line for line in capfd.readouterr().err.splitlines() if "cut to stay" in line]
    quote = "(local host 0) cut to stay within bounds: 12 line(s) of env output ..."
    assert_quoted("guides/env-output.md", quote, line)


def test_a_module_serve_cannot_import():
    message = stderr_of("serve", "--import", "myenvs")
    assert_quoted("guides/your-envs.md", message, message)


def test_a_job_spec_outside_a_job():
    message = stderr_of("ping", "slurm://job:5555")
    quote = "slurm://job names the nodes of this Slurm job, but this process runs in none"
    assert_quoted("deployment/slurm.md", quote + " (SLURM_JOB_NODELIST is not set)...", message)
