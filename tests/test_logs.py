"""What a host logs: one line per session opened and closed and per env error (with session, env
index and exception type), nothing per step at INFO; --log-format json gives one JSON object per
line, the startup lines included."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envserver import client
from envserver.testing import start_host


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
