"""SIGINT and SIGTERM as an exception, for commands that stop cleanly and report what they did.

Inside :func:`signals_interrupt`, both signals raise :class:`Interrupted` in the main thread
(a ``KeyboardInterrupt``, so ``except Exception`` blocks let it through and ``finally`` blocks
run): a command catches it, closes what it opened, prints one line and its partial results, and
exits with the shell's status for the signal (130 for SIGINT, 143 for SIGTERM). It closes its
vector envs within :func:`closing_mid_call`: a call the signal interrupted is still pending.
"""

from __future__ import annotations

import contextlib
import signal
import warnings
from collections.abc import Iterator, Sequence

__all__ = ["Interrupted", "Interrupts", "closing_mid_call", "exit_status", "signals_interrupt"]

#: The signals :func:`signals_interrupt` turns into :class:`Interrupted`.
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal asked the command to stop.

    Args:
        signum: The signal's number.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        super().__init__(self.signal_name)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's exit status for a process ended by the signal behind ``interrupt``.

    A plain ``KeyboardInterrupt`` (Python's own SIGINT handler) counts as SIGINT: 130.
    """
    signum = interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT
    return 128 + int(signum)


class Interrupts:
    """The signal :func:`signals_interrupt` received, for a command's loop to check.

    The handler's exception can be lost: pyzmq frees messages in ``__dealloc__``, where an
    exception is printed ("Exception ignored in") and dropped. A loop that calls :meth:`check`
    at each turn stops there all the same.

    Attributes:
        received: The last signal received inside the block, or None.
    """

    def __init__(self) -> None:
        self.received: int | None = None

    def check(self) -> None:
        """Raises :class:`Interrupted` if a signal was received (its exception was lost).

        Raises:
            Interrupted: For the signal received.
        """
        if self.received is not None:
            raise Interrupted(self.received)


@contextlib.contextmanager
def signals_interrupt(signums: Sequence[int] = INTERRUPT_SIGNALS) -> Iterator[Interrupts]:
    """Within the block, the given signals raise :class:`Interrupted` (main thread only).

    The previous handlers come back when the block ends.

    Yields:
        What was received, for loops that check it (see :class:`Interrupts`).
    """
    interrupts = Interrupts()

    def _raise(signum: int, _frame: object) -> None:
        interrupts.received = signum
        raise Interrupted(signum)

    previous = {signum: signal.signal(signum, _raise) for signum in signums}
    try:
        yield interrupts
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


#: Gymnasium's warning (AsyncVectorEnv's, and RemoteVectorEnv's, which says the same) for a vector
#: env closed while a call is pending; ``gymnasium.logger.warn`` colours it, so it may not start it.
PENDING_CALL_WARNING = r".*Calling `close` while waiting for a pending call"


@contextlib.contextmanager
def closing_mid_call() -> Iterator[None]:
    """Within the block, closing a vector env whose call is pending does not warn.

    A command that a signal stopped closes its vector envs knowingly: the warning, meant for code
    that closes one by mistake, would tell its user nothing. The close itself is the same (a
    RemoteVectorEnv waits a bounded time for the call to finish first).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PENDING_CALL_WARNING)
        yield
