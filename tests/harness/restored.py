"""Env stacks before and after a snapshot's restore, and snapshots damaged (tests/state, client)."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym

from envserver.state import Snapshot


def run(env: gym.Env, actions: list[Any]) -> list[tuple]:
    """Steps ``env`` through ``actions``, resetting (without a seed) where an episode ends.

    Returns every step's results and every reset's; an episode's wall time (RecordEpisode-
    Statistics' ``"t"``) is left out: it is the clock's.
    """
    results = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        info = {k: v for k, v in info.items() if k != "episode"} | (
            {"episode": {k: info["episode"][k] for k in "rl"}} if "episode" in info else {}
        )
        results.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            results.append(env.reset())
    return results


def with_an_action_changed(state: bytes, index: int, actions: int) -> bytes:
    """A replayed snapshot (bytes) with its action ``index`` (of ``actions`` discrete) changed."""
    snapshot = Snapshot.from_bytes(state)
    assert snapshot.replay is not None
    changed = snapshot.replay.actions.copy()
    changed[index] = (changed[index] + 1) % actions
    replay = dataclasses.replace(snapshot.replay, actions=changed)
    return dataclasses.replace(snapshot, replay=replay).to_bytes()
