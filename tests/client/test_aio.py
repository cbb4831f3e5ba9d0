"""The agent-loop pool (``envserver.client.aio``) on real hosts, each env against its local twin.

Every rollout runs as a coroutine with an env of its own; its twin is ``gymnasium.make`` of the
same env in this process, given the same seeds and actions. Each test runs its own event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from helpers import assert_same, keygen, running_hosts

from envserver.client import aio
from envserver.client.aio._host import PooledHost
from envserver.errors import (
    EnvLostError,
    HostUnavailableError,
    LimitError,
    MessageTooLargeError,
    PickleNotAllowedError,
    RequestTimeoutError,
)
from envserver.wire.messages import Command

TOOL = "envserver.testing:envserver/Tool-v0"
FAILING = "envserver.testing:envserver/Failing-v0"
GATE = "envserver.testing:envserver/Gate-v0"


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    with running_hosts(tmp_path_factory.mktemp("aio-hosts"), 4) as hosts:
        yield [h.endpoint for h in hosts]


async def twin_rollout(
    pool: aio.EnvPool, k: int, steps: int, env_id: str = "CartPole-v1", **kwargs: Any
) -> int:
    """Runs ``steps`` random steps on a new env and its local twin, resetting at each end."""
    env = await pool.make(**kwargs)
    twin = gym.make(env_id, **kwargs)
    rng = np.random.default_rng(k)
    assert_same(await env.reset(seed=k), twin.reset(seed=k), f"env {k} reset")
    for t in range(steps):
        action = int(rng.integers(2))
        result = await env.step(action)
        assert_same(result, twin.step(action), f"env {k} step {t}")
        if result[2] or result[3]:
            assert_same(await env.reset(seed=k + t), twin.reset(seed=k + t), f"env {k} {t}")
    await env.close()
    twin.close()
    return steps


def test_a_thousand_coroutines_each_step_their_env_exactly(four_hosts):
    """1,000 rollouts at once over 4 hosts, each equal to its twin step by step; their calls
    leave a few messages per host per turn, not one per call."""

    async def main() -> tuple[int, int]:
        async with aio.EnvPool("CartPole-v1", hosts=four_hosts) as pool:
            sent = [0]
            for host in pool.hosts:
                original = host.request

                def request(*args: Any, original: Any = original) -> None:
                    sent[0] += 1
                    original(*args)

                host.request = request
            steps = await asyncio.gather(*(twin_rollout(pool, k, 30) for k in range(1000)))
            assert sorted(len(h.envs) for h in pool.hosts) == [0, 0, 0, 0]  # all closed
            return sum(steps), sent[0]

    steps, messages = asyncio.run(main())
    assert steps == 30_000
    # Makes, resets, steps and closes: about 35 turns, a few messages per host each.
    assert messages < 1_000, messages


def test_text_envs_that_wait_like_tool_calls(four_hosts):
    """Text observations and actions travel as any space does; envs whose steps wait are
    stepped as their twins are."""

    async def agent(pool: aio.EnvPool, k: int) -> float:
        env = await pool.make(wait_s=0.002)
        twin = gym.make(TOOL, wait_s=0.002)
        assert isinstance(env.observation_space, gym.spaces.Text)
        low, high, total = 0, 100, 0.0
        assert_same(await env.reset(seed=k), twin.reset(seed=k))
        done = False
        while not done:
            guess = str((low + high) // 2)
            obs, reward, terminated, truncated, info = await env.step(guess)
            assert_same((obs, reward, terminated, truncated, info), twin.step(guess))
            low, high = (int(guess) + 1, high) if obs == "higher" else (low, int(guess))
            total += reward
            done = terminated or truncated
        await env.close()
        return total

    async def main() -> list[float]:
        async with aio.EnvPool(TOOL, hosts=four_hosts) as pool:
            return await asyncio.gather(*(agent(pool, k) for k in range(40)))

    totals = asyncio.run(main())
    assert all(total > 0.9 for total in totals)  # binary search finds it within 12 guesses


def test_steps_in_pieces_are_each_their_twins(four_hosts, monkeypatch):
    """A host whose envs wait gets its steps in pieces of PIECE envs (here every host, the
    bounds set to nothing): each rollout still equals its twin, in more messages."""
    from envserver.client.aio import _turn

    monkeypatch.setattr(_turn, "WAITING_PER_ENV_S", 0.0)
    monkeypatch.setattr(_turn, "OVER_THE_TURN", 0.0)

    async def main() -> tuple[list[int], int]:
        async with aio.EnvPool("CartPole-v1", hosts=four_hosts[:1]) as pool:
            sent = [0]
            original = pool.hosts[0].request

            def request(command: Command, *args: Any) -> None:
                sent[0] += command is Command.STEP
                original(command, *args)

            pool.hosts[0].request = request
            steps = await asyncio.gather(*(twin_rollout(pool, k, 20) for k in range(40)))
            assert pool.hosts[0].turn.in_pieces
            return steps, sent[0]

    steps, messages = asyncio.run(main())
    assert sum(steps) == 800
    # Until the first reply, steps leave whole (40 at most, in one message, at least); then
    # in pieces: 760 env steps in at least 95 messages.
    assert messages >= 1 + (20 - 1) * 40 // _turn.PIECE


def test_a_step_never_waits_for_another_envs_step(four_hosts):
    """Two envs on one host, their steps sent in different turns: the first waits until the
    second's step ran, which a host serving one request after another never allows (its
    info would say the gate stayed shut)."""

    async def main() -> None:
        async with aio.EnvPool(GATE, hosts=four_hosts[:1]) as pool:
            waiting = await pool.make(role="wait", gate="aio", timeout_s=30.0)
            opening = await pool.make(role="open", gate="aio")
            await asyncio.gather(waiting.reset(seed=0), opening.reset(seed=1))
            waited = asyncio.ensure_future(waiting.step(0))
            for _ in range(3):  # its message leaves before the other's is made
                await asyncio.sleep(0)
            await opening.step(1)
            assert (await waited)[4] == {"opened": True}

    asyncio.run(main())


def test_an_env_that_raises_fails_its_own_call_only(four_hosts):
    """Envs stepped in one message: the one that raises gets its exception, the others their
    results, and it stays usable after a reset."""

    async def main() -> None:
        async with aio.EnvPool(FAILING, hosts=four_hosts[:1]) as pool:
            failing = await pool.make(step_error_at=3)
            others = [await pool.make() for _ in range(5)]
            twins = [gym.make(FAILING) for _ in others]
            for k, (env, twin) in enumerate(zip([failing, *others], [None, *twins])):
                result = await env.reset(seed=k)
                if twin is not None:
                    assert_same(result, twin.reset(seed=k))
            for t in range(1, 6):
                results = await asyncio.gather(
                    failing.step(1), *(env.step(0) for env in others), return_exceptions=True
                )
                if t == 3:
                    assert isinstance(results[0], ValueError)
                    assert "simulated failure in step" in str(results[0])
                    assert failing.name in str(results[0])
                else:
                    assert not isinstance(results[0], BaseException), results[0]
                for result, twin in zip(results[1:], twins):
                    assert_same(result, twin.step(0), f"step {t}")
            await failing.reset(seed=9)
            await failing.step(0)

    asyncio.run(main())


def test_an_action_that_does_not_fit_fails_its_own_call_only(four_hosts):
    async def main() -> None:
        async with aio.EnvPool("CartPole-v1", hosts=four_hosts[:1]) as pool:
            bad, good = await pool.make(), await pool.make()
            twin = gym.make("CartPole-v1")
            await bad.reset(seed=1)
            assert_same(await good.reset(seed=2), twin.reset(seed=2))
            results = await asyncio.gather(
                bad.step(np.zeros((3, 3))), good.step(1), return_exceptions=True
            )
            assert isinstance(results[0], ValueError) and bad.name in str(results[0])
            assert_same(results[1], twin.step(1))

    asyncio.run(main())


def test_cancelled_calls_are_abandoned_and_the_env_stays_usable(four_hosts):
    """A call cancelled before it left is taken back (the env did not step); one cancelled
    after it left has its reply dropped, and the env's next call waits for it first."""

    async def main() -> None:
        async with aio.EnvPool(TOOL, hosts=four_hosts[:1]) as pool:
            env = await pool.make(wait_s=0.4)
            twin = gym.make(TOOL, wait_s=0.0)
            assert_same(await env.reset(seed=3), twin.reset(seed=3))
            task = asyncio.ensure_future(env.step("50"))
            task.cancel()  # in this turn: it never leaves
            with pytest.raises(asyncio.CancelledError):
                await task
            assert_same(await env.step("10"), twin.step("10"))  # the first step taken
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(env.step("20"), timeout=0.05)  # left, then abandoned
            twin.step("20")  # it was taken on the host
            assert_same(await env.step("30"), twin.step("30"))
            assert_same(await env.reset(seed=4), twin.reset(seed=4))

    asyncio.run(main())


