"""Conformance: what the envs say travels with the replies of the sessions that ask for it.

CartPole-v1 warns when rendered without a render mode (Gymnasium's ``logger.warn``, a
``UserWarning``): RENDER makes each env say something, a warning the host must send once.
"""

from __future__ import annotations

from envserver.conformance.conftest import ENV_ID, Session
from envserver.conformance.wire import Wire
from envserver.wire.messages import Command


def hearing_session(wire: Wire, said: bool) -> Session:
    """A session whose HELLO asks (or not) for what the envs say, holding two CartPole envs."""
    body = wire.request(Command.HELLO, {"client": "conformance", "said": said}).ok()
    session = Session(wire, body["session"])
    session.request(Command.MAKE, {"env_id": ENV_ID, "kwargs": None, "num_envs": 2}).ok()
    session.request(Command.RESET, {"seeds": [0, 1]}).ok()
    return session


def test_a_session_that_asks_hears_each_warning_once(wire: Wire) -> None:
    """A warning raised by both envs comes once, with both envs and its count; not again."""
    session = hearing_session(wire, said=True)
    try:
        reply = session.request(Command.RENDER, {})
        assert reply.ok() == [None, None]
        assert reply.said is not None, "a RENDER without a render mode warns: said must be 1"
        (warning,) = [w for w in reply.said["warnings"] if "render" in w["message"]]
        assert warning["category"] == "builtins.UserWarning"
        assert warning["envs"] == [0, 1] and warning["count"] == 2
        assert warning["filename"].endswith(".py") and warning["lineno"] > 0
        again = session.request(Command.RENDER, {})
        assert again.said is None or not again.said["warnings"], "each warning once per session"
    finally:
        session.request(Command.CLOSE)


def test_a_session_that_does_not_ask_hears_nothing(wire: Wire) -> None:
    """Without ``"said": true`` in HELLO, no reply carries a said frame."""
    session = hearing_session(wire, said=False)
    try:
        reply = session.request(Command.RENDER, {})
        assert reply.ok() == [None, None] and reply.said is None
    finally:
        session.request(Command.CLOSE)
