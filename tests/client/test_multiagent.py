"""MultiAgentVectorEnv against the reference loop (tests/harness/agent_loop.py), on real hosts.

Every test steps the vector env and the loop side by side with the same seeds and actions
(drawn from each agent's space, within its action mask) and compares every agent's values, the
infos per env, and ``SAME_STEP``'s final observations, step after step.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import signal
import warnings
from typing import Any

import numpy as np
import pettingzoo
import pytest
import supersuit
from agent_loop import AgentLoop, Results, env_infos, masked_actions, row, same, set_row
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode
from one_remote_env import OneRemoteEnv
from pettingzoo.test import parallel_api_test

from envserver.client import MultiAgentVectorEnv
from envserver.testing.agents import ScriptedAgents

SCRIPTED = "envserver.testing.agents"
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
#: Keys of the vector env's infos that the loop keeps elsewhere.
SET_APART = {"final_obs", "_final_obs", "final_info", "_final_info"}


def compare(
    envs: MultiAgentVectorEnv,
    loop: AgentLoop,
    got: tuple,
    want: Results,
    rows: int | None = None,
    masks_from: Results | None = None,
) -> None:
    """Fails where the vector env's results (its first ``rows`` envs) are not the loop's.

    The action masks are those of ``masks_from`` where given (a masked reset's, see
    :func:`merged`), else of ``want``.
    """
    n = envs.num_envs if rows is None else rows
    obs, infos = got[0], got[-1]
    for agent in loop.agents:
        assert same(_head(obs[agent], n), want.obs[agent]), f"{agent}'s observations"
        assert _dtypes(obs[agent]) == _dtypes(want.obs[agent]), f"{agent}'s dtypes"
        assert np.array_equal(envs.active[agent][:n], want.active[agent]), f"{agent} active"
    if len(got) == 5:
        for k, (name, values) in enumerate(
            [
                ("reward", want.rewards),
                ("terminated", want.terminations),
                ("truncated", want.truncations),
            ]
        ):
            for agent in loop.agents:
                column = got[k + 1][agent]
                assert column.dtype == (np.float64 if k == 0 else np.bool_)
                assert np.array_equal(column[:n], values[agent]), f"{agent}'s {name}: {column}"
    kept = {k: v for k, v in infos.items() if k not in SET_APART}
    for i in range(n):
        assert same(env_infos(kept, i), want.infos[i]), f"env {i}'s infos"
    ended = np.zeros(n, bool)
    ended[list(want.final_obs)] = True
    if want.final_obs or "_final_obs" in infos:
        assert np.array_equal(infos["_final_obs"][:n], ended)
        for i, final in want.final_obs.items():
            for agent in loop.agents:
                assert bool(infos["final_obs"][f"_{agent}"][i]) == (agent in final)
                if agent in final:
                    assert same(row(infos["final_obs"][agent], i), final[agent])
            assert same(env_infos(infos["final_info"], i), want.final_infos[i])
    masks, want_masks = envs.action_masks(), loop.masks(masks_from or want)
    assert want_masks.keys() <= masks.keys()
    for agent, mask in masks.items():  # all false where the loop has none (rows past n have)
        wanted = want_masks.get(agent, np.zeros_like(mask[:n]))
        assert np.array_equal(mask[:n], wanted), f"{agent}'s action masks"


def run_both(
    envs: MultiAgentVectorEnv, loop: AgentLoop, steps: int, seed: int = 7
) -> dict[str, int]:
    """Steps both ``steps`` times from a reset with ``seed``; what happened, counted."""
    rng = np.random.default_rng(seed)
    spaces = {a: envs.single_action_space(a) for a in envs.possible_agents}
    want = loop.reset(seed=seed)
    compare(envs, loop, envs.reset(seed=seed), want)
    seen = {"left": 0, "joined": 0, "episodes": 0}
    for _ in range(steps):
        assert envs.ended.tolist() == loop.ended
        if envs.autoreset_mode == AutoresetMode.DISABLED and any(loop.ended):
            mask = envs.ended
            want, masks_from = merged(loop.reset(mask=mask), want, mask)
            got = envs.reset(options={"reset_mask": mask})
            compare(envs, loop, got, want, masks_from=masks_from)
        before = {a: envs.active[a].copy() for a in envs.possible_agents}
        actions = masked_actions(rng, spaces, envs.action_masks(), envs.num_envs)
        want = loop.step(actions)
        got = envs.step(actions)
        compare(envs, loop, got, want)
        for agent in envs.possible_agents:
            seen["left"] += int((got[2][agent] | got[3][agent]).sum())
            seen["joined"] += int((want.active[agent] & ~before[agent]).sum())
        seen["episodes"] += len(want.final_obs) + sum(loop.ended)
    return seen


def merged(want: Results, last: Results, mask: np.ndarray) -> tuple[Results, Results]:
    """A masked reset's results, where the envs not reset keep their last observations; and
    the same with their last infos too, which their action masks come from."""
    for agent, batch in want.obs.items():
        for i in np.flatnonzero(~mask):
            set_row(batch, i, row(last.obs[agent], i))
            want.active[agent][i] = last.active[agent][i]
    masks_from = copy.copy(want)
    masks_from.infos = [want.infos[i] if mask[i] else last.infos[i] for i in range(len(mask))]
    return want, masks_from


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_agents_that_leave_and_join_match_the_loop(mode: AutoresetMode, lean_sends) -> None:
    """Four kinds of spaces, all arrays: every step travels the lean way (STEP_RAW)."""
    kwargs = {"leave_p": 0.15, "episode_steps": 9}
    loop = AgentLoop([functools.partial(ScriptedAgents, **kwargs)] * 5, mode)
    with MultiAgentVectorEnv(
        SCRIPTED, num_envs=5, env_kwargs=kwargs, num_local_hosts=2, autoreset_mode=mode
    ) as envs:
        assert envs.possible_agents == ["a", "b", "c", "d"]
        seen = run_both(envs, loop, 40)
    loop.close()
    assert seen["left"] > 20 and seen["joined"] > 5 and seen["episodes"] > 5, seen
    assert len(lean_sends) == 40 and all(lean_sends)


def _head(batch: Any, n: int) -> Any:
    if isinstance(batch, dict):
        return {k: _head(v, n) for k, v in batch.items()}
    return batch[:n]


def _dtypes(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _dtypes(v) for k, v in batch.items()}
    return np.asarray(batch).dtype


#: PettingZoo envs of four families: agents that die (knights and archers, walkers that fall),
#: agents that all truncate (MPE), a turn-based game with action masks in its observations.
PETTINGZOO = {
    "kaz": (
        "butterfly/knights_archers_zombies-v11",  # PettingZoo's registry
        {"max_cycles": 30, "spawn_delay": 3, "max_zombies": 8, "line_death": True},
    ),
    "multiwalker": (
        "sisl/multiwalker-v9",
        {"max_cycles": 30, "terminate_on_fall": False, "remove_on_fall": True},
    ),
    "simple_spread": ("mpe2.simple_spread_v3", {"N": 3, "max_cycles": 10}),
    "tictactoe": ("envserver.testing.games:envserver/tictactoe-v3", {}),
}


def factory(spec: str, kwargs: dict[str, Any]) -> Any:
    """What a host makes for ``spec``, made here (for the loop)."""
    module, _, name = spec.partition(":")
    if "/" in spec:  # a registered id, or one its module registers
        if name:
            importlib.import_module(module)
        return functools.partial(pettingzoo.make, "parallel", name or spec, **kwargs)
    function = getattr(importlib.import_module(module), name or "parallel_env")
    return functools.partial(function, **kwargs)


@pytest.mark.parametrize(
    ("name", "mode"),
    [(name, AutoresetMode.NEXT_STEP) for name in PETTINGZOO]
    + [("kaz", mode) for mode in MODES[1:]],  # the scripted env runs every family's modes
    ids=lambda value: getattr(value, "value", value),
)
def test_pettingzoo_envs_on_three_hosts_match_the_loop(plain_hosts, name, mode) -> None:
    """Two hosts over ipc and one over TCP, none allowing pickle: envs made by name."""
    spec, kwargs = PETTINGZOO[name]
    loop = AgentLoop([factory(spec, kwargs)] * 5, mode)
    with MultiAgentVectorEnv(
        spec, num_envs=5, env_kwargs=kwargs, hosts=plain_hosts, autoreset_mode=mode
    ) as envs:
        seen = run_both(envs, loop, 45)
    loop.close()
    assert seen["left"] > 5 and seen["episodes"] > 1, seen


def test_a_global_state_and_frames_per_env() -> None:
    kwargs = {"render_mode": "rgb_array"}
    loop = AgentLoop([functools.partial(ScriptedAgents, **kwargs)] * 3, AutoresetMode.NEXT_STEP)
    with MultiAgentVectorEnv(SCRIPTED, num_envs=3, env_kwargs=kwargs, num_local_hosts=1) as envs:
        run_both(envs, loop, 4)
        state = envs.state()
        assert state.shape == (3, 4) and state.dtype == np.float64
        assert np.array_equal(state, np.stack([env.state() for env in loop.envs]))
        frames = envs.render()
        assert len(frames) == 3
        assert all(np.array_equal(f, env.render()) for f, env in zip(frames, loop.envs))
        assert envs.render_mode == "rgb_array"
        assert envs.get_attr("state_space")[0] == loop.envs[0].state_space
    loop.close()


def test_wrong_actions_are_refused_before_anything_is_sent() -> None:
    with MultiAgentVectorEnv(SCRIPTED, num_envs=2, num_local_hosts=1) as envs:
        envs.reset(seed=1)
        actions = {a: envs.action_space(a).sample() for a in envs.possible_agents}
        with pytest.raises(ValueError, match=r"missing: \['b'\]"):
            envs.step({a: v for a, v in actions.items() if a != "b"})
        with pytest.raises(ValueError, match=r"not an agent: \['e'\]"):
            envs.step({**actions, "e": actions["a"]})
        with pytest.raises(TypeError, match="sets info_format itself"):
            MultiAgentVectorEnv(SCRIPTED, num_envs=1, info_format="list")


def test_an_env_that_raises_is_named_and_the_vector_env_goes_on() -> None:
    """A masked-out action makes the scripted env raise; a reset brings every env back."""
    loop = AgentLoop([ScriptedAgents] * 4, AutoresetMode.NEXT_STEP)
    with MultiAgentVectorEnv(SCRIPTED, num_envs=4, num_local_hosts=2) as envs:
        envs.reset(seed=3)
        actions = masked_actions(
            np.random.default_rng(0), _action_spaces(envs), envs.action_masks(), 4
        )
        masks = envs.action_masks()["c"]
        i = next(i for i in range(4) if not masks[i].all())  # one there is, with this seed
        actions["c"][i] = np.flatnonzero(~masks[i])[0]
        with pytest.raises(ValueError, match=rf"env {i}.*action \d is masked out"):
            envs.step(actions)
        run_both(envs, loop, 12)  # usable again, from a reset
    loop.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "pettingzoo.test.example_envs.generated_agents_parallel_v0",
            "has no possible_agents: its batches have one slot per possible agent",
        ),
        ("classic/tictactoe-v3", "tictactoe_v3 is an AEC env whose agents take turns"),
        ("nope/nothing-v0", "Namespace 'nope' not found"),
        ("envserver.testing.agents:no_such_factory", "calls only when started with --allow"),
        ("os:system", "'os:system' names a callable other than a module's parallel_env"),
        ("envserver.testing.agents:parallel_env", None),
        ("no_such_package.envs", "No module named 'no_such_package'"),
    ],
)
def test_envs_that_cannot_be_served_say_why(plain_hosts, spec, message) -> None:
    """On a host that does not allow pickle, only what was made to be called is called."""
    if message is None:  # the module's parallel_env, named
        MultiAgentVectorEnv(spec, num_envs=1, hosts=plain_hosts[:1]).close()
        return
    with pytest.raises(Exception, match=message) as raised:
        MultiAgentVectorEnv(spec, num_envs=2, hosts=plain_hosts[:1])
    assert "env 0" in str(raised.value)


def test_a_host_that_allows_pickle_calls_any_callable_named(pickle_hosts) -> None:
    loop = AgentLoop(
        [factory("envserver.testing.games:turn_based", {"game": "connect_four_v3"})] * 2,
        AutoresetMode.NEXT_STEP,
    )
    with MultiAgentVectorEnv(
        "envserver.testing.games:turn_based",
        num_envs=2,
        env_kwargs={"game": "connect_four_v3"},
        hosts=pickle_hosts[:2],
    ) as envs:
        seen = run_both(envs, loop, 30)
    loop.close()
    assert seen["episodes"] >= 1, seen


def _action_spaces(envs: MultiAgentVectorEnv) -> dict[str, Any]:
    return {a: envs.single_action_space(a) for a in envs.possible_agents}


@pytest.mark.parametrize("mode", MODES[:2], ids=lambda m: m.value)
def test_envs_lost_with_their_host_report_each_live_agent_truncated_once(mode) -> None:
    """Host 1 (envs 2 and 3) killed on step 5: "b" terminated, "c" truncated, "d" joined."""
    kwargs = {"leave": {"c": [4, "truncated"]}}
    loop = AgentLoop([functools.partial(ScriptedAgents, **kwargs)] * 2, mode)  # host 0's envs
    rng = np.random.default_rng(5)
    with MultiAgentVectorEnv(
        SCRIPTED,
        num_envs=4,
        env_kwargs=kwargs,
        num_local_hosts=2,
        autoreset_mode=mode,
        on_host_failure="restart",
    ) as envs:
        spaces = _action_spaces(envs)

        def step() -> tuple:
            actions = masked_actions(rng, spaces, envs.action_masks(), 4)
            want, got = loop.step(actions), envs.step(actions)
            compare(envs, loop, got, want, rows=2)
            return got

        compare(envs, loop, envs.reset(seed=7), loop.reset(seed=7), rows=2)
        for _ in range(4):
            got = step()
        live = {a: envs.active[a] & ~got[2][a] & ~got[3][a] for a in envs.possible_agents}
        assert [bool(live[a][2]) for a in "abcd"] == [True, False, False, True]
        os.kill(envs.vector._hosts.local.processes[1].pid, signal.SIGKILL)
        _, rewards, terminations, truncations, infos = step()
        assert infos["_host_failure"].tolist() == [False, False, True, True]
        for agent in envs.possible_agents:
            assert np.array_equal(truncations[agent][2:], live[agent][2:]), agent
            assert not terminations[agent][2:].any() and not rewards[agent][2:].any()
        if mode == AutoresetMode.SAME_STEP:  # the lost envs start anew at once
            for agent in envs.possible_agents:
                assert np.array_equal(infos["final_obs"][f"_{agent}"][2:], live[agent][2:])
            assert [bool(envs.active[a][2]) for a in "abcd"] == [True, True, True, False]
        else:  # they end here, and start anew on the next step
            assert all(np.array_equal(envs.active[a][2:], live[a][2:]) for a in "abcd")
            _, _, terminations, truncations, infos = step()
            assert "host_failure" not in infos
            assert [bool(envs.active[a][2]) for a in "abcd"] == [True, True, True, False]
        for _ in range(6):  # reported once: from here on the lost envs' agents are as any
            _, _, terminations, truncations, infos = step()
            assert "host_failure" not in infos
    loop.close()


def test_the_flat_view_matches_supersuit() -> None:
    """SuperSuit's vector env, on MPE's simple_spread (agents that share spaces, none dies).

    SuperSuit resets an env on the step its agents end (Gymnasium's SAME_STEP), puts the last
    observations in each row's ``terminal_observation`` and gives float32 rewards.
    """
    kwargs = {"N": 3, "max_cycles": 6}
    oracle = supersuit.concat_vec_envs_v1(
        supersuit.pettingzoo_env_to_vec_env_v1(mpe2_spread(**kwargs)), 4, num_cpus=0
    )
    multi = MultiAgentVectorEnv(
        "mpe2.simple_spread_v3",
        num_envs=4,
        env_kwargs=kwargs,
        num_local_hosts=2,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    envs = multi.flat()
    try:
        assert envs.num_envs == 12 and envs.single_action_space == oracle.action_space
        obs, _ = envs.reset(seed=11)
        assert np.array_equal(obs, oracle.reset(seed=11)[0])
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(15):
            actions = rng.integers(5, size=12)
            obs, rewards, terminations, truncations, infos = envs.step(actions)
            want = oracle.step(actions)
            assert np.array_equal(obs, want[0])
            assert np.array_equal(rewards.astype(np.float32), want[1])
            assert np.array_equal(terminations, want[2].astype(bool))
            assert np.array_equal(truncations, want[3].astype(bool))
            for r, info in enumerate(want[4]):
                ended = "terminal_observation" in info
                assert bool(infos.get("_final_obs", np.zeros(12, bool))[r]) == ended
                if ended:
                    assert np.array_equal(infos["final_obs"][r], info["terminal_observation"])
                    ends += 1
            assert infos["active"].all()
    finally:
        envs.close()
    oracle.close()
    assert ends == 24  # every row's episode, twice


def test_a_flat_view_names_the_agents_whose_spaces_differ() -> None:
    with MultiAgentVectorEnv(SCRIPTED, num_envs=1, num_local_hosts=1) as envs:
        with pytest.raises(ValueError, match=r"share their spaces.*from a's.*: b \(obs") as raised:
            envs.flat()
        assert all(f"{a} (" in str(raised.value) for a in "bcd")


def mpe2_spread(**kwargs: Any) -> Any:
    return importlib.import_module("mpe2.simple_spread_v3").parallel_env(**kwargs)


def test_the_flat_view_of_agents_that_die_matches_the_loop(plain_hosts) -> None:
    """Walkers share their spaces and fall: their rows go quiet, with no second end."""
    spec, kwargs = "sisl/multiwalker-v9", {"terminate_on_fall": False, "remove_on_fall": True}
    loop = AgentLoop([factory(spec, kwargs)] * 3, AutoresetMode.NEXT_STEP)
    agents = loop.agents
    count = len(agents)
    envs = MultiAgentVectorEnv(spec, num_envs=3, env_kwargs=kwargs, hosts=plain_hosts).flat()
    try:
        rows = [(i, a) for i in range(3) for a in agents]  # env-major, as SuperSuit's
        obs, infos = envs.reset(seed=4)
        want = loop.reset(seed=4)
        assert all(np.array_equal(obs[r], want.obs[a][i]) for r, (i, a) in enumerate(rows))
        envs.action_space.seed(1)
        quiet = 0
        for _ in range(100):  # with random actions, the first walker falls after 60 steps
            actions = envs.action_space.sample()
            want = loop.step({a: actions[j::count] for j, a in enumerate(agents)})
            obs, rewards, terminations, truncations, infos = envs.step(actions)
            for r, (i, a) in enumerate(rows):
                assert np.array_equal(obs[r], want.obs[a][i])
                assert rewards[r] == want.rewards[a][i]
                assert terminations[r] == want.terminations[a][i]
                assert truncations[r] == want.truncations[a][i]
                assert infos["active"][r] == want.active[a][i]
                quiet += not want.active[a][i]
        assert quiet > 0  # rows of fallen walkers were seen
    finally:
        envs.close()
        loop.close()


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        (SCRIPTED, {"leave_p": 0.1, "enforce_masks": False}),
        PETTINGZOO["kaz"],
    ],
    ids=["scripted", "kaz"],
)
def test_pettingzoos_api_test_passes_on_a_served_env(plain_hosts, spec, kwargs) -> None:
    """PettingZoo's parallel_api_test, on one served env seen as a Parallel env."""
    envs = MultiAgentVectorEnv(
        spec,
        num_envs=1,
        env_kwargs=kwargs,
        hosts=plain_hosts[2:],  # the TCP host
        autoreset_mode=AutoresetMode.DISABLED,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parallel_api_test(OneRemoteEnv(envs), num_cycles=200)
    envs.close()
    said = [str(w.message) for w in caught if "pettingzoo" in w.filename]
    assert not said, said  # "Live agent was not given ...", "Agent was given ... but was dead"


def test_an_aec_env_that_can_run_in_parallel_is_served_through_pettingzoo(pickle_hosts) -> None:
    """Multiwalker's AEC env (its module's ``env``: any callable, so a host that allows pickle)."""
    from pettingzoo.sisl import multiwalker_v9
    from pettingzoo.utils.conversions import aec_to_parallel

    kwargs = {"max_cycles": 20}
    loop = AgentLoop(
        [lambda: aec_to_parallel(multiwalker_v9.env(**kwargs))] * 2, AutoresetMode.NEXT_STEP
    )
    with MultiAgentVectorEnv(
        "pettingzoo.sisl.multiwalker_v9:env", num_envs=2, env_kwargs=kwargs, hosts=pickle_hosts[:1]
    ) as envs:
        seen = run_both(envs, loop, 25)
    loop.close()
    assert seen["episodes"] >= 2, seen


def test_snapshots_of_parallel_envs_with_state_hooks_go_on_exactly() -> None:
    """The scripted env has get_state/set_state: its snapshots, taken mid-episode on one local
    host, restored on another vector env's, give the same next steps (agents leaving, joining);
    a PettingZoo env without hooks is refused, named."""
    kwargs = {"leave_p": 0.2, "episode_steps": 9}
    source = MultiAgentVectorEnv(SCRIPTED, num_envs=3, env_kwargs=kwargs, num_local_hosts=1)
    target = MultiAgentVectorEnv(SCRIPTED, num_envs=3, env_kwargs=kwargs, num_local_hosts=1)
    rng = np.random.default_rng(7)
    try:
        source.reset(seed=4)
        spaces = {agent: source.single_action_space(agent) for agent in source.possible_agents}

        def act() -> dict[str, Any]:
            return masked_actions(rng, spaces, source.action_masks(), 3)

        for _ in range(6):
            source.step(act())
        snapshots = source.get_state()
        obs_then, infos_then = source.set_state(snapshots)  # into itself: nothing changes
        actions, expected = [], []
        for _ in range(15):
            actions.append(act())
            expected.append(source.step(actions[-1]))
        target.reset(seed=99)
        restored, infos = target.set_state(snapshots)
        assert same(restored, obs_then) and all(map(same, infos, infos_then))
        assert infos[0]["common"]["t"] == 6  # each env's infos, as the Parallel env gave them
        for t, (action, want) in enumerate(zip(actions, expected)):
            assert data_equivalence(target.step(action), want, exact=True), f"step {t}"
    finally:
        source.close()
        target.close()
    with MultiAgentVectorEnv(
        "mpe2.simple_spread_v3", num_envs=1, env_kwargs={"max_cycles": 5}, num_local_hosts=1
    ) as plain:
        plain.reset(seed=0)
        with pytest.raises(Exception, match="has no get_state"):
            plain.get_state()
