"""``envserver serve``'s stop signals: SIGTERM stops a host gracefully (with ``--drain-grace``
it drains first: tests/client/test_drain.py), SIGINT (Ctrl-C) at once, both cleanly. Under
``--processes``, tests/cli/test_serve_processes.py.
"""

from __future__ import annotations

import re
import signal

from helpers import wait_for

from envserver import client
from envserver.testing import start_host


def test_sigint_stops_a_draining_host_at_once_and_cleanly(tmp_path) -> None:
    host = start_host(tmp_path, "--drain-grace", "60")
    envs = client.make_vec("CartPole-v1", num_envs=2, vector_kwargs={"hosts": [host.endpoint]})
    try:
        envs.reset(seed=0)
        host.process.send_signal(signal.SIGTERM)
        wait_for(lambda: "draining: 1 session(s) holding 2 env(s)" in host.log_text(), "a drain")
        host.process.send_signal(signal.SIGINT)  # the session is still open: no drain to end
        wait_for(lambda: host.process.poll() is not None, "SIGINT stopped it", 20)
        assert host.process.returncode == 0
        log = host.log_text()
        assert re.search(r"session \w+ closed", log)  # its envs closed
        assert "received SIGTERM, SIGINT; shut down" in log
        assert "Traceback" not in log and "KeyboardInterrupt" not in log
    finally:
        envs.close()
        host.stop()
