"""Env families from other packages, served as Gymnasium envs.

- :mod:`envserver.envs.skyrl`: SkyRL-Gym's text envs for LLM agents (``envserver[skyrl]``),
  as ``envserver/SkyRL-v0``.

Each module registers its ids with Gymnasium on import, so a host loads them by
``"envserver.envs.skyrl:envserver/SkyRL-v0"``. The layer imports nothing else of envserver.
"""
