"""Session leases: a trainer that is gone (SIGKILL, Ctrl-C, an exit without ``close()``) does
not hold its envs on the hosts; a live one keeps them, idle or busy, over ipc, CURVE, dns:// and
through recovery."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth
from helpers import scrape, wait_for

from envserver import client
from envserver.errors import LimitError
from envserver.testing import HostProcess, start_host
from envserver.wire.messages import Command, Status, decode_reply, encode_request

#: The lease of the hosts here, in seconds: short, so that tests see it pass.
LEASE = "1"
TIMEOUT_S = 60
ENV_ID = "lease_envs:lease/Closing-v0"

ENVS_MODULE = '''
import os
import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ClosingEnv(gym.Env):
    """Leaves a file in ``markers`` when it is closed; each step sleeps ``step_s``."""

    def __init__(self, markers, step_s=0.0):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.markers, self.step_s = markers, step_s

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        time.sleep(self.step_s)
        return np.zeros(2, dtype=np.float32), 1.0, False, False, {}

    def close(self):
        open(os.path.join(self.markers, f"closed-{os.getpid()}-{id(self)}"), "w").close()


gym.register("lease/Closing-v0", entry_point=ClosingEnv)
'''

TRAINER = """
import sys
import time

import numpy as np

from envserver import client

endpoint, markers, ending = sys.argv[1:4]
envs = client.make_vec(
    "lease_envs:lease/Closing-v0", num_envs=2, hosts=[endpoint], markers=markers
)
envs.reset(seed=0)
envs.step(np.zeros(2, dtype=np.int64))
print("ready", flush=True)
if ending == "killed":
    while True:
        time.sleep(60)
if ending == "interrupted":
    while True:
        envs.step(np.zeros(2, dtype=np.int64))
if ending == "frozen":
    sys.stdin.readline()  # the test stops this process, then lets it go on
    try:
        envs.step(np.zeros(2, dtype=np.int64))
    except client.HostUnavailableError as exc:
        print(exc, flush=True)
# ending == "exits": the script ends without envs.close()
"""


@pytest.fixture
def markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the envs of ``ENV_ID`` leave a file each when closed (hosts and trainers find the
    env's module through PYTHONPATH)."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "lease_envs.py").write_text(ENVS_MODULE)
    paths = [str(modules), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.syspath_prepend(str(modules))
    found = tmp_path / "markers"
    found.mkdir()
    return found


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[..., HostProcess]]:
    """Starts hosts (with the short lease and metrics unless told otherwise), stops them after."""
    started: list[HostProcess] = []

    def start(*args: str, bind: str | None = None) -> HostProcess:
        if "--session-lease" not in args:
            args = ("--session-lease", LEASE, *args)
        started.append(start_host(tmp_path / "hosts", "--metrics-port", "0", *args, bind=bind))
        return started[-1]

    yield start
    for host in started:
        host.stop()


def host_info(endpoint: str, curve: dict[str, Path] | None = None) -> dict:
    """The host's answer to PING (its session count, its lease, ...)."""
    context = zmq.Context.instance()
    with context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            sock.curve_serverkey = zmq.auth.load_certificate(curve["server_public"])[0]
            sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(
                curve["trainer_secret"]
            )
        sock.connect(endpoint)
        sock.send_multipart(encode_request(1, Command.PING, None, {}, allow_pickle=False))
        assert sock.poll(TIMEOUT_S * 1000), f"{endpoint} did not answer PING"
        return decode_reply(sock.recv_multipart(), allow_pickle=False).body


def metrics(host: HostProcess) -> dict[tuple[str, tuple], float]:
    """Every sample of the host's metrics, by name and sorted labels."""
    wait_for(lambda: "metrics on http" in host.log_text(), "the host never served metrics")
    return scrape(re.search(r"metrics on (http://\S+)", host.log_text()).group(1))