def test_one_env_has_one_caller_at_a_time(four_hosts):
    async def main() -> None:
        async with aio.EnvPool(TOOL, hosts=four_hosts[:1]) as pool:
            env = await pool.make(wait_s=0.05)
            await env.reset(seed=0)
            first = asyncio.ensure_future(env.step("1"))
            await asyncio.sleep(0)
            with pytest.raises(RuntimeError, match="already has a call under way"):
                await env.step("2")
            await first
            await env.close()
            with pytest.raises(gym.error.ClosedEnvironmentError):
                await env.step("3")
            await env.close()  # twice: nothing

    asyncio.run(main())


def test_full_hosts_are_passed_over_by_their_limits_and_refuse_in_one_line(tmp_path):
    """Hosts say their limits: a pool places envs by load where there is room, asks no host
    that is full, and says so in one line when every host is."""
    with running_hosts(tmp_path, 2, "--max-envs-per-session", "3") as hosts:

        async def main() -> None:
            async with aio.EnvPool("CartPole-v1", hosts=[h.endpoint for h in hosts]) as pool:
                assert [h.connection.requests.session.info.max_envs_per_session
                        for h in pool.hosts] == [3, 3]  # fmt: skip
                envs = await asyncio.gather(*(pool.make() for _ in range(6)))
                assert sorted(len(h.envs) for h in pool.hosts) == [3, 3]  # by load
                with pytest.raises(LimitError, match="no host took env 6") as caught:
                    await pool.make()
                assert "2 full by their limits, 0 refused" in str(caught.value)
                assert "\n" not in str(caught.value)
                stats = pool.stats()
                assert (stats.envs, stats.made, stats.refusals, stats.unplaced) == (6, 6, 0, 1)
                assert stats.skipped_full == 3  # the 6th make passed one over, the 7th both
                where = envs[0].host
                await envs[0].close()
                again = await pool.make()  # room again where one was closed
                assert again.host == where

        asyncio.run(main())


