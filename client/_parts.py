"""The parts of a vector env, composed in one place (``RemoteVectorEnv`` and the tests use it)."""

from __future__ import annotations

from dataclasses import dataclass

from ._env_results import EnvResults
from ._first_ready import FirstReady
from ._hosts import Hosts
from ._in_flight import InFlight
from ._lockstep import Lockstep
from ._options import VectorOptions
from ._recipe import EnvRecipe
from ._recovery import Recovery
from ._recovery.history import EnvHistory
from ._spaces import VectorSpaces

__all__ = ["VectorParts"]


@dataclass(frozen=True)
class VectorParts:
    """What a vector env works with once its hosts are connected and its envs made.

    Attributes:
        results: Every env's last results.
        recovery: Brings failed hosts back; knows which envs were lost and each env's history.
        lockstep: Lockstep calls (``reset``, ``step``, ``call``...).
        first_ready: First-ready batches (``send``, ``async_reset``, ``recv``).
    """

    results: EnvResults
    recovery: Recovery
    lockstep: Lockstep
    first_ready: FirstReady

    @classmethod
    def compose(
        cls,
        hosts: Hosts,
        recipe: EnvRecipe,
        spaces: VectorSpaces,
        options: VectorOptions,
        batch_size: int,
    ) -> VectorParts:
        """Makes the parts, each handed the others it works with.

        Args:
            hosts: The hosts, connected, their envs made.
            recipe: How the hosts made their envs (to make them again).
            spaces: The envs' spaces.
            options: The vector env's options.
            batch_size: How many envs a first-ready batch has.

        Raises:
            ValueError: If ``sub_batch_size`` is not positive.
        """
        pool = hosts.pool
        sub_batch_size = options.sub_batch_size_for(batch_size, len(pool.connections))
        results = EnvResults(
            len(spaces.env_spaces),
            spaces.single_observation_space,
            options.autoreset_mode,
            options.info_format,
            options.copy,
        )
        action_space = spaces.single_action_space
        restore = options.on_host_failure == "restore"
        history = EnvHistory(pool, action_space, options.snapshot_every if restore else None)
        env_spaces = spaces.env_spaces
        recovery = Recovery(
            pool, recipe, env_spaces, results, options, history, hosts.launcher, hosts.discovery
        )
        engine = InFlight(pool, recovery)
        return cls(
            results,
            recovery,
            Lockstep(pool, engine, recovery, results, action_space),
            FirstReady(
                pool,
                engine,
                recovery,
                results,
                action_space,
                batch_size,
                sub_batch_size,
                options.info_format,
            ),
        )
