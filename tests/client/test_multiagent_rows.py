"""MultiAgentVectorEnv's rows where they are easy to get wrong, against the reference loop.

An agent that left just before its host was lost; action masks from infos after a masked
reset; what ``active`` shows on a ``SAME_STEP`` end step; ``set_state``'s infos; an id
PettingZoo's registry lacks.
"""

from __future__ import annotations

import copy
import functools
import os
import signal
from typing import Any

import numpy as np
import pytest
from agent_loop import AgentLoop, Results, masked_actions, row, same
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_empty_array
from test_multiagent import MODES, SCRIPTED, compare, merged

from envserver.client import MultiAgentVectorEnv
from envserver.testing.agents import ScriptedAgents


def _action_spaces(envs: MultiAgentVectorEnv) -> dict[str, Any]:
    return {a: envs.single_action_space(a) for a in envs.possible_agents}


def _zeros(space: Any) -> Any:
    return row(create_empty_array(space, 1, fn=np.zeros), 0)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_an_agent_that_left_before_its_host_was_lost_shows_zeros(mode: AutoresetMode) -> None:
    """Env 1's "c" truncates on step 2, then host 1 (env 1's) is killed: on step 3, env 1's
    live agents report the loop's step-2 observations, truncated, and "c" zeros (in ``obs``,
    or in ``infos["final_obs"]`` with SAME_STEP); env 0 goes on as the loop's."""
    kwargs = {"leave": {"c": [2, "truncated"]}}
    loop = AgentLoop([functools.partial(ScriptedAgents, **kwargs)] * 2, mode)
    rng = np.random.default_rng(3)
    with MultiAgentVectorEnv(
        SCRIPTED,
        num_envs=2,
        env_kwargs=kwargs,
        num_local_hosts=2,
        autoreset_mode=mode,
        on_host_failure="restart",
    ) as envs:
        spaces = _action_spaces(envs)
        compare(envs, loop, envs.reset(seed=7), loop.reset(seed=7))
        for _ in range(2):
            actions = masked_actions(rng, spaces, envs.action_masks(), 2)
            last, got = loop.step(actions), envs.step(actions)
            compare(envs, loop, got, last)
        live = {a: bool(envs.active[a][1] and not (got[2][a][1] or got[3][a][1])) for a in "abcd"}
        assert live == {"a": True, "b": True, "c": False, "d": True}
        assert last.active["c"][1]  # "c" left on step 2 with an observation that is not zeros
        assert not same(row(last.obs["c"], 1), _zeros(loop.spaces["c"]))
        os.kill(envs.vector._hosts.local.processes[1].pid, signal.SIGKILL)
        actions = masked_actions(rng, spaces, envs.action_masks(), 2)
        want, got = loop.step(actions), envs.step(actions)
        compare(envs, loop, got, _first(want), rows=1)
        obs, rewards, terminations, truncations, infos = got
        assert infos["_host_failure"].tolist() == [False, True]
        final = infos["final_obs"] if mode == AutoresetMode.SAME_STEP else obs
        for agent in envs.possible_agents:
            wanted = row(last.obs[agent], 1) if live[agent] else _zeros(loop.spaces[agent])
            assert same(row(final[agent], 1), wanted), f"{agent}'s last observation"
            assert truncations[agent][1] == live[agent] and not terminations[agent][1]
            assert rewards[agent][1] == 0.0
        if mode == AutoresetMode.SAME_STEP:  # env 1 starts anew at once ("d" joins later)
            assert [bool(final[f"_{a}"][1]) for a in "abcd"] == [True, True, False, True]
            assert [bool(envs.active[a][1]) for a in "abcd"] == [True, True, True, False]
        else:  # env 1's live agents end here
            assert [bool(envs.active[a][1]) for a in "abcd"] == [True, True, False, True]
    loop.close()


def _first(results: Results) -> Results:
    """Env 0's results alone."""
    first = copy.copy(results)
    for name in ("obs", "rewards", "terminations", "truncations", "active"):
        setattr(first, name, {a: _head(v) for a, v in getattr(results, name).items()})
    first.infos = results.infos[:1]
    first.final_obs = {i: v for i, v in results.final_obs.items() if i == 0}
    first.final_infos = {i: v for i, v in results.final_infos.items() if i == 0}
    return first


def _head(batch: Any) -> Any:
    return {k: _head(v) for k, v in batch.items()} if isinstance(batch, dict) else batch[:1]


def _tail(batch: Any) -> Any:
    return {k: _tail(v) for k, v in batch.items()} if isinstance(batch, dict) else batch[1:]


