"""Observation slabs: local hosts' large observations through shared memory, exact and leaving
nothing behind.

Against SyncVectorEnv in every autoreset mode (a Box and a Dict of a large and a small leaf),
first-ready batches (rows of some envs), a host killed and respawned (the slab is made anew),
and the clean-up: no name in /dev/shm and no mapping left after close, after the trainer is
SIGKILLed, or after a host is; names left by a killed trainer are swept by the next one.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers import alive, assert_same, children, wait_for, wait_until_gone

from envserver import client
from envserver.wire.slab import SLAB_DIRECTORY, Slab, SlabOffer

PIXELS = "envserver.testing:envserver/Pixels-v0"

pytestmark = pytest.mark.skipif(not os.path.isdir(SLAB_DIRECTORY), reason="no /dev/shm")


def slab_names(pid: int) -> list[str]:
    """The slab and channel names a client process ``pid`` made that are still in /dev/shm."""
    return [
        *glob.glob(os.path.join(SLAB_DIRECTORY, f"envserver-slab-{pid}-*")),
        *glob.glob(os.path.join(SLAB_DIRECTORY, f"envserver-chan-{pid}-*")),
    ]


def mapped_slab_paths(pid: int, maker: int, kind: str = "slab") -> set[str]:
    """The paths of ``maker``'s slabs (or channels: ``kind="chan"``) that process ``pid`` maps."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    named = f"envserver-{kind}-{maker}-"
    return {line.split()[5] for line in maps.splitlines() if named in line}


def mapped_slabs(pid: int, maker: int) -> int:
    """How many of ``maker``'s slabs process ``pid`` maps."""
    return len(mapped_slab_paths(pid, maker))


def slabs_in_use(envs: client.RemoteVectorEnv) -> list[bool]:
    return [c.requests.session.step_layout.slab is not None for c in envs._hosts.pool.connections]


def pixels(num_envs: int, **kwargs: object) -> tuple[client.RemoteVectorEnv, SyncVectorEnv]:
    env_kwargs = {"episode_steps": 4, **kwargs}
    mode = env_kwargs.pop("autoreset_mode", AutoresetMode.NEXT_STEP)
    oracle = SyncVectorEnv([lambda: gym.make(PIXELS, **env_kwargs)] * num_envs, autoreset_mode=mode)
    envs = client.RemoteVectorEnv(
        env_id=PIXELS,
        env_kwargs=env_kwargs,
        num_envs=num_envs,
        num_local_hosts=2,
        autoreset_mode=mode,
    )
    return envs, oracle


@pytest.mark.parametrize("dict_obs", [False, True], ids=["box", "dict"])
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
def test_slab_steps_match_sync_vector_env(mode: AutoresetMode, dict_obs: bool) -> None:
    """Every step's observations come through the slabs, exactly SyncVectorEnv's."""
    before = mapped_slab_paths(os.getpid(), os.getpid())  # other tests' in this process
    envs, oracle = pixels(6, dict_obs=dict_obs, autoreset_mode=mode)
    rng = np.random.default_rng(3)
    try:
        assert slabs_in_use(envs) == [True, True]
        assert len(mapped_slab_paths(os.getpid(), os.getpid()) - before) == 2
        assert slab_names(os.getpid()) == []  # the names live only until the hosts answer MAKE
        assert_same(envs.reset(seed=11), oracle.reset(seed=11))
        for _ in range(11):  # episodes of 4 steps: autoresets on both kinds of step
            actions = rng.integers(0, 6, 6)
            got, expected = envs.step(actions), oracle.step(actions)
            assert_same(got, expected)
            ended = np.logical_or(expected[2], expected[3])
            if mode == AutoresetMode.DISABLED and ended.any():
                options = {"reset_mask": ended}
                assert_same(envs.reset(options=options), oracle.reset(options=options))
    finally:
        envs.close()
        oracle.close()
    after = mapped_slab_paths(os.getpid(), os.getpid())
    assert after <= before, "the slabs are still mapped after close"