def evicted(host: HostProcess, reason: str) -> float:
    return metrics(host)[("envserver_sessions_evicted_total", (("reason", reason),))]


def heartbeats(host: HostProcess) -> float:
    key = ("envserver_requests_total", (("command", "heartbeat"), ("status", "ok")))
    return metrics(host).get(key, 0.0)


def start_trainer(tmp_path: Path, endpoint: str, markers: Path, ending: str) -> subprocess.Popen:
    """A trainer process, once its envs are made and have stepped."""
    log = open(tmp_path / f"trainer-{ending}.log", "w")  # noqa: SIM115 (the process writes it)
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, endpoint, str(markers), ending],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    log.close()
    line = trainer.stdout.readline()
    assert line.strip() == "ready", (tmp_path / f"trainer-{ending}.log").read_text()
    return trainer


def closed_envs(markers: Path) -> int:
    return len(list(markers.iterdir()))


def test_a_killed_trainer_s_session_and_envs_are_released_within_the_lease(
    tmp_path, markers, hosts
):
    host = hosts()
    trainer = start_trainer(tmp_path, host.endpoint, markers, "killed")
    assert host_info(host.endpoint)["sessions"] == 1
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(TIMEOUT_S)
    wait_for(
        lambda: host_info(host.endpoint)["sessions"] == 0,
        "the killed trainer's session was never released",
    )
    assert closed_envs(markers) == 2
    assert "nothing heard for 1 s, its lease" in host.log_text()
    assert evicted(host, "lease") == 1 and evicted(host, "idle") == 0


def test_a_trainer_frozen_past_the_lease_loses_its_session_and_is_told_so(tmp_path, markers, hosts):
    host = hosts()
    trainer = start_trainer(tmp_path, host.endpoint, markers, "frozen")
    try:
        trainer.send_signal(signal.SIGSTOP)  # Ctrl-Z: its heartbeats stop too
        wait_for(lambda: host_info(host.endpoint)["sessions"] == 0, "the lease never passed")
        assert closed_envs(markers) == 2
    finally:
        trainer.send_signal(signal.SIGCONT)
    trainer.stdin.write("go on\n")
    trainer.stdin.flush()
    assert "no longer holds this client's session" in trainer.stdout.readline()
    assert trainer.wait(TIMEOUT_S) == 0


@pytest.mark.parametrize("ending", ["exits", "interrupted"])
def test_a_trainer_that_ends_without_close_releases_its_session_at_exit(
    tmp_path, markers, hosts, ending
):
    host = hosts("--session-lease", "3600")  # the lease cannot be what releases it
    trainer = start_trainer(tmp_path, host.endpoint, markers, ending)
    if ending == "interrupted":
        trainer.send_signal(signal.SIGINT)  # Ctrl-C while stepping
    assert trainer.wait(TIMEOUT_S) == (0 if ending == "exits" else -signal.SIGINT)
    assert host_info(host.endpoint)["sessions"] == 0  # closed before the trainer exited
    assert closed_envs(markers) == 2
    assert evicted(host, "lease") == evicted(host, "idle") == 0


@pytest.fixture(scope="module")
def curve_keys(tmp_path_factory) -> dict[str, Path]:
    keys = tmp_path_factory.mktemp("keys")
    authorized = tmp_path_factory.mktemp("authorized")
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    trainer_public, trainer_secret = zmq.auth.create_certificates(keys, "trainer")
    (authorized / "trainer.key").write_bytes(Path(trainer_public).read_bytes())
    return {
        "server_public": Path(server_public),
        "server_secret": Path(server_secret),
        "trainer_secret": Path(trainer_secret),
        "authorized": authorized,
    }


