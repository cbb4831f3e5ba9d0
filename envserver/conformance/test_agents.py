"""Conformance: sessions of Parallel envs (MAKE ``"kind": "parallel"``), in the agents layout.

The env is ``envserver.testing.agents``' scripted one: four agents ``a``, ``b``, ``c``, ``d``;
``d`` joins after step 2 and ``b`` terminates on step 3, so every rule of the layout shows within
four steps of one env.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from envserver.conformance.conftest import Session
from envserver.wire.agents import ACTIVE, AGENTS, REWARD, TERMINATED, TRUNCATED, AgentLayout
from envserver.wire.messages import Command
from envserver.wire.spaces import space_from_data


@pytest.fixture
def agents(request: pytest.FixtureRequest, session: Session) -> tuple[Session, AgentLayout]:
    """A session holding one Parallel env, and its layout read from the MAKE reply."""
    reply = session.make(
        1, env_id=request.config.getoption("--conformance-parallel-env"), kind="parallel"
    )
    observation = space_from_data(reply["observation_spaces"][0])
    action = space_from_data(reply["action_spaces"][0])
    return session, AgentLayout.from_spaces(observation, action)


def step(session: Session, layout: AgentLayout, t: int) -> dict[str, Any]:
    """STEP the env, on its step ``t`` (from 0), with an action its masks allow to each agent.

    The scripted env always allows action ``t % 3`` to ``c`` and ``t % 4`` to ``d``.
    """
    allowed = {"c": t % 3, "d": t % 4}
    actions = {}
    for agent in layout.agents:
        space = layout.action_spaces[agent]
        value = np.full(space.shape, allowed.get(agent, 0), dtype=space.dtype)
        actions[agent] = value[None]
    return session.request(Command.STEP, {"actions": actions, "env_ids": None}).ok()


def columns(obs: dict[str, Any], layout: AgentLayout) -> dict[str, list[Any]]:
    """The per-agent columns of one env's observation, keyed by agent."""
    return {key: dict(zip(layout.agents, np.asarray(obs[key])[0].tolist())) for key in (
        REWARD, TERMINATED, TRUNCATED, ACTIVE)}  # fmt: skip


def test_make_answers_the_agents_layout(agents: tuple[Session, AgentLayout]) -> None:
    """Each agent's spaces inside one Dict, per-agent columns beside them, a raw step layout."""
    _, layout = agents
    assert layout.agents == ("a", "b", "c", "d")
    assert isinstance(layout.observation_spaces["c"], type(layout.observation_space()))


def test_agents_leave_and_join_as_the_layout_says(agents: tuple[Session, AgentLayout]) -> None:
    """Active from the results that hold an agent to its last step; after it, zeros."""
    session, layout = agents
    reset = session.request(Command.RESET, {"seeds": [3], "options": None}).ok()
    assert columns(reset["obs"], layout)[ACTIVE] == {"a": True, "b": True, "c": True, "d": False}
    assert np.asarray(reset["obs"][AGENTS]["d"]).tolist() == [0]  # inactive: zeros
    seen = [columns(step(session, layout, t)["obs"], layout) for t in range(4)]
    assert [s[ACTIVE]["d"] for s in seen] == [False, True, True, True]  # joins after step 2
    assert [s[ACTIVE]["b"] for s in seen] == [True, True, True, False]  # leaves on step 3
    assert [s[TERMINATED]["b"] for s in seen] == [False, False, True, False]
    assert seen[3][REWARD]["b"] == 0.0 and seen[2][REWARD]["b"] != 0.0
    assert not any(s[TRUNCATED][a] for s in seen for a in layout.agents)


def test_the_envs_own_reward_is_the_sum_of_its_agents(agents: tuple[Session, AgentLayout]) -> None:
    """The STEP reply's reward column of the env: its active agents' rewards, summed."""
    session, layout = agents
    session.request(Command.RESET, {"seeds": [5], "options": None}).ok()
    reply = step(session, layout, 0)
    total = sum(columns(reply["obs"], layout)[REWARD].values())
    assert np.isclose(float(np.asarray(reply["rewards"])[0]), total)


@pytest.mark.parametrize("kind", ["aec", "", 1, None])
def test_an_unknown_kind_is_refused(session: Session, kind: Any) -> None:
    """MAKE's ``kind`` is ``"gym"`` or ``"parallel"``; anything else is a ProtocolError."""
    body = {"env_id": "CartPole-v1", "kwargs": None, "num_envs": 1, "kind": kind}
    session.request(Command.MAKE, body).error("ProtocolError")
