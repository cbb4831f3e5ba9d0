"""PettingZoo's turn-based classic games, registered as Parallel envs for tests.

Importing this module registers ``envserver/tictactoe-v3`` and ``envserver/connect_four-v3``
with PettingZoo's registry: each is the AEC game wrapped in PettingZoo's
``turn_based_aec_to_parallel`` (every agent acts on each step; only the action of the agent
whose turn it is counts, the others' masks are all zeros). A host serves them by name, as
``envserver.testing.games:envserver/tictactoe-v3``. Needs PettingZoo 1.27 or later.
"""

from __future__ import annotations

import importlib
from typing import Any

import pettingzoo
from pettingzoo.utils.conversions import turn_based_aec_to_parallel

__all__ = ["GAMES", "turn_based"]

#: The games registered, by id: their module in ``pettingzoo.classic``.
GAMES = {"envserver/tictactoe-v3": "tictactoe_v3", "envserver/connect_four-v3": "connect_four_v3"}


def turn_based(game: str, **kwargs: Any) -> Any:
    """The classic game ``game`` (a module of ``pettingzoo.classic``) as a Parallel env."""
    module = importlib.import_module(f"pettingzoo.classic.{game}")
    return turn_based_aec_to_parallel(module.env(**kwargs))


for _id, _game in GAMES.items():
    if _id not in pettingzoo.parallel_registry:
        pettingzoo.register("parallel", _id, turn_based, kwargs={"game": _game})
