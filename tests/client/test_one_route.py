"""One recovery route: a host failure gets the same decision from lockstep steps and from
first-ready batches of every env (issue 52).

The same fault schedule runs through ``step`` and through ``send``/``recv`` (batches of all the
envs, so both ask every env each round), with ``on_host_failure`` "restart" and "restore", on
the vector env's local hosts and on hosts of the host list. Each fault's decision is read from
what the trainer sees: the envs resumed (no loss, no restart), restored (a restart, no loss) or
re-made (a restart, and their loss reported in ``infos["host_failure"]``). Both runs must take
the decisions the policy names, step for step equal to SyncVectorEnv but for the losses they
report, and equal to each other.

Where the two call styles differ, :class:`RouteDiffers` says how.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import SyncVectorEnv
from helpers import assert_same, wait_for

from envserver import client
from envserver.testing import HostProcess, start_host
from envserver.testing.envs import EpisodicEnv

EPISODIC = "envserver.testing:envserver/Episodic-v0"
KWARGS = {"terminate_prob": 0.05, "max_steps": 30}
MAKE = functools.partial(gym.make, EPISODIC, **KWARGS)
STEPS = 12
FAILED = [2, 3]  # the envs of host 1, the one that fails
STYLES = ["lockstep", "first-ready"]


class RouteDiffers(AssertionError):
    """The call styles took different decisions, or gave different results."""


class WakeOnRecovery(logging.Handler):
    """Continues a stopped process the moment the client starts recovering its host."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.woken = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.woken and "recovering" in record.getMessage():
            self.woken = True
            with contextlib.suppress(ProcessLookupError):  # in the client's recovery: no raise
                os.kill(self.pid, signal.SIGCONT)


class LocalHosts:
    """The vector env's two local hosts: a killed or frozen one is respawned in its place."""

    def options(self) -> dict:
        return {"num_local_hosts": 2}

    def pid(self, envs: client.RemoteVectorEnv) -> int:
        return envs._hosts.local.processes[1].pid

    def kill(self, envs: client.RemoteVectorEnv) -> None:
        os.kill(self.pid(envs), signal.SIGKILL)


class ListedHosts:
    """Two hosts of the host list (TCP): a killed one is started again on its port."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.hosts = [self._start("tcp://127.0.0.1:*") for _ in range(2)]

    def _start(self, bind: str) -> HostProcess:
        return start_host(self.directory, "--allow-pickle", bind=bind)

    def options(self) -> dict:
        return {"hosts": [h.endpoint for h in self.hosts]}

    def pid(self, envs: client.RemoteVectorEnv) -> int:
        return self.hosts[1].process.pid

    def kill(self, envs: client.RemoteVectorEnv) -> None:
        self.hosts[1].stop(signal.SIGKILL)
        self.hosts[1] = self._start(self.hosts[1].endpoint)

    def stop(self) -> None:
        for host in self.hosts:
            host.process.send_signal(signal.SIGCONT)
            host.stop()


class Calls:
    """A vector env stepped in one call style: lockstep, or first-ready batches of all envs."""

    def __init__(self, envs: client.RemoteVectorEnv, style: str) -> None:
        self.envs, self.first_ready = envs, style == "first-ready"

    def reset(self, seed: int) -> tuple:
        if not self.first_ready:
            return self.envs.reset(seed=seed)
        self.envs.async_reset(seed=seed)
        obs, _, _, _, infos = self.finish()
        return obs, infos

    def start(self, actions: np.ndarray) -> None:
        if self.first_ready:
            self.envs.send(actions)
        else:
            self.envs.step_async(actions)

    def finish(self) -> tuple:
        if not self.first_ready:
            return self.envs.step_wait()
        obs, rewards, terminations, truncations, infos = self.envs.recv(timeout=120)
        assert infos.pop("env_id").tolist() == [0, 1, 2, 3]  # a batch of all, in order
        return obs, rewards, terminations, truncations, infos


def by_key(result: tuple) -> tuple:
    """``result`` with its infos' keys sorted, at every level: a first-ready batch merges the
    infos of its hosts' replies in the order they came, so its keys may come in another order
    than SyncVectorEnv's."""

    def sort(value):
        if isinstance(value, dict):
            return {key: sort(value[key]) for key in sorted(value)}
        return value

    return (*result[:-1], sort(result[-1]))


def decision(restarts: int, lost: list[int]) -> str | None:
    """What a recovery did, as the trainer sees it (None: nothing)."""
    names = {(0, False): None, (1, False): "restored", (1, True): "re-made"}
    return names.get((restarts, bool(lost)), f"{restarts} restarts, envs {lost} lost")


def lost_envs(infos: dict) -> list[int]:
    return np.flatnonzero(infos["_host_failure"]).tolist() if "_host_failure" in infos else []


def gates(directory: Path, style: str) -> tuple[Path, Path]:
    """Host 1's envs step only while the first file exists, and make the second as they begin."""
    return directory / f"{style}-gate", directory / f"{style}-started"


def vector_env(hosts, mode: str, directory: Path, style: str) -> client.RemoteVectorEnv:
    """Four Episodic envs, two on each host. Host 1's have gates (made with them, so every
    env restored or re-made has them as well)."""
    gate, started = map(str, gates(directory, style))
    gated = functools.partial(MAKE, step_gate=gate, step_started=started)
    return client.RemoteVectorEnv(
        [MAKE, MAKE, gated, gated],
        on_host_failure=mode,
        snapshot_every=4,
        host_timeout_s=2.0,
        **hosts.options(),
    )


