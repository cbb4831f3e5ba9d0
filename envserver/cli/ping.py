"""``envserver ping``: whether hosts answer, and what each says about itself.

Takes endpoints, ``dns://NAME:PORT`` specs (one host per address of NAME) and ``slurm://`` specs
(one per node of a Slurm job), as a trainer's host list does (without them, ``$ENVSERVER_HOSTS``,
and the CURVE key files from the environment as a trainer takes them); PINGs every host at once
(where nothing listens is an answer at once, unless ``--wait``), and prints one line per host that
answered (stdout) and one per host that did not, with why (stderr); ``--json`` prints one JSON
array instead. The exit status is 0 only when every host answered: a health check of a host, or
of a whole cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from envserver.cli.commands import Subcommand, add_curve_client_arguments
from envserver.cli.settings import positive_seconds
from envserver.curve.keys import load_curve_keys
from envserver.errors import EnvServerError
from envserver.launch.environment import HOSTS_VARIABLE, HostChoice
from envserver.launch.specs import spec_endpoints
from envserver.wire.endpoints import HostSpec, client_socket
from envserver.wire.messages import Command, Status, decode_reply, encode_request
from envserver.wire.reach import MONITORED_EVENTS, Reachability, wait_for_reply
from envserver.wire.replies import HostInfo

__all__ = ["Answer", "add_arguments", "command", "ping_all", "run"]

#: CURVE keys ``(server_public, client_public, client_secret)``.
Curve = tuple[bytes, bytes, bytes]


@dataclasses.dataclass
class Answer:
    """What one host said to a PING, or why it said nothing.

    Attributes:
        endpoint: The host's endpoint (or the ``dns://`` spec that did not resolve).
        info: The host info it answered with (see docs/protocol.md), or None.
        error: Why there is no answer, or None.
    """

    endpoint: str
    info: HostInfo | None = None
    error: str | None = None

    def line(self) -> str:
        """One line for a person: what the host said, or why it said nothing."""
        if self.info is None:
            return f"envserver ping: {self.endpoint}: {self.error}"
        info = self.info
        details = [
            f"pid {info.pid}",
            f"{info.sessions} session(s)",
            f"{info.envs} env(s)",
            f"lease {_duration(info.session_lease_s, plain=True)}",
            f"up {_duration(info.uptime_s)}",
            "CURVE" if info.curve else "no CURVE",
        ]
        return (
            f"{self.endpoint}: envserver {info.envserver} (protocol {info.protocol}), "
            f"{', '.join(details)}"
        )

    def as_json(self) -> dict[str, Any]:
        """The answer as a JSON object: the endpoint, ``ok``, and the info or the error."""
        if self.info is None:
            return {"endpoint": self.endpoint, "ok": False, "error": self.error}
        return {"endpoint": self.endpoint, "ok": True, **self.info.to_wire()}


def _duration(seconds: Any, plain: bool = False) -> str:
    """``"3h12m"`` (the two largest units), or ``"30 s"`` if ``plain``; ``"?"`` if not a number."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "?"
    if plain:
        return f"{seconds:g} s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{value}{unit}" for value, unit in parts if value][:2]
    return "".join(shown) or "0s"


def ping_one(
    context: zmq.Context, endpoint: str, curve: Curve | None, timeout_s: float, wait: bool = False
) -> Answer:
    """PINGs one host; the answer, or why there is none (as the client tells it apart).

    Nothing listening at the endpoint is an answer at once, unless ``wait`` (for a host still
    starting: up to ``timeout_s``).
    """
    socket = monitor = None
    try:
        socket = client_socket(context, endpoint, curve)
        monitor = socket.get_monitor_socket(MONITORED_EVENTS)
        socket.connect(endpoint)
        with contextlib.suppress(zmq.Again):  # no peer to queue for: the wait says why
            socket.send_multipart(
                encode_request(1, Command.PING, None, {}, allow_pickle=False), zmq.NOBLOCK
            )
        reach = Reachability(endpoint, uses_curve=curve is not None)
        if not wait_for_reply(socket, monitor, reach, timeout_s, refused_ends=not wait):
            if reach.refusal is not None:
                why = f"the host {reach.refusal}"  # the line names the endpoint first
                if curve is None:
                    why += "; pass --curve-server-key and --curve-client-key"
            elif reach.refused and not wait:  # told at once: nothing listens there
                why = reach.why_silent()
            else:
                why = f"no answer within {timeout_s:g} s: {reach.why_silent()}"
            return Answer(endpoint, error=why)
        reply = decode_reply(socket.recv_multipart(), allow_pickle=False)
        if reply.status != Status.OK:
            return Answer(endpoint, error=f"answered with an error: {reply.body}")
        return Answer(endpoint, info=HostInfo.from_wire(reply.body))
    except (zmq.ZMQError, EnvServerError, OSError, ValueError) as exc:
        return Answer(endpoint, error=str(exc))
    finally:
        if monitor is not None and socket is not None:
            socket.disable_monitor()
            monitor.close(linger=0)
        if socket is not None:
            socket.close(linger=0)