def test_trainers_share_hosts_each_seeing_its_own_envs(tmp_path):
    """Two pools on the same hosts: each holds a session of its own there and sees only its
    envs; a host the other filled refuses, and the next is tried, till none has room."""
    with running_hosts(tmp_path, 2, "--max-envs", "4") as hosts:
        endpoints = [h.endpoint for h in hosts]

        async def main() -> None:
            async with aio.EnvPool(TOOL, hosts=endpoints) as a:
                mine = await asyncio.gather(*(a.make() for _ in range(3)))
                async with aio.EnvPool(TOOL, hosts=endpoints) as b:
                    theirs = await asyncio.gather(*(b.make() for _ in range(5)))
                    with pytest.raises(LimitError, match="0 full by their limits, 2 refused"):
                        await b.make()  # 8 of 8 held
                    assert (a.num_envs, b.num_envs) == (3, 5)
                    stats = b.stats()
                    assert (stats.made, stats.unplaced, stats.envs, stats.hosts) == (5, 1, 5, 2)
                    assert stats.refusals >= 2
                    for k, env in enumerate([*mine, *theirs]):  # each its own env
                        twin = gym.make(TOOL)
                        assert_same(await env.reset(seed=k), twin.reset(seed=k), f"env {k}")
                        assert_same(await env.step("50"), twin.step("50"), f"env {k}")
                    await mine[0].close()
                    await b.make()  # room again

        asyncio.run(main())


def test_a_killed_host_loses_its_envs_once_and_no_other(tmp_path):
    """Without restore: each env of the killed host raises EnvLostError exactly once (naming
    it and its host, the episode cut), then goes on, made anew on the other host, from a
    reset; the envs of the other host never notice."""
    with running_hosts(tmp_path, 2) as hosts:
        endpoints = [h.endpoint for h in hosts]
        losses: dict[int, list[EnvLostError]] = {}

        async def rollout(pool: aio.EnvPool, k: int, ready: asyncio.Event, killed: asyncio.Event):
            env = await pool.make()
            twin = gym.make("CartPole-v1")
            assert_same(await env.reset(seed=k), twin.reset(seed=k))
            first_host = env.host
            for t in range(60):
                if t == 10:
                    ready.set()
                    await killed.wait()
                action = t % 2
                try:
                    result = await env.step(action)
                except EnvLostError as exc:
                    losses.setdefault(k, []).append(exc)
                    assert_same(await env.reset(seed=100 + k), twin.reset(seed=100 + k))
                    assert env.host != first_host
                    continue
                assert_same(result, twin.step(action), f"env {k} step {t}")
                if result[2] or result[3]:
                    assert_same(await env.reset(seed=k + t), twin.reset(seed=k + t))
            return first_host

        async def main() -> list[str]:
            async with aio.EnvPool("CartPole-v1", hosts=endpoints, host_timeout_s=1.0) as pool:
                ready = [asyncio.Event() for _ in range(20)]
                killed = asyncio.Event()
                tasks = [
                    asyncio.ensure_future(rollout(pool, k, ready[k], killed)) for k in range(20)
                ]
                await asyncio.gather(*(event.wait() for event in ready))
                os.kill(hosts[0].process.pid, signal.SIGKILL)
                hosts[0].process.wait()
                killed.set()
                return await asyncio.gather(*tasks)

        first_hosts = asyncio.run(main())
        lost_host = f"host {endpoints[0]}"
        on_lost = {k for k, host in enumerate(first_hosts) if host == lost_host}
        assert on_lost and len(on_lost) < 20
        assert set(losses) == on_lost
        for k, errors in losses.items():
            assert len(errors) == 1
            assert errors[0].episode_lost and errors[0].env == f"env {k}"
            assert errors[0].host == lost_host and lost_host in str(errors[0])


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("CartPole-v1", {}),
        ("Hopper-v5", {}),  # MuJoCo's whole state
        ("LunarLander-v3", {}),  # replayed from its episode's start
        (TOOL, {"wait_s": 0.001}),  # text; its own hooks (get_state, set_state)
    ],
    ids=["cartpole", "mujoco", "replayed", "text"],
)
def test_forks_go_on_exactly_as_the_original(four_hosts, env_id, kwargs):
    """Forked mid-episode, the original and its forks given the same actions are identical; a
    fork given other actions goes its own way, and the others do not notice."""

    async def main() -> None:
        async with aio.EnvPool(env_id, hosts=four_hosts) as pool:
            env = await pool.make(**kwargs)
            space = env.action_space
            space.seed(0)
            await env.reset(seed=5)
            for _ in range(7):
                await env.step(space.sample())
            forks = await env.fork(3)
            assert {f.host for f in forks} - {env.host}  # placed by load: other hosts too
            for t in range(15):
                action = space.sample()
                other = space.sample()
                results = await asyncio.gather(
                    env.step(action),
                    forks[0].step(action),
                    forks[1].step(other),
                    forks[2].step(action),
                )
                assert_same(results[1], results[0], f"fork 0, step {t}")
                assert_same(results[3], results[0], f"fork 2, step {t}")
                if results[0][2] or results[0][3]:
                    break
            await asyncio.gather(env.close(), *(f.close() for f in forks))

    asyncio.run(main())


def test_an_env_never_reset_has_no_state_to_fork(four_hosts):
    async def main() -> None:
        async with aio.EnvPool("CartPole-v1", hosts=four_hosts) as pool:
            env = await pool.make()
            with pytest.raises(gym.error.ResetNeeded, match="env 0 has no state to fork"):
                await env.fork(2)
            assert pool.num_envs == 1 and pool.stats().forks == 0  # none made
            await env.reset(seed=3)
            forks = await env.fork(2)
            assert pool.stats().forks == 2 and pool.num_envs == 3
            assert_same(await forks[0].step(1), await env.step(1))

    asyncio.run(main())


