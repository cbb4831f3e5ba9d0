"""Snapshots of an env stack: taken layer by layer, carried as bytes, restored checked.

``capture(env)`` walks the stack from the outermost wrapper to the env itself and asks each
layer's mechanism (hooks, a built-in handler, an adapter: see :mod:`envserver.state`) for its
state; ``check(env, snapshot)`` checks the fingerprint and the layers against ``env``'s and
returns the restore, ready (:class:`Checked`), which gives each layer its state back and the
env's random generator its state; ``restore(env, snapshot)`` is both.

A stack a layer of which is exact only at an episode's start (after its reset, or before it)
has its snapshots taken from an :class:`Episode` record instead: the stack's state at the
episode's start, and what a restore runs again from there (:class:`Replay`: the reset, if the
state is of the moment before it, and the actions since), checked as it runs.
"""

from __future__ import annotations

import copy
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
from envserver.state import pickled, replayed
from envserver.state.mechanism import Exact, Mechanism, ignore, nothing
from envserver.state.simulators import adapter_of
from envserver.state.wrappers import HANDLERS, STATELESS
from envserver.wire import codec

__all__ = [
    "FORMAT",
    "MAX_SNAPSHOT_BYTES",
    "Checked",
    "Episode",
    "Fingerprint",
    "Replay",
    "Reset",
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
        replay: For a stack a layer of which is exact only at an episode's start (taken from
            an :class:`Episode` record): ``layers`` and ``rng`` are the stack's at the
            episode's start (right after its reset, or right before it), and this is what a
            restore runs again from there, and checks. None for the others.
    """

    fingerprint: Fingerprint
    layers: list[list[Any]]
    rng: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    replay: Replay | None = None

    def to_bytes(self) -> bytes:
        """The snapshot as bytes: msgpack and raw arrays (the wire codec's), never pickle."""
        body = {
            "fingerprint": self.fingerprint.to_data(),
            "layers": self.layers,
            "rng": self.rng,
            "extra": self.extra,
            "replay": self.replay.to_data() if self.replay is not None else None,
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
        recorded = body.get("replay")
        replay = Replay.from_data(recorded) if recorded is not None else None
        return cls(fingerprint, layers, rng, extra, replay)


@dataclass(frozen=True)
class Reset:
    """A reset a restore runs again, and what it gave where the snapshot was taken.

    Attributes:
        seed: Its seed; None where the env's generator went on (from the snapshot's ``rng``).
        options: Its options.
        obs: The observation it gave.
        info: The info it gave.
    """

    seed: int | None
    options: dict[str, Any] | None
    obs: Any
    info: dict[str, Any]

    def run(self, env: gym.Env) -> None:
        """Resets ``env`` (its generator put back) as then, checking what it gives.

        Raises:
            StateMismatchError: If it gives another observation or info (the env is then as
                the reset left it).
        """
        obs, info = env.reset(seed=self.seed, options=copy.deepcopy(self.options))
        for what, got, then in (("observation", obs, self.obs), ("info", info, self.info)):
            if not data_equivalence(got, then, exact=True):
                raise StateMismatchError(
                    f"the reset replayed gave another {what} than it gave where the snapshot "
                    f"was taken: {_class_name(env.unwrapped)}'s reset depends on more than its "
                    "np_random, seed and options (the env is as that reset left it)"
                )

    def to_data(self) -> dict[str, Any]:
        """Plain data."""
        return {"seed": self.seed, "options": self.options, "obs": self.obs, "info": self.info}

    @classmethod
    def from_data(cls, data: Any) -> Reset:
        """Reads what :meth:`to_data` wrote, trusting nothing in it.

        Raises:
            ProtocolError: If it is not a reset.
        """
        if (
            not isinstance(data, dict)
            or "obs" not in data
            or not isinstance(data.get("info"), dict)
        ):
            raise ProtocolError("a snapshot's reset is a map of its seed, options, obs and info")
        seed, options = data.get("seed"), data.get("options")
        if not (seed is None or type(seed) is int) or not (
            options is None or isinstance(options, dict)
        ):
            raise ProtocolError(
                "a snapshot's reset has a seed that is not an int, or options that are not a map"
            )
        return cls(seed, options, data["obs"], data["info"])


@dataclass(frozen=True)
class Replay:
    """What a restore runs again once it has put a snapshot's layers and generator back.

    Attributes:
        reset: The reset to run first, where the snapshot is of the moment before it; None
            where it is of the moment after it.
        actions: The actions since the reset, stepped again: an array where they are arrays
            of one dtype and shape, else a list.
        obs: The observation the last of them gave (checked); None without actions.
    """

    reset: Reset | None
    actions: Any
    obs: Any

    @property
    def last_obs(self) -> Any:
        """The observation the replay ends on, checked: its last action's, else its reset's."""
        if len(self.actions):
            return self.obs
        return None if self.reset is None else self.reset.obs

    def run(self, env: gym.Env) -> None:
        """Runs the reset and the actions again on ``env``, checking what they give.

        Raises:
            StateMismatchError: If the reset or the last action gives another observation (or
                the reset another info) than where the snapshot was taken (the env is then as
                they left it).
        """
        if self.reset is not None:
            self.reset.run(env)
        if not len(self.actions):
            return
        for action in self.actions:
            obs = env.step(action)[0]
        if not data_equivalence(obs, self.obs, exact=True):
            raise StateMismatchError(
                f"replaying the {len(self.actions)} actions since the episode's start gave "
                "another observation than they gave where the snapshot was taken (the env is as "
                "they left it)"
            )

    def to_data(self) -> dict[str, Any]:
        """Plain data."""
        reset = self.reset.to_data() if self.reset is not None else None
        return {"reset": reset, "actions": self.actions, "obs": self.obs}

    @classmethod
    def from_data(cls, data: Any) -> Replay:
        """Reads what :meth:`to_data` wrote, trusting nothing in it.

        Raises:
            ProtocolError: If it is not a replay.
        """
        if not isinstance(data, dict) or not isinstance(data.get("actions"), (list, np.ndarray)):
            raise ProtocolError("a snapshot's replay is a map with its actions")
        reset = data.get("reset")
        return cls(
            Reset.from_data(reset) if reset is not None else None, data["actions"], data.get("obs")
        )


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
        if mechanism.exact is not Exact.ANYTIME:
            raise UnsupportedStateError(
                f"{_class_name(layer)}'s state is exact only at an episode's start "
                f"({mechanism.exact.value}): a snapshot of it is taken from a record of the "
                "episode (envserver.state.Episode)"
            )
    return _snapshot(env, layers, Fingerprint.of(env), extra)


def _snapshot(
    env: gym.Env,
    layers: list[tuple[Any, Mechanism]],
    fingerprint: Fingerprint,
    extra: dict[str, Any] | None,
) -> Snapshot:
    """The snapshot of ``env``, each layer's state taken by its mechanism."""
    taken = [[_class_name(layer), m.name, m.get(layer)] for layer, m in layers]
    rng = env.unwrapped.np_random.bit_generator.state
    return Snapshot(fingerprint, taken, rng, dict(extra or {}))


class Episode:
    """The record a snapshot of a stack exact only at an episode's start is taken from.

    Such a stack has a layer exact only right after a reset (ALE with sticky actions) or only
    right before one (an env re-created by its reset: :mod:`~envserver.state.replayed`). Its
    record takes the stack's state at each reset (after it; or before it, noting the reset's
    seed and options and what it gave) and keeps the actions since; its snapshot is both
    (:class:`Replay`), and a restore runs the reset and the actions again, checked.

    Made by :meth:`of`. The env's resets go through :meth:`reset`; its steps are noted with
    :meth:`acted`.

    Args:
        env: The stack.
        layers: Each of its layers and the mechanism that covers it, outermost first.
    """

    def __init__(self, env: gym.Env, layers: list[tuple[Any, Mechanism]]) -> None:
        self._env = env
        self._layers = layers
        self._before_reset = _exact(layers) is Exact.BEFORE_RESET
        self._fingerprint = Fingerprint.of(env)
        # The stack's state at the episode's start (None: never reset), the reset to run again
        # from it (None: the state is of the moment after the reset), the actions since, the
        # observation the last gave, and whether the record was lost (a reset or a restore
        # into the env failed: its state is not known until its next reset).
        self._start: Snapshot | None = None
        self._reset: Reset | None = None
        self._actions: list[Any] = []
        self._obs: Any = None
        self._lost = False

    @classmethod
    def of(cls, env: gym.Env, allow_pickle: bool = False) -> Episode | None:
        """The record of ``env``'s episodes; None where its snapshots need none.

        None too where no mechanism covers a layer of the stack (said when a snapshot is
        asked for). ``allow_pickle`` as :func:`capture`'s.
        """
        try:
            layers = _layers(env, allow_pickle)
        except UnsupportedStateError:
            return None
        return None if _exact(layers) is Exact.ANYTIME else cls(env, layers)

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, Any]:
        """Resets the env with ``seed`` and ``options``, and starts the record of the episode.

        Returns:
            What the env's reset returns.

        Raises:
            BaseException: Whatever the env's reset raises (the record is then lost).
        """
        env = self._env
        before = self._state() if self._before_reset else None
        asked = copy.deepcopy(options) if before is not None else None  # the env may change them
        try:
            obs, info = env.reset(seed=seed, options=options)
        except BaseException:
            self._lost = True
            raise
        if before is None:
            self._start, self._reset = self._state(), None
        else:
            seed = None if seed is None else int(seed)
            self._start = before
            self._reset = Reset(seed, asked, copy.deepcopy(obs), copy.deepcopy(info))
        self._actions, self._obs, self._lost = [], None, False
        return obs, info

    def acted(self, action: Any, obs: Any) -> None:
        """Notes a step: its action and the observation it gave."""
        self._actions.append(action.copy() if isinstance(action, np.ndarray) else action)
        self._obs = obs

    def capture(self, extra: dict[str, Any] | None = None) -> Snapshot:
        """The snapshot of the env now: its episode's start, and what a restore runs again.

        Raises:
            StateMismatchError: If the record was lost (a reset or a restore into the env
                failed) and the env has not been reset since.
        """
        if self._lost:
            raise StateMismatchError(
                f"{_class_name(self._env.unwrapped)}'s state is not known since a reset or a "
                "restore into it failed: reset it before taking its snapshot"
            )
        if self._start is None:  # not reset yet: its state now is a start
            self._start = self._state()
        start = self._start
        replay = Replay(self._reset, _batched(self._actions), self._obs)
        return Snapshot(start.fingerprint, start.layers, start.rng, dict(extra or {}), replay)

    def restored(self, snapshot: Snapshot) -> None:
        """Takes over the record of a snapshot just restored into the env."""
        replay = snapshot.replay or Replay(None, [], None)
        self._start = Snapshot(snapshot.fingerprint, snapshot.layers, snapshot.rng)
        self._reset, self._actions, self._obs = replay.reset, list(replay.actions), replay.obs
        self._lost = False

    def lost(self) -> None:
        """Notes that a restore into the env failed: its state is not known until its reset."""
        self._lost = True

    def _state(self) -> Snapshot:
        return _snapshot(self._env, self._layers, self._fingerprint, None)


def check(env: gym.Env, snapshot: Snapshot, *, allow_pickle: bool = False) -> Checked:
    """Checks that ``snapshot`` can be restored into ``env`` (changes nothing).

    Each layer's state goes back by the mechanism that took it, where it covers the layer here
    (a replay taken on a host that does not allow pickle, on one that does). ``allow_pickle``
    as :func:`capture`'s: a layer's pickled state is only read where it is.

    Returns:
        The restore, ready to be applied.

    Raises:
        StateMismatchError: If the fingerprint, the stack's layers or their mechanisms differ,
            or the snapshot of a stack exact only at an episode's start has nothing to replay.
        UnsupportedStateError: If no mechanism covers a layer.
    """
    Fingerprint.of(env).check(snapshot.fingerprint)
    stack = _stack(env)
    names = [_class_name(layer) for layer in stack]
    taken = [name for name, _, _ in snapshot.layers]
    if names != taken:
        raise StateMismatchError(f"the snapshot's layers are {taken}, this env's are {names}")
    layers = []
    for layer, (_, taken_by, state) in zip(stack, snapshot.layers):
        mechanism = _restoring(layer, taken_by, allow_pickle)
        mechanism.check(layer, state)
        layers.append((layer, mechanism))
    if snapshot.replay is None and _exact(layers) is not Exact.ANYTIME:
        raise StateMismatchError(
            "the snapshot has nothing to replay, and this stack is exact only at an episode's start"
        )
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

        A snapshot taken from an :class:`Episode` is restored at its episode's start, then
        its reset (where the state is of the moment before it) and its actions are run again
        (:meth:`Replay.run`).

        Raises:
            StateMismatchError: If the reset or the actions run again gave another observation
                than they did where the snapshot was taken (the env is then as they left it).
        """
        env, snapshot = self.env, self.snapshot
        for (layer, mechanism), (_, _, state) in zip(self.layers, snapshot.layers):
            mechanism.put(layer, state)
        env.unwrapped.np_random.bit_generator.state = snapshot.rng
        if snapshot.replay is not None:
            snapshot.replay.run(env)


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


def _exact(layers: list[tuple[Any, Mechanism]]) -> Exact:
    """When a stack's state is exact: as its layer exact at the fewest moments."""
    found = {mechanism.exact for _, mechanism in layers}
    for exact in (Exact.BEFORE_RESET, Exact.AFTER_RESET):
        if exact in found:
            return exact
    return Exact.ANYTIME


def _mechanism(layer: Any, allow_pickle: bool) -> Mechanism:
    """The first mechanism that covers ``layer`` (:func:`_mechanisms`).

    Raises:
        UnsupportedStateError: If none does.
    """
    found = _mechanisms(layer, allow_pickle)
    if found:
        return found[0]
    name = _class_name(layer)
    if allow_pickle:  # and the layer is an EzPickle wrapper
        raise UnsupportedStateError(
            f"{name} keeps state no snapshot mechanism covers, and is an EzPickle: its pickle "
            "makes a fresh one, not this one; give it get_state() and set_state(state) methods"
        )
    raise UnsupportedStateError(
        f"{name} keeps state no snapshot mechanism covers: give it get_state() and "
        "set_state(state) methods (plain data: numbers, strings, arrays, lists, maps), or serve "
        "it from hosts started with --allow-pickle"
    )


def _mechanisms(layer: Any, allow_pickle: bool) -> list[Mechanism]:
    """The mechanisms that cover ``layer`` here, the one its snapshots are taken by first.

    Hooks, a handler (a wrapper) or an adapter (an env), alone; else pickle where it is allowed
    (never an ``EzPickle``) and, for the env (not a wrapper), the replay of its reset. A state
    taken by either is restored by it: a replay taken where pickle was not allowed, here too.
    """
    if _has_hooks(layer):
        return [Mechanism("hooks", lambda e: e.get_state(), lambda e, s: e.set_state(s))]
    wrapper = isinstance(layer, gym.Wrapper)
    if wrapper:
        handler = HANDLERS.get(type(layer))
        if handler is not None:
            return [Mechanism("gymnasium wrapper", *handler)]
        if type(layer) in STATELESS:
            return [Mechanism("stateless", nothing, ignore)]
    else:
        adapter = adapter_of(layer)
        if adapter is not None:
            return [adapter]
    pickle = pickled.mechanism(layer, _class_name(layer)) if allow_pickle else None
    found = [] if pickle is None else [pickle]
    return found if wrapper else [*found, replayed.MECHANISM]


def _restoring(layer: Any, taken_by: str, allow_pickle: bool) -> Mechanism:
    """The mechanism that restores ``layer``'s state taken by ``taken_by``: that one, here.

    Raises:
        StateMismatchError: If it does not (pickle where it is not allowed, or another one).
        UnsupportedStateError: If no mechanism covers the layer here.
    """
    found = _mechanisms(layer, allow_pickle)
    for mechanism in found:
        if mechanism.name == taken_by:
            return mechanism
    if taken_by == pickled.NAME and not allow_pickle:
        raise StateMismatchError(
            f"{_class_name(layer)}'s state was taken by pickle, which this host does not "
            "allow: only a host started with --allow-pickle restores it"
        )
    here = _mechanism(layer, allow_pickle).name
    raise StateMismatchError(
        f"{_class_name(layer)}'s state was taken by {taken_by}, here it is by {here}"
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
