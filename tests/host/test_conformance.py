"""The conformance suite as a user runs it: passes on a real host, fails on broken ones.

(`make test` also runs the suite itself, from envserver/conformance, against a local host.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from helpers import running_hosts

from envserver.host.loop import EnvHost, HostConfig

Mutation = Callable[[list[Any], list[Any]], list[Any] | None]


def run_suite(endpoint: str, *pytest_args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envserver.conformance", endpoint, "--timeout", "3", "--", "-q",
         "-p", "no:randomly", *pytest_args],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip


def test_a_real_host_over_tcp_conforms(tmp_path):
    with running_hosts(tmp_path, 1, bind="tcp://127.0.0.1:*") as hosts:
        result = run_suite(hosts[0].endpoint)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


def test_the_runner_reports_a_missing_endpoint_as_failures():
    result = run_suite("tcp://127.0.0.1:1", "-x", "-k", "ping_needs_no_session")
    assert result.returncode == 1
    assert "sent no reply within 3 s" in result.stdout


class BrokenHost(EnvHost):
    """A real host whose replies a mutation rewrites (or drops), to show the suite notices."""

    def __init__(self, mutation: Mutation) -> None:
        super().__init__(HostConfig(bind="tcp://127.0.0.1:*"))
        self.mutation = mutation

    def handle(self, frames: list[Any]) -> list[Any] | None:
        reply = super().handle(frames)
        return None if reply is None else self.mutation(frames, reply)


@pytest.fixture
def broken_host() -> Iterator[Callable[[Mutation], str]]:
    started: list[tuple[BrokenHost, threading.Thread]] = []

    def start(mutation: Mutation) -> str:
        host = BrokenHost(mutation)
        thread = threading.Thread(target=host.serve_forever, daemon=True)
        thread.start()
        started.append((host, thread))
        return host.endpoint

    yield start
    for host, thread in started:
        host.stop()
        thread.join(30)


def envelope_of(frames: list[Any]) -> list[Any]:
    return msgpack.unpackb(bytes(memoryview(frames[0])), raw=False)


def wrong_request_id(request: list[Any], reply: list[Any]) -> list[Any]:
    version, request_id, status, said = envelope_of(reply)
    bumped = None if request_id is None else request_id + 1
    return [msgpack.packb([version, bumped, status, said]), *reply[1:]]


def silent_on_unknown_commands(request: list[Any], reply: list[Any]) -> list[Any] | None:
    try:
        command = envelope_of(request)[2]
    except Exception:
        return reply
    return None if command == 99 else reply


def error_without_env_index(request: list[Any], reply: list[Any]) -> list[Any]:
    if envelope_of(reply)[2] != 1:
        return reply
    body = msgpack.unpackb(bytes(memoryview(reply[1])), raw=False)
    body.pop("env_index", None)
    return [reply[0], msgpack.packb(body), *reply[2:]]


def swapped_columns(request: list[Any], reply: list[Any]) -> list[Any]:
    if envelope_of(request)[2] != 4 or envelope_of(reply)[2] != 0:
        return reply
    body = msgpack.unpackb(bytes(memoryview(reply[1])), raw=False, strict_map_key=False)
    body["rewards"] = [int(r) for r in body["rewards"]]  # integers where float64s are due
    return [reply[0], msgpack.packb(body), *reply[2:]]


@pytest.mark.parametrize(
    ("mutation", "selection", "failing"),
    [
        (wrong_request_id, "reply_echoes_the_request_id", "test_reply_echoes_the_request_id"),
        (silent_on_unknown_commands, "unknown-command", "sent no reply"),
        (error_without_env_index, "requests_need_a_known_session", "env_index must be"),
        (swapped_columns, "test_step_reply_shape", "must hold floats"),
    ],
    ids=["wrong-request-id", "no-reply", "error-body", "integer-rewards"],
)
def test_the_suite_fails_a_broken_host(broken_host, mutation, selection, failing):
    result = run_suite(broken_host(mutation), "-k", selection)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "passed" not in result.stdout.splitlines()[-1], result.stdout[-2000:]
    assert failing in result.stdout, result.stdout[-3000:]