@pytest.mark.parametrize("transport", ["ipc", "curve", "dns"])
def test_an_idle_client_keeps_its_session_for_many_leases(markers, hosts, curve_keys, transport):
    vector_kwargs, curve = {}, None
    if transport == "ipc":
        host = hosts()
        endpoints = [host.endpoint]
    elif transport == "curve":
        host = hosts(
            "--curve-secret-key", str(curve_keys["server_secret"]),
            "--authorized-keys", str(curve_keys["authorized"]),
            bind="tcp://127.0.0.1:*",
        )  # fmt: skip
        endpoints, curve = [host.endpoint], curve_keys
        vector_kwargs = {
            "curve_server_key": curve_keys["server_public"],
            "curve_client_key": curve_keys["trainer_secret"],
        }
    else:
        host = hosts(bind="tcp://127.0.0.1:*")
        endpoints = [f"dns://envhosts:{host.endpoint.rsplit(':', 1)[1]}"]
        vector_kwargs = {"resolver": lambda name, port: ["127.0.0.1"]}
    envs = client.make_vec(
        ENV_ID, num_envs=2, hosts=endpoints, vector_kwargs=vector_kwargs, markers=str(markers)
    )
    try:
        envs.reset(seed=0)
        # Heartbeats come every third of the lease: a dozen span four leases.
        wait_for(lambda: heartbeats(host) >= 12, "the client sent no heartbeats")
        assert envs.step(np.zeros(2, dtype=np.int64))[0].shape == (2, 2)
        assert host_info(host.endpoint, curve)["sessions"] == 1
        assert evicted(host, "lease") == 0 and closed_envs(markers) == 0
    finally:
        envs.close()
    assert not envs._hosts.heartbeat._thread.is_alive()  # close() stops the thread
    assert host_info(host.endpoint, curve)["sessions"] == 0 and closed_envs(markers) == 2


def test_a_step_longer_than_the_lease_costs_no_session(markers, hosts):
    host = hosts()
    slow = client.make_vec(ENV_ID, num_envs=1, hosts=[host.endpoint], markers=str(markers),
                           step_s=3 * float(LEASE))  # fmt: skip
    idle = client.make_vec(ENV_ID, num_envs=1, hosts=[host.endpoint], markers=str(markers))
    try:
        slow.reset(seed=0)
        idle.reset(seed=0)
        # While the host is busy stepping, the idle client's heartbeats wait in its queue:
        # the host must read them before it judges whose lease passed.
        slow.step(np.zeros(1, dtype=np.int64))
        assert slow.get_attr("step_s") == (3.0,)
        assert idle.step(np.zeros(1, dtype=np.int64))[0].shape == (1, 2)
        assert evicted(host, "lease") == 0 and host_info(host.endpoint)["sessions"] == 2
    finally:
        slow.close()
        idle.close()


def test_a_request_being_served_renews_the_lease_without_heartbeats(markers, hosts):
    """A bare client that sends no HEARTBEAT: a step three leases long does not lose it the
    session (the host hears from it when the step starts and when the reply is ready)."""
    host = hosts()
    context = zmq.Context.instance()
    with context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(host.endpoint)
        ids = iter(range(1, 100))

        def ask(command, body, session=None, request_id=None):
            request_id = next(ids) if request_id is None else request_id
            sock.send_multipart(encode_request(request_id, command, session, body,
                                               allow_pickle=False))  # fmt: skip
            assert sock.poll(TIMEOUT_S * 1000), "the host did not answer"
            return decode_reply(sock.recv_multipart(), allow_pickle=False)

        hello = ask(Command.HELLO, {"client": "bare"})
        assert hello.body["session_lease_s"] == float(LEASE)
        session = hello.body["session"]
        kwargs = {"markers": str(markers), "step_s": 3 * float(LEASE)}
        made = ask(Command.MAKE, {"env_id": ENV_ID, "kwargs": kwargs, "num_envs": 1}, session)
        assert made.status == Status.OK, made.body
        assert ask(Command.RESET, {"seeds": [0]}, session).status == Status.OK
        step = ask(Command.STEP, {"actions": [0]}, session)
        assert step.status == Status.OK, step.body
        assert ask(Command.CALL, {"name": "step_s"}, session).body == [3.0]

        # HEARTBEAT: answered with the lease (and the envs stepped at once); outside the
        # request-id order and the reply cache (a client sends it from a socket of its own,
        # with ids of its own).
        beat = ask(Command.HEARTBEAT, None, session, request_id=1)
        assert beat.status == Status.OK
        assert beat.body == {"session_lease_s": float(LEASE), "env_threads": 1}
        again = ask(Command.CALL, {"name": "step_s"}, session, request_id=next(ids) - 1)
        assert again.body == [3.0]  # the last request, answered from the cache
        gone = ask(Command.HEARTBEAT, None, b"x" * 16)
        assert gone.status == Status.ERROR and gone.body["type"] == "UnknownSessionError"
        assert ask(Command.CLOSE, None, session).status == Status.OK
    assert closed_envs(markers) == 1 and evicted(host, "lease") == 0


