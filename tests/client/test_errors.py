"""Exceptions raised by remote envs reach the trainer with their type, host, env index and
remote traceback; the host keeps serving and the vector env stays usable."""

from __future__ import annotations

import functools
import json
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same, message_faults

from envserver import client
from envserver.errors import HostUnavailableError, ProtocolError, RemoteEnvError, RemoteTraceback
from envserver.testing import HostProcess, start_host

FAILING = "envserver.testing:envserver/Failing-v0"


def test_the_error_message_scan_sees_an_env_s_error_rebuilt(
    plain_hosts, error_messages_name_hosts_once
):
    # The suite's scan of error messages (conftest.py) hooks where they are made: if a rename
    # moved that place, this test sees nothing recorded.
    envs = client.RemoteVectorEnv(env_id=FAILING, num_envs=1, hosts=plain_hosts[:1])
    envs.set_attr("step_error_at", [1])
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="simulated failure in step") as caught:
            envs.step(np.zeros(1, dtype=np.int64))
    finally:
        envs.close()
    assert str(caught.value) in error_messages_name_hosts_once
    assert str(caught.value) == f"host {plain_hosts[0]}, env 0: simulated failure in step"


@pytest.mark.parametrize(
    ("error", "expected_type"),
    [("value", ValueError), ("gym", gym.error.ResetNeeded), ("custom", RemoteEnvError)],
)
def test_step_error_reaches_trainer(plain_hosts, error, expected_type):
    # Env 3 (the second env of host 1) fails on its 3rd step; the others never do.
    envs = client.RemoteVectorEnv(
        env_id=FAILING, num_envs=4, hosts=plain_hosts[:2], env_kwargs={"error": error}
    )
    envs.set_attr("step_error_at", [None, None, None, 3])
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(expected_type) as caught:
            envs.step(np.zeros(4, dtype=np.int64))
        message = str(caught.value)
        assert plain_hosts[1] in message
        assert "env 3" in message
        assert "simulated failure in step" in message
        if expected_type is RemoteEnvError:
            assert caught.value.remote_type == "envserver.testing.envs.SimulatorCrash"
        cause = caught.value.__cause__
        assert isinstance(cause, RemoteTraceback)
        assert "envs.py" in cause.tb and "in step" in cause.tb and "in _raise" in cause.tb
        assert cause.tb.startswith("Traceback")

        # Usable again after a reset, step for step like a fresh SyncVectorEnv.
        envs.set_attr("step_error_at", None)
        oracle = SyncVectorEnv(
            [functools.partial(gym.make, "envserver/Failing-v0", error=error)] * 4
        )
        assert_same(envs.reset(seed=5)[0], oracle.reset(seed=5)[0])
        for _ in range(5):
            actions = np.ones(4, dtype=np.int64)
            assert_same(envs.step(actions), oracle.step(actions))
        oracle.close()
    finally:
        envs.close()


def test_reset_error_reaches_trainer_and_host_survives(plain_hosts):
    envs = client.RemoteVectorEnv(
        env_id=FAILING, num_envs=3, hosts=plain_hosts[:1], env_kwargs={"reset_error_at": 2}
    )
    try:
        envs.reset(seed=1)
        with pytest.raises(ValueError, match=r"env 0: simulated failure in reset") as caught:
            envs.reset(seed=2)
        assert plain_hosts[0] in str(caught.value)
        assert "in reset" in caught.value.__cause__.tb
        assert "simulated failure in reset" in caught.value.__cause__.tb
        obs, _ = envs.reset(seed=3)  # the third reset of every env succeeds
        assert obs.shape == (3, 2)
    finally:
        envs.close()
    # The host still serves new clients.
    other = client.make_vec("CartPole-v1", num_envs=2, hosts=plain_hosts[:1])
    assert other.reset(seed=0)[0].shape == (2, 4)
    other.close()


def test_error_while_making_envs(plain_hosts):
    with pytest.raises(TypeError, match="env 0") as caught:
        client.make_vec("CartPole-v1", num_envs=2, hosts=plain_hosts[:1], no_such_argument=1)
    assert plain_hosts[0] in str(caught.value)
    with pytest.raises(gym.error.Error):
        client.make_vec("NoSuchEnv-v0", num_envs=1, hosts=plain_hosts[:1])