def test_first_ready_batches_read_their_envs_rows() -> None:
    """Sub-batches step some envs of a host: each reads its own rows of the slab."""
    num_envs = 6
    envs = client.make_vec(
        PIXELS,
        num_envs=num_envs,
        vector_kwargs={"batch_size": 2, "sub_batch_size": 1, "num_local_hosts": 2},
        episode_steps=5,
    )
    oracles = [SyncVectorEnv([lambda: gym.make(PIXELS, episode_steps=5)]) for _ in range(num_envs)]
    try:
        assert slabs_in_use(envs) == [True, True]
        expected = {i: (o.reset(seed=20 + i)[0][0], 0.0, False) for i, o in enumerate(oracles)}
        envs.async_reset(seed=20)
        for t in range(40):
            obs, rewards, _, truncations, infos = envs.recv()
            ids = infos["env_id"].tolist()
            for k, env_id in enumerate(ids):
                np.testing.assert_array_equal(obs[k], expected[env_id][0])
                assert (rewards[k], truncations[k]) == expected[env_id][1:]
            actions = np.array([(i + t) % 6 for i in ids])
            for env_id, action in zip(ids, actions):
                got = oracles[env_id].step(np.array([action]))
                expected[env_id] = (got[0][0], got[1][0], got[3][0])
            envs.send(actions, ids)
    finally:
        envs.close()
        for oracle in oracles:
            oracle.close()


def test_small_observations_and_shared_memory_off_use_frames() -> None:
    """CartPole's batch is far below the threshold; shared_memory=False never offers a slab."""
    small = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=2, num_local_hosts=1)
    off = client.RemoteVectorEnv(env_id=PIXELS, num_envs=4, num_local_hosts=1, shared_memory=False)
    try:
        assert slabs_in_use(small) == [False] and slabs_in_use(off) == [False]
        assert off.reset(seed=0)[0].shape == (4, 84, 84, 4)  # 112 KiB: it would have one
        assert off.step(np.zeros(4, np.int64))[0].shape == (4, 84, 84, 4)
    finally:
        small.close()
        off.close()


def test_a_killed_host_gets_a_new_slab() -> None:
    """A host SIGKILLed mid-run is respawned and its envs re-made with a new slab; no name is
    left and the old mapping is gone with the old process."""
    envs = client.RemoteVectorEnv(
        env_id=PIXELS, num_envs=6, num_local_hosts=2, on_host_failure="restart"
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(6, np.int64))
        old = envs._hosts.local.processes[0].pid
        assert mapped_slabs(old, os.getpid()) == 1
        os.kill(old, signal.SIGKILL)
        for _ in range(50):  # the step that meets the loss recovers; the next ones are normal
            envs.step(np.zeros(6, np.int64))
            if envs._hosts.local.processes[0].pid != old and slabs_in_use(envs) == [True, True]:
                break
        new = envs._hosts.local.processes[0].pid
        assert new != old and slabs_in_use(envs) == [True, True]
        assert mapped_slabs(new, os.getpid()) == 1
        assert wait_until_gone([old]) == []
        assert slab_names(os.getpid()) == []
        # the re-made envs' observations come through the new slab
        reference = SyncVectorEnv([lambda: gym.make(PIXELS)] * 3)
        reference.reset(seed=5)
        envs.reset(seed=5)
        actions = np.array([1, 2, 3, 4, 5, 0])
        obs = envs.step(actions)[0]
        np.testing.assert_array_equal(obs[:3], reference.step(actions[:3])[0])
        reference.close()
    finally:
        envs.close()


TRAINER = """
import sys
import numpy as np
from envserver import client

envs = client.RemoteVectorEnv(env_id="envserver.testing:envserver/Pixels-v0", num_envs=6,
                              num_local_hosts=2)
envs.reset(seed=0)
envs.step(np.zeros(6, np.int64))
print("ready", flush=True)
sys.stdin.read()
"""


