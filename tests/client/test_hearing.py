"""A trainer hears its envs: warnings and output from every host reach it, deduplicated, with
where they came from; bounded for a chatty env; off when asked. Real hosts, real envs."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import running_hosts, wait_for

from envserver import client
from envserver.client._transport.hearing import Hearing, describe_envs, warning_category

CHATTY = "envserver.testing:envserver/Chatty-v0"
pytestmark = pytest.mark.filterwarnings("ignore:.*ChattyEnv was reset")


def lines_of(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_local_hosts_tell_the_trainer_what_their_envs_say(capfd):
    envs = client.make_vec(CHATTY, 4, vector_kwargs={"num_local_hosts": 2})
    try:
        with pytest.warns(UserWarning, match=r"^\[envs 0-3 on 2 hosts, 4x\] ChattyEnv was reset"):
            envs.reset(seed=7)
        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            envs.reset(seed=7)  # the same warning: each session hears it once, as Python shows it
        assert not [w for w in again if "ChattyEnv" in str(w.message)]
        envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()
    err = capfd.readouterr().err
    for index, host in ((0, 0), (1, 0), (2, 1), (3, 1)):
        assert f"(env {index}, local host {host}) reset {7 + index}\n" in err
    assert lines_of(err, "hello from every env") == [
        "(envs 0-3 on 2 hosts) hello from every env [repeated 4x]"
    ]
    # Written to file descriptor 2 by "native" code: the host cannot tell which env.
    assert lines_of(err, "native 1") == ["(2 hosts) native 1 [repeated 4x]"]


def test_one_line_for_sixteen_envs_with_its_count(capfd):
    envs = client.make_vec(CHATTY, 16, vector_kwargs={"num_local_hosts": 4})
    try:
        envs.reset(seed=0)
        capfd.readouterr()
        envs.step(np.ones(16, dtype=np.int64))
    finally:
        envs.close()
    err = capfd.readouterr().err
    assert lines_of(err, "hello from every env") == [
        "(envs 0-15 on 4 hosts) hello from every env [repeated 16x]"
    ]
    assert len(lines_of(err, "step 1")) == 1


def test_gymnasium_env_checker_warning_from_a_remote_host_reaches_pytest_warns(tmp_path):
    with running_hosts(tmp_path, 1, bind="tcp://127.0.0.1:*") as (host,):
        envs = client.make_vec(CHATTY, 2, hosts=[host.endpoint], out_of_space=True)
        try:
            with pytest.warns(UserWarning, match="is not within the observation space") as heard:
                envs.reset(seed=0)
        finally:
            envs.close()
    checker = [w for w in heard if "observation space" in str(w.message)]
    assert checker and checker[0].filename.endswith("passive_env_checker.py")
    assert str(checker[0].message).startswith(f"[envs 0-1, host {host.endpoint}, 2x] ")


def test_the_host_log_has_it_all_whether_or_not_the_trainer_hears(tmp_path, capfd):
    with running_hosts(tmp_path, 1, bind="tcp://127.0.0.1:*") as (host,):
        for forward in (True, False):
            envs = client.make_vec(
                CHATTY, 2, hosts=[host.endpoint], vector_kwargs={"forward_env_output": forward}
            )
            try:
                envs.reset(seed=3)
                envs.step(np.zeros(2, dtype=np.int64))
            finally:
                envs.close()
        wait_for(lambda: host.log_text().count("reset 4") >= 2, "the host to log both sessions")
    err = capfd.readouterr().err
    assert len(lines_of(err, "reset 4")) == 1  # the second trainer did not ask
    assert "env 1: reset 4" in host.log_text()  # attributed when heard, plain when not


def test_the_environment_turns_forwarding_off(monkeypatch, capfd):
    monkeypatch.setenv("ENVSERVER_FORWARD_ENV_OUTPUT", "0")
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        envs = client.make_vec(CHATTY, 2, vector_kwargs={"num_local_hosts": 1})
        try:
            envs.reset(seed=0)
            envs.step(np.zeros(2, dtype=np.int64))
        finally:
            envs.close()
    assert not [w for w in heard if "ChattyEnv" in str(w.message)]
    assert "hello from every env" not in capfd.readouterr().err
    monkeypatch.setenv("ENVSERVER_FORWARD_ENV_OUTPUT", "sometimes")
    with pytest.raises(ValueError, match="ENVSERVER_FORWARD_ENV_OUTPUT='sometimes'"):
        client.make_vec(CHATTY, 1)


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))


@pytest.mark.timeout(300)
def test_a_chatty_env_costs_bounded_memory_and_says_what_was_cut(tmp_path, capfd):
    megabyte = 1 << 20
    with running_hosts(tmp_path, 1, bind="tcp://127.0.0.1:*") as (host,):
        envs = client.make_vec(CHATTY, 2, hosts=[host.endpoint], print_bytes=megabyte)
        try:
            envs.reset(seed=0)
            for _ in range(5):
                envs.step(np.zeros(2, dtype=np.int64))
            before = rss_kb(host.process.pid)
            for _ in range(40):  # 80 MB printed
                envs.step(np.zeros(2, dtype=np.int64))
            after = rss_kb(host.process.pid)
        finally:
            envs.close()
    assert after - before < 16 * 1024, f"host RSS grew from {before} to {after} kB"
    err = capfd.readouterr().err
    long_lines = lines_of(err, "xxxx")
    assert len(long_lines) == 45  # one per step, both envs' lines as one
    assert all(len(line) < 2100 and "…" in line for line in long_lines)
    assert "[repeated 2x]" in long_lines[0]


def test_an_env_that_fails_is_heard_up_to_its_failure(capfd):
    envs = client.make_vec(CHATTY, 2, vector_kwargs={"num_local_hosts": 1})
    try:
        envs.reset(seed=0)
        capfd.readouterr()
        with pytest.raises(ZeroDivisionError):
            envs.call("shout", "about to fail")
    finally:
        envs.close()
    assert "(env 0, local host 0) about to fail\n" in capfd.readouterr().err


# ------------------------------------------------------------- the parts, alone


def test_where_is_said_as_a_user_reads_it():
    assert describe_envs([3], ["local host 0"]) == "env 3, local host 0"
    assert describe_envs([0, 1, 2, 5], ["tcp://a:1"]) == "envs 0-2,5, tcp://a:1"
    assert describe_envs(range(16), ["h1", "h2", "h1"]) == "envs 0-15 on 2 hosts"
    assert describe_envs([], ["h1"]) == "h1"


def test_categories_map_to_known_classes_only():
    assert warning_category("builtins.DeprecationWarning") is DeprecationWarning
    assert warning_category("builtins.ValueError") is None  # not a warning
    assert warning_category("evil.module.Warning") is None  # never imported
    assert warning_category("gymnasium.logger.nothing") is None


def test_an_unknown_category_is_a_user_warning_that_names_it():
    hearing = Hearing()
    said = {
        "warnings": [
            {
                "category": "mylib.CustomWarning",
                "message": "careful",
                "filename": "/srv/mylib.py",
                "lineno": 9,
                "envs": [1],
                "count": 1,
            }
        ],
        "output": [],
        "cut": {"warnings": 0, "lines": 0, "bytes": 0},
    }
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("default")
        hearing.heard("h", 4, said)
        hearing.tell()
        hearing.heard("h", 4, said)
        hearing.tell()  # once per location, as Python shows it
    (warning,) = heard
    assert warning.category is UserWarning and warning.lineno == 9
    assert str(warning.message) == "[env 5, h] careful (mylib.CustomWarning)"


def test_an_agent_loop_pool_hears_its_envs_by_their_names_and_not_when_off(tmp_path, capfd):
    """The asyncio pool's envs are told as the pool names them (``env N``: their session's
    index differs), what coroutines stepped in one message once with its count; off, nothing."""
    import asyncio

    from envserver.client import aio

    with running_hosts(tmp_path, 2, bind="tcp://127.0.0.1:*") as hosts:
        endpoints = [h.endpoint for h in hosts]

        async def main(forward: bool) -> list[str]:
            async with aio.EnvPool(CHATTY, hosts=endpoints, forward_env_output=forward) as pool:
                envs = [await pool.make() for _ in range(4)]
                await asyncio.gather(*(env.reset(seed=10 + k) for k, env in enumerate(envs)))
                await asyncio.gather(*(env.step(0) for env in envs))
                return [env.host for env in envs]

        with pytest.warns(UserWarning, match=r"^\[envs? [0-3-,]+.*\] ChattyEnv was reset"):
            places = asyncio.run(main(True))
        err = capfd.readouterr().err
        for k, host in enumerate(places):
            assert f"(env {k}, {host}) reset {10 + k}\n" in err
        assert sorted(lines_of(err, "hello from every env")) == sorted(
            f"(envs {a},{b}, {host}) hello from every env [repeated 2x]"
            for host in dict.fromkeys(places)
            for a, b in [[k for k, h in enumerate(places) if h == host]]
        )
        with warnings.catch_warnings(record=True) as off:
            warnings.simplefilter("always")
            asyncio.run(main(False))
        assert not [w for w in off if "ChattyEnv" in str(w.message)]
        assert not lines_of(capfd.readouterr().err, "hello from every env")


def test_sessions_that_overlap_on_one_host_each_hear_their_own_envs_only(tmp_path, capfd):
    """Two pools share a host, their requests running on threads at once: the one that hears
    its envs gets what they said, never a word of the other's (seeds 90+), which is not heard."""
    import asyncio

    from envserver.client import aio

    with running_hosts(tmp_path, 1) as (host,):

        async def rollouts(pool: aio.EnvPool, seeds: range) -> None:
            envs = [await pool.make() for _ in seeds]
            for _ in range(20):
                await asyncio.gather(*(env.reset(seed=s) for s, env in zip(seeds, envs)))

        async def main() -> None:
            async with (
                aio.EnvPool(CHATTY, hosts=[host.endpoint]) as heard,
                aio.EnvPool(CHATTY, hosts=[host.endpoint], forward_env_output=False) as quiet,
            ):
                await asyncio.gather(rollouts(heard, range(10, 14)), rollouts(quiet, range(90, 94)))

        asyncio.run(main())
    err = capfd.readouterr().err
    assert {line.rsplit(" ", 1)[1] for line in lines_of(err, ") reset ")} == {
        "10",
        "11",
        "12",
        "13",
    }


def test_envs_stepped_on_env_threads_are_heard_by_their_indices(capfd):
    """A vector env whose host steps its envs on env threads: each thread's words go with the
    command they ran for, each line named by its env."""
    envs = client.make_vec(CHATTY, 4, vector_kwargs={"num_local_hosts": 1, "env_threads": 4})
    try:
        envs.reset(seed=0)
        capfd.readouterr()
        envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()
    err = capfd.readouterr().err
    assert lines_of(err, "hello from every env") == [
        "(envs 0-3, local host 0) hello from every env [repeated 4x]"
    ]
    assert len(lines_of(err, ") step 1")) == 1
