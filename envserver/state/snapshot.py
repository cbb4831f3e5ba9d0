"""Snapshots of an env stack: taken layer by layer, carried as bytes, restored checked.

``capture(env)`` walks the stack from the outermost wrapper to the env itself and asks each
layer's mechanism (hooks, a built-in handler, an adapter: see :mod:`envserver.state`) for its
state; ``check(env, snapshot)`` checks the fingerprint and the layers against ``env``'s and
returns the restore, ready (:class:`Checked`), which gives each layer its state back and the
env's random generator its state; ``restore(env, snapshot)`` is both.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import gymnasium as gym
import msgpack
import numpy as np
from gymnasium.utils.env_checker import data_equivalence

from envserver.errors import ProtocolError, StateMismatchError, UnsupportedStateError
from envserver.state import pickled
from envserver.state.mechanism import Mechanism
from envserver.state.simulators import adapter_of
from envserver.state.wrappers import HANDLERS, STATELESS
from envserver.wire import codec

__all__ = [
    "FORMAT",
    "MAX_SNAPSHOT_BYTES",
    "Checked",
    "Episode",
    "Fingerprint",
    "Snapshot",
    "capture",
    "check",
    "restore",
]

#: The version of the snapshot format (a snapshot of another is refused).
FORMAT = 1
#: The tag a snapshot's bytes start with (a msgpack document's first item).
TAG = "envserver-state"
#: The largest snapshot read (bytes).
MAX_SNAPSHOT_BYTES = 1 << 28
#: The packages whose versions a snapshot is taken with: restored only with the same.
PACKAGES = ("gymnasium", "numpy")


@dataclass(frozen=True)
class Fingerprint:
    """What a snapshot can only be restored into the same of.

    Attributes:
        env: The env's id (its spec's), or its class's ``module.qualname`` without a spec.
        kwargs: The spec's keyword arguments, as text (``repr``) where they are not plain data,
            and its ``max_episode_steps``.
        versions: Python's and :data:`PACKAGES`' versions.
        machine: The CPU architecture (``platform.machine()``).
    """

    env: str
    kwargs: dict[str, Any]
    versions: dict[str, str]
    machine: str

    @classmethod
    def of(cls, env: gym.Env) -> Fingerprint:
        """The fingerprint of ``env`` on this machine."""
        spec = env.spec
        if spec is not None:
            name, kwargs = spec.id, {str(k): _plain_or_repr(v) for k, v in spec.kwargs.items()}
            kwargs["max_episode_steps"] = spec.max_episode_steps  # gym.make's, beside them
        else:
            name, kwargs = _class_name(env.unwrapped), {}
            inner = getattr(env.unwrapped, "env", None)
            if inner is not None and not isinstance(inner, gym.Env):  # an adapter's foreign env
                name += f"({_class_name(inner)})"
        return cls(name, kwargs, dict(_versions()), platform.machine())

    def check(self, other: Fingerprint) -> None:
        """Raises if ``other`` (a snapshot's) is not this one.

        Raises:
            StateMismatchError: Naming the first field that differs, and both values.
        """
        for name in ("env", "kwargs", "versions", "machine"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise StateMismatchError(
                    f"the snapshot was taken with {name} {theirs!r}, this env has {mine!r}"
                )

    def to_data(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "env": self.env,
            "kwargs": self.kwargs,
            "versions": self.versions,
            "machine": self.machine,
        }


@dataclass(frozen=True)
class Snapshot:
    """One env stack's state.

    Attributes:
        fingerprint: What it may be restored into.
        layers: Per layer, outermost first: ``[class name, mechanism, state]``.
        rng: The env's bit generator state (``np_random.bit_generator.state``).
        extra: What the caller keeps beside the env's state (a host's bookkeeping).
        replay: For a stack a layer of which is exact only at an episode's start: ``layers``
            and ``rng`` are the stack's at the episode's start, and this is
            ``{"actions": ..., "obs": ...}``, the actions since (an array where they are
            arrays of one dtype and shape, else a list) and the observation the last of them
            gave (checked when they are replayed). None for the others.
    """

    fingerprint: Fingerprint
    layers: list[list[Any]]
    rng: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    replay: dict[str, Any] | None = None

    def to_bytes(self) -> bytes:
        """The snapshot as bytes: msgpack and raw arrays (the wire codec's), never pickle."""
        body = {
            "fingerprint": self.fingerprint.to_data(),
            "layers": self.layers,
            "rng": self.rng,
            "extra": self.extra,
            "replay": self.replay,
        }
        frames = [bytes(memoryview(f).cast("B")) for f in codec.encode(body)]
        return msgpack.packb([TAG, FORMAT, frames], use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        """Reads a snapshot that :meth:`to_bytes` wrote, trusting nothing in it.

        Raises:
            ProtocolError: If the bytes are not a snapshot of this format.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ProtocolError(f"a snapshot is bytes, got {type(data).__name__}")
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise ProtocolError(f"a snapshot of {len(data)} bytes is over {MAX_SNAPSHOT_BYTES}")
        try:
            tag, version, frames = msgpack.unpackb(bytes(data), raw=False, max_bin_len=len(data))
        except Exception as exc:
            raise ProtocolError(f"not an envserver snapshot: {type(exc).__name__}") from None
        if tag != TAG or not isinstance(frames, list) or not frames:
            raise ProtocolError("not an envserver snapshot")
        if version != FORMAT:
            raise ProtocolError(f"a snapshot of format {version!r}; this envserver reads {FORMAT}")
        body = codec.decode(frames)
        try:
            fingerprint = Fingerprint(**body["fingerprint"])
            layers, rng, extra = body["layers"], body["rng"], body["extra"]
        except (TypeError, KeyError) as exc:
            raise ProtocolError(f"a snapshot without its {exc}") from None
        if not isinstance(layers, list) or not all(
            isinstance(layer, list) and len(layer) == 3 and isinstance(layer[0], str)
            for layer in layers
        ):
            raise ProtocolError("a snapshot's layers are [class, mechanism, state] triples")
        if not isinstance(rng, dict) or not isinstance(extra, dict):
            raise ProtocolError("a snapshot's rng and extra are maps")
        replay = body.get("replay")
        if replay is not None and not (
            isinstance(replay, dict) and isinstance(replay.get("actions"), (list, np.ndarray))
        ):
            raise ProtocolError("a snapshot's replay is a map with its actions")
        return cls(fingerprint, layers, rng, extra, replay)


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    """Python's and :data:`PACKAGES`' versions: read once (from the packages' metadata files)."""
    packages = ((package, metadata.version(package)) for package in PACKAGES)
    return (("python", platform.python_version()), *packages)


def capture(
    env: gym.Env, extra: dict[str, Any] | None = None, *, allow_pickle: bool = False
) -> Snapshot:
    """Takes the state of ``env``'s whole stack.

    Args:
        env: The stack.
        extra: What the caller keeps beside it (a host's bookkeeping).
        allow_pickle: Whether a layer no other mechanism covers may be pickled (a host that
            allows pickle; see :mod:`envserver.state.pickled`).

    Raises:
        UnsupportedStateError: Naming the first layer no mechanism covers, or one whose
            mechanism is exact only at an episode's start (take those with :class:`Episode`).
    """
    layers = _layers(env, allow_pickle)
    for layer, mechanism in layers:
        if mechanism.from_start:
            raise UnsupportedStateError(
                f"{_class_name(layer)}'s state is exact only at an episode's start: a snapshot "
                "of it is taken from a record of the episode (envserver.state.Episode)"
            )
    return _snapshot(env, layers, extra)


def _snapshot(
    env: gym.Env, layers: list[tuple[Any, Mechanism]], extra: dict[str, Any] | None
) -> Snapshot:
    """The snapshot of ``env``, each layer's state taken by its mechanism."""
    taken = [[_class_name(layer), m.name, m.get(layer)] for layer, m in layers]
    rng = env.unwrapped.np_random.bit_generator.state
    return Snapshot(Fingerprint.of(env), taken, rng, dict(extra or {}))


class Episode:
    """The record a snapshot of a stack exact only at an episode's start is taken from.

    Such a stack (ALE with sticky actions) has its state taken at each episode's start, and
    the actions since kept; its snapshot is both, and a restore replays the actions, checking
    that the last gives the observation it gave here.

    Args:
        allow_pickle: As :func:`capture`'s.
    """

    def __init__(self, allow_pickle: bool = False) -> None:
        self._allow_pickle = allow_pickle
        self._start: Snapshot | None = None
        self._actions: list[Any] = []
        self._obs: Any = None

    @staticmethod
    def needed(env: gym.Env, allow_pickle: bool = False) -> bool:
        """Whether ``env``'s stack has a layer exact only at an episode's start."""
        try:
            return any(mechanism.from_start for _, mechanism in _layers(env, allow_pickle))
        except UnsupportedStateError:
            return False  # no snapshot of it at all: said when one is asked for

    def started(self, env: gym.Env) -> None:
        """Notes that ``env`` was just reset (an episode starts)."""
        self._start = _snapshot(env, _layers(env, self._allow_pickle), None)
        self._actions, self._obs = [], None

    def acted(self, action: Any, obs: Any) -> None:
        """Notes a step: its action and the observation it gave."""
        self._actions.append(action.copy() if isinstance(action, np.ndarray) else action)
        self._obs = obs

    def capture(self, env: gym.Env, extra: dict[str, Any] | None = None) -> Snapshot:
        """The snapshot of ``env`` now: its episode's start and the actions since."""
        if self._start is None:  # not reset yet: its state now is a start
            self.started(env)
        assert self._start is not None
        start = self._start
        replay = {"actions": _batched(self._actions), "obs": self._obs}
        return Snapshot(start.fingerprint, start.layers, start.rng, dict(extra or {}), replay)

    def restored(self, snapshot: Snapshot) -> None:
        """Takes over the record of a snapshot just restored (its start, its actions)."""
        replay = snapshot.replay or {"actions": [], "obs": None}
        self._start = Snapshot(snapshot.fingerprint, snapshot.layers, snapshot.rng)
        self._actions, self._obs = list(replay["actions"]), replay.get("obs")


def check(env: gym.Env, snapshot: Snapshot, *, allow_pickle: bool = False) -> Checked:
    """Checks that ``snapshot`` can be restored into ``env`` (changes nothing).

    ``allow_pickle`` as :func:`capture`'s: a layer's pickled state is only read where it is.

    Returns:
        The restore, ready to be applied.

    Raises:
        StateMismatchError: If the fingerprint, the stack's layers or their mechanisms differ.
        UnsupportedStateError: If no mechanism covers a layer.
    """
    Fingerprint.of(env).check(snapshot.fingerprint)
    layers = _layers(env, allow_pickle)
    names = [_class_name(layer) for layer, _ in layers]
    taken = [name for name, _, _ in snapshot.layers]
    if names != taken:
        raise StateMismatchError(f"the snapshot's layers are {taken}, this env's are {names}")
    for (layer, mechanism), (_, taken_by, state) in zip(layers, snapshot.layers):
        if mechanism.name != taken_by:
            raise StateMismatchError(
                f"{_class_name(layer)}'s state was taken by {taken_by}, here it is by "
                f"{mechanism.name}"
            )
        mechanism.check(layer, state)
    generator = env.unwrapped.np_random.bit_generator.state["bit_generator"]
    if snapshot.rng.get("bit_generator") != generator:
        raise StateMismatchError(
            f"the snapshot's generator is {snapshot.rng.get('bit_generator')!r}, this env's is "
            f"{generator!r}"
        )
    return Checked(env, snapshot, layers)


@dataclass(frozen=True)
class Checked:
    """A snapshot :func:`check` found nothing against, and the env it goes into.

    Attributes:
        env: The env stack.
        snapshot: The snapshot.
        layers: Each layer of the stack and its mechanism, outermost first.
    """

    env: gym.Env
    snapshot: Snapshot
    layers: list[tuple[Any, Mechanism]]

    def apply(self) -> None:
        """Gives the stack the snapshot's state.

        A snapshot taken from an :class:`Episode` is restored at its episode's start, then its
        actions are stepped again.

        Raises:
            StateMismatchError: If the actions replayed gave another observation than they did
                where the snapshot was taken (the env is then in the replay's state).
        """
        env, snapshot = self.env, self.snapshot
        for (layer, mechanism), (_, _, state) in zip(self.layers, snapshot.layers):
            mechanism.put(layer, state)
        env.unwrapped.np_random.bit_generator.state = snapshot.rng
        actions = snapshot.replay["actions"] if snapshot.replay is not None else []
        if not len(actions):
            return
        for action in actions:
            obs = env.step(action)[0]
        if not data_equivalence(obs, snapshot.replay.get("obs"), exact=True):
            raise StateMismatchError(
                f"replaying the {len(actions)} actions since the episode's start gave another "
                "observation than they gave where the snapshot was taken"
            )


def _batched(actions: list[Any]) -> Any:
    """The actions as one array where they share a dtype and shape, else as a list.

    One array costs a few bytes per action, a list a message per action.
    """
    if actions and all(isinstance(a, (np.ndarray, np.generic)) for a in actions):
        first = np.asarray(actions[0])
        if all(np.asarray(a).dtype == first.dtype and np.shape(a) == first.shape for a in actions):
            return np.stack(actions)
    return list(actions)


def restore(env: gym.Env, snapshot: Snapshot, *, allow_pickle: bool = False) -> None:
    """Checks ``snapshot`` against ``env`` (:func:`check`) and restores it (:meth:`Checked.apply`).

    Raises:
        StateMismatchError: If the fingerprint or the stack's layers differ, or a replay gave
            another observation.
        UnsupportedStateError: If no mechanism covers a layer.
    """
    check(env, snapshot, allow_pickle=allow_pickle).apply()


def _stack(env: gym.Env) -> list[gym.Env]:
    """The wrappers, outermost first, then the env itself."""
    layers = []
    while isinstance(env, gym.Wrapper):
        layers.append(env)
        env = env.env
    layers.append(env)
    return layers


def _layers(env: gym.Env, allow_pickle: bool) -> list[tuple[Any, Mechanism]]:
    """Each layer of ``env``'s stack, outermost first, with the mechanism that covers it.

    Raises:
        UnsupportedStateError: Naming the first layer no mechanism covers.
    """
    return [(layer, _mechanism(layer, allow_pickle)) for layer in _stack(env)]


def _class_name(layer: Any) -> str:
    return f"{type(layer).__module__}.{type(layer).__qualname__}"


def _nothing(_layer: Any) -> None:
    return None


def _ignore(_layer: Any, _state: Any) -> None:
    return None


def _mechanism(layer: Any, allow_pickle: bool) -> Mechanism:
    """The first mechanism that covers ``layer`` (pickle last, where it is allowed)."""
    if _has_hooks(layer):
        return Mechanism("hooks", lambda e: e.get_state(), lambda e, s: e.set_state(s))
    if isinstance(layer, gym.Wrapper):
        handler = HANDLERS.get(type(layer))
        if handler is not None:
            return Mechanism("gymnasium wrapper", *handler)
        if type(layer) in STATELESS:
            return Mechanism("stateless", _nothing, _ignore)
    else:
        adapter = adapter_of(layer)
        if adapter is not None:
            return adapter
    if allow_pickle:
        return pickled.mechanism(layer, _class_name(layer))
    raise UnsupportedStateError(
        f"{_class_name(layer)} keeps state no snapshot mechanism covers: give it get_state() "
        "and set_state(state) methods (plain data: numbers, strings, arrays, lists, maps), or "
        "serve it from hosts started with --allow-pickle"
    )


def _has_hooks(layer: Any) -> bool:
    """Whether the layer's own class defines both hooks (a wrapper's are not its env's)."""
    get, put = getattr(type(layer), "get_state", None), getattr(type(layer), "set_state", None)
    return callable(get) and callable(put) and "get_state" in _own_names(layer)


def _own_names(layer: Any) -> set[str]:
    """Attribute names defined by the layer's class and its bases, but not Gymnasium's."""
    names: set[str] = set()
    for cls in type(layer).__mro__:
        if cls.__module__.startswith("gymnasium.core") or cls is object:
            continue
        names.update(vars(cls))
    return names


def _plain_or_repr(value: Any) -> Any:
    """``value`` if the codec carries it as plain data, else its ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain_or_repr(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain_or_repr(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)
