"""Envs for agent loops: an asyncio client where each coroutine steps an env of its own.

Trainers of language-model agents run hundreds of rollouts as coroutines, each at its own pace,
each with one env whose step may wait seconds (a tool call, a sandbox). :class:`EnvPool` gives
each its env on shared hosts::

    from envserver.client import aio

    async with aio.EnvPool("MyTextEnv-v0", hosts=["tcp://sim-a:5555"]) as pool:
        env = await pool.make()
        obs, info = await env.reset(seed=7)
        obs, reward, terminated, truncated, info = await env.step(action)
        await env.close()

Each env follows ``gymnasium.Env`` (no autoreset). Calls that coroutines make on one host within
one turn of the event loop leave as one message (a step over several envs, as a vector step),
and each reply is handed to its coroutines as it comes. An env that raises fails its own call
only. An env lost with its host raises :class:`~envserver.errors.EnvLostError` once, saying
whether an episode was cut; its next call makes it anew on another host.

It is a face over the client's transport (connections, requests and their replies, leases,
local hosts), not a second one.
"""

from __future__ import annotations

from envserver.errors import EnvLostError

from ._env import AsyncEnv
from ._pool import EnvPool, PoolStats

__all__ = ["AsyncEnv", "EnvLostError", "EnvPool", "PoolStats"]