def test_a_request_that_cannot_be_sent_fails_its_calls_only(tmp_path):
    """A make whose request is over the host's bound fails with MessageTooLargeError (the
    client does not send it: libzmq would drop the connection); kwargs that need pickle are
    refused by the host; the pool goes on."""
    with running_hosts(tmp_path, 1, "--max-message-bytes", "100000") as hosts:

        async def main() -> None:
            async with aio.EnvPool("CartPole-v1", hosts=[hosts[0].endpoint]) as pool:
                with pytest.raises(MessageTooLargeError, match="over its bound"):
                    await pool.make(render_mode="x" * 200_000)
                with pytest.raises(PickleNotAllowedError):
                    await pool.make(render_mode=object())
                env = await pool.make()
                await env.reset(seed=0)

        asyncio.run(main())


def test_the_envs_of_a_draining_host_move_in_their_state(tmp_path):
    """On SIGTERM a host started with --drain-grace drains: each env moves with its state to
    another host at its next call, its coroutine unaware (every step equals its twin's), and
    the drained host stops once the pool's session there is closed."""
    draining = ("--drain-grace", "60", "--session-lease", "3")  # heartbeats every second
    with running_hosts(tmp_path, 2, *draining) as hosts:

        async def rollout(
            pool: aio.EnvPool, k: int, ready: asyncio.Event, signalled: asyncio.Event
        ) -> tuple:
            env = await pool.make()
            twin = gym.make("CartPole-v1")
            assert_same(await env.reset(seed=k), twin.reset(seed=k))
            first, after = env.host, 0
            ready.set()
            await signalled.wait()
            deadline = time.monotonic() + 60  # the drain is heard within a heartbeat or two
            for t in itertools.count():
                assert time.monotonic() < deadline, f"env {k} did not move"
                action = (t // 2 + k) % 2
                result = await env.step(action)
                assert_same(result, twin.step(action), f"env {k} step {t}")
                if result[2] or result[3]:
                    assert_same(await env.reset(seed=k + t), twin.reset(seed=k + t))
                after += env.host != first or first != f"host {hosts[0].endpoint}"
                if after > 20:
                    return first, env.host
                await asyncio.sleep(0.01)  # a pace, as an agent thinks between its steps

        async def main() -> list[tuple]:
            async with aio.EnvPool("CartPole-v1", hosts=[h.endpoint for h in hosts]) as pool:
                ready = [asyncio.Event() for _ in range(6)]
                signalled = asyncio.Event()
                tasks = [
                    asyncio.ensure_future(rollout(pool, k, ready[k], signalled)) for k in range(6)
                ]
                await asyncio.gather(*(event.wait() for event in ready))
                fresh = await pool.make()  # never reset: no state to move, made anew elsewhere
                assert fresh.host == f"host {hosts[0].endpoint}"  # (3 and 3: the first host)
                hosts[0].process.send_signal(signal.SIGTERM)
                signalled.set()
                places = await asyncio.gather(*tasks)
                assert_same(await fresh.reset(seed=99), gym.make("CartPole-v1").reset(seed=99))
                assert fresh.host == f"host {hosts[1].endpoint}"
                assert pool.stats().moved == 4  # its 3 rollouts, and the fresh one
                return places

        places = asyncio.run(main())
        drained = f"host {hosts[0].endpoint}"
        moved = [(first, last) for first, last in places if first == drained]
        assert moved and all(last == f"host {hosts[1].endpoint}" for _, last in moved)
        assert hosts[0].process.wait(timeout=60) == 0  # stopped: no session left


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_with_restore_a_lost_hosts_envs_come_back_unnoticed(tmp_path, fault):
    """on_host_failure="restore": a host killed (or frozen) mid-run; every env it held comes
    back on the other host in its state (snapshot, then the steps since), and every rollout
    equals its twin step for step, without an exception."""
    with running_hosts(tmp_path, 2) as hosts:
        endpoints = [h.endpoint for h in hosts]

        async def rollout(pool: aio.EnvPool, k: int, ready: asyncio.Event, hit: asyncio.Event):
            env = await pool.make()
            twin = gym.make("CartPole-v1")
            rng = np.random.default_rng(k)
            assert_same(await env.reset(seed=k), twin.reset(seed=k))
            first = env.host
            for t in range(80):
                if t == 13:  # between two snapshots (every 10)
                    ready.set()
                    await hit.wait()
                action = int(rng.integers(2))
                result = await env.step(action)
                assert_same(result, twin.step(action), f"env {k} step {t}")
                if result[2] or result[3]:
                    assert_same(await env.reset(seed=k + t), twin.reset(seed=k + t))
            return first, env.host

        async def main() -> tuple[list, int]:
            async with aio.EnvPool(
                "CartPole-v1",
                hosts=endpoints,
                host_timeout_s=1.0,
                on_host_failure="restore",
                snapshot_every=10,
            ) as pool:
                ready = [asyncio.Event() for _ in range(12)]
                hit = asyncio.Event()
                tasks = [asyncio.ensure_future(rollout(pool, k, ready[k], hit)) for k in range(12)]
                await asyncio.gather(*(event.wait() for event in ready))
                if fault == "killed":
                    os.kill(hosts[0].process.pid, signal.SIGKILL)
                else:
                    os.kill(hosts[0].process.pid, signal.SIGSTOP)
                hit.set()
                try:
                    return await asyncio.gather(*tasks), pool.stats().restored
                finally:
                    if fault == "frozen":
                        os.kill(hosts[0].process.pid, signal.SIGCONT)

        places, restores = asyncio.run(main())
        lost = [first for first, _ in places if first == f"host {endpoints[0]}"]
        assert lost and restores == len(lost)
        assert all(last == f"host {endpoints[1]}" for _, last in places)


def test_a_curve_host_serves_a_pool_with_the_keys_and_refuses_one_without(tmp_path):
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    keys.mkdir()
    authorized.mkdir()
    server_public, server_secret = keygen(keys, "server")
    trainer_public, trainer_secret = keygen(keys, "trainer")
    _, stranger_secret = keygen(keys, "stranger")
    (authorized / "trainer.key").write_bytes(trainer_public.read_bytes())
    curve = ("--curve-secret-key", str(server_secret), "--authorized-keys", str(authorized))
    with running_hosts(tmp_path, 1, *curve, bind="tcp://127.0.0.1:*") as hosts:
        endpoint = hosts[0].endpoint

        async def rollout(client_key: Any) -> Any:
            async with aio.EnvPool(
                "CartPole-v1",
                hosts=[endpoint],
                curve_server_key=server_public,
                curve_client_key=client_key,
                connect_timeout_s=3.0,
            ) as pool:
                env = await pool.make()
                twin = gym.make("CartPole-v1")
                assert_same(await env.reset(seed=3), twin.reset(seed=3))
                assert_same(await env.step(1), twin.step(1))

        asyncio.run(rollout(trainer_secret))
        with pytest.raises(HostUnavailableError, match="no host of the pool answered"):
            asyncio.run(rollout(stranger_secret))


@pytest.mark.long
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["restore", "remake"])
def test_a_thousand_rollouts_through_a_kill_a_freeze_and_a_drain(tmp_path, mode):
    """The issue's oracle: 1,000 coroutines over 4 hosts; mid-run one host is killed, one
    frozen and one drained. With restore every rollout equals its twin; without, every loss
    of the killed and frozen hosts' envs is raised exactly once, and no other env is touched
    (the drained host's envs move, unnoticed, in both modes)."""
    limits = ("--max-envs-per-session", "1000", "--max-envs", "1000")
    draining = ("--drain-grace", "120", "--session-lease", "3")
    with running_hosts(tmp_path, 4, *limits, *draining) as hosts:
        endpoints = [h.endpoint for h in hosts]
        losses: dict[int, int] = {}

        async def rollout(pool: aio.EnvPool, k: int, ready: asyncio.Event, hit: asyncio.Event):
            env = await pool.make()
            twin = gym.make("CartPole-v1")
            rng = np.random.default_rng(k)
            assert_same(await env.reset(seed=k), twin.reset(seed=k))
            for t in range(40):
                if t == 7:
                    ready.set()
                    await hit.wait()
                action = int(rng.integers(2))
                try:
                    result = await env.step(action)
                except EnvLostError as loss:
                    assert mode == "remake" and loss.episode_lost, loss
                    losses[k] = losses.get(k, 0) + 1
                    assert_same(await env.reset(seed=k + 1000), twin.reset(seed=k + 1000))
                    continue
                assert_same(result, twin.step(action), f"env {k} step {t}")
                if result[2] or result[3]:
                    assert_same(await env.reset(seed=k + t), twin.reset(seed=k + t))
            await env.close()

        async def main() -> int:
            async with aio.EnvPool(
                "CartPole-v1",
                hosts=endpoints,
                host_timeout_s=2.0,
                on_host_failure=mode,
                snapshot_every=8,
            ) as pool:
                ready = [asyncio.Event() for _ in range(1000)]
                hit = asyncio.Event()
                tasks = [
                    asyncio.ensure_future(rollout(pool, k, ready[k], hit)) for k in range(1000)
                ]
                await asyncio.gather(*(event.wait() for event in ready))
                held = {host.name: len(host.envs) for host in pool.hosts}
                os.kill(hosts[0].process.pid, signal.SIGKILL)
                os.kill(hosts[1].process.pid, signal.SIGSTOP)
                hosts[2].process.send_signal(signal.SIGTERM)
                hit.set()
                try:
                    await asyncio.gather(*tasks)
                finally:
                    os.kill(hosts[1].process.pid, signal.SIGCONT)
                lost = held[f"host {endpoints[0]}"] + held[f"host {endpoints[1]}"]
                stats = pool.stats()
                assert stats.lost >= lost and stats.moved > 0 and stats.hosts == 1
                if mode == "restore":
                    assert stats.restored == stats.lost and not losses
                else:
                    assert stats.restored == 0 and len(losses) == lost == stats.lost
                    assert set(losses.values()) == {1}
                return lost

        assert asyncio.run(main()) > 0
        assert hosts[2].process.wait(timeout=120) == 0  # drained: stopped once moved off


