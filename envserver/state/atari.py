"""ALE's Atari envs: the emulator's state (``cloneState(include_rng=True)``), the ROM checked.

The emulator's state holds the console, the game's RAM, the frame counters and ALE's random
generator, but not the action a sticky action repeats: where ``repeat_action_probability`` is
above 0, a state taken mid-episode diverges on restore (measured: 9 restores in 40). So with
sticky actions the mechanism is exact only at an episode's start, and a snapshot of such an env
is its state then plus the actions since, replayed on restore (:mod:`envserver.state.snapshot`).
The action repeated is the env's own, not the state's: a restore resets the game first, so that
it is the one every episode starts with (measured: without that, a replay into an env that had
been stepped diverged, into a fresh one it did not).
ALE restores a state of another ROM without a word: the ROM's SHA-256 is checked here.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import gymnasium as gym

from envserver.errors import StateMismatchError
from envserver.state.mechanism import Exact, Mechanism, check_version

__all__ = ["mechanism"]

#: The class of ALE's Gymnasium env.
CLASS = "ale_py.env.AtariEnv"


def mechanism(env: gym.Env, name: str) -> Mechanism | None:
    """The mechanism for ALE's ``AtariEnv`` (its class named ``name``), or None."""
    game = env.spec.kwargs.get("game") if env.spec is not None else None
    if name != CLASS or not isinstance(game, str):  # its ROM is known by gym.make's spec
        return None
    import ale_py  # only where an Atari env runs

    def get(e: Any) -> Any:
        state = e.ale.cloneState(include_rng=True)
        return {
            "ale_py": ale_py.__version__,
            "rom": _rom_digest(game),
            "emulator": state.serialize(),
        }

    def check(e: Any, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("emulator"), bytes):
            raise StateMismatchError("an Atari state without its emulator state")
        check_version(state, "ale_py", "ale-py", ale_py.__version__)
        if state.get("rom") != _rom_digest(game):
            raise StateMismatchError(f"the snapshot was taken with another ROM than {game}'s")
        try:
            ale_py.ALEState(state["emulator"])
        except Exception:  # ALE says only SystemError
            raise StateMismatchError("the snapshot's emulator state is damaged") from None

    sticky = env.ale.getFloat("repeat_action_probability") > 0

    def put(e: Any, state: Any) -> None:
        if sticky:  # the action a sticky one repeats, as at any episode's start (not a state's)
            e.ale.reset_game()
        try:
            e.ale.restoreState(ale_py.ALEState(state["emulator"]))
        except Exception:  # a part of the console refused its state: the rest may be restored
            raise StateMismatchError("the snapshot's emulator state is damaged") from None

    name = "ale, replayed from the episode's start" if sticky else "ale"
    return Mechanism(name, get, put, check, Exact.AFTER_RESET if sticky else Exact.ANYTIME)


@functools.cache
def _rom_digest(game: str) -> str:
    """The SHA-256 of the game's ROM file, read once per process."""
    from ale_py import roms

    with open(roms.get_rom_path(game), "rb") as rom:
        return hashlib.sha256(rom.read()).hexdigest()
