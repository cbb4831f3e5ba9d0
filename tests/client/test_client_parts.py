"""The client's parts, each through its own interface: Hosts, VectorSpaces, EnvResults,
Lockstep, Recovery and FirstReady (RemoteVectorEnv composes them; see its tests for the whole).

Real host processes (the session's plain hosts, or embedded local hosts) and real CartPole envs;
results are compared with Gymnasium's own envs, seeded the same.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState

from envserver.client._env_results import EnvResults
from envserver.client._hosts import Hosts
from envserver.client._options import VectorOptions
from envserver.client._parts import VectorParts
from envserver.client._recipe import EnvRecipe
from envserver.client._spaces import VectorSpaces
from envserver.client._transport.session import HostSession
from envserver.errors import WaitTimeoutError
from envserver.testing import start_host
from envserver.wire.bodies import Call, Reset, SetAttr, Step
from envserver.wire.messages import Command, Status
from envserver.wire.replies import HelloReply, MakeReply, StepReply

CARTPOLE = "CartPole-v1"


def connected(endpoints, num_envs: int, **options) -> Hosts:
    """Hosts found (or started: ``endpoints`` None) and connected, as RemoteVectorEnv does."""
    hosts = Hosts(VectorOptions(**options))
    found = hosts.find(endpoints, num_envs, curve=None)
    hosts.connect(found, num_envs, allow_pickle=endpoints is None, curve=None)
    return hosts


def made_with(hosts: Hosts, env_ids=None) -> list:
    """Sessions opened and envs made (``env_ids``: the env id each host makes; CartPole)."""
    if env_ids is None:
        return hosts.make_envs(EnvRecipe(None, CARTPOLE, allow_pickle=hosts.local is not None))
    by_host = dict(zip(hosts.pool.connections, env_ids))
    for connection, body in hosts.pool.round_trip(
        Command.HELLO, lambda c: EnvRecipe(None, CARTPOLE).hello(), 60
    ):
        hello = HelloReply.from_wire(body)
        connection.hold(HostSession(hello.session, hello.info))
    made = hosts.pool.round_trip(
        Command.MAKE,
        lambda c: EnvRecipe(None, by_host[c]).make(c.block.start, c.block.stop),
        60,
    )
    return [(connection, MakeReply.from_wire(body)) for connection, body in made]


@pytest.fixture
def compose() -> Iterator:
    """The parts, composed as RemoteVectorEnv composes them, on given hosts (None: local)."""
    made: list[Hosts] = []

    def build(endpoints, num_envs, batch_size=None, **kwargs):
        hosts = connected(endpoints, num_envs, **kwargs)
        made.append(hosts)
        options = hosts.options
        recipe = EnvRecipe.of(None, CARTPOLE, {}, options, local=endpoints is None)
        spaces = VectorSpaces.of(hosts.make_envs(recipe), "same")
        parts = VectorParts.compose(hosts, recipe, spaces, options, batch_size or num_envs)
        return SimpleNamespace(hosts=hosts, pool=hosts.pool, spaces=spaces, **vars(parts))

    yield build
    for hosts in made:
        hosts.close(polite=True)


def reference(num_envs: int, seed: int) -> tuple[SyncVectorEnv, np.ndarray]:
    envs = SyncVectorEnv([lambda: gym.make(CARTPOLE)] * num_envs)
    obs, _ = envs.reset(seed=seed)
    return envs, obs


# ----------------------------------------------------------------- Hosts


def test_hosts_spread_the_envs_in_blocks_and_close_closes_the_sessions(plain_hosts):
    hosts = connected(plain_hosts, 5)
    pool = hosts.pool
    assert [(c.block.endpoint, c.block.start, c.block.count) for c in pool.connections] == [
        (plain_hosts[0], 0, 2),
        (plain_hosts[1], 2, 2),
        (plain_hosts[2], 4, 1),
    ]
    made_with(hosts)
    sessions = [c.requests.session for c in pool.connections]
    hosts.close(polite=True)

    again = connected(plain_hosts, 3)
    try:
        for connection, session in zip(again.pool.connections, sessions):
            connection.hold(session)  # the old session: the host closed it
            reply = again.pool.ask(connection, Command.RESET, Reset([None]), time.monotonic() + 60)
            assert reply.status == Status.ERROR
            assert reply.body["type"] == "UnknownSessionError"
            connection.let_go()
    finally:
        again.close(polite=False)


def test_hosts_start_local_hosts_and_stop_them_at_close():
    hosts = connected(None, 3, num_local_hosts=2)
    processes = list(hosts.local.processes)
    assert [c.block.count for c in hosts.pool.connections] == [2, 1]
    assert all(c.block.endpoint.startswith("ipc://") for c in hosts.pool.connections)
    made_with(hosts)
    hosts.close(polite=True)
    assert hosts.local is None
    assert all(p.poll() is not None for p in processes)


def test_hosts_refuse_min_hosts_without_hosts_and_more_hosts_than_envs(plain_hosts):
    with pytest.raises(ValueError, match="min_hosts needs hosts"):
        Hosts(VectorOptions(min_hosts=1)).find(None, 2, curve=None)
    hosts = Hosts(VectorOptions())
    with pytest.raises(ValueError, match="3 hosts for 2 envs"):
        hosts.connect(hosts.find(plain_hosts, 2, curve=None), 2, allow_pickle=False, curve=None)
    hosts.close(polite=False)


# ----------------------------------------------------------------- VectorSpaces


def made_on(endpoints, env_ids) -> list:
    """MAKE replies of one env per host, each host making the given env id."""
    hosts = connected(endpoints, len(env_ids))
    try:
        return made_with(hosts, env_ids)
    finally:
        hosts.close(polite=True)


def test_vector_spaces_batch_the_envs_spaces_and_name_the_env_that_differs(plain_hosts):
    spaces = VectorSpaces.of(made_on(plain_hosts, [CARTPOLE] * 3), "same")
    single = gym.make(CARTPOLE).observation_space
    assert spaces.single_observation_space == single
    assert spaces.observation_space == gym.vector.utils.batch_space(single, 3)
    assert len(spaces.env_spaces) == 3
    assert spaces.metadata["render_fps"] == gym.make(CARTPOLE).metadata["render_fps"]

    made = made_on(plain_hosts[:2], [CARTPOLE, "MountainCar-v0"])
    with pytest.raises(RuntimeError, match="observation spaces are not equivalent") as error:
        VectorSpaces.of(made, "same")
    assert f"host {plain_hosts[1]}, env 1" in str(error.value)
    with pytest.raises(ValueError, match=r"Box\.low shape to be equal"):  # as Gymnasium's
        VectorSpaces.of(made, "different")
    with pytest.raises(ValueError, match="Invalid `observation_mode`"):
        VectorSpaces.of(made, "other")


# ----------------------------------------------------------------- EnvResults


def test_env_results_merge_blocks_and_parts_of_blocks(plain_hosts):
    hosts = connected(plain_hosts[:2], 4)
    try:
        first, second = hosts.pool.connections
        space = gym.spaces.Box(-1.0, 1.0, (2,))
        results = EnvResults(4, space, AutoresetMode.DISABLED, "dict", copy=False)
        infos = results.infos.start()
        infos = results.merge_step(
            infos,
            first,
            None,
            StepReply(
                np.ones((2, 2), dtype=np.float32),
                [1.0, 2.0],
                [False, True],
                [False, False],
                [[1, {"x": 5}]],
            ),
        )
        infos = results.merge_step(
            infos,
            second,
            [1],  # only the second env of the block
            StepReply(
                np.full((1, 2), 3, dtype=np.float32),
                [4.0],
                [False],
                [True],
                [],
            ),
        )
        obs, rewards, terminations, truncations, infos = results.step_result(infos)
        assert obs is results.observations  # copy=False hands out the buffer
        np.testing.assert_array_equal(obs, [[1, 1], [1, 1], [0, 0], [3, 3]])
        np.testing.assert_array_equal(rewards, [1.0, 2.0, 0.0, 4.0])
        np.testing.assert_array_equal(terminations, [False, True, False, False])
        np.testing.assert_array_equal(truncations, [False, False, False, True])
        np.testing.assert_array_equal(infos["x"], [0, 5, 0, 0])
        np.testing.assert_array_equal(infos["_x"], [False, True, False, False])
        with pytest.raises(AssertionError, match=r"envs \[1, 3\] ended their episodes"):
            results.refuse_finished(np.arange(4), "reset them")
        results.refuse_finished(np.array([0, 2]), "reset them")  # the others may step
    finally:
        hosts.close(polite=False)


# ----------------------------------------------------------------- Lockstep


def test_lockstep_steps_as_sync_vector_env_and_keeps_the_async_state(plain_hosts, compose):
    parts = compose(plain_hosts, 5)
    lockstep, expected_envs = parts.lockstep, reference(5, 3)[0]
    lockstep.send_reset(list(range(3, 8)), None, None)
    assert lockstep.state == AsyncState.WAITING_RESET
    with pytest.raises(NoAsyncCallError):
        lockstep.check_waiting(AsyncState.WAITING_STEP)
    with pytest.raises(AlreadyPendingCallError):
        lockstep.check_no_pending("step_async")
    obs, _ = lockstep.reset_result(60, "reset_wait")
    assert lockstep.state == AsyncState.DEFAULT
    expected_obs, _ = expected_envs.reset(seed=3)
    np.testing.assert_array_equal(obs, expected_obs)
    for step in range(30):
        actions = np.array([(step + i) % 2 for i in range(5)])
        lockstep.send_step(actions)
        got = lockstep.step_result(60, "step_wait")
        expected = expected_envs.step(actions)
        for a, e in zip(got[:4], expected[:4]):
            np.testing.assert_array_equal(a, e)
    seeds = parts.pool.on_envs(
        Command.CALL, lambda c, local: Call("np_random_seed", env_ids=local), [4, 0]
    )
    assert seeds == (7, 3)


def test_a_lockstep_wait_that_fails_leaves_no_call_pending(tmp_path, compose):
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    try:
        parts = compose([host.endpoint], 2)
        host.process.send_signal(signal.SIGSTOP)  # frozen: no reply comes
        parts.lockstep.send_reset([None, None], None, None)
        with pytest.raises(WaitTimeoutError):
            parts.lockstep.reset_result(0.3, "reset_wait")
        assert parts.lockstep.state == AsyncState.DEFAULT
        parts.lockstep.check_no_pending("step_async")
    finally:
        host.process.send_signal(signal.SIGCONT)
        host.stop()


# ----------------------------------------------------------------- Recovery


def test_recovery_remakes_a_killed_local_host_and_its_envs_report_once(compose):
    parts = compose(None, 4, num_local_hosts=2, on_host_failure="restart")
    recovery, lockstep = parts.recovery, parts.lockstep
    ledger = recovery.ledger
    lockstep.send_reset([0, 1, 2, 3], None, None)
    before, _ = lockstep.reset_result(60, "reset_wait")
    parts.hosts.local.processes[1].kill()
    failed = parts.pool.connections[1]
    failed.health.fail("killed by the test")
    new, answers, remade = recovery.recover(failed, [], "test")  # no request under way
    assert answers == [] and remade
    assert parts.pool.connections[1] is new and new.health.failure is None
    assert recovery.host_restarts == 1 and ledger.any_lost
    recovery.host_restarts = 0  # a trainer may reset the count: the lost envs still report
    assert ledger.any_lost and ledger.lost_in(new) == [0, 1]
    np.testing.assert_array_equal(ledger.lost_mask(np.arange(4)), [False, False, True, True])
    report = ledger.lost_step(new, [0, 1])  # their last observations, truncated
    np.testing.assert_array_equal(report.obs, before[2:])
    assert report.truncations.all() and not report.terminations.any()
    assert report.infos == [[0, {"host_failure": True}], [1, {"host_failure": True}]]
    assert not ledger.any_lost and ledger.lost_in(new) == []
    lockstep.send_step(np.zeros(4, dtype=np.int64))  # the re-made envs step again
    _, _, _, _, infos = lockstep.step_result(60, "step_wait")
    assert "host_failure" not in infos


def test_recovery_resumes_a_session_the_host_still_holds(plain_hosts, compose):
    parts = compose(plain_hosts[:1], 2, on_host_failure="restart")
    parts.lockstep.send_reset([5, 6], None, None)
    parts.lockstep.reset_result(60, "reset_wait")
    connection = parts.pool.connections[0]
    request = parts.pool.send(Command.STEP, lambda c: Step(np.array([0, 1])))[connection]
    connection.health.fail("looked failed to the test")  # the host is fine and holds the session
    held = connection.requests.session
    new, (answered,), remade = parts.recovery.recover(connection, [request], "test")
    reply = answered.reply
    assert not remade and parts.recovery.host_restarts == 0
    assert reply.status == Status.OK and reply.request_id == request.request_id
    expected_envs, _ = reference(2, 5)
    np.testing.assert_array_equal(reply.body["obs"], expected_envs.step(np.array([0, 1]))[0])
    assert (
        new.requests.session is held and connection.requests.session is None
    )  # the new connection's now


def test_recovery_is_off_unless_asked_and_once_stopped(plain_hosts, compose):
    parts = compose(plain_hosts[:1], 1)
    assert not parts.recovery.recoverable(Command.STEP)
    parts = compose(plain_hosts[:1], 1, on_host_failure="restart")
    assert parts.recovery.recoverable(Command.RESET)
    assert not parts.recovery.recoverable(Command.CALL)  # only steps and resets
    parts.recovery.stop()
    assert not parts.recovery.recoverable(Command.STEP)


# ----------------------------------------------------------------- FirstReady


def test_first_ready_hands_out_batches_of_the_first_envs_to_finish(plain_hosts, compose):
    parts = compose(plain_hosts, 6, batch_size=2, sub_batch_size=1)
    first_ready = parts.first_ready
    _, expected_obs = reference(6, 11)
    first_ready.reset(11, None, None)
    assert first_ready.busy
    with pytest.raises(ValueError, match="already in flight"):
        first_ready.send(np.zeros(1, dtype=np.int64), [3])
    seen = []
    for _ in range(3):
        obs, rewards, terminations, truncations, infos = first_ready.recv(60)
        ids = infos["env_id"]
        assert list(ids) == sorted(ids) and len(ids) == 2
        np.testing.assert_array_equal(obs, expected_obs[ids])
        assert not rewards.any() and not terminations.any() and not truncations.any()
        seen += ids.tolist()
    assert sorted(seen) == list(range(6)) and not first_ready.busy
    with pytest.raises(RuntimeError, match="recv needs 2 envs"):
        first_ready.recv(1)

    first_ready.send(np.ones(3, dtype=np.int64), [5, 0, 3])
    first_ready.drop()  # closing: nothing in flight any more
    assert not first_ready.busy


def test_a_request_owns_its_arrays_once_sent(plain_hosts):
    """Arrays sent in frames (copied by the send, or here when ZeroMQ would not copy them) are
    the request's: the caller may change its own at once."""
    hosts = connected(plain_hosts[:1], 1)
    try:
        made_with(hosts)
        pool = hosts.pool
        sizes = {"framed": 4096, "zero_copy": 1 << 17}  # bytes: under and over ZeroMQ's copy
        arrays = {name: np.arange(size // 8, dtype=np.int64) for name, size in sizes.items()}
        pending = pool.send(
            Command.SET_ATTR,
            lambda c: SetAttr("blobs", [dict(arrays)], [0]),
        )
        for array in arrays.values():
            array[:] = -1  # the trainer reuses its buffers before the host has read them
        pool.gather(pending, 60, "set_attr")
        ((_, values),) = pool.round_trip(Command.CALL, lambda c: Call("blobs"), 60)
        for name, size in sizes.items():
            np.testing.assert_array_equal(values[0][name], np.arange(size // 8))
    finally:
        hosts.close(polite=True)