def test_a_make_cancelled_leaves_no_env_behind(four_hosts):
    """A make cancelled after its MAKE left: the env made for it is closed again."""

    async def main() -> None:
        async with aio.EnvPool(TOOL, hosts=four_hosts[:1]) as pool:
            task = asyncio.ensure_future(pool.make())
            for _ in range(3):  # its MAKE leaves
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            kept = await pool.make()  # after the cancelled one's reply
            await kept.reset(seed=0)
            host = pool.hosts[0]
            held = await host.ask(Command.PING, None)
            deadline = time.monotonic() + 30
            while held["envs"] != 1:  # the cancelled one's CLOSE is answered soon
                assert time.monotonic() < deadline, held
                await asyncio.sleep(0.05)
                held = await host.ask(Command.PING, None)
            assert pool.num_envs == 1

    asyncio.run(main())


def kill_host(name: str, hosts: list[Any]) -> Any:
    """SIGKILLs the host messages name ``name`` (``env.host``), and waits for it to be gone."""
    host = next(h for h in hosts if name == f"host {h.endpoint}")
    os.kill(host.process.pid, signal.SIGKILL)
    host.process.wait()
    return host


async def envs_held(pool: aio.EnvPool) -> int:
    """How many envs the pool's live hosts hold for its sessions, as the hosts say."""
    live = [h for h in pool.hosts if h.failure is None]
    return sum(
        reply["envs"] for reply in await asyncio.gather(*(h.ask(Command.PING, None) for h in live))
    )


