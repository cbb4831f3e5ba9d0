"""Each env's one history (``EnvHistory``): what re-created envs are given again, and with
``"restore"`` what brings a block back, round by round; without, steps are not kept.

Its bookkeeping needs no host: a pool stands in with its env count only (snapshots are given,
as a drain or ``set_state`` gives them). Recoveries through real hosts are in test_recovery.py
and test_restore_recovery.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np

from envserver.client._recovery.history import EnvHistory, derived_seed
from envserver.wire.bodies import Reset, SetAttr, Step

SPACE = gym.spaces.Discrete(3)


def history(num_envs: int, snapshot_every: int | None) -> EnvHistory:
    pool = SimpleNamespace(connections=[SimpleNamespace(block=SimpleNamespace(count=num_envs))])
    return EnvHistory(pool, SPACE, snapshot_every)


def test_resets_and_attributes_are_given_again_to_re_created_envs() -> None:
    envs = history(3, None)
    options = {"offset": 1.0}
    envs.sent([0, 1, 2], Reset([7, 8, 9], options))
    envs.sent([2], Reset([None], None, [2]))  # no seed: the last one stays
    options["offset"] = 2.0  # the trainer's dict changes later: the reset's stays
    envs.set_attr("label", {0: "a", 2: "c"}, False)
    envs.set_attr("size", {2: 5}, True)
    envs.set_attr("label", {2: "z"}, False)  # the last value set counts, in its order
    assert envs.first_resets(1, 3) == [
        [derived_seed(8, 1), {"offset": 1.0}],
        [derived_seed(9, 1), None],
    ]
    assert envs.set_attr_bodies(1, 3) == [
        SetAttr("size", [5], [1], True),
        SetAttr("label", ["z"], [1], False),
    ]
    envs.remade(2, 3)
    assert envs.first_resets(2, 3) == [[derived_seed(9, 2), None]]  # a second re-creation differs


def test_without_snapshots_nothing_restores_and_steps_are_not_kept() -> None:
    envs = history(2, None)
    assert not envs.keeps_snapshots
    envs.snapshots_taken([0, 1], [b"s0", b"s1"])
    envs.sent(None, Step(np.array([1, 2])))
    assert envs.of_block(0, 2, ()) is None


def test_a_block_is_restored_from_its_snapshots_and_the_requests_since_round_by_round() -> None:
    envs = history(3, 100)
    envs.snapshots_taken([0, 1, 2], [b"s0", b"s1", b"s2"])
    envs.sent(None, Step(np.array([0, 1, 2])))  # a lockstep step: every env
    envs.sent([2, 0], Step(np.array([1, 2]), [2, 0]))  # a first-ready sub-batch
    envs.sent([1], Reset([4], {"k": 1}, [1]))
    block = envs.of_block(0, 3, in_flight={1})  # env 1's reset is under way
    assert block.states == [b"s0", b"s1", b"s2"]
    (first, second) = block.again
    assert first.env_ids is None and first.actions.tolist() == [0, 1, 2]
    assert second.env_ids == [0, 2] and second.actions.tolist() == [2, 1]
    assert block.under_way == [Reset([4], {"k": 1}, [1])]
    envs.remade(1, 2)  # re-created fresh: no snapshot, no reset to start from
    assert envs.of_block(0, 3, ()) is None and envs.of_block(0, 1, ()) is not None