def test_masks_from_infos_outlive_a_masked_reset_of_other_envs() -> None:
    """DISABLED: env 0's episode ends on step 3 while env 1's goes on; once env 0 alone is
    reset, "d"'s action masks (from its infos) in env 1 are still its step-3 ones."""
    env_fns = [functools.partial(ScriptedAgents, episode_steps=s) for s in (3, 8)]
    loop = AgentLoop(env_fns, AutoresetMode.DISABLED)
    rng = np.random.default_rng(2)
    with MultiAgentVectorEnv(
        env_fns=env_fns, num_local_hosts=2, autoreset_mode=AutoresetMode.DISABLED
    ) as envs:
        spaces = _action_spaces(envs)
        compare(envs, loop, envs.reset(seed=5), loop.reset(seed=5))
        for _ in range(3):
            actions = masked_actions(rng, spaces, envs.action_masks(), 2)
            last, got = loop.step(actions), envs.step(actions)
            compare(envs, loop, got, last)
        assert loop.ended == [True, False] == envs.ended.tolist()
        mask = envs.ended
        want, masks_from = merged(loop.reset(mask=mask), last, mask)
        compare(envs, loop, envs.reset(options={"reset_mask": mask}), want, masks_from=masks_from)
        d = last.infos[1]["d"]["action_mask"]
        assert np.array_equal(envs.action_masks()["d"][1], d) and d.any()
        for _ in range(3):  # the masks drawn from go on being the loop's
            actions = masked_actions(rng, spaces, envs.action_masks(), 2)
            compare(envs, loop, envs.step(actions), loop.step(actions))
    loop.close()


def test_on_a_same_step_end_step_active_is_the_new_episodes() -> None:
    """Env 0's agents all leave on step 3 ("d" had joined on step 2): that step's rewards and
    flags are theirs, ``infos["final_obs"]`` masks the four of them, and ``active`` holds the
    reset's agents ("d" is not there yet); in env 1, "b" leaves on step 3, active there."""
    env_fns = [functools.partial(ScriptedAgents, episode_steps=s) for s in (3, 8)]
    loop = AgentLoop(env_fns, AutoresetMode.SAME_STEP)
    rng = np.random.default_rng(4)
    with MultiAgentVectorEnv(
        env_fns=env_fns, num_local_hosts=1, autoreset_mode=AutoresetMode.SAME_STEP
    ) as envs:
        spaces = _action_spaces(envs)
        compare(envs, loop, envs.reset(seed=1), loop.reset(seed=1))
        for _ in range(3):
            actions = masked_actions(rng, spaces, envs.action_masks(), 2)
            want, got = loop.step(actions), envs.step(actions)
            compare(envs, loop, got, want)
        _, rewards, terminations, truncations, infos = got
        assert infos["_final_obs"].tolist() == [True, False]
        assert [bool(infos["final_obs"][f"_{a}"][0]) for a in "abcd"] == [True] * 4
        assert [bool(envs.active[a][0]) for a in "abcd"] == [True, True, True, False]
        assert [bool(terminations[a][0]) for a in "abcd"] == [True, True, False, False]
        assert [bool(truncations[a][0]) for a in "abcd"] == [False, False, True, True]
        assert all(rewards[a][0] == want.rewards[a][0] != 0 for a in "abcd")
        assert envs.active["b"][1] and terminations["b"][1]  # in env 1, its last observation
        assert envs.ended.tolist() == [False, False]
    loop.close()


def test_an_id_not_in_pettingzoos_registry_names_its_near_matches(plain_hosts) -> None:
    """One line naming the ids near it, not the whole registry (nor in the remote traceback)."""
    with pytest.raises(Exception, match="env 0") as raised:
        MultiAgentVectorEnv("butterfly/pistonbal-v6", num_envs=1, hosts=plain_hosts[:1])
    said = str(raised.value)
    assert "'butterfly/pistonbal-v6' is not in PettingZoo's registry (near matches: " in said
    assert "'butterfly/pistonball-v6'" in said and "\n" not in said and len(said) < 300
    assert "atari/" not in said + str(raised.value.__cause__)


def test_set_state_gives_each_envs_infos_as_the_parallel_env_gave_them() -> None:
    """A SAME_STEP snapshot of env 0's end step: ``set_state`` gives ``obs, infos`` as
    RemoteVectorEnv's does, env 0's ``final_obs`` and ``final_info`` those of the loop's end
    step (per agent, as PettingZoo gives them), and action masks from the restored infos."""
    env_fns = [functools.partial(ScriptedAgents, episode_steps=s) for s in (3, 8)]
    loop = AgentLoop(env_fns, AutoresetMode.SAME_STEP)
    rng = np.random.default_rng(6)
    options = {"autoreset_mode": AutoresetMode.SAME_STEP, "num_local_hosts": 1}
    with (
        MultiAgentVectorEnv(env_fns=env_fns, **options) as source,
        MultiAgentVectorEnv(env_fns=env_fns, **options) as target,
    ):
        spaces = _action_spaces(source)
        compare(source, loop, source.reset(seed=8), loop.reset(seed=8))
        for _ in range(3):
            actions = masked_actions(rng, spaces, source.action_masks(), 2)
            want, got = loop.step(actions), source.step(actions)
            compare(source, loop, got, want)
        assert list(want.final_obs) == [0]
        target.reset(seed=99)
        obs, infos = target.set_state(source.get_state())
        assert same(obs, got[0]) and len(infos) == 2
        assert same(infos[0]["final_obs"], want.final_obs[0])
        assert same(infos[0]["final_info"], want.final_infos[0])
        assert "final_obs" not in infos[1] and same(infos[1], want.infos[1])
        assert same(target.action_masks(), source.action_masks())
        assert target.action_masks()["d"][1].any()  # "d"'s, from env 1's infos
        one, infos_1 = target.set_state(source.get_state([1]), [1])  # batched in env_ids order
        assert same(one, {a: _tail(v) for a, v in obs.items()})
        assert len(infos_1) == 1 and same(infos_1[0], infos[1])
    loop.close()
