"""SkyRL-Gym's text envs (``skyrl-gym`` from PyPI) served by real hosts to an agent-loop pool.

Each rollout's twin is the same :class:`~envserver.envs.skyrl.SkyRLEnv` made in this process
with the same task and given the same completions. The SQL task runs its tool (SQLite) on the
host, over a database this test writes.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import gymnasium as gym
import pytest
from helpers import assert_same, running_hosts

import envserver.envs.skyrl  # noqa: F401  (registers envserver/SkyRL-v0 here, for the twins)
from envserver.client import aio

SKYRL = "envserver.envs.skyrl:envserver/SkyRL-v0"


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    with running_hosts(tmp_path_factory.mktemp("skyrl-hosts"), 2) as hosts:
        yield [h.endpoint for h in hosts]


def gsm8k_task(k: int) -> dict:
    """A multi-turn GSM8K task: its prompt and its row (the answer is ``k * 3``)."""
    question = f"Tom has {k} bags with 3 apples each. How many apples has he?"
    return {
        "env": "gsm8k_multi_turn",
        "prompt": [{"role": "user", "content": question}],
        "extras": {"reward_spec": {"ground_truth": str(k * 3)}, "max_turns": 3},
    }


def completions(k: int) -> list[str]:
    """What a model might answer: badly formatted, then wrong, then right (for odd k)."""
    last = k * 3 if k % 2 else k * 3 + 1
    return [f"I think it is {k * 3}", f"#### {k * 3 + 2}", f"So the answer:\n#### {last}"]


def test_gsm8k_rollouts_equal_their_local_twins(two_hosts):
    """64 coroutines, each a multi-turn GSM8K task of its own: every reset and turn (messages,
    reward, done, info) as the same env gives it in this process."""

    async def rollout(pool: aio.EnvPool, k: int) -> float:
        task = gsm8k_task(k)
        env = await pool.make(**task)
        twin = gym.make("envserver/SkyRL-v0", **task)
        first = await env.reset()
        assert_same(first, twin.reset(), f"task {k} reset")
        assert json.loads(first[0])[0]["content"].startswith(f"Tom has {k} bags")
        total = 0.0
        for t, text in enumerate(completions(k)):
            result = await env.step(text)
            assert_same(result, twin.step(text), f"task {k} turn {t}")
            total += result[1]
            if result[2]:
                break
        await env.close()
        return total

    async def main() -> list[float]:
        async with aio.EnvPool(SKYRL, hosts=two_hosts) as pool:
            return await asyncio.gather(*(rollout(pool, k) for k in range(64)))

    totals = asyncio.run(main())
    solved = [t for t in totals if t >= 1.0]
    assert len(solved) == 32  # the odd tasks: answered right on the last turn


@pytest.fixture(scope="module")
def sql_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Spider-layout database folder, as text2sql reads one: a shop with three orders."""
    root = tmp_path_factory.mktemp("sql_data")
    folder = root / "spider" / "database" / "shop"
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / "shop.sqlite") as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?)",
            [(1, "ada", 12.5), (2, "bob", 40.0), (3, "ada", 7.5)],
        )
    return root


def sql_task(sql_data: Path) -> dict:
    return {
        "env": "text2sql",
        "prompt": "What did ada spend in all? Answer with SQL.",
        "extras": {
            "db_id": "shop",
            "data": "spider",
            "reward_spec": {"ground_truth": "SELECT SUM(total) FROM orders WHERE customer = 'ada'"},
            "max_turns": 4,
        },
        "env_config": {"db_path": str(sql_data)},
    }


def test_a_sql_agents_tool_calls_run_on_the_host_and_forks_go_on_exactly(two_hosts, sql_data):
    """text2sql's SQL tool runs on the host; a fork taken after a tool call, given the same
    turns, answers as the original (its tool called again on its own host), and one given a
    wrong answer is scored on its own."""

    query = "<think>who</think><sql>SELECT customer, SUM(total) FROM orders GROUP BY customer</sql>"
    answer = "SELECT SUM(total) FROM orders WHERE customer='ada'"
    right = f"<think>ada's</think><solution>{answer}</solution>"
    wrong = "<think>all</think><solution>SELECT SUM(total) FROM orders</solution>"

    async def main() -> None:
        async with aio.EnvPool(SKYRL, hosts=two_hosts) as pool:
            env = await pool.make(**sql_task(sql_data))
            await env.reset()
            messages, reward, done, _, info = await env.step(query)
            assert not done and reward == 0
            assert "ada" in json.loads(messages)[0]["content"]  # the query ran, on the host
            assert info["tool_name"] == "sql"
            forks = await env.fork(2)
            assert {f.host for f in forks} | {env.host} == set(pool_hosts(pool))
            again = "<think>how many</think><sql>SELECT COUNT(*) FROM orders</sql>"
            results = await asyncio.gather(*(e.step(again) for e in (env, *forks)))
            assert_same(results[1], results[0], "fork 0 after a second tool call")
            assert_same(results[2], results[0], "fork 1 after a second tool call")
            finals = await asyncio.gather(
                env.step(right), forks[0].step(right), forks[1].step(wrong)
            )
            assert [(r[1], r[2]) for r in finals] == [(1.0, True), (1.0, True), (0.0, True)]
            await asyncio.gather(env.close(), *(f.close() for f in forks))

    asyncio.run(main())


def pool_hosts(pool: aio.EnvPool) -> list[str]:
    return [host.name for host in pool.hosts]


def test_an_unknown_skyrl_env_fails_its_make_in_one_line(two_hosts):
    async def main() -> None:
        async with aio.EnvPool(SKYRL, hosts=two_hosts) as pool:
            with pytest.raises(Exception, match=r"no SkyRL-Gym env 'chess'.*gsm8k") as caught:
                await pool.make(env="chess", prompt="e4")
            assert "\n" not in str(caught.value)
            env = await pool.make(**gsm8k_task(2))  # the pool goes on
            assert json.loads((await env.reset())[0])[0]["role"] == "user"

    asyncio.run(main())
