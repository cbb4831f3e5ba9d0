"""An env no hook or adapter covers, re-created by running its reset again, then its actions.

A Gymnasium env draws its randomness from its generator (``np_random``), and its reset makes
its episode anew from that generator, the reset's seed and its options. So the state of such
an env is how its episode began and the actions since: its generator's state right before the
reset (``np_random.bit_generator.state``, plain data: a snapshot's ``rng``), the seed and the
options of the reset, and the actions. The env layer itself holds nothing more
(:attr:`~envserver.state.mechanism.Exact.BEFORE_RESET`): a snapshot of its stack is taken
from the record of its episode (:class:`~envserver.state.snapshot.Episode`), which takes the
stack's state before every reset (the wrappers' as well, with what they keep across episodes)
and notes the reset and the actions.

A restore puts the wrappers' states and the generator's, resets the stack with the seed and
the options, checks the observation and the info the reset gives, steps the actions and checks
the observation the last one gives, exactly: where they differ, the restore is refused
(:class:`~envserver.errors.StateMismatchError`). So an env whose reset or steps draw on more
than its generator (Python's ``random``, the time, a simulator's own generator) is refused at
its restore, never restored wrong. What the checks cannot see is state the env keeps across its
episodes and shows in neither its observations nor its reset's info (a count of its resets that
only its step infos carry): such an env needs ``get_state``/``set_state`` hooks.

It covers the env of the stack (never a wrapper: a wrapper keeps what it keeps across episodes,
which its own reset does not re-create), after the hooks, the handlers and the adapters, and
after pickle where pickle is allowed and the env is not an ``EzPickle`` (see
:mod:`~envserver.state.pickled`). Box2D's envs (LunarLander, BipedalWalker, CarRacing) are
covered by it: no state API, and ``EzPickle``.
"""

from __future__ import annotations

from envserver.state.mechanism import Exact, Mechanism, ignore, nothing

__all__ = ["MECHANISM"]

#: The mechanism of the env of a stack (its unwrapped layer) nothing else covers: its state is
#: its generator's, which a snapshot holds beside its layers' (``Snapshot.rng``).
MECHANISM = Mechanism("reset replayed", nothing, ignore, exact=Exact.BEFORE_RESET)