def run(envs, style, hosts, faults: dict[int, str], directory: Path) -> tuple[list, list]:
    """Runs the schedule ``faults`` (by step) in ``style``, checked against SyncVectorEnv.

    Envs of a host that recovered stay equal to the oracle's, but those that report a loss,
    which go on from then as envs made anew.

    Returns:
        Each fault's step and decision; every result (the reset's first).
    """
    calls = Calls(envs, style)
    oracle = SyncVectorEnv([lambda: EpisodicEnv(**KWARGS)] * 4)
    gate, started = gates(directory, style)
    gate.touch()
    try:
        first = calls.reset(seed=3)
        assert_same(by_key(first), by_key(oracle.reset(seed=3)))
        results, decisions = [first], []
        remade = np.zeros(4, dtype=np.bool_)  # envs that went on as envs made anew
        previous = first[0]
        for t in range(STEPS):
            actions = np.array([(t + i) % 3 for i in range(4)])
            restarts = envs.host_restarts
            fault = faults.get(t)
            wake = None
            if fault == "kill-between":
                hosts.kill(envs)
            elif fault == "freeze":
                wake = WakeOnRecovery(hosts.pid(envs))
                logging.getLogger("envserver.client").addHandler(wake)
                os.kill(wake.pid, signal.SIGSTOP)
            elif fault == "kill-mid-step":
                gate.unlink()
                started.unlink(missing_ok=True)
            try:
                calls.start(actions)
                if fault == "kill-mid-step":
                    wait_for(started.exists, "host 1 never began the step")
                    hosts.kill(envs)
                    gate.touch()
                got = calls.finish()
            finally:
                if wake is not None:
                    logging.getLogger("envserver.client").removeHandler(wake)
                    if not wake.woken:  # for the next test, on the same hosts
                        os.kill(wake.pid, signal.SIGCONT)
            if wake is not None:
                assert wake.woken, f"step {t}: no recovery of the frozen host"
            lost = lost_envs(got[4])
            taken = decision(envs.host_restarts - restarts, lost)
            if fault is not None:
                decisions.append((t, taken or "resumed"))
            else:
                assert taken is None, f"step {t}, no fault: {taken}"
            expected = oracle.step(actions)
            if lost:
                assert lost == FAILED, f"step {t}"
                assert got[3][lost].all() and not got[2][lost].any() and not got[1][lost].any()
                np.testing.assert_array_equal(got[0][lost], previous[lost])
                remade[lost] = True
            kept = ~remade
            if kept.all():
                assert_same(by_key(got), by_key(expected), f"step {t}")
            else:
                for k, (a, e) in enumerate(zip(got[:4], expected[:4])):
                    np.testing.assert_array_equal(a[kept], e[kept], f"step {t}, part {k}")
            results.append(got)
            previous = got[0]
        return decisions, results
    finally:
        oracle.close()


def compare(runs: dict[str, tuple[list, list]], expected: list) -> None:
    """Lockstep took the ``expected`` decisions; first-ready took its, with its results."""
    (lockstep, lockstep_results), (first_ready, first_ready_results) = runs.values()
    assert lockstep == expected, "lockstep's decisions"
    if first_ready != lockstep:
        raise RouteDiffers(f"lockstep took {lockstep}, first-ready {first_ready}")
    try:
        for t, (a, b) in enumerate(zip(lockstep_results, first_ready_results)):
            assert_same(by_key(b), by_key(a), f"result {t}")
    except AssertionError as exc:
        raise RouteDiffers(f"first-ready's results are not lockstep's: {exc}") from None


def both_styles(hosts, mode: str, faults: dict[int, str], directory: Path) -> dict:
    runs = {}
    for style in STYLES:
        envs = vector_env(hosts, mode, directory, style)
        try:
            runs[style] = run(envs, style, hosts, faults, directory)
        finally:
            envs.close()
    return runs


@pytest.fixture(scope="module")
def listed_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ListedHosts]:
    """Shared by the tests of this file: each leaves them running (host 1 started anew)."""
    hosts = ListedHosts(tmp_path_factory.mktemp("listed-hosts"))
    try:
        yield hosts
    finally:
        hosts.stop()


KILLS = {2: "kill-between", 6: "kill-mid-step"}
LOST = {"restart": "re-made", "restore": "restored"}


@pytest.mark.parametrize("mode", ["restart", "restore"])
def test_local_hosts_killed_or_frozen(mode: str, tmp_path: Path) -> None:
    """A local host killed or frozen is respawned: its envs are restored or re-made."""
    faults = {**KILLS, 10: "freeze"}
    runs = both_styles(LocalHosts(), mode, faults, tmp_path)
    compare(runs, [(t, LOST[mode]) for t in faults])


@pytest.mark.parametrize("mode", ["restart", "restore"])
def test_a_listed_host_killed_and_started_again(mode: str, listed_hosts, tmp_path: Path) -> None:
    """Started again on its port, the host does not hold the session: restored or re-made."""
    runs = both_styles(listed_hosts, mode, KILLS, tmp_path)
    compare(runs, [(t, LOST[mode]) for t in KILLS])


@pytest.mark.parametrize("mode", ["restart", "restore"])
def test_a_listed_host_frozen_then_continued(mode: str, listed_hosts, tmp_path: Path) -> None:
    """Continued as recovery starts, the host still holds the session: it is resumed, in
    both call styles."""
    faults = {3: "freeze"}
    runs = both_styles(listed_hosts, mode, faults, tmp_path)
    compare(runs, [(3, "resumed")])