async def until(ready: Callable[[], Any], what: str, timeout_s: float = 30.0) -> None:
    """Polls ``ready()`` (a truth, or an awaitable of one) until it holds; fails with ``what``."""
    deadline = time.monotonic() + timeout_s
    while not ((await held) if inspect.isawaitable(held := ready()) else held):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_a_fork_cancelled_at_any_point_leaves_its_original_and_nothing_behind(four_hosts):
    """A fork cancelled right after each request it sends (GET_STATE, each MAKE, SET_STATE),
    and after each number of turns of the event loop from none until it completes: whatever
    it had made is closed again (the hosts come back to holding the one env), and the
    original goes on exactly as its twin."""
    sent = PooledHost.request

    async def main() -> int:
        async with aio.EnvPool("CartPole-v1", hosts=four_hosts) as pool:
            env = await pool.make()
            twin = gym.make("CartPole-v1")
            assert_same(await env.reset(seed=1), twin.reset(seed=1))
            cancel_after: list[Command] = []  # the next request of this kind cancels the fork
            task: asyncio.Future | None = None

            def request(host: Any, command: Command, *args: Any) -> None:
                sent(host, command, *args)
                if cancel_after and command is cancel_after[0] and task is not None:
                    cancel_after.clear()
                    asyncio.get_running_loop().call_soon(task.cancel)

            async def cancelled(turns: int, after: Command | None = None) -> bool:
                """Cancels a fork; whether it completed before (its forks closed then)."""
                nonlocal task
                cancel_after[:] = [] if after is None else [after]
                task = asyncio.ensure_future(env.fork(2))
                for _ in range(turns):
                    await asyncio.sleep(0)
                if task.done() and not task.cancelled():
                    await asyncio.gather(*(f.close() for f in task.result()))
                    return False
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

                async def only_the_original() -> bool:
                    return pool.num_envs == 1 and await envs_held(pool) == 1

                await until(
                    only_the_original, f"a fork cancelled ({turns} turns, after {after}) left envs"
                )
                action = turns % 2
                result = await env.step(action)
                assert_same(result, twin.step(action), f"after a cancel at {turns}, {after}")
                if result[2] or result[3]:
                    assert_same(await env.reset(seed=turns), twin.reset(seed=turns))
                return True

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(PooledHost, "request", request)
                for command in (Command.GET_STATE, Command.MAKE, Command.SET_STATE):
                    assert await cancelled(10_000, after=command), command
            sweep = 0
            while await cancelled(sweep):
                sweep += 1
            forks = await env.fork(2)
            assert pool.num_envs == 3
            expected = twin.step(0)
            for result in await asyncio.gather(env.step(0), *(f.step(0) for f in forks)):
                assert_same(result, expected)
            return sweep

    assert asyncio.run(main()) > 10  # (a fork takes several turns: the sweep saw them)


def test_with_restore_forks_lost_before_their_first_step_come_back_in_their_state(tmp_path):
    """A fork's state is its first snapshot: forks whose host is killed before they ever
    stepped come back in the state they were forked in, and go on as their original."""
    with running_hosts(tmp_path, 3) as hosts:

        async def main() -> int:
            async with aio.EnvPool(
                "CartPole-v1",
                hosts=[h.endpoint for h in hosts],
                host_timeout_s=1.0,
                on_host_failure="restore",
            ) as pool:
                env = await pool.make()
                await env.reset(seed=2)
                for t in range(9):
                    await env.step(t % 2)
                forks = await env.fork(4)
                doomed = next(f.host for f in forks if f.host != env.host)
                kill_host(doomed, hosts)
                for t in range(20):
                    results = await asyncio.gather(env.step(t % 2), *(f.step(t % 2) for f in forks))
                    for k, result in enumerate(results[1:]):
                        assert_same(result, results[0], f"fork {k}, step {t}")
                    if results[0][2] or results[0][3]:
                        break
                assert t > 3 and all(f.host != doomed for f in forks)
                return pool.stats().restored

        assert asyncio.run(main()) >= 1


def test_a_restore_cancelled_midway_is_made_whole_at_the_next_call(tmp_path):
    """With restore, a step cancelled while its env is being restored (its steps since the
    snapshot sent again) leaves no half-restored env: its next call restores it again, and it
    goes on as its twin (the cancelled step never taken)."""
    with running_hosts(tmp_path, 2) as hosts:

        async def main() -> None:
            async with aio.EnvPool(
                TOOL,
                hosts=[h.endpoint for h in hosts],
                host_timeout_s=1.0,
                on_host_failure="restore",
                snapshot_every=100,
            ) as pool:
                env = await pool.make(wait_s=0.1)
                twin = gym.make(TOOL, wait_s=0.0)
                assert_same(await env.reset(seed=4), twin.reset(seed=4))  # a snapshot
                for guess in ("50", "25", "75", "12", "88", "37"):
                    assert_same(await env.step(guess), twin.step(guess))
                kill_host(env.host, hosts)
                await until(lambda: pool.stats().hosts == 1, "the killed host was not seen gone")
                with pytest.raises(TimeoutError):  # six steps of ~0.1 s to send again
                    await asyncio.wait_for(env.step("60"), timeout=0.25)
                assert_same(await env.step("61"), twin.step("61"))
                assert_same(await env.step("62"), twin.step("62"))
                assert pool.stats().restored == 1

                async def one_held() -> bool:  # the half-restored one closed
                    return await envs_held(pool) == 1

                await until(one_held, "the half-restored env was not closed")

        asyncio.run(main())


