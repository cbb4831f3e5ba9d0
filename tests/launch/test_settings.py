"""Settings from the environment: ENVSERVER_HOSTS and its companions for trainers, ping and
rollout, ENVSERVER_<OPTION> for `envserver serve`; and the precedence argument > flag >
environment > default, with real hosts, real vector envs and the real command."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import running_hosts, wait_for_text

from envserver import client
from envserver.cli.settings import variable_for
from envserver.errors import HostUnavailableError
from envserver.launch.environment import HostChoice

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("ENVSERVER_")}


@pytest.fixture(autouse=True)
def no_settings(monkeypatch):
    """Each test starts from an environment without ENVSERVER_* variables."""
    for name in os.environ:
        if name.startswith("ENVSERVER_"):
            monkeypatch.delenv(name)


def envserver(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envserver", "--log-level", "WARNING", *args],
        env={**CLEAN, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


# ------------------------------------------------------------------ which setting wins


def test_hosts_given_win_over_the_environment():
    environ = {"ENVSERVER_HOSTS": "tcp://a:1", "ENVSERVER_MIN_HOSTS": "3"}
    choice = HostChoice.of(["tcp://b:2"], min_hosts=2, environ=environ)
    assert choice.hosts == ("tcp://b:2",) and choice.min_hosts == 2
    assert choice.describe() == "hosts from the arguments: tcp://b:2"


def test_a_slurm_node_list_keeps_its_commas():
    environ = {"ENVSERVER_HOSTS": "slurm://cpu[1,3-4],gpu01:5555-5556,tcp://a:1, slurm://gpu1:7"}
    choice = HostChoice.of(None, environ=environ)
    assert choice.hosts == ("slurm://cpu[1,3-4],gpu01:5555-5556", "tcp://a:1", "slurm://gpu1:7")


LISTED = ("tcp://a:1", "dns://b:2", "slurm://n[1,3]:5")


@pytest.mark.parametrize(
    "hosts",
    [
        "tcp://a:1,dns://b:2,slurm://n[1,3]:5",
        "tcp://a:1, dns://b:2 ,slurm://n[1,3]:5,,",
        ["tcp://a:1,dns://b:2", "slurm://n[1,3]:5"],
        ["tcp://a:1", "dns://b:2", "slurm://n[1,3]:5", "tcp://a:1"],
    ],
)
def test_a_host_list_is_read_one_way_as_argument_and_variable(hosts):
    """A string or each string of a list may hold several hosts: as ENVSERVER_HOSTS does."""
    assert HostChoice.of(hosts, environ={}).hosts == LISTED
    text = hosts if isinstance(hosts, str) else ",".join(hosts)
    assert HostChoice.of(None, environ={"ENVSERVER_HOSTS": text}).hosts == LISTED


@pytest.mark.parametrize(
    ("hosts", "says"),
    [
        ("tcp://a:1,127.0.0.1:2", "'tcp://a:1,127.0.0.1:2' is not one host: '127.0.0.1:2' after"),
        ("tcp://a:1 tcp://b:2", "'tcp://a:1 tcp://b:2' is more than one host: separate hosts"),
        ("tcp://a:1;dns://b:2", "'tcp://a:1;dns://b:2' is more than one host"),
        ("tcp://a:1,b:2", "'b:2' after its comma is not a host"),
        ("tcp://a:1,tcp://a:99999", "'tcp://a:99999': the port must be a number from 1 to 65535"),
        ("tcp://a:1,dns://b", "'dns://b' is not a host spec: expected dns://NAME:PORT"),
        ("CartPole-v1", "'CartPole-v1' is not an endpoint: expected tcp://HOST:PORT"),
        ("local,tcp://a:1", "local starts local hosts and is the whole host list"),
    ],
)
def test_a_malformed_host_list_is_one_line_wherever_it_is_given(hosts, says):
    with pytest.raises(ValueError) as given:
        HostChoice.of(hosts, environ={})
    assert says in str(given.value) and "\n" not in str(given.value)
    with pytest.raises(ValueError) as listed:
        HostChoice.of(None, environ={"ENVSERVER_HOSTS": hosts})
    assert str(listed.value) == f"ENVSERVER_HOSTS: {given.value}"


@pytest.mark.parametrize("hosts", ["", " ", [""], [" , "]])
def test_hosts_given_that_name_none_are_refused(hosts):
    with pytest.raises(ValueError, match="names no host"):
        HostChoice.of(hosts, environ={"ENVSERVER_HOSTS": "tcp://a:1"})


def test_hosts_come_from_the_environment_with_their_settings():
    environ = {
        "ENVSERVER_HOSTS": " tcp://a:1, dns://hosts:5555 ,,tcp://a:1",
        "ENVSERVER_MIN_HOSTS": "4",
        "ENVSERVER_CURVE_SERVER_KEY": "/keys/server.key",
        "ENVSERVER_CURVE_CLIENT_KEY": "/keys/trainer.key_secret",
    }
    choice = HostChoice.of(None, curve_client_key="mine.key_secret", environ=environ)
    assert choice.hosts == ("tcp://a:1", "dns://hosts:5555")
    assert choice.min_hosts == 4
    assert choice.curve_server_key == "/keys/server.key"
    assert choice.curve_client_key == "mine.key_secret"  # given: the variable loses
    assert choice.describe() == (
        "hosts from ENVSERVER_HOSTS: tcp://a:1, dns://hosts:5555 (also from the environment: "
        "ENVSERVER_MIN_HOSTS, ENVSERVER_CURVE_SERVER_KEY)"
    )


@pytest.mark.parametrize(
    ("hosts", "environ", "why"),
    [
        (None, {}, "no hosts given, ENVSERVER_HOSTS unset"),
        (None, {"ENVSERVER_HOSTS": "  "}, "no hosts given, ENVSERVER_HOSTS unset"),
        (None, {"ENVSERVER_HOSTS": "local"}, "ENVSERVER_HOSTS=local"),
        ("local", {"ENVSERVER_HOSTS": "tcp://a:1"}, "hosts=local"),
        (["local"], {"ENVSERVER_HOSTS": "tcp://a:1"}, "hosts=local"),
    ],
)
def test_local_hosts_ignore_the_cluster_settings(hosts, environ, why):
    cluster = {"ENVSERVER_MIN_HOSTS": "3", "ENVSERVER_CURVE_SERVER_KEY": "/keys/server.key"}
    choice = HostChoice.of(hosts, environ={**cluster, **environ})
    assert choice.local and choice.min_hosts is None and choice.curve_server_key is None
    assert choice.describe() == f"starting local hosts ({why})"


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_bad_min_hosts_is_named(value):
    environ = {"ENVSERVER_HOSTS": "tcp://a:1", "ENVSERVER_MIN_HOSTS": value}
    with pytest.raises(
        ValueError, match=f"ENVSERVER_MIN_HOSTS must be an integer of at least 1, got '{value}'"
    ):
        HostChoice.of(None, environ=environ)


def test_each_option_has_its_variable():
    assert variable_for("--max-sessions") == "ENVSERVER_MAX_SESSIONS"
    assert variable_for("--curve-server-key") == "ENVSERVER_CURVE_SERVER_KEY"


# ------------------------------------------------------------------ trainers, for real


def test_make_vec_without_hosts_runs_on_the_hosts_of_the_environment(tmp_path, monkeypatch, caplog):
    with running_hosts(tmp_path, 2) as hosts:
        endpoints = [host.endpoint for host in hosts]
        monkeypatch.setenv("ENVSERVER_HOSTS", ",".join(endpoints))
        with caplog.at_level(logging.INFO, logger="envserver.client"):
            envs = client.make_vec("CartPole-v1", 4)
        try:
            assert list(envs.hosts) == endpoints and list(envs.envs_per_host) == [2, 2]
            envs.reset(seed=0)
            envs.step(envs.action_space.sample())
        finally:
            envs.close()
        assert f"hosts from ENVSERVER_HOSTS: {', '.join(endpoints)}" in caplog.text

        envs = client.make_vec("CartPole-v1", 2, hosts="local")  # the code's choice wins
        try:
            assert all(endpoint.startswith("ipc://") for endpoint in envs.hosts)
        finally:
            envs.close()


def test_several_hosts_in_one_string_reach_every_host(tmp_path):
    with running_hosts(tmp_path, 2, bind="tcp://127.0.0.1:*") as hosts:
        endpoints = [host.endpoint for host in hosts]
        for given in (",".join(endpoints), [", ".join(endpoints)]):
            envs = client.make_vec("CartPole-v1", 4, hosts=given)
            try:
                assert list(envs.hosts) == endpoints and list(envs.envs_per_host) == [2, 2]
                envs.reset(seed=0)
                envs.step(envs.action_space.sample())
            finally:
                envs.close()
        with pytest.raises(ValueError, match="is not one host"):  # before anything is reached
            client.make_vec("CartPole-v1", 2, hosts=f"{endpoints[0]},127.0.0.1:5556")


def test_min_hosts_from_the_environment_is_waited_for(tmp_path, monkeypatch):
    with running_hosts(tmp_path, 1, bind="tcp://127.0.0.1:*") as (host,):
        port = host.endpoint.rsplit(":", 1)[1]
        monkeypatch.setenv("ENVSERVER_HOSTS", f"dns://localhost:{port}")
        monkeypatch.setenv("ENVSERVER_MIN_HOSTS", "2")  # localhost is one host
        with pytest.raises(HostUnavailableError, match="too few env hosts answered"):
            client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, connect_timeout_s=1)
        monkeypatch.setenv("ENVSERVER_MIN_HOSTS", "1")
        envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, connect_timeout_s=30)
        envs.close()


def test_rollout_and_ping_take_their_hosts_from_the_environment(tmp_path):
    with running_hosts(tmp_path, 2) as hosts:
        endpoints = [host.endpoint for host in hosts]
        listed = ",".join(endpoints)
        rollout = ["rollout", "CartPole-v1", "--num-envs", "2", "--steps", "5", "--json"]
        result = envserver(*rollout, ENVSERVER_HOSTS=listed)
        assert result.returncode == 0, result.stderr
        assert [h["endpoint"] for h in json.loads(result.stdout)["hosts"]] == endpoints

        result = envserver(*rollout, "--hosts", "local", ENVSERVER_HOSTS=listed)  # flag wins
        assert result.returncode == 0, result.stderr
        assert all(h["endpoint"].startswith("ipc://") for h in json.loads(result.stdout)["hosts"])

        result = envserver(*rollout, "--import", "json", ENVSERVER_HOSTS=listed)
        assert result.returncode == 2  # a usage error
        assert "hosts given with --hosts or $ENVSERVER_HOSTS import their own" in result.stderr

        result = envserver("ping", "--json", ENVSERVER_HOSTS=listed)
        assert result.returncode == 0, result.stderr
        assert [answer["endpoint"] for answer in json.loads(result.stdout)] == endpoints

    result = envserver("ping")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "envserver ping: name the hosts to ping (endpoints, dns:// or slurm:// specs) or set "
        "ENVSERVER_HOSTS"
    )


# ------------------------------------------------------------------ envserver serve


def serve(tmp_path: Path, *flags: str, **env: str) -> tuple[subprocess.Popen, dict]:
    """Starts `envserver serve` with ``env``; returns it and what it answers to a PING."""
    log = tmp_path / "host.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "envserver", "serve", *flags],
            env={**CLEAN, **env},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_text(log.read_text, "serving on")
        answer = envserver("ping", "--json", env["ENVSERVER_BIND"])
        assert answer.returncode == 0, answer.stderr
        return process, json.loads(answer.stdout)[0]
    except BaseException:
        process.kill()
        process.wait()
        raise


def test_serve_takes_its_options_from_the_environment_and_flags_win(tmp_path):
    bind = f"ipc://{tmp_path}/host.sock"
    env = {
        "ENVSERVER_BIND": bind,
        "ENVSERVER_NAME": "from-the-environment",
        "ENVSERVER_SESSION_LEASE": "7.5",
        "ENVSERVER_ALLOW_PICKLE": "yes",
    }
    process, info = serve(tmp_path, **env)
    process.terminate()
    assert process.wait(timeout=60) == 0
    assert info["name"] == "from-the-environment"
    assert info["session_lease_s"] == 7.5 and info["allow_pickle"] is True

    process, info = serve(
        tmp_path, "--name", "from-the-flag", **{**env, "ENVSERVER_ALLOW_PICKLE": "0"}
    )
    process.terminate()
    assert process.wait(timeout=60) == 0
    assert info["name"] == "from-the-flag" and info["allow_pickle"] is False


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("ENVSERVER_MAX_SESSIONS", "many", "must be an integer of at least 1, got 'many'"),
        ("ENVSERVER_MAX_SESSIONS", "0", "must be an integer of at least 1, got 0"),
        (
            "ENVSERVER_SESSION_LEASE",
            "long",
            "must be a number of seconds from 0 to 1e+09, got 'long'",
        ),
        (
            "ENVSERVER_BIND",
            "tcp://127.0.0.1:99999",
            "'tcp://127.0.0.1:99999': the port must be a number from 1 to 65535 (or * for any "
            "free port), got '99999'",
        ),
        (
            "ENVSERVER_ALLOW_PICKLE",
            "maybe",
            "not a yes/no value (1, true, yes, on or 0, false, no, off)",
        ),
        ("ENVSERVER_LOG_FORMAT", "xml", "not one of plain, json"),
    ],
)
def test_a_variable_the_option_cannot_take_is_one_clear_line(variable, value, why):
    result = envserver("serve", **{variable: value})
    assert result.returncode == 2
    assert result.stderr.strip() == f"envserver serve: {variable}='{value}': {why}"
    assert "Traceback" not in result.stderr
    assert envserver("serve", "--help", **{variable: value}).returncode == 0


def test_a_bad_host_variable_does_not_break_other_commands():
    result = envserver("ping", "tcp://127.0.0.1:1", "--timeout", "0.2", ENVSERVER_MAX_SESSIONS="x")
    assert result.returncode == 1 and "ENVSERVER_MAX_SESSIONS" not in result.stderr
    assert "no host listens there" in result.stderr
