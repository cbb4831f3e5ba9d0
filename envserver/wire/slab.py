"""Observation slabs: STEP_RAW observations in shared memory, for hosts on the client's machine.

A client that knows its host shares its machine (the embedded local hosts) makes an empty file
in the shared-memory directory and names it in MAKE (``"obs_slab"``). If the session's
observations step raw and their batch is large (:data:`SLAB_MIN_BYTES`), the host sizes the
file, maps it, removes its name and says the size in the MAKE reply; both sides then map the
same pages, and a STEP_RAW reply carries no observation frames: the host has written each
stepped env's observation into its rows of the slab before replying. The name exists only from
the client's MAKE to the host's answer (and is removed by both), so a slab leaves nothing in
``/dev/shm`` when either side is killed: its memory goes with the last process that maps it.

The slab's layout: one area per observation leaf, in leaf order, each starting at a multiple of
:data:`ALIGN` bytes and holding the block's ``k`` rows of that leaf (row ``i``: env ``i``).
``docs/protocol.md`` (STEP_RAW, Observations in shared memory) is the normative text.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import secrets
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from envserver.errors import ProtocolError

if TYPE_CHECKING:
    from envserver.wire.raw import Leaf

__all__ = [
    "ALIGN",
    "SLAB_DIRECTORY",
    "SLAB_MIN_BYTES",
    "Slab",
    "SlabOffer",
    "aligned",
    "check_name",
    "new_name",
    "slab_areas",
    "sweep_orphans",
]

logger = logging.getLogger(__name__)

#: Where slabs are made: Linux's shared-memory file system (elsewhere there are no slabs).
SLAB_DIRECTORY = "/dev/shm"
#: The smallest observation batch (all leaves, all of a session's envs) a host puts in a slab:
#: below it, frames cost about as little, and the session keeps no mapping.
SLAB_MIN_BYTES = 64 * 1024
#: Every leaf's area starts at a multiple of this many bytes (a cache line).
ALIGN = 64
#: The kinds of file a client makes in :data:`SLAB_DIRECTORY`, and the MAKE key that names
#: each: a slab, and a channel (:mod:`envserver.wire.channel`, whose pipes add ``-up`` and
#: ``-down`` to its name). A name: ``envserver-<kind>-<pid of its maker>-<16 hex digits>``.
_KEYS = {"slab": "obs_slab", "chan": "channel"}
_NAMES = {kind: re.compile(rf"envserver-{kind}-[0-9]{{1,10}}-[0-9a-f]{{16}}") for kind in _KEYS}
#: Any name a client makes there (what :func:`sweep_orphans` removes once its maker is gone).
_MADE = re.compile(r"envserver-(?:slab|chan)-([0-9]{1,10})-[0-9a-f]{16}(?:-up|-down)?")


def new_name(kind: str) -> str:
    """A new name of this process for a file of ``kind`` (``"slab"`` or ``"chan"``)."""
    return f"envserver-{kind}-{os.getpid()}-{secrets.token_hex(8)}"


def check_name(name: Any, kind: str = "slab") -> str:
    """``name`` if it is a name of ``kind`` (``"slab"`` or ``"chan"``; no directory, nothing else).

    Raises:
        ProtocolError: If it is not.
    """
    if not isinstance(name, str) or _NAMES[kind].fullmatch(name) is None:
        raise ProtocolError(
            f"{_KEYS[kind]} must be a file name envserver-{kind}-<pid>-<16 hex digits> in "
            f"{SLAB_DIRECTORY}"
        )
    return name


def aligned(size: int) -> int:
    """``size`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-size // ALIGN) * ALIGN


def slab_areas(leaves: Sequence[Leaf], count: int) -> tuple[list[int], int]:
    """Where each leaf's area starts, and the slab's size in bytes.

    Args:
        leaves: The observation leaves, in leaf order.
        count: The session's envs.
    """
    offsets, end = [], 0
    for leaf in leaves:
        start = aligned(end)
        offsets.append(start)
        end = start + leaf.size * count
    return offsets, end


class Slab:
    """One mapped slab: each observation leaf's rows, as an array over the shared pages.

    Args:
        mapping: The mapped file (exactly :func:`slab_areas`'s size); unmapped once the slab and
            every view of it are dropped.
        leaves: The observation leaves, in leaf order.
        count: The session's envs.
    """

    def __init__(self, mapping: mmap.mmap, leaves: Sequence[Leaf], count: int) -> None:
        offsets, self.size = slab_areas(leaves, count)
        whole = memoryview(mapping)
        #: Each leaf's rows as flat bytes, for copies with no array made.
        self.bytes = [
            whole[offset : offset + leaf.size * count] for offset, leaf in zip(offsets, leaves)
        ]
        #: Each leaf's ``count`` rows (read-only where the mapping is).
        self.arrays = [
            np.frombuffer(area, leaf.dtype).reshape(count, *leaf.shape)
            for area, leaf in zip(self.bytes, leaves)
        ]

    def write(self, arrays: Sequence[np.ndarray], env_ids: Sequence[int] | None) -> None:
        """Writes stepped envs' observations (one array per leaf) into their rows.

        Args:
            arrays: Each leaf's batch, in ``env_ids`` order.
            env_ids: The envs' indices in the block (None: all, in order).
        """
        for rows, values in zip(self.arrays, arrays):
            if values is rows:  # written in place (``StepLayout.slab_batch``)
                continue
            if env_ids is None:
                rows[...] = values
            else:
                rows[np.asarray(env_ids)] = values

    def read(self, env_ids: Sequence[int] | None, count: int) -> list[np.ndarray]:
        """Copies of the rows of ``env_ids`` (None: the first ``count``), one array per leaf."""
        if env_ids is None:
            return [rows[:count].copy() for rows in self.arrays]
        index = np.asarray(env_ids)
        return [rows[index] for rows in self.arrays]

    @classmethod
    def for_host(cls, name: str, leaves: Sequence[Leaf], count: int) -> Slab | None:
        """Opens, sizes and maps the client's slab ``name``, then removes its name.

        Returns:
            The slab, or None if there is no such file the host may use: not found (the client
            is on another machine), not a regular file of the host's user, or not empty.
        """
        path = os.path.join(SLAB_DIRECTORY, check_name(name))
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            logger.info("no observation slab %s: %s", name, exc)
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size:
                logger.warning("observation slab %s refused: not an empty file of ours", name)
                return None
            size = slab_areas(leaves, count)[1]
            os.ftruncate(fd, size)
            slab = cls(mmap.mmap(fd, size), leaves, count)
            with contextlib.suppress(FileNotFoundError):  # the client may have been quicker
                os.unlink(path)
            return slab
        except OSError as exc:  # no room in /dev/shm: frames instead
            logger.warning("observation slab %s not made: %s", name, exc)
            return None
        finally:
            os.close(fd)


class SlabOffer:
    """The client's side before MAKE: an empty file offered to the host as a slab.

    Use :meth:`make`; then :meth:`accept` (the host sized it) or :meth:`withdraw`.
    """

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self._fd: int | None = fd

    @classmethod
    def make(cls) -> SlabOffer | None:
        """A new empty slab file, or None where there is no shared-memory directory."""
        if not os.path.isdir(SLAB_DIRECTORY):
            return None
        name = new_name("slab")
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(os.path.join(SLAB_DIRECTORY, name), flags, 0o600)
        except OSError as exc:
            logger.info("no observation slab: %s", exc)
            return None
        return cls(name, fd)

    def accept(self, size: Any, leaves: Sequence[Leaf], count: int) -> Slab:
        """Maps the slab the host sized to ``size`` bytes (read-only), and withdraws the name.

        Raises:
            ProtocolError: If ``size`` is not the layout's, or the file does not have it.
        """
        try:
            expected = slab_areas(leaves, count)[1]
            if type(size) is not int or size != expected:
                raise ProtocolError(f"an observation slab of {size!r} bytes; the layout needs "
                                    f"{expected}")  # fmt: skip
            if os.fstat(self._fd).st_size != size:
                raise ProtocolError("the observation slab does not have the size the host said")
            return Slab(mmap.mmap(self._fd, size, prot=mmap.PROT_READ), leaves, count)
        finally:
            self.withdraw()

    def withdraw(self) -> None:
        """Removes the name (if the host has not) and closes the file; a mapping stays."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SLAB_DIRECTORY, self.name))
        os.close(self._fd)
        self._fd = None


def sweep_orphans() -> int:
    """Removes the names of slabs and channels left by clients that no longer run.

    A client killed between making them and MAKE's answer leaves them.

    Returns:
        How many were removed.
    """
    try:
        names = os.listdir(SLAB_DIRECTORY)
    except OSError:
        return 0
    removed = 0
    for name in names:
        match = _MADE.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SLAB_DIRECTORY, name))
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True