def test_a_host_that_dies_idle_is_seen_gone_without_a_call(tmp_path):
    """A host killed while none of its envs has a call under way is seen gone from its
    refused connection, not after ``host_timeout_s`` (1,000 s here): the pool stops counting
    it, and its env reports the loss at its next call, once."""
    with running_hosts(tmp_path, 2) as hosts:

        async def main() -> None:
            async with aio.EnvPool(
                "CartPole-v1", hosts=[h.endpoint for h in hosts], host_timeout_s=1000.0
            ) as pool:
                env = await pool.make()
                await env.reset(seed=0)
                await env.step(0)
                host = kill_host(env.host, hosts)
                await until(lambda: pool.stats().hosts == 1, "the idle host's death was not seen")
                assert env.host is None and pool.stats().lost == 1
                with pytest.raises(EnvLostError, match="is gone") as lost:
                    await env.step(1)
                assert lost.value.episode_lost
                await env.reset(seed=1)  # made anew on the other host
                assert env.host != f"host {host.endpoint}"

        asyncio.run(main())


def test_a_restore_that_does_not_give_what_the_env_gave_is_a_loss(tmp_path):
    """With restore, an env whose steps do not repeat (a tool whose answers drift) is not
    passed off as restored: the steps sent again give another observation than its coroutine
    was given, so it raises its loss once (episode cut) and goes on from a reset elsewhere."""
    with running_hosts(tmp_path, 2) as hosts:

        async def main() -> None:
            async with aio.EnvPool(
                TOOL,
                hosts=[h.endpoint for h in hosts],
                host_timeout_s=1.0,
                on_host_failure="restore",
            ) as pool:
                env = await pool.make(drifts=True)
                await env.reset(seed=4)
                for guess in ("50", "25", "75"):
                    await env.step(guess)
                host = kill_host(env.host, hosts)
                with pytest.raises(EnvLostError, match="did not give the observation") as lost:
                    await env.step("60")
                assert lost.value.episode_lost and env.host != f"host {host.endpoint}"
                assert pool.stats().restored == 0
                obs, _ = await env.reset(seed=5)
                assert obs.startswith("guess a number")
                pids = {f"host {h.endpoint}": h.process.pid for h in hosts}
                assert (await env.step("10"))[0].endswith(str(pids[env.host]))

        asyncio.run(main())


def test_a_call_past_request_timeout_raises_and_its_host_goes_on(four_hosts):
    """request_timeout_s bounds a call, not a host: the slow env's step raises
    RequestTimeoutError (abandoned: its next call waits for its answer), and the host and its
    other env go on, each equal to its twin."""

    async def main() -> None:
        async with aio.EnvPool(TOOL, hosts=four_hosts[:1], request_timeout_s=0.3) as pool:
            slow, fast = await pool.make(wait_s=2.0), await pool.make(wait_s=0.0)
            twins = gym.make(TOOL, wait_s=0.0), gym.make(TOOL, wait_s=0.0)
            for env, twin in zip((slow, fast), twins):
                assert_same(await env.reset(seed=7), twin.reset(seed=7))
            late = asyncio.ensure_future(slow.step("40"))
            await asyncio.sleep(0.05)  # (its own message: not one with the fast env's steps)
            for guess in ("10", "20", "30"):
                assert_same(await fast.step(guess), twins[1].step(guess))
            with pytest.raises(RequestTimeoutError, match=r"env 0: no answer within"):
                await late
            twins[0].step("40")  # it was taken all the same
            assert pool.stats().hosts == 1 and pool.stats().lost == 0
            slow.pool.request_timeout_s = None  # (its next step waits for the first too)
            assert_same(await slow.step("41"), twins[0].step("41"))
            assert_same(await fast.step("31"), twins[1].step("31"))

    asyncio.run(main())


def test_with_restore_a_step_abandoned_after_it_left_is_restored_too(tmp_path):
    """A step cut by a timeout after it left is taken by its host: a later restore sends it
    again with the others, and the env goes on as its twin (which took it too)."""
    with running_hosts(tmp_path, 2) as hosts:

        async def main() -> None:
            async with aio.EnvPool(
                TOOL, hosts=[h.endpoint for h in hosts], host_timeout_s=1.0,
                on_host_failure="restore",
            ) as pool:  # fmt: skip
                env = await pool.make(wait_s=0.2)
                twin = gym.make(TOOL, wait_s=0.0)
                assert_same(await env.reset(seed=3), twin.reset(seed=3))
                assert_same(await env.step("50"), twin.step("50"))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(env.step("30"), timeout=0.05)
                twin.step("30")
                assert_same(await env.step("31"), twin.step("31"))
                kill_host(env.host, hosts)
                assert_same(await env.step("32"), twin.step("32"))
                assert pool.stats().restored == 1

        asyncio.run(main())


