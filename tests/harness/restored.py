"""Running an env stack before and after a snapshot's restore (tests/state)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym


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