def test_call_error_and_unencodable_result(plain_hosts):
    envs = client.make_vec("CartPole-v1", num_envs=2, hosts=plain_hosts[:2])
    try:
        with pytest.raises(AttributeError, match="env 0"):
            envs.get_attr("no_such_attribute")
        # A value that only travels pickled, from a host that does not allow pickle.
        with pytest.raises(TypeError, match="without pickle"):
            envs.get_attr("unwrapped")
        assert envs.get_attr("gravity") == (9.8, 9.8)
    finally:
        envs.close()


# A host process whose STEP replies are altered as the test says (a broken or hostile host).
BROKEN_HOST = """
import json, os, sys
from envserver.cli import app as cli
from envserver.host.commands import HostCommands
changes = json.loads(os.environ["BROKEN_HOST_STEP_CHANGES"])
step = HostCommands._step
HostCommands._step = lambda self, session, body: {**step(self, session, body), **changes}
from envserver.wire.raw import StepLayout
StepLayout.shared_by = classmethod(lambda cls, envs: None)  # no raw steps: every step a STEP
sys.exit(cli.main(sys.argv[sys.argv.index("serve"):]))
"""


def start_broken_host(tmp_path, monkeypatch, changes: dict) -> HostProcess:
    script = tmp_path / "broken_host.py"
    script.write_text(BROKEN_HOST)
    monkeypatch.setenv("BROKEN_HOST_STEP_CHANGES", json.dumps(changes))
    return start_host(tmp_path, prefix=[sys.executable, str(script)])


@pytest.mark.parametrize(
    "changes",
    [
        {"rewards": [None]},
        {"rewards": ["1.5"]},
        {"rewards": [True]},
        {"rewards": [0.0, 0.0]},
        {"terminations": ["False"]},
        {"terminations": [0.5]},
        {"truncations": [[True]]},
        {"truncations": None},
    ],
    ids=json.dumps,
)
def test_a_malformed_step_reply_is_refused_and_its_host_not_trusted_again(
    tmp_path, monkeypatch, changes
):
    host = start_broken_host(tmp_path, monkeypatch, changes)
    refused_then_untrusted(host, 1, "malformed reply")


def refused_then_untrusted(host: HostProcess, num_envs: int, match: str) -> None:
    """A step on ``host`` raises ProtocolError (``match``), the next HostUnavailableError."""
    envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=num_envs, hosts=[host.endpoint])
    try:
        envs.reset(seed=0)
        with pytest.raises(ProtocolError, match=match):
            envs.step(np.zeros(num_envs, dtype=np.int64))
        with pytest.raises(HostUnavailableError, match=match):
            envs.step(np.zeros(num_envs, dtype=np.int64))
    finally:
        envs.close()
        host.stop()


BROKEN_RAW_HOST = """
import os, sys
from envserver.cli import app as cli
from envserver.host.commands import HostCommands
case = os.environ["BROKEN_RAW_CASE"]
step_raw = HostCommands._step_raw
def broken(self, session, frames):
    out = [bytes(memoryview(f).cast("B")) for f in step_raw(self, session, frames)]
    if case == "flag-2":
        out[1] = out[1][:-1] + b"\\x02"
    elif case == "short-obs":
        out[0] = out[0][:-1]
    elif case == "no-columns":
        out = out[:1]
    elif case == "bad-infos":
        out.append(b"\\xc1")
    elif case == "empty-infos":
        out.append(b"\\x90")
    return out
HostCommands._step_raw = broken
sys.exit(cli.main(sys.argv[sys.argv.index("serve"):]))
"""


@pytest.mark.parametrize("case", ["flag-2", "short-obs", "no-columns", "bad-infos", "empty-infos"])
def test_a_malformed_raw_step_reply_is_refused_and_its_host_not_trusted_again(
    tmp_path, monkeypatch, case
):
    """A STEP_RAW reply that does not fit the layout is refused; that host is not used again."""
    script = tmp_path / "broken_raw_host.py"
    script.write_text(BROKEN_RAW_HOST)
    monkeypatch.setenv("BROKEN_RAW_CASE", case)
    refused_then_untrusted(
        start_host(tmp_path, prefix=[sys.executable, str(script)]), 2, "invalid reply"
    )


