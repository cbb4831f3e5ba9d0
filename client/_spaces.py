"""The spaces of a vector env, read from its hosts' MAKE replies and checked as Gymnasium does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector.utils import batch_differing_spaces, batch_space

from envserver.errors import ProtocolError
from envserver.wire.raw import StepLayout
from envserver.wire.replies import MakeReply

from ._results import space_of
from ._transport.connection import HostConnection

__all__ = ["VectorSpaces"]


@dataclass(frozen=True)
class VectorSpaces:
    """Every env's spaces, and the single and batched spaces of the vector env.

    Attributes:
        env_spaces: ``(observation_space, action_space)`` of each env, in env order (envs made
            anew after a host failure must have the same).
        single_observation_space: One env's observation space.
        observation_space: The batched observation space.
        single_action_space: One env's action space.
        action_space: The batched action space.
        metadata: The first env's metadata.
        render_mode: The first env's render mode.
        step_layout: How steps travel raw for these spaces (None: they do not).
    """

    env_spaces: list[tuple[gym.Space, gym.Space]]
    single_observation_space: gym.Space
    observation_space: gym.Space
    single_action_space: gym.Space
    action_space: gym.Space
    metadata: dict[str, Any]
    render_mode: Any
    step_layout: StepLayout | None

    @classmethod
    def of(
        cls, made: list[tuple[HostConnection, MakeReply]], observation_mode: str | tuple
    ) -> VectorSpaces:
        """Reads every env's spaces from the MAKE replies (in host order) and checks them.

        Args:
            made: Each host's connection and MAKE reply body.
            observation_mode: ``"same"``, ``"different"``, or a ``(batch, single)`` pair.

        Raises:
            RuntimeError: If the envs' spaces differ where the mode needs them equal, with
                Gymnasium's wording and which host and env differ.
            ProtocolError: If a host reported spaces for another number of envs.
        """
        observation_spaces: list[gym.Space] = []
        action_spaces: list[gym.Space] = []
        where: list[str] = []
        for connection, reply in made:
            block = connection.block
            observation_spaces += [space_of(s) for s in reply.observation_spaces]
            action_spaces += [space_of(s) for s in reply.action_spaces]
            where += [f"{block.name}, env {i}" for i in range(block.start, block.stop)]
            if len(observation_spaces) != block.stop or len(action_spaces) != block.stop:
                raise ProtocolError(f"{block.name} reported spaces for wrong count")
        num_envs = len(observation_spaces)
        observation_space, single = _observation_spaces(observation_mode, observation_spaces)
        first_endpoint, first = made[0][0].block.endpoint, made[0][1]
        spaces = cls(
            env_spaces=list(zip(observation_spaces, action_spaces)),
            single_observation_space=single,
            observation_space=observation_space,
            single_action_space=action_spaces[0],
            action_space=batch_space(action_spaces[0], num_envs),
            metadata=dict(first.metadata),
            render_mode=first.render_mode,
            step_layout=StepLayout.of(single, action_spaces[0]),
        )
        for label, observation, action in zip(where, observation_spaces, action_spaces):
            spaces._check(observation_mode, label, observation, action, first_endpoint)
        return spaces

    def _check(
        self, mode: Any, label: str, observation: gym.Space, action: gym.Space, first: str
    ) -> None:
        """Gymnasium's wording (users search for it), then which env differs from which."""
        single = self.single_observation_space
        if mode == "same" and observation != single:
            raise RuntimeError(
                "RemoteVectorEnv(..., observation_mode='same') however some of the "
                "sub-environments observation spaces are not equivalent. "
                f"single_observation_space={single} (host {first}, env 0), sub-environment "
                f"observation_space={observation} ({label}). If this is intentional, use "
                "`observation_mode='different'` instead."
            )
        if mode != "same" and not is_space_dtype_shape_equiv(observation, single):
            raise RuntimeError(
                "RemoteVectorEnv(..., observation_mode='different' or custom space) however "
                "the sub-environment's observation spaces do not share a common shape and "
                f"dtype. {label} has {observation}, host {first} env 0 has {single}."
            )
        if action != self.single_action_space:
            raise RuntimeError(
                "Some environments have an action space different from "
                f"`{self.single_action_space}`. In order to batch actions, the action spaces "
                f"from all environments must be equal. {label} has {action} (host "
                f"{first}, env 0 has {self.single_action_space})."
            )


def _observation_spaces(
    mode: Any, observation_spaces: list[gym.Space]
) -> tuple[gym.Space, gym.Space]:
    """The batched and single observation spaces ``observation_mode`` asks for."""
    if isinstance(mode, tuple) and len(mode) == 2:
        if not all(isinstance(s, gym.Space) for s in mode):
            raise TypeError(
                f"Expected both elements of observation_mode to be Spaces, got "
                f"{type(mode[0])} and {type(mode[1])}"
            )
        return mode[0], mode[1]
    if mode == "same":
        return batch_space(observation_spaces[0], len(observation_spaces)), observation_spaces[0]
    if mode == "different":
        return batch_differing_spaces(observation_spaces), observation_spaces[0]
    raise ValueError(
        "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single "
        f"and batch observation space, actual got {mode}"
    )
