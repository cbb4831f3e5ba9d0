"""What `envserver serve` logs names a session one way: its id in hex, as the client's errors do."""

from __future__ import annotations

import numpy as np
import zmq
from helpers import wait_for_text

from envserver.testing import start_host
from envserver.wire.messages import Command, Status, decode_reply, encode_request

TIMEOUT_MS = 30_000


def test_a_closed_session_is_named_in_hex_in_the_log_and_the_reply(tmp_path):
    host = start_host(tmp_path)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(host.endpoint)

    def ask(request_id, command, session, body):
        socket.send_multipart(
            encode_request(request_id, command, session, body, allow_pickle=False)
        )
        assert socket.poll(TIMEOUT_MS), "the host did not answer"
        return decode_reply(socket.recv_multipart(), allow_pickle=False)

    try:
        session = ask(1, Command.HELLO, None, {"client": "test"}).body["session"]
        made = ask(2, Command.MAKE, session, {"env_id": "CartPole-v1", "kwargs": {}, "num_envs": 1})
        assert made.status == Status.OK, made.body
        assert ask(3, Command.CLOSE, session, None).status == Status.OK
        gone = ask(4, Command.STEP, session, {"actions": np.zeros(1, dtype=np.int64)})
        assert gone.status == Status.ERROR and gone.body["type"] == "UnknownSessionError"
        assert gone.body["message"].startswith(f"this host holds no session {session.hex()}: ")
        nameless = ask(5, Command.STEP, None, {"actions": np.zeros(1, dtype=np.int64)})
        assert "holds no session (the request names none)" in nameless.body["message"]
        wait_for_text(host.log_text, f"no session {session.hex()}")
    finally:
        socket.close()
        context.term()
        host.stop()
    log = host.log_text()
    for said in ("opened by test", "made 1 env", "closed"):
        assert f"session {session.hex()} {said}" in log, log
    assert f"no session {session.hex()}: " in log
    assert "b'" not in log and 'b"' not in log, log  # no id as raw bytes
