"""One way to start a host process (envserver.launch.spawn): the embedded hosts and the tests' hosts
both go through it."""

from __future__ import annotations

import os
import signal
import sys
import time

from envserver.launch.spawn import serve_command, spawn_host

DEADLINE_S = 60.0


def test_serve_command_spells_every_option():
    command = serve_command(
        "ipc:///tmp/x.sock",
        allow_pickle=True,
        parent_pid=7,
        log_level="DEBUG",
        orphan_cleanup=("/tmp/x.log", "/tmp/x.sock"),
        channel_spin_s=0.0001,
        extra=("--env", "CartPole-*"),
        prefix=("nice",),
    )
    assert command == [
        "nice", sys.executable, "-m", "envserver", "serve", "--bind", "ipc:///tmp/x.sock",
        "--allow-pickle", "--parent-pid", "7", "--log-level", "DEBUG",
        "--orphan-cleanup", "/tmp/x.log", "--orphan-cleanup", "/tmp/x.sock",
        "--channel-spin", "0.0001", "--env", "CartPole-*",
    ]  # fmt: skip
    assert serve_command("tcp://127.0.0.1:*") == [
        sys.executable, "-m", "envserver", "serve", "--bind", "tcp://127.0.0.1:*",
    ]  # fmt: skip


def test_a_spawned_host_serves_in_its_own_session_and_logs_to_its_file(tmp_path):
    log = tmp_path / "host.log"
    log.write_text("earlier run\n")
    process = spawn_host(serve_command(f"ipc://{tmp_path}/h.sock"), log, own_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while "serving on" not in log.read_text():
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.05)
        assert os.getsid(process.pid) == process.pid != os.getsid(0)
        assert log.read_text().startswith("earlier run\n")  # appended, as a respawn does
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE_S) == 0