def test_nothing_is_left_after_the_trainer_is_killed() -> None:
    """SIGKILL of the trainer: its hosts exit, and no slab name or mapping outlives them."""
    process = subprocess.Popen(
        [sys.executable, "-c", TRAINER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline().strip() == "ready"
        (server,) = children(process.pid)  # the fork server; the hosts are its children
        hosts = children(server)
        assert len(hosts) == 2 and all(mapped_slabs(h, process.pid) == 1 for h in hosts)
        assert all(len(mapped_slab_paths(h, process.pid, "chan")) == 1 for h in hosts)
        assert slab_names(process.pid) == []
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
        assert wait_until_gone([*hosts, server]) == []
        assert slab_names(process.pid) == []
        assert not any(mapped_slabs(int(p.name), process.pid)
                       or mapped_slab_paths(int(p.name), process.pid, "chan")
                       for p in Path("/proc").iterdir()
                       if p.name.isdigit() and alive(int(p.name)))  # fmt: skip
    finally:
        process.kill()
        process.wait()


def test_names_of_killed_trainers_are_swept() -> None:
    """A name whose maker no longer runs (killed between making it and its MAKE) is removed
    when local hosts are next started; a running maker's is kept."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = Path(SLAB_DIRECTORY, f"envserver-slab-{dead.pid}-0123456789abcdef")
    kept = SlabOffer.make()
    orphan.touch()
    try:
        envs = client.RemoteVectorEnv(env_id="CartPole-v1", num_envs=1, num_local_hosts=1)
        envs.close()
        wait_for(lambda: not orphan.exists(), "the orphaned name to be swept")
        assert Path(SLAB_DIRECTORY, kept.name).exists()
    finally:
        kept.withdraw()
        orphan.unlink(missing_ok=True)


def test_a_host_uses_only_empty_files_of_its_own_user(tmp_path: Path) -> None:
    """A name that is a symlink, a file with content, or missing gets no slab (None)."""
    from envserver.wire.raw import StepLayout

    layout = StepLayout.of(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(6))
    leaves = layout.slab_for_host  # bound method under test
    base = f"envserver-slab-{os.getpid()}-"
    full = Path(SLAB_DIRECTORY, base + "f" * 16)
    link = Path(SLAB_DIRECTORY, base + "e" * 16)
    target = tmp_path / "target"
    target.write_bytes(b"")
    full.write_bytes(b"x")
    link.symlink_to(target)
    try:
        assert leaves(full.name, 4) is None and full.read_bytes() == b"x"
        assert leaves(link.name, 4) is None and target.read_bytes() == b""
        assert leaves(base + "d" * 16, 4) is None  # not there: a client on another machine
        offer = SlabOffer.make()
        assert leaves(offer.name, 1) is None  # 28 KiB: below the threshold, left alone
        slabbed = leaves(offer.name, 4)
        assert isinstance(slabbed.slab, Slab) and not Path(SLAB_DIRECTORY, offer.name).exists()
        offer.withdraw()
    finally:
        full.unlink(missing_ok=True)
        link.unlink(missing_ok=True)


class NarrowSteps(gym.Wrapper):
    """Steps return frames narrower than the observation space (resets do not)."""

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (obs[:, :1], *rest)


def narrow_steps() -> gym.Env:
    return NarrowSteps(gym.make(PIXELS, disable_env_checker=True))


@pytest.mark.parametrize("shared_memory", [True, False])
def test_observations_of_the_wrong_shape_are_an_error_not_a_broadcast(shared_memory) -> None:
    """An env whose frames are narrower than its space: the step fails (ValueError) whether the
    frames go to the slab or in the reply; nothing is broadcast into the slab's rows."""
    envs = client.RemoteVectorEnv(
        [narrow_steps] * 6, num_local_hosts=2, shared_memory=shared_memory, allow_pickle=True
    )
    try:
        assert slabs_in_use(envs) == [shared_memory] * 2
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="local host 0"):
            envs.step(np.zeros(6, np.int64))
    finally:
        envs.close()
