"""STEP_RAW: a step's values as raw array frames, in a layout both sides derive from the spaces.

A session whose observation and action spaces are made of arrays (Box, Discrete, MultiDiscrete,
MultiBinary, and Tuple or Dict of them) has a :class:`StepLayout`: its *leaves*, the array spaces
in depth-first order, each batched into one array. A STEP_RAW request then carries the env ids
(when not all envs are stepped) and one frame per action leaf; its reply one frame per
observation leaf, one of rewards and flags and, only when some env has any, the info entries as
a codec message. No msgpack is packed or
unpacked per step but the envelope's. ``docs/protocol.md`` (STEP_RAW) is the normative text.

Everything read from a peer is checked: frame counts, every frame's length against the layout,
env ids, flag bytes; a defect raises :class:`~envserver.errors.ProtocolError` before any value is
used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from envserver.errors import ProtocolError
from envserver.wire import codec
from envserver.wire.replies import StepReply
from envserver.wire.slab import SLAB_MIN_BYTES, Slab, SlabOffer, check_name

__all__ = ["Leaf", "StepLayout"]

#: Dtype kinds a leaf may have: bool, signed and unsigned integers, floats.
_LEAF_KINDS = frozenset("biuf")
_INT32 = np.dtype("<i4")
_FLOAT64 = np.dtype("<f8")


@dataclass(frozen=True)
class Leaf:
    """One array of a batched value: its dtype and the shape of one env's part."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @functools.cached_property
    def size(self) -> int:
        """Bytes per env."""
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> list[Any]:
        """``[dtype, shape]`` as the MAKE reply carries it."""
        return [self.dtype.str, list(self.shape)]


def _leaves(space: spaces.Space, out: list[Leaf]) -> bool:
    """Appends ``space``'s leaves to ``out``; False if it has no layout."""
    if isinstance(space, spaces.Tuple):
        return bool(space.spaces) and all(_leaves(s, out) for s in space.spaces)
    if isinstance(space, spaces.Dict):
        return bool(space.spaces) and all(_leaves(s, out) for s in space.spaces.values())
    if isinstance(space, spaces.Discrete):
        dtype = np.dtype(np.int64)
    elif isinstance(space, spaces.MultiBinary):
        dtype = np.dtype(np.int8)
    elif isinstance(space, (spaces.Box, spaces.MultiDiscrete)):
        dtype = np.dtype(space.dtype)
    else:
        return False
    if dtype.kind not in _LEAF_KINDS or dtype.newbyteorder("<") != dtype:  # little-endian only
        return False
    out.append(Leaf(dtype, tuple(int(d) for d in space.shape)))
    return True


def _flatten(space: spaces.Space, value: Any, out: list[Any]) -> None:
    """Appends the arrays of a batched ``value`` to ``out``, in leaf order."""
    if isinstance(space, spaces.Tuple):
        for sub, item in zip(space.spaces, value):
            _flatten(sub, item, out)
    elif isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _flatten(sub, value[key], out)
    else:
        out.append(value)


def _nest(space: spaces.Space, arrays: Any) -> Any:
    """The batched value of ``space`` from an iterator over its leaves' arrays."""
    if isinstance(space, spaces.Tuple):
        return tuple(_nest(s, arrays) for s in space.spaces)
    if isinstance(space, spaces.Dict):
        return {key: _nest(s, arrays) for key, s in space.spaces.items()}
    return next(arrays)


