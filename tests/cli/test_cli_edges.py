"""Every command and option of ``envserver``, given wrong, empty, huge and malformed values.

Each is answered with one line a user can act on (the command named, what is wrong, no
traceback, no Python type name where plain words say it), exit status 2 for a usage error, and
nothing left running (the command runs in a process group of its own, which is empty after).
Hosts, keys and settings come in every way a user gives them: flags, ``ENVSERVER_*`` variables,
host lists with ``dns://`` specs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from envserver.testing import start_host

TIMEOUT_S = 60.0
NOWHERE = "tcp://127.0.0.1:9"  # a well-formed endpoint the command never gets to use

#: (arguments, environment, what the one line says). Usage errors, all of them: exit 2.
USAGE_ERRORS = [
    # the command itself
    ([], {}, "the following arguments are required"),
    (["serv"], {}, "invalid choice: 'serv'"),
    (["serve", "--bnd", "x"], {}, "unrecognized arguments: --bnd x"),
    (["--log-level", "LOUD", "serve"], {}, "--log-level: must be one of DEBUG, INFO"),
    (["--log-format", "xml", "serve"], {}, "--log-format: invalid choice: 'xml'"),
    (["serve"], {"ENVSERVER_LOG_LEVEL": "loud"}, "ENVSERVER_LOG_LEVEL='loud'"),
    # serve
    (["serve", "--bind", ""], {}, "'' is not an endpoint"),
    (["serve", "--bind", "foo"], {}, "'foo' is not an endpoint: expected tcp://HOST:PORT"),
    (["serve", "--bind", "tcp//127.0.0.1:5"], {}, "is not an endpoint"),
    (["serve", "--bind", "tcp://127.0.0.1"], {}, "'tcp://127.0.0.1' is not an endpoint"),
    (["serve", "--bind", "tcp://127.0.0.1:99999"], {}, "port must be a number from 1 to 65535"),
    (["serve", "--bind", "tcp://127.0.0.1:-1"], {}, "port must be a number from 1 to 65535"),
    (["serve", "--bind", "tcp://127.0.0.1:56O1"], {}, "got '56O1'"),
    (["serve", "--bind", "tcp://[::1:5555"], {}, "is not an endpoint"),
    (["serve", "--bind", "ipc://"], {}, "names no address"),
    (["serve"], {"ENVSERVER_BIND": "tcp://127.0.0.1:70000"}, "ENVSERVER_BIND='tcp://127.0.0.1:"),
    (["serve", "--max-sessions", "0"], {}, "--max-sessions: must be an integer of at least 1"),
    (["serve", "--max-sessions", "-1"], {}, "--max-sessions: must be an integer of at least 1"),
    (["serve", "--max-sessions", ""], {}, "--max-sessions: must be an integer of at least 1"),
    (["serve", "--max-sessions", "1e3"], {}, "--max-sessions: must be an integer of at least 1"),
    (["serve"], {"ENVSERVER_MAX_SESSIONS": "lots"}, "ENVSERVER_MAX_SESSIONS='lots'"),
    (["serve", "--max-envs", "0"], {}, "--max-envs: must be an integer of at least 1"),
    (["serve", "--max-envs-per-session", "-3"], {}, "--max-envs-per-session: must be an"),
    (["serve", "--max-env-threads", "0"], {}, "--max-env-threads: must be an integer"),
    (["serve", "--max-message-bytes", "0"], {}, "--max-message-bytes: must be an integer of"),
    (["serve", "--max-message-bytes", "big"], {}, "--max-message-bytes: must be an integer"),
    (["serve", "--session-lease", "-1"], {}, "--session-lease: must be a number of seconds"),
    (["serve", "--session-lease", "nan"], {}, "--session-lease: must be a number of seconds"),
    (["serve", "--session-lease", "1e300"], {}, "--session-lease: must be a number of seconds"),
    (["serve", "--channel-spin", "1"], {}, "--channel-spin: must be a number of seconds from 0"),
    (["serve", "--session-idle-timeout", "inf"], {}, "--session-idle-timeout: must be a number"),
    (["serve", "--metrics-port", "70000"], {}, "--metrics-port: must be an integer from 0 to"),
    (["serve", "--metrics-port", "-1"], {}, "--metrics-port: must be an integer from 0 to"),
    (["serve", "--processes", "0"], {}, "--processes: must be an integer of at least 1"),
    (["serve", "--processes", "many"], {}, "--processes: must be an integer of at least 1"),
    (["serve", "--processes", "100000"], {}, "go past port 65535"),
    (["serve", "--processes", "2", "--bind", "inproc://x"], {}, "--processes needs a tcp://"),
    (["serve", "--curve-secret-key", "/no/such.key_secret"], {}, "CURVE needs a directory"),
    (["serve", "--import", "no_such_module_here"], {}, "cannot import no_such_module_here"),
    (["serve"], {"ENVSERVER_ALLOW_PICKLE": "perhaps"}, "ENVSERVER_ALLOW_PICKLE='perhaps'"),
    # ping
    (["ping"], {}, "name the hosts to ping"),
    (["ping"], {"ENVSERVER_HOSTS": ""}, "name the hosts to ping"),
    (["ping", "tcp//127.0.0.1:5555"], {}, "'tcp//127.0.0.1:5555' is not an endpoint"),
    (["ping", "tcp://127.0.0.1:99999"], {}, "port must be a number from 1 to 65535"),
    (["ping", "tcp://127.0.0.1:560l"], {}, "got '560l'"),
    (["ping", "tcp://*:5555"], {}, "binds every interface"),
    (["ping", "dns://envhost"], {}, "'dns://envhost' is not a host spec"),
    (["ping", "dns://envhost:0"], {}, "port must be a number from 1 to 65535"),
    (["ping"], {"ENVSERVER_HOSTS": "tcp://127.0.0.1:99999"}, "port must be a number"),
    (["ping", "--timeout", "0", NOWHERE], {}, "--timeout: must be a number of seconds above 0"),
    (["ping", "--timeout", "-1", NOWHERE], {}, "--timeout: must be a number of seconds above"),
    (["ping", "--timeout", "1e300", NOWHERE], {}, "--timeout: must be a number of seconds"),
    (["ping", "--timeout", "soon", NOWHERE], {}, "--timeout: must be a number of seconds"),
    (["ping", "--curve-server-key", "/no/such.key", NOWHERE], {}, "CURVE needs both"),
    # keygen
    (["keygen"], {}, "the following arguments are required: directory"),
    (["keygen", ""], {}, "name the directory to write the key files into"),
    # rollout
    (["rollout"], {}, "the following arguments are required: env_id"),
    (["rollout", "CartPole-v1", "--num-envs", "0"], {}, "--num-envs: must be an integer"),
    (["rollout", "CartPole-v1", "--num-envs", "-2"], {}, "--num-envs: must be an integer"),
    (["rollout", "CartPole-v1", "--steps", "0"], {}, "--steps: must be an integer of at least"),
    (["rollout", "CartPole-v1", "--seed", "x"], {}, "--seed: invalid int value: 'x'"),
    (["rollout", "CartPole-v1", "--min-hosts", "0"], {}, "--min-hosts: must be an integer"),
    (["rollout", "CartPole-v1", "--connect-timeout", "0"], {}, "--connect-timeout: must be"),
    (["rollout", "CartPole-v1", "--connect-timeout", "1e300"], {}, "--connect-timeout: must"),
    (["rollout", "CartPole-v1", "--on-host-failure", "retry"], {}, "invalid choice: 'retry'"),
    (["rollout", "CartPole-v1", "--hosts", "tcp://127.0.0.1:99999"], {}, "port must be a"),
    (["rollout", "CartPole-v1", "--hosts", "tcp//127.0.0.1:5"], {}, "is not an endpoint"),
    (["rollout", "CartPole-v1", "--hosts", "dns://h"], {}, "'dns://h' is not a host spec"),
    (["rollout", "CartPole-v1"], {"ENVSERVER_HOSTS": "tcp://h:0"}, "port must be a number"),
    (["rollout", "CartPole-v1", "--hosts", NOWHERE], {"ENVSERVER_MIN_HOSTS": "0"}, "MIN_HOSTS"),
    (["rollout", "CartPole-v1", "--min-hosts", "1"], {}, "min_hosts needs hosts"),
    (["rollout", "CartPole-v1", "--hosts", NOWHERE, "--import", "json"], {}, "--import applies"),
    (["rollout", "CartPole-v1", "--hosts", NOWHERE, "--curve-server-key", "/x"], {}, "CURVE"),
    # bench
    (["bench", "--nope"], {}, "unrecognized arguments: --nope"),
    (["bench", "--rounds", "0"], {}, "--rounds: must be an integer of at least 1"),
    (["bench", "--round-seconds", "0"], {}, "--round-seconds: must be a number of seconds"),
    (["bench", "--soak-steps", "-1"], {}, "--soak-steps: must be an integer of at least 1"),
    (["bench", "--num-envs", "0"], {}, "--num-envs: counts must be positive"),
    (["bench", "--hosts", "x"], {}, "argument --hosts"),
    (["bench", "--transports", "udp"], {}, "argument --transports"),
    (["bench", "--env-kwargs", "{oops"], {}, "argument --env-kwargs"),
    (["bench", "--batch-size", "0"], {}, "--batch-size: must be an integer of at least 1"),
    (["bench", "--quick", "--only", "nothing"], {}, "--only and --skip select nothing"),
    (["bench", "--quick", "--env-kwargs", '{"a": 1}'], {}, "--env-kwargs needs --env"),
]

#: Words that a line a user reads should not need: Python's names for what went wrong.
PYTHON_NAMES = ("ValueError", "OSError", "ZMQError", "Traceback", "TypeError:", "OverflowError")


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs ``envserver ARGS`` in a process group of its own; checks nothing is left of it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ENVSERVER_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "envserver", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, **env},
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    finally:
        with_group_gone(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def with_group_gone(group: int) -> None:
    """Asserts the command left no process in its group (polling briefly: exits take a moment)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            os.killpg(group, signal.SIGKILL)
            raise AssertionError(f"envserver left processes running in group {group}")
        time.sleep(0.05)


