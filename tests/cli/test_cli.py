"""The envserver command: ping for health checks, rollout, serve errors, python -m."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
from helpers import refused_port, run_envserver

from envserver.testing import start_host
from envserver.wire.messages import PROTOCOL_VERSION

TIMEOUT_S = 120


def envserver(*args: str) -> subprocess.CompletedProcess:
    return run_envserver(*args, timeout_s=TIMEOUT_S)


def test_ping_a_live_host(plain_hosts):
    for endpoint in plain_hosts:
        result = envserver("ping", endpoint)
        assert result.returncode == 0, result.stderr
        assert "envserver" in result.stdout and "protocol" in result.stdout


def test_ping_nobody_fails_within_timeout():
    """A listener that never greets (connections accepted, no ZeroMQ handshake)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result = envserver("ping", f"tcp://127.0.0.1:{port}", "--timeout", "0.5")
    assert result.returncode == 1
    assert "no answer within 0.5 s" in result.stderr


def test_ping_of_a_port_that_refuses_answers_at_once():
    """Nothing listens there: one line, without waiting for the timeout (an hour here)."""
    with refused_port() as port:
        endpoint = f"tcp://127.0.0.1:{port}"
        result = envserver("ping", endpoint, "--timeout", "3600")  # the run is bounded at 120 s
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"envserver ping: {endpoint}: nothing answers at this address (connections refused: "
        "no host listens there)"
    ]


def test_ping_wait_waits_where_nothing_listens_yet():
    """--wait: a host still starting is waited for, up to the timeout."""
    with refused_port() as port:
        endpoint = f"tcp://127.0.0.1:{port}"
        result = envserver("ping", endpoint, "--wait", "--timeout", "1")
    assert result.returncode == 1
    assert f"envserver ping: {endpoint}: no answer within 1 s: nothing answers" in result.stderr


@pytest.mark.parametrize("spec", ["dns://no-port", "tcp//127.0.0.1:1", "tcp://127.0.0.1:99999"])
def test_ping_refuses_a_malformed_host_before_pinging_any(plain_hosts, spec):
    result = envserver("ping", plain_hosts[0], spec)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"envserver ping: '{spec}'")


def test_ping_a_cluster_one_line_per_host_and_who_did_not_answer(plain_hosts):
    """Several endpoints and a dns:// spec: a line per host that answered, the host that did
    not named with why, exit 1; the same as one JSON array."""
    port = plain_hosts[2].rsplit(":", 1)[1]  # the TCP host, reached again by a dns:// spec
    with refused_port() as refused:
        silent = f"tcp://127.0.0.1:{refused}"
        unknown = "dns://no-such-host.invalid:5555"  # a name that does not resolve
        hosts = [*plain_hosts[:2], f"dns://127.0.0.1:{port}", silent, unknown]
        result = envserver("ping", *hosts, "--timeout", "1")
        as_json = envserver("ping", *hosts, "--timeout", "1", "--json")
    assert result.returncode == 1 and as_json.returncode == 1
    lines = result.stdout.splitlines()
    answered = [*plain_hosts[:2], f"tcp://127.0.0.1:{port}"]
    assert len(lines) == len(answered)
    assert all(line.startswith(f"{e}: envserver ") for line, e in zip(lines, answered)), lines
    for line in lines:
        for part in (
            f"(protocol {PROTOCOL_VERSION})",
            "session(s)",
            "env(s)",
            "lease 30 s",
            "up ",
            "no CURVE",
        ):
            assert part in line, (part, line)
    assert f"envserver ping: {silent}: nothing answers at this address" in result.stderr
    assert f"envserver ping: {unknown}: " in result.stderr
    answers = json.loads(as_json.stdout)
    assert [a["endpoint"] for a in answers] == [*answered, silent, unknown]
    assert [a["ok"] for a in answers] == [True, True, True, False, False]
    assert all(a["protocol"] == PROTOCOL_VERSION and a["curve"] is False for a in answers[:3])
    assert "no host listens there" in answers[3]["error"]


def test_ping_every_host_answering_exits_0(plain_hosts):
    result = envserver("ping", *plain_hosts)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(plain_hosts) and not result.stderr