def test_one_env_misused_gets_one_clear_answer(four_hosts):
    """Closing an env while its coroutine's step is under way waits for that step; stepping
    at once after task.cancel() waits for the cancelled call; a step after the episode ended
    is refused until a reset (ResetNeeded)."""

    async def main() -> None:
        async with aio.EnvPool(TOOL, hosts=four_hosts[:1]) as pool:
            env = await pool.make(wait_s=0.2, max_turns=2)
            twin = gym.make(TOOL, wait_s=0.0, max_turns=2)
            assert_same(await env.reset(seed=1), twin.reset(seed=1))
            task = asyncio.ensure_future(env.step("1"))
            await asyncio.sleep(0.05)
            task.cancel()  # not reached the task yet: the env's next call waits for it
            twin.step("1")  # (it had left: taken)
            assert_same(await env.step("2"), twin.step("2"))
            with pytest.raises(gym.error.ResetNeeded, match="env 0: its episode ended"):
                await env.step("3")  # (truncated after 2 turns)
            await env.reset(seed=2)
            stepping = asyncio.ensure_future(env.step("4"))
            await asyncio.sleep(0.05)
            await env.close()  # waits for the step under way, then closes
            assert (await stepping)[0] in ("higher", "lower", "correct")
            assert pool.num_envs == 0 and await envs_held(pool) == 0

    asyncio.run(main())


def test_a_pool_not_open_closed_or_without_hosts_says_so(tmp_path):
    """A make on a pool not open or closed is a ClosedEnvironmentError saying which; with
    every host failed, a HostUnavailableError (not a limit)."""
    with running_hosts(tmp_path, 1) as hosts:

        async def main() -> None:
            pool = aio.EnvPool("CartPole-v1", hosts=[hosts[0].endpoint])
            with pytest.raises(gym.error.ClosedEnvironmentError, match="is not open"):
                await pool.make()
            async with pool:
                env = await pool.make()
                await env.reset(seed=0)
                kill_host(env.host, hosts)
                with pytest.raises(EnvLostError):
                    await env.step(0)
                with pytest.raises(HostUnavailableError, match="no host of the pool can take"):
                    await pool.make()
            with pytest.raises(gym.error.ClosedEnvironmentError, match="is closed"):
                await pool.make()

        asyncio.run(main())


def test_a_move_cut_short_leaves_the_env_in_its_state_on_its_draining_host(tmp_path):
    """A step cancelled while its env moves off a draining host (its state being set on the
    new one) leaves the env where it was, in its episode: its next step moves it, equal to
    its twin."""
    with running_hosts(tmp_path, 2, "--drain-grace", "60", "--session-lease", "3") as hosts:
        sent = PooledHost.request

        async def main() -> None:
            async with aio.EnvPool("CartPole-v1", hosts=[h.endpoint for h in hosts]) as pool:
                env = await pool.make()
                twin = gym.make("CartPole-v1")
                assert_same(await env.reset(seed=6), twin.reset(seed=6))
                first = env.host
                assert_same(await env.step(0), twin.step(0))
                next(h for h in hosts if first == f"host {h.endpoint}").process.send_signal(
                    signal.SIGTERM
                )
                await until(  # heard with a heartbeat
                    lambda: any(h.draining for h in pool.hosts), "the drain was not heard"
                )
                task = asyncio.ensure_future(env.step(1))

                def request(host: Any, command: Command, *args: Any) -> None:
                    sent(host, command, *args)
                    if command is Command.SET_STATE:
                        asyncio.get_running_loop().call_soon(task.cancel)

                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(PooledHost, "request", request)
                    with pytest.raises(asyncio.CancelledError):
                        await task
                assert env.host == first  # (not moved, not lost)
                assert_same(await env.step(1), twin.step(1))
                assert env.host != first and pool.stats().moved == 1

        asyncio.run(main())


@pytest.mark.parametrize("how", ["a call of its own", "an abandoned step"])
def test_a_host_that_dies_under_a_call_is_that_envs_loss_once(tmp_path, how):
    """A host killed while an env's request of its own (``env.call``) is under way, or after a
    step of the env was abandoned: the env's loss is EnvLostError, raised once (by that call,
    or by its next one), and the env goes on from a reset elsewhere."""
    with running_hosts(tmp_path, 2) as hosts:

        async def main() -> None:
            async with aio.EnvPool(TOOL, hosts=[h.endpoint for h in hosts]) as pool:
                env = await pool.make(wait_s=2.0)
                await env.reset(seed=0)
                host = env.host
                if how == "a call of its own":
                    task = asyncio.ensure_future(env.call("think", 2.0))
                else:
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(env.step("5"), timeout=0.1)
                    task = asyncio.ensure_future(env.step("6"))  # waits for the abandoned one
                await asyncio.sleep(0.2)
                kill_host(host, hosts)
                with pytest.raises(EnvLostError, match="lost with its host") as lost:
                    await task
                assert lost.value.episode_lost and lost.value.host == host
                await env.reset(seed=1)  # once: made anew on the other host
                assert env.host != host and pool.stats().lost == 1

        asyncio.run(main())


def test_with_restore_close_waits_for_the_whole_call_under_way(tmp_path):
    """With restore and a snapshot after every step, a step is two requests (the step, then
    its snapshot): close() from another coroutine meanwhile waits for both, then closes."""
    with running_hosts(tmp_path, 1) as hosts:

        async def main() -> None:
            async with aio.EnvPool(
                TOOL, hosts=[hosts[0].endpoint], on_host_failure="restore", snapshot_every=1
            ) as pool:
                env = await pool.make(wait_s=0.2)
                await env.reset(seed=0)
                stepping = asyncio.ensure_future(env.step("7"))
                await asyncio.sleep(0.25)  # (its step answered, its snapshot under way, or both)
                await env.close()
                assert (await stepping)[0] in ("higher", "lower", "correct")
                assert env.closed and pool.num_envs == 0 and await envs_held(pool) == 0

        asyncio.run(main())