@pytest.mark.parametrize(("args", "env", "says"), USAGE_ERRORS, ids=lambda v: repr(v)[:60])
def test_a_usage_error_is_one_line_and_exit_status_2(args, env, says):
    result = run(args, env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    # A global option before the command is the top parser's: ``envserver: ...``.
    command = None if not args or args[0].startswith("-") else args[0]
    command = command if command in COMMANDS else None
    assert line.startswith(f"envserver {command}: " if command else "envserver: "), line
    assert says in line, line
    assert not any(name in line for name in PYTHON_NAMES), line
    assert result.stdout == ""


COMMANDS = ("serve", "ping", "keygen", "rollout", "bench")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ping", "tcp://127.0.0.1:9", "--timeout", "0.2"], "no host listens there"),
        (["keygen", "/proc/no-such-dir/keys"], "/proc/no-such-dir: No such file or directory"),
        (["serve", "--bind", "ipc:///no/such/dir/h.sock"], "cannot bind ipc:///no/such/dir/h.sock"),
        (
            [
                "serve",
                "--bind",
                "tcp://127.0.0.1:0",
                "--metrics-port",
                "0",
                "--metrics-bind",
                "999.1.1.1",
            ],
            "cannot serve metrics on 999.1.1.1:0",
        ),
        (["rollout", "NoSuchEnv-v0", "--num-envs", "1", "--steps", "1"], "doesn't exist"),
    ],
    ids=lambda v: repr(v)[:60],
)
def test_a_failure_at_run_time_is_one_line(args, says):
    """Not a usage error (exit 1, or 2 for a host that cannot start), one line all the same."""
    result = run(args, {})
    assert result.returncode in (1, 2), result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("envserver ")]
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_host_that_cannot_start_is_named_by_its_own_one_line_error(tmp_path):
    """What ``envserver bench`` says when its hosts cannot start (``--host-args``)."""
    with pytest.raises(RuntimeError) as caught:
        start_host(tmp_path, "--metrics-port", "notaport")
    assert str(caught.value) == (
        "a host exited with status 2: envserver serve: argument --metrics-port: must be an "
        "integer from 0 to 65535, got 'notaport' (see envserver serve --help)"
    )