@pytest.mark.parametrize("use_hosts", [False, True], ids=["local-hosts", "remote-host"])
def test_rollout_reports_speed_and_returns(plain_hosts, use_hosts):
    args = ["rollout", "CartPole-v1", "--num-envs", "3", "--steps", "200", "--no-progress"]
    if use_hosts:
        args += ["--hosts", *plain_hosts[:2]]
    result = envserver("--log-level", "WARNING", *args)
    assert result.returncode == 0, result.stderr
    assert "steps/s:" in result.stdout
    episodes = int(result.stdout.split("episodes finished:")[1].split()[0])
    assert episodes > 0
    mean_return = float(result.stdout.split("mean episode return:")[1].split()[0])
    assert 5 < mean_return < 500
    assert "on 2 host(s)" in result.stdout


def test_serve_on_a_taken_address_fails_clearly(plain_hosts):
    tcp_endpoint = plain_hosts[2]
    result = envserver("serve", "--bind", tcp_endpoint)
    assert result.returncode == 2
    assert "cannot bind" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # nothing left unclosed


def test_help_lists_commands():
    result = envserver("--help")
    assert result.returncode == 0
    for command in ("serve", "rollout", "ping"):
        assert command in result.stdout


def test_rollout_json_reports_one_object(plain_hosts):
    result = envserver(
        "--log-level", "WARNING", "rollout", "CartPole-v1", "--num-envs", "3", "--steps", "150",
        "--hosts", *plain_hosts[:2], "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["env_id"] == "CartPole-v1"
    assert summary["num_envs"] == 3 and summary["env_steps"] == 450
    assert summary["seconds"] > 0 and summary["steps_per_second"] > 0
    assert summary["episodes"] > 0 and 5 < summary["mean_return"] < 500
    assert summary["host_restarts"] == 0
    assert summary["hosts"] == [
        {"endpoint": plain_hosts[0], "num_envs": 2},
        {"endpoint": plain_hosts[1], "num_envs": 1},
    ]


def assert_one_line_error(
    result: subprocess.CompletedProcess, command: str, text: str, status: int = 1
) -> None:
    """One line naming the command, with ``text``; exit ``status`` (2: a usage error)."""
    assert result.returncode == status
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("envserver ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"envserver {command}: ") and text in lines[0], result.stderr


def test_rollout_against_nobody_fails_in_one_line():
    with refused_port() as port:
        result = envserver(
            "--log-level", "WARNING", "rollout", "CartPole-v1", "--json",
            "--hosts", f"tcp://127.0.0.1:{port}", "--connect-timeout", "1",
        )  # fmt: skip
    assert result.stdout == ""
    assert_one_line_error(result, "rollout", "HostUnavailableError: host tcp://127.0.0.1:")


def test_rollout_takes_several_hosts_in_one_argument(plain_hosts):
    listed = ",".join(plain_hosts[:2])
    result = envserver(
        "--log-level", "WARNING", "rollout", "CartPole-v1", "--num-envs", "2", "--steps", "5",
        "--hosts", listed, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [h["endpoint"] for h in json.loads(result.stdout)["hosts"]] == plain_hosts[:2]


def test_rollout_with_the_env_id_after_its_hosts_says_where_it_goes(plain_hosts):
    result = envserver("rollout", "--hosts", *plain_hosts[:2], "CartPole-v1")
    assert_one_line_error(result, "rollout", "'CartPole-v1' is not an endpoint", 2)
    assert "if it is the env_id: put it before --hosts" in result.stderr
    wrong = envserver("rollout", "CartPole-v1", "--hosts", "tcp//127.0.0.1:5")
    assert_one_line_error(wrong, "rollout", "'tcp//127.0.0.1:5' is not an endpoint", 2)
    assert "env_id" not in wrong.stderr  # the env id was given: no such hint


def test_rollout_with_a_bad_host_spec_fails_in_one_line():
    result = envserver("rollout", "CartPole-v1", "--hosts", "dns://envhost")
    assert_one_line_error(
        result, "rollout", "'dns://envhost' is not a host spec: expected dns://NAME:PORT", 2
    )


def test_rollout_that_loses_its_host_fails_in_one_line(tmp_path):
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    rollout = subprocess.Popen(
        [sys.executable, "-m", "envserver", "--log-level", "WARNING", "rollout", "CartPole-v1",
         "--hosts", host.endpoint, "--steps", "10000000", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while "1 session(s)" not in envserver("ping", host.endpoint).stdout:
            assert time.monotonic() < deadline and rollout.poll() is None
        host.process.kill()
        stdout, stderr = rollout.communicate(timeout=TIMEOUT_S)
    finally:
        rollout.kill()
        host.stop()
    result = subprocess.CompletedProcess(rollout.args, rollout.returncode, stdout, stderr)
    assert_one_line_error(result, "rollout", f"HostUnavailableError: host {host.endpoint}")


def test_rollout_min_hosts_without_hosts_fails_in_one_line():
    result = envserver("rollout", "CartPole-v1", "--min-hosts", "1", "--json")
    assert_one_line_error(result, "rollout", "rollout: min_hosts needs hosts", 2)


@pytest.mark.xdist_group("loopback-port")  # binds an ephemeral port on ::1: see test_discovery
def test_ping_an_ipv6_host(tmp_path):
    host = start_host(tmp_path, bind="tcp://[::1]:*")
    try:
        assert host.endpoint.startswith("tcp://[::1]:")
        result = envserver("ping", host.endpoint, "--timeout", "30")
        assert result.returncode == 0, result.stderr
    finally:
        host.stop()


def test_serve_help_shows_the_host_config_defaults():
    from envserver.host.loop import HostConfig

    defaults = HostConfig()
    result = envserver("serve", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for shown in (
        f"(default: {defaults.bind};",
        f"(default: {defaults.max_message_bytes})",
        f"(default: {defaults.max_sessions})",
        f"(default: {defaults.max_envs_per_session})",
        f"of all sessions together (default: {defaults.max_envs})",
        f"in turn (default: {defaults.max_env_threads})",
        f"idle this long (default: {defaults.session_idle_timeout_s})",
        f"(default: {defaults.session_lease_s}; 0: no lease)",
        f"(default: {defaults.metrics_bind};",
    ):
        assert shown in text, shown


@pytest.fixture
def contributed(tmp_path, monkeypatch):
    """A package on the path that adds `hello` (and a broken `oops`) to envserver."""
    (tmp_path / "hello_cmd.py").write_text(
        "from envserver.cli.commands import Subcommand\n"
        "def add(parser):\n"
        "    parser.add_argument('who')\n"
        "def run(args):\n"
        "    print(f'hello {args.who}')\n"
        "    return 3\n"
        "hello = Subcommand('say hello', add, run)\n"
    )
    dist = tmp_path / "hello_cmd-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-cmd\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[envserver.commands]\nhello = hello_cmd:hello\noops = no_such_module:oops\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_another_package_adds_a_command(contributed):
    result = envserver("hello", "world", "--log-level", "WARNING")
    assert (result.returncode, result.stdout) == (3, "hello world\n"), result.stderr
    result = envserver("--help")
    assert result.returncode == 0
    for command in ("serve", "rollout", "hello", "ping", "keygen"):
        assert command in result.stdout
    assert "say hello" in result.stdout
    assert "envserver oops is not available: ModuleNotFoundError" in result.stderr


def test_a_contributed_command_that_cannot_be_loaded_fails_in_one_line(contributed):
    result = envserver("oops")
    assert_one_line_error(result, "oops", "ModuleNotFoundError: No module named 'no_such_module'")
    ping = envserver("ping", "ipc:///nonexistent/x.sock", "--timeout", "0.1")
    assert ping.returncode == 1 and "oops" not in ping.stderr  # loaded only when run


def test_keygen_keeps_an_existing_key_pair_unless_forced(tmp_path):
    """A second keygen of a name would leave every copy of the public key wrong: refused."""
    first = envserver("--log-level", "WARNING", "keygen", str(tmp_path), "--name", "server")
    assert first.returncode == 0, first.stderr
    public = (tmp_path / "server.key").read_bytes()
    secret = (tmp_path / "server.key_secret").read_bytes()
    again = envserver("--log-level", "WARNING", "keygen", str(tmp_path), "--name", "server")
    assert again.stdout == ""
    assert_one_line_error(again, "keygen", f"{tmp_path / 'server.key'} exists; --force", 2)
    assert (tmp_path / "server.key").read_bytes() == public
    assert (tmp_path / "server.key_secret").read_bytes() == secret
    (tmp_path / "server.key").unlink()  # half a pair left: still refused
    half = envserver("--log-level", "WARNING", "keygen", str(tmp_path), "--name", "server")
    assert_one_line_error(half, "keygen", f"{tmp_path / 'server.key_secret'} exists", 2)
    forced = envserver("keygen", str(tmp_path), "--name", "server", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "server.key").read_bytes() != public
    assert (tmp_path / "server.key_secret").read_bytes() != secret