def _endpoints(specs: Sequence[str]) -> tuple[list[str], list[Answer]]:
    """The endpoints of the host list (its specs resolved), and the specs that failed."""
    endpoints: list[str] = []
    failed: list[Answer] = []
    for text in specs:
        try:
            endpoints += spec_endpoints(HostSpec.parse(text))
        except (OSError, ValueError) as exc:
            failed.append(Answer(text, error=str(exc)))
    return list(dict.fromkeys(endpoints)), failed


def ping_all(
    specs: Sequence[str], curve: Curve | None, timeout_s: float, wait: bool = False
) -> list[Answer]:
    """PINGs every host of the list at once (``dns://`` specs resolved); answers in list order.

    ``wait``: hosts where nothing listens yet are waited for, up to ``timeout_s``.
    """
    endpoints, failed = _endpoints(specs)
    answers: list[Answer | None] = [None] * len(endpoints)
    context = zmq.Context()
    try:

        def ask(index: int) -> None:
            answers[index] = ping_one(context, endpoints[index], curve, timeout_s, wait)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(endpoints))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        context.term()
    return [answer for answer in answers if answer is not None] + failed


def add_arguments(ping: argparse.ArgumentParser) -> None:
    """The ``ping`` command's arguments."""
    ping.add_argument(
        "hosts",
        nargs="*",
        metavar="HOST",
        help="endpoints (tcp://127.0.0.1:5555), dns://NAME:PORT specs (every address of NAME) "
        "and slurm://NODES:PORT specs (every node of a Slurm job: NODES is job, het-group-N or a "
        "node list; "
        f"default: ${HOSTS_VARIABLE})",
    )
    ping.add_argument(
        "--timeout",
        type=positive_seconds,
        default=5.0,
        help="seconds to wait for an answer (default: 5)",
    )
    ping.add_argument(
        "--wait",
        action="store_true",
        help="wait (up to --timeout) for hosts where nothing listens yet, such as hosts still "
        "starting; without it, a refused connection is an answer at once",
    )
    ping.add_argument("--json", action="store_true", help="print one JSON array of the answers")
    add_curve_client_arguments(ping)


def run(args: argparse.Namespace) -> int:
    """Runs ``envserver ping``: 0 if every host answered, else 1."""
    choice = HostChoice.of(
        args.hosts or None,
        curve_server_key=args.curve_server_key,
        curve_client_key=args.curve_client_key,
    )
    if choice.local:
        raise ValueError(
            f"name the hosts to ping (endpoints, dns:// or slurm:// specs) or set {HOSTS_VARIABLE}"
        )
    for text in choice.hosts:  # a malformed entry is a usage error, before any is pinged
        HostSpec.parse(text)
    curve = load_curve_keys(choice.curve_server_key, choice.curve_client_key)
    answers = ping_all(choice.hosts, curve, args.timeout, args.wait)
    if args.json:
        print(json.dumps([answer.as_json() for answer in answers], indent=2))
    for answer in answers:
        if answer.info is None:
            print(answer.line(), file=sys.stderr)
        elif not args.json:
            print(answer.line())
    return 0 if answers and all(answer.info is not None for answer in answers) else 1


command = Subcommand(
    "exit 0 if every host answers (health checks of a host or a cluster)", add_arguments, run
)