def test_a_broken_host_is_recovered_with_restart_never_raised_out_of_step(tmp_path, monkeypatch):
    """With on_host_failure="restart", a reply that does not decode is a lost host: its envs
    are made anew and reported lost (here on the same broken host, so at every step)."""
    script = tmp_path / "broken_raw_host.py"
    script.write_text(BROKEN_RAW_HOST)
    monkeypatch.setenv("BROKEN_RAW_CASE", "short-obs")
    host = start_host(tmp_path, prefix=[sys.executable, str(script)])
    envs = client.RemoteVectorEnv(
        env_id="CartPole-v1", num_envs=2, hosts=[host.endpoint], on_host_failure="restart"
    )
    try:
        envs.reset(seed=0)
        for restarts in (1, 2):
            *_, truncations, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert truncations.all() and infos["host_failure"].all()
            assert envs.host_restarts == restarts
    finally:
        envs.close()
        host.stop()


def test_the_broken_host_harness_works_unchanged(tmp_path, monkeypatch):
    # The control for the test above: with no change, that host steps as SyncVectorEnv.
    host = start_broken_host(tmp_path, monkeypatch, {})
    envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=1, hosts=[host.endpoint])
    oracle = gym.make_vec("CartPole-v1", num_envs=1, vectorization_mode="sync")
    try:
        assert_same(envs.reset(seed=0), oracle.reset(seed=0))
        for _ in range(20):
            actions = np.ones(1, dtype=np.int64)
            assert_same(envs.step(actions), oracle.step(actions))
    finally:
        envs.close()
        oracle.close()
        host.stop()


def public_name(cls: type) -> str:
    """``module.Name`` as users write it (multiprocessing.context's types as multiprocessing's)."""
    module = cls.__module__
    return f"{'multiprocessing' if module == 'multiprocessing.context' else module}.{cls.__name__}"


def drawn_tree(root: type, depth: int = 0, last: bool = True) -> list[str]:
    """The exception tree under ``root`` as errors.py draws it (names and extra bases)."""
    parent = root.__mro__[1]
    extra = [base for base in root.__bases__ if base is not parent and base is not Exception]
    names = [b.__name__ if b.__module__ == "builtins" else public_name(b) for b in extra]
    label = root.__name__ + (f" ({', '.join(names)})" if names else "")
    lines = [label if depth == 0 else ("└── " if last else "├── ") + label]
    children = [c for c in root.__subclasses__() if c.__module__ == "envserver.errors"]
    for index, child in enumerate(children):
        below = drawn_tree(child, depth + 1, index == len(children) - 1)
        lines += [below[0]] + [
            ("    " if index == len(children) - 1 else "│   ") + line for line in below[1:]
        ]
    return lines


def test_the_docstring_draws_the_exception_tree_of_the_code():
    import re

    from envserver import errors

    block = errors.__doc__.split("::")[1].strip("\n").split("\n\n")[0]
    # Each line: the tree's prefix, the class (and its extra bases), two spaces, what it means.
    lines = [re.match(r"([│├└─ ]*)(.*?)(?: {2,}|$)", line[4:]) for line in block.splitlines()]
    documented = [match.group(1) + match.group(2) for match in lines]
    assert documented == drawn_tree(errors.EnvServerError)
    assert "    │   └── MessageTooLargeError" in [f"    {line}" for line in documented]


def every_error() -> set[str]:
    from envserver import errors

    found, todo = set(), [errors.EnvServerError]
    while todo:
        error = todo.pop()
        if error.__module__ == "envserver.errors":
            found.add(error.__name__)
            todo += error.__subclasses__()
    return found


def test_both_packages_export_every_error():
    import envserver

    assert len(every_error()) == 17  # EnvServerError and 16 below it
    for package in (envserver, client):
        exported = {name for name in package.__all__ if name.endswith("Error")}
        assert exported == every_error(), package.__name__
        assert all(getattr(package, name) is getattr(envserver.errors, name) for name in exported)


def test_the_suites_message_scan_finds_what_it_looks_for():
    """tests/conftest.py scans every error message of the run with this check."""
    assert message_faults("host tcp://h:5555: host tcp://h:5555 refuses pickled data") == [
        "names tcp://h:5555 2 times"
    ]
    assert message_faults("host ipc:///tmp/envserver-ab12/host-0.sock, env 2: boom") == [
        "names a local host's socket"
    ]
    assert message_faults("local host 0, env 2: boom; host tcp://a:1 and tcp://b:1") == []