def test_max_sessions_admits_a_new_trainer_once_a_killed_one_s_lease_passed(
    tmp_path, markers, hosts
):
    host = hosts("--max-sessions", "1")
    trainer = start_trainer(tmp_path, host.endpoint, markers, "killed")
    with pytest.raises(LimitError):
        client.make_vec(ENV_ID, num_envs=1, hosts=[host.endpoint], markers=str(markers))
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            envs = client.make_vec(ENV_ID, num_envs=1, hosts=[host.endpoint],
                                   markers=str(markers))  # fmt: skip
            break
        except LimitError:
            assert time.monotonic() < deadline, "the killed trainer's session was never released"
            time.sleep(0.1)
    try:
        assert envs.reset(seed=0)[0].shape == (1, 2)
    finally:
        envs.close()
    assert evicted(host, "lease") == 1


def test_a_recovered_host_gets_heartbeats_too(tmp_path, markers, hosts):
    bind = f"ipc://{tmp_path}/recovered.sock"
    first = hosts(bind=bind)
    envs = client.make_vec(ENV_ID, num_envs=2, hosts=[first.endpoint], markers=str(markers),
                           vector_kwargs={"on_host_failure": "restart"})  # fmt: skip
    try:
        envs.reset(seed=0)
        first.stop(signal.SIGKILL)
        second = hosts(bind=bind)
        *_, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert envs.host_restarts == 1 and infos["host_failure"].all()
        wait_for(lambda: heartbeats(second) >= 12, "the re-made session got no heartbeats")
        *_, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert "host_failure" not in infos
        assert evicted(second, "lease") == 0 and host_info(second.endpoint)["sessions"] == 1
    finally:
        envs.close()


def test_the_host_states_its_lease_and_refuses_a_negative_one(tmp_path, hosts):
    host = hosts("--session-lease", "7.5")
    assert host_info(host.endpoint)["session_lease_s"] == 7.5
    result = subprocess.run(
        [sys.executable, "-m", "envserver", "serve", "--bind", f"ipc://{tmp_path}/no.sock",
         "--session-lease", "-1"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "envserver serve: argument --session-lease: must be a number of seconds from 0 to 1e+09,"
        " got -1.0 (see envserver serve --help)"
    ]


def test_close_without_waiting_still_closes_the_sessions(hosts):
    host = hosts("--session-lease", "0")  # no lease: only the CLOSE can free the session
    envs = client.make_vec("CartPole-v1", num_envs=2, hosts=[host.endpoint])
    envs.reset(seed=0)
    assert host_info(host.endpoint)["sessions"] == 1
    envs.step_async(np.zeros(2, dtype=np.int64))
    envs.close(terminate=True)  # sends CLOSE without waiting; it must still leave
    deadline = time.monotonic() + TIMEOUT_S
    while host_info(host.endpoint)["sessions"] != 0:
        assert time.monotonic() < deadline, host.log_text()
        time.sleep(0.05)