class _Side:
    """One space's layout: its leaves, and its batched values to and from raw frames."""

    def __init__(self, space: spaces.Space, leaves: list[Leaf]) -> None:
        self.space = space
        self.leaves = leaves
        #: A single array space: the batch is the one leaf's array (no nesting to walk).
        self.flat = len(leaves) == 1 and not isinstance(space, (spaces.Tuple, spaces.Dict))

    def arrays(self, batch: Any, count: int, contiguous: bool = False) -> list[np.ndarray] | None:
        """The leaves' arrays of a batch of ``count`` values, in leaf order.

        None unless every leaf's array has exactly its leaf's dtype and shape: nothing is cast,
        the values arrive as they left. ``contiguous``: each array C-contiguous (copied if it is
        not), as raw frames are.
        """
        arrays: list[Any] = [batch] if self.flat else []
        if not self.flat:
            _flatten(self.space, batch, arrays)
        for i, (array, leaf) in enumerate(zip(arrays, self.leaves)):
            if (
                type(array) is not np.ndarray
                or array.dtype != leaf.dtype
                or array.shape != (count, *leaf.shape)
            ):
                return None
            if contiguous and not array.flags.c_contiguous:
                arrays[i] = np.ascontiguousarray(array)
        return arrays

    def checked(self, frames: Sequence[Any], count: int, what: str) -> None:
        """Checks that ``frames`` (one per leaf) hold ``count`` values each.

        Raises:
            ProtocolError: If a frame has another length.
        """
        for frame, leaf in zip(frames, self.leaves):
            nbytes = memoryview(frame).nbytes
            if nbytes != count * leaf.size:
                raise ProtocolError(
                    f"a {what} frame of {nbytes} bytes where {count} values of "
                    f"{leaf.dtype.str} {list(leaf.shape)} take {count * leaf.size}"
                )

    def read(self, frames: Sequence[Any], count: int, what: str, copy: bool) -> Any:
        """The batch of ``count`` values in ``frames`` (one per leaf), each frame checked."""
        self.checked(frames, count, what)
        return self.batch(frames, count, copy)

    def batch(self, frames: Sequence[Any], count: int, copy: bool) -> Any:
        """The batch of ``count`` values in ``frames`` already :meth:`checked`."""
        arrays = []
        for frame, leaf in zip(frames, self.leaves):
            array = np.frombuffer(frame, leaf.dtype).reshape(count, *leaf.shape)
            arrays.append(array.copy() if copy else array)
        return self.nest(arrays)

    def nest(self, arrays: list[np.ndarray]) -> Any:
        """The batch made of its leaves' arrays (in leaf order)."""
        return arrays[0] if self.flat else _nest(self.space, iter(arrays))


def _bytes(value: Any) -> memoryview:
    """A flat view of the bytes of a C-contiguous buffer."""
    view = memoryview(value)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B") if view.nbytes else memoryview(bytearray())  # nothing, writable


