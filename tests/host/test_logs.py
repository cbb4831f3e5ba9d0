"""What a host logs: one line per session opened and closed and per env error (with session, env
index and exception type), nothing per step at INFO; --log-format json gives one JSON object per
line, the startup lines included."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zmq

from envserver import client
from envserver.testing import start_host
from envserver.wire.messages import Command, decode_reply, encode_request


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_json_logs_of_sessions_and_env_errors_and_none_per_step(tmp_path):
    host = start_host(tmp_path, "--log-format", "json", bind="tcp://127.0.0.1:*")
    try:
        envs = client.make_vec(
            "envserver.testing:envserver/Failing-v0",
            num_envs=2,
            hosts=[host.endpoint],
            step_error_at=40,
        )
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        lines_before = len(host.log_text().splitlines())
        for _ in range(30):
            envs.step(np.zeros(2, dtype=np.int64))
        assert len(host.log_text().splitlines()) == lines_before  # nothing per step
        for _ in range(12):
            try:
                envs.step(np.zeros(2, dtype=np.int64))
            except ValueError:
                break
        else:
            pytest.fail("the env never raised")
        envs.close()
    finally:
        host.stop()
    logged = records(host.log_text())  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in logged)
    assert any("serving on" in r["message"] for r in logged)
    opened = [r for r in logged if r["message"].endswith(f"opened by {r.get('client')}")]
    (session,) = {r["session"] for r in opened}
    closed = [r for r in logged if r.get("session") == session and "closed" in r["message"]]
    assert len(opened) == 1 and len(closed) == 1
    (error,) = [r for r in logged if "exception" in r]
    assert error["session"] == session and error["level"] == "INFO"
    assert error["env_index"] == 0 and error["exception"] == "ValueError"


def test_plain_logs_name_the_session_env_and_exception(tmp_path):
    host = start_host(tmp_path, bind="tcp://127.0.0.1:*")
    try:
        envs = client.make_vec(
            "envserver.testing:envserver/Failing-v0",
            num_envs=1,
            hosts=[host.endpoint],
            reset_error_at=1,
            error="custom",
        )
        with pytest.raises(client.RemoteEnvError):
            envs.reset(seed=0)
        envs.close()
    finally:
        host.stop()
    text = host.log_text()
    assert " env 0 raised SimulatorCrash: simulated failure in reset" in text
    assert text.count("opened by RemoteVectorEnv") == 1 and " closed" in text


def test_a_flood_of_failing_requests_logs_a_line_a_second_per_kind(tmp_path):
    """A client (hostile or broken) sending thousands of refused HELLOs cannot fill the log: a
    line per kind of failure a second, the next one saying how many it left out."""
    host = start_host(tmp_path, "--max-sessions", "1", bind="tcp://127.0.0.1:*")
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(host.endpoint)

    def hello(request_id: int) -> dict:
        socket.send_multipart(
            encode_request(request_id, Command.HELLO, None, {}, allow_pickle=False)
        )
        assert socket.poll(30_000), "no reply"
        return decode_reply(socket.recv_multipart(), allow_pickle=False).body

    try:
        assert "session" in hello(1)
        for request_id in range(2, 2002):
            assert hello(request_id)["type"] == "LimitError"
        request_id, deadline = 2002, time.monotonic() + 30
        while "more like it" not in host.log_text():  # the next line, a second later
            assert time.monotonic() < deadline, host.log_text()[-2000:]
            hello(request_id)
            request_id += 1
            time.sleep(0.05)  # a slow trickle: the condition is polled, not waited for
        refused = [line for line in host.log_text().splitlines() if "LimitError" in line]
        assert 2 <= len(refused) < 40, refused
    finally:
        socket.close()
        context.term()
        host.stop()
