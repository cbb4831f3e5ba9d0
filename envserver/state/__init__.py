"""Env state: a whole env stack's state taken as plain data, and restored into another stack.

A snapshot holds, for each layer of an env stack (every wrapper, outermost first, then the env
itself), the state that layer keeps, taken by the first mechanism that covers it:

1. ``get_state()`` / ``set_state(state)`` hooks on the layer (plain data in, plain data out);
2. built-in handlers for Gymnasium's own stateful wrappers (:mod:`~envserver.state.wrappers`);
3. adapters for simulators (:mod:`~envserver.state.simulators`: classic control, MuJoCo, ALE);
4. where the caller allows pickle (a host started with ``--allow-pickle``), the layer's
   attributes pickled (:mod:`~envserver.state.pickled`; never an ``EzPickle`` layer);
5. for the env itself (not a wrapper), the replay of its reset
   (:mod:`~envserver.state.replayed`): its generator's state before its episode's reset, the
   reset's seed and options, and the actions since.

A stack a layer of which is exact only at an episode's start (ALE with sticky actions: right
after its reset; an env whose reset is replayed: right before it) has its snapshots taken from
an :class:`~envserver.state.snapshot.Episode` record: the state at the episode's start, and the
reset (where the state is of the moment before it) and the actions since, run again on restore
and checked.

It also holds the env's random generator (``unwrapped.np_random``'s bit generator state) and a
fingerprint (the env and its arguments, package versions, the machine's architecture): a restore
whose fingerprint or layers differ is refused, as is a replay that goes another way, and a stack
a wrapper of which no mechanism covers (:class:`~envserver.errors.UnsupportedStateError`): never
approximated. A restore gives each layer its state by the mechanism that took it, on any host
that has it: a replay taken where pickle is not allowed restores where it is too; a pickle
restores only where pickle is allowed. Snapshots travel as bytes
(:mod:`~envserver.state.snapshot`): msgpack and raw arrays through the wire layer's codec; a
pickle only inside the state of a layer the fourth mechanism took, read only where pickle is
allowed.

The layer imports :mod:`envserver.errors` and :mod:`envserver.wire`; the host uses it.
"""

from envserver.state.snapshot import (
    Episode,
    Fingerprint,
    Replay,
    Reset,
    Snapshot,
    capture,
    check,
    restore,
)

__all__ = ["Episode", "Fingerprint", "Replay", "Reset", "Snapshot", "capture", "check", "restore"]