class StepLayout:
    """The raw frames of one session's steps (see the module docstring).

    Use :meth:`of`: a layout exists only for spaces made of arrays.
    """

    def __init__(self, observations: _Side, actions: _Side, slab: Slab | None = None) -> None:
        self._obs = observations
        self._actions = actions
        #: Where the observations of a STEP_RAW reply are (None: in its frames).
        self.slab = slab
        self._obs_frames = 0 if slab is not None else len(observations.leaves)
        #: The bytes of one env's actions in a request's frames.
        self.action_bytes = sum(leaf.size for leaf in actions.leaves)
        #: ``action_arrays(actions, count)``: the leaves' C-contiguous arrays of ``count`` envs'
        #: actions, or None if they do not fit exactly (as :meth:`request_frames` has them; a
        #: slice of their rows is a request's frames). A partial: no Python call of its own.
        self.action_arrays = functools.partial(actions.arrays, contiguous=True)
        #: The bytes of one env's observation.
        self.obs_bytes = sum(leaf.size for leaf in observations.leaves)

    @classmethod
    def of(cls, observation_space: spaces.Space, action_space: spaces.Space) -> StepLayout | None:
        """The layout of these single (per-env) spaces, or None if either has none."""
        obs: list[Leaf] = []
        actions: list[Leaf] = []
        if not (_leaves(observation_space, obs) and _leaves(action_space, actions)):
            return None
        return cls(_Side(observation_space, obs), _Side(action_space, actions))

    @classmethod
    def shared_by(cls, envs: Sequence[Any]) -> StepLayout | None:
        """The layout of envs that all have the same spaces (None if they differ or have none).

        Args:
            envs: Objects with ``observation_space`` and ``action_space`` (a session's envs).
        """
        first = envs[0]
        if any(
            e.observation_space != first.observation_space or e.action_space != first.action_space
            for e in envs[1:]
        ):
            return None
        return cls.of(first.observation_space, first.action_space)

    def slab_for_host(self, name: str, count: int) -> StepLayout | None:
        """This layout with its observations in the client's slab ``name``, for ``count`` envs.

        None when the observations are too small to be worth one (:data:`SLAB_MIN_BYTES`) or
        the host cannot use the file (see :meth:`Slab.for_host`).

        Raises:
            ProtocolError: If ``name`` is not a slab's name.
        """
        check_name(name)
        if self.obs_bytes * count < SLAB_MIN_BYTES:
            return None
        slab = Slab.for_host(name, self._obs.leaves, count)
        return None if slab is None else StepLayout(self._obs, self._actions, slab)

    def slab_for_client(self, offer: SlabOffer, size: Any, count: int) -> StepLayout:
        """This layout with its observations in the slab the host sized to ``size`` bytes.

        Raises:
            ProtocolError: If the size is not this layout's for ``count`` envs.
        """
        return StepLayout(self._obs, self._actions, offer.accept(size, self._obs.leaves, count))

    def slab_batch(self) -> Any:
        """The slab's rows as an observation batch of all its envs (a host writes into it)."""
        return self._obs.nest(self.slab.arrays)

    def describe(self) -> dict[str, list[Any]]:
        """The MAKE reply's ``"step_layout"``."""
        return {
            "obs": [leaf.describe() for leaf in self._obs.leaves],
            "actions": [leaf.describe() for leaf in self._actions.leaves],
        }

    # ------------------------------------------------------------- the client's side

    def request_frames(
        self, actions: Any, count: int, env_ids: Sequence[int] | None
    ) -> list[Any] | None:
        """A request's frames after the envelope, or None if ``actions`` do not fit exactly.

        Args:
            actions: The batched actions of ``count`` envs.
            count: How many envs are stepped.
            env_ids: Which envs of the block, in the order of ``actions`` (None: all, and no
                env ids frame is sent).
        """
        frames = self.action_arrays(actions, count)
        if frames is None or env_ids is None:
            return frames
        return [np.asarray(env_ids, _INT32).tobytes(), *frames]

    def reply_views(
        self, observations: Any, rewards: np.ndarray, flags: np.ndarray
    ) -> list[memoryview] | None:
        """Byte views of a step's whole batches, for :meth:`write_reply` to write replies into.

        Args:
            observations: The observation batch.
            rewards: The rewards (float64, one per env).
            flags: The terminations (row 0) and truncations (row 1), bool.

        Returns:
            One view per observation leaf, then the rewards' and the flags'; None unless every
            array is C-contiguous with exactly the layout's dtype and shape.
        """
        count = len(rewards)
        arrays = self._obs.arrays(observations, count)
        if arrays is None or rewards.dtype != _FLOAT64 or flags.shape != (2, count):
            return None
        arrays += [rewards, flags]
        if flags.dtype != np.bool_ or not all(a.flags.c_contiguous for a in arrays):
            return None
        return [_bytes(a) for a in arrays]

    def _checked_reply(
        self, frames: Sequence[Any], count: int, allow_pickle: bool, writable: bool
    ) -> tuple[memoryview, list[Any]]:
        """Checks an OK reply's frames; returns its rewards and flags frame and info entries."""
        leaves = self._obs_frames
        if len(frames) < leaves + 1:
            raise ProtocolError(f"a STEP_RAW reply needs {leaves + 1} frames, got {len(frames)}")
        if leaves:
            self._obs.checked(frames[:leaves], count, "observation")
        columns = memoryview(frames[leaves])
        if columns.nbytes != 10 * count:
            raise ProtocolError(
                f"rewards and flags of {columns.nbytes} bytes for {count} envs (10 bytes per env)"
            )
        if columns[8 * count :].tobytes().translate(None, b"\0\1"):  # bytes left: not 0 or 1
            raise ProtocolError("a flag byte other than 0 or 1")
        infos: Any = []
        if len(frames) > leaves + 1:
            infos = codec.decode(frames[leaves + 1 :], allow_pickle=allow_pickle, writable=writable)
            if not isinstance(infos, list) or not infos:
                raise ProtocolError("STEP_RAW info entries must be a non-empty array")
        return columns, infos

    def read_reply(
        self,
        frames: Sequence[Any],
        count: int,
        *,
        allow_pickle: bool,
        writable: bool,
        env_ids: Sequence[int] | None = None,
    ) -> StepReply:
        """Decodes an OK reply's frames after the envelope (and before a said frame).

        Args:
            frames: The frames.
            count: How many envs were stepped.
            allow_pickle: Whether the info entries may hold pickled values.
            writable: False for read-only views of the frames (for a caller that copies).
            env_ids: The envs stepped, when not all of the block (their rows of a slab).

        Returns:
            The reply, read: its rewards and flags arrays of the envs stepped, checked.

        Raises:
            ProtocolError: If a frame is missing or does not fit the layout.
        """
        columns, infos = self._checked_reply(frames, count, allow_pickle, writable)
        if self.slab is None:
            obs = self._obs.batch(frames[: self._obs_frames], count, writable)  # checked above
        else:
            obs = self._obs.nest(self.slab.read(env_ids, count))
        rewards = np.frombuffer(columns, _FLOAT64, count)
        flags = np.frombuffer(columns, np.bool_, offset=8 * count)
        return StepReply(
            obs,
            rewards.copy() if writable else rewards,
            flags[:count].copy() if writable else flags[:count],
            flags[count:].copy() if writable else flags[count:],
            infos,
        )

    def write_reply(
        self,
        frames: Sequence[Any],
        into: Sequence[memoryview],
        at: int,
        count: int,
        *,
        allow_pickle: bool,
    ) -> list[Any]:
        """Checks an OK reply's frames and copies its values into a step's whole batches.

        Nothing is written unless every frame fits (a broken reply leaves the batches as they
        were). Copies of bytes, no arrays made: the cheapest way in per host and step.

        Args:
            frames: The frames after the envelope (no said frame).
            into: What :meth:`reply_views` returned.
            at: The row of the first env stepped.
            count: How many envs were stepped (rows ``at..at+count-1`` are written).
            allow_pickle: Whether the info entries may hold pickled values.

        Returns:
            The info entries (writable).

        Raises:
            ProtocolError: If a frame is missing or does not fit the layout.
        """
        # Flat bytes views of the frames, an empty one too (a zmq.Frame itself is not a safe
        # source of a slice copy, and memoryview.cast refuses a shape with a 0).
        buffers = []
        for frame in frames:  # (a loop: no Python call, as a comprehension is)
            buffers.append(memoryview(np.frombuffer(frame, np.uint8)))
        columns, infos = self._checked_reply(buffers, count, allow_pickle, True)
        leaves = self._obs.leaves
        sources = buffers if self.slab is None else self.slab.bytes
        for source, leaf, view in zip(sources, leaves, into):
            view[at * leaf.size : (at + count) * leaf.size] = source[: count * leaf.size]
        rewards, flags = into[len(leaves) :]
        rewards[8 * at : 8 * (at + count)] = columns[: 8 * count]
        second = len(flags) // 2 + at  # the truncations row's first byte to write
        flags[at : at + count] = columns[8 * count : 9 * count]
        flags[second : second + count] = columns[9 * count :]
        return infos

    # ------------------------------------------------------------- the host's side

    def read_request(self, frames: Sequence[Any], num_envs: int) -> tuple[Any, list[int] | None]:
        """The batched actions and env ids of a request's frames after the envelope.

        The actions are writable copies, as STEP's decoded actions are.

        Raises:
            ProtocolError: If the frames do not fit the layout.
        """
        leaves = len(self._actions.leaves)
        if len(frames) not in (leaves, leaves + 1):
            raise ProtocolError(
                f"a STEP_RAW request needs {leaves} frames, or {leaves + 1} with env ids; "
                f"got {len(frames)}"
            )
        if len(frames) == leaves:
            return self._actions.read(frames, num_envs, "action", True), None
        ids = memoryview(frames[0])
        if not ids.nbytes or ids.nbytes % 4:
            raise ProtocolError("STEP_RAW env ids must be one or more int32 values (4 bytes each)")
        env_ids = np.frombuffer(ids, _INT32).tolist()
        if not all(0 <= i < num_envs for i in env_ids) or len(set(env_ids)) != len(env_ids):
            raise ProtocolError(f"STEP_RAW env ids must be distinct indices below {num_envs}")
        count = len(env_ids)
        return self._actions.read(frames[1:], count, "action", True), env_ids

    def reply_frames(
        self,
        obs: Any,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        entries: list[Any],
        *,
        allow_pickle: bool,
        env_ids: Sequence[int] | None = None,
    ) -> list[Any]:
        """An OK reply's frames after the envelope (the observations written into the slab).

        Args:
            obs: The stepped envs' observations (batched).
            rewards: Their rewards.
            terminations: Their terminations.
            truncations: Their truncations.
            entries: Their info entries.
            allow_pickle: Whether the info entries may hold pickled values.
            env_ids: The envs stepped, when not all of the block (their rows of a slab).

        Raises:
            TypeError: If the observations do not fit the layout (a space the envs broke), or
                the info entries cannot be encoded.
        """
        count = len(rewards)
        frames: list[Any] | None = self._obs.arrays(obs, count, contiguous=True)
        if frames is None:
            raise TypeError("observations that do not fit the session's step layout")
        if self.slab is not None:
            self.slab.write(frames, env_ids)
            frames = []
        frames.append(
            b"".join(
                (
                    rewards.astype(_FLOAT64, copy=False).tobytes(),
                    terminations.tobytes(),
                    truncations.tobytes(),
                )
            )
        )
        if entries:
            frames += codec.encode(entries, allow_pickle=allow_pickle)
        return frames
