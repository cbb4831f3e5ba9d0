"""The hostile client of ``tests/harness/load.py``: a ZeroMQ peer written by hand (ZMTP 3.0), so
that it can stall anywhere in a handshake or a message, and the attacks it runs on a host.

Run as ``python tests/harness/load.py attacker ...`` (a process of its own); see
``tests/harness/load.py``.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq
from load import CHECK_INTERVAL_S, PING_BOUND_S, dealer_socket, touch, wait_for, write_json

from envserver.wire.messages import Command, Status, decode_reply, encode_request

# ---------------------------------------------------------------- a ZeroMQ peer by hand (ZMTP 3.0)

#: The greeting of a ZMTP 3.0 peer with the NULL mechanism (no CURVE), as a client.
ZMTP_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04


def zmtp_frame_header(size: int, *, more: bool = False, command: bool = False) -> bytes:
    """The flags and size of a ZMTP frame of ``size`` bytes."""
    flags = (_MORE if more else 0) | (_COMMAND if command else 0)
    if size < 256:
        return bytes([flags, size])
    return bytes([flags | _LONG]) + size.to_bytes(8, "big")


def zmtp_frame(data: bytes, *, more: bool = False, command: bool = False) -> bytes:
    """A whole ZMTP frame."""
    return zmtp_frame_header(len(data), more=more, command=command) + data


#: The READY command of a DEALER.
ZMTP_READY = zmtp_frame(
    b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER", command=True
)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the host closed the connection")
        data += chunk
    return data


def zmtp_read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One frame: its flags and its data."""
    flags = _recv_exact(sock, 1)[0]
    size_bytes = _recv_exact(sock, 8 if flags & _LONG else 1)
    return flags, _recv_exact(sock, int.from_bytes(size_bytes, "big"))


def zmtp_connect(address: tuple[str, int], timeout_s: float = PING_BOUND_S) -> socket.socket:
    """A TCP connection that has done the whole ZMTP handshake as a DEALER."""
    sock = socket.create_connection(address, timeout_s)
    try:
        sock.sendall(ZMTP_GREETING)
        _recv_exact(sock, len(ZMTP_GREETING))
        sock.sendall(ZMTP_READY)
        while True:
            flags, data = zmtp_read_frame(sock)
            if flags & _COMMAND and data.startswith(b"\x05READY"):
                return sock
    except BaseException:
        sock.close()
        raise


def zmtp_request(sock: socket.socket, frames: Sequence[bytes]) -> list[bytes]:
    """Sends a message and reads the reply (ZMTP commands, the host's heartbeats, skipped)."""
    sock.sendall(b"".join(zmtp_frame(f, more=i < len(frames) - 1) for i, f in enumerate(frames)))
    reply: list[bytes] = []
    while True:
        flags, data = zmtp_read_frame(sock)
        if flags & _COMMAND:
            continue
        reply.append(data)
        if not flags & _MORE:
            return reply


# ---------------------------------------------------------------- attacker


class Attack:
    """A hostile client without CURVE, on loopback; every kind of abuse runs on its own thread.

    Args:
        endpoint: The host's ``tcp://127.0.0.1:PORT``.
        max_message_bytes: The host's ``--max-message-bytes``.
        counts: How many connections of each held kind, and flooding sockets.
    """

    HELD_KINDS = ("silent", "half-signature", "half-greeting", "partial-multipart", "partial-frame")

    def __init__(self, endpoint: str, max_message_bytes: int, counts: dict[str, int]) -> None:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.address = (host, int(port))
        self.endpoint = endpoint
        self.max_message_bytes = max_message_bytes
        self.counts = counts
        self.stop = threading.Event()
        self.lock = threading.Lock()
        #: What happened, for the report (JSON-ready).
        self.stats: dict[str, Any] = {
            "opened": Counter(), "closed_by_host": Counter(), "lifetimes_s": {},
            "open_failures": Counter(), "oversized_frames_sent": 0, "oversized_dropped": 0,
            "oversized_kept": 0, "oversized_dealer_sent": 0, "oversized_dealer_replies": 0,
            "over_total_sent": 0, "over_total_replies": Counter(), "hello_sent": 0,
            "hello_replies": Counter(), "hello_refusal": None, "errors": [],
        }  # fmt: skip
        self.started = {name: threading.Event() for name in ("held", "oversized", "flood")}

    def count(self, key: str, item: str | None = None, by: int = 1) -> None:
        with self.lock:
            if item is None:
                self.stats[key] += by
            else:
                self.stats[key][item] += by

    def check_raw_zmtp(self) -> None:
        """A whole PING over the hand-made ZMTP peer: its handshake and framing are right."""
        with zmtp_connect(self.address) as sock:
            reply = zmtp_request(
                sock, encode_request(1, Command.PING, None, {}, allow_pickle=False)
            )
        if decode_reply(reply, allow_pickle=False).status != Status.OK:
            raise RuntimeError(f"the hand-made ZMTP peer's PING failed: {reply}")

    # -- held connections: never send, stall in the handshake, stall inside a message

    def open_held(self, kind: str) -> socket.socket:
        """A connection that stalls in one of the ways of ``HELD_KINDS``."""
        if kind in ("partial-multipart", "partial-frame"):
            sock = zmtp_connect(self.address)
            envelope = encode_request(1, Command.PING, None, {}, allow_pickle=False)[0]
            if kind == "partial-multipart":  # the envelope of a request, then nothing
                sock.sendall(zmtp_frame(envelope, more=True))
            else:  # a frame just under the bound, announced in full and half sent
                size = self.max_message_bytes - 1
                sock.sendall(zmtp_frame_header(size) + bytes(size // 2))
        else:
            sock = socket.create_connection(self.address, PING_BOUND_S)
            if kind == "half-signature":
                sock.sendall(ZMTP_GREETING[:10])
            elif kind == "half-greeting":
                sock.sendall(ZMTP_GREETING)
        sock.setblocking(False)
        self.count("opened", kind)
        return sock

    def hold(self) -> None:
        """Keeps ``counts[kind]`` connections of each held kind open, reopening those the host
        closes (and recording how long each lasted)."""
        selector = selectors.DefaultSelector()
        opened_at: dict[socket.socket, tuple[str, float]] = {}

        def open_one(kind: str) -> None:
            try:
                sock = self.open_held(kind)
            except OSError as exc:
                self.count("open_failures", f"{kind}: {type(exc).__name__}")
                return
            opened_at[sock] = (kind, time.monotonic())
            selector.register(sock, selectors.EVENT_READ)

        for kind in self.HELD_KINDS:
            for _ in range(self.counts.get(kind, 0)):
                open_one(kind)
        self.started["held"].set()
        while not self.stop.is_set():
            for key, _ in selector.select(CHECK_INTERVAL_S):
                sock = key.fileobj
                try:
                    if sock.recv(65536):  # the host's greeting, READY, heartbeats
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                kind, since = opened_at.pop(sock)
                selector.unregister(sock)
                sock.close()
                self.count("closed_by_host", kind)
                with self.lock:
                    self.stats["lifetimes_s"].setdefault(kind, []).append(time.monotonic() - since)
                open_one(kind)
            held = Counter(kind for kind, _ in opened_at.values())
            for kind in self.HELD_KINDS:  # those that failed to open: try again
                for _ in range(self.counts.get(kind, 0) - held[kind]):
                    open_one(kind)
        for sock in opened_at:
            sock.close()
        selector.close()

    # -- messages over the bound

    def oversize(self) -> None:
        """Sends messages just over the host's bound, over and over, in three ways."""
        context = zmq.Context()
        bound = self.max_message_bytes
        over_total = encode_request(2, Command.PING, None, {}, allow_pickle=False)
        over_total += [bytes(bound // 2 + 1), bytes(bound // 2 + 1)]
        first = True
        while not self.stop.is_set():
            self._oversized_raw(bound + 1)
            with context.socket(zmq.DEALER) as dealer:  # as libzmq sends a trainer's request
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(self.endpoint)
                dealer.send_multipart([over_total[0], bytes(bound + 1)])
                self.count("oversized_dealer_sent")
                if dealer.poll(200):
                    dealer.recv_multipart()
                    self.count("oversized_dealer_replies")
            with context.socket(zmq.DEALER) as dealer:  # every frame under, the whole over
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(self.endpoint)
                dealer.send_multipart(over_total)
                self.count("over_total_sent")
                if dealer.poll(PING_BOUND_S * 1000):
                    reply = decode_reply(dealer.recv_multipart(), allow_pickle=False)
                    self.count("over_total_replies", str(reply.body.get("type")))
                else:
                    self.count("over_total_replies", "none")
            if first:
                self.started["oversized"].set()
                first = False
            self.stop.wait(CHECK_INTERVAL_S)
        context.term()

    def _oversized_raw(self, size: int) -> None:
        """One frame of ``size`` bytes on a raw connection; counts whether the host drops it."""
        try:
            sock = zmtp_connect(self.address)
        except OSError as exc:
            self.count("open_failures", f"oversized: {type(exc).__name__}")
            return
        with sock:
            self.count("oversized_frames_sent")
            try:
                sock.sendall(zmtp_frame_header(size) + bytes(size))
                while sock.recv(65536):  # heartbeats, until the host closes
                    pass
            except TimeoutError:
                self.count("oversized_kept")
                return
            except OSError:
                pass
            self.count("oversized_dropped")

    # -- HELLO flood

    def flood(self, window: int = 16) -> None:
        """HELLOs as fast as the host answers, ``window`` in flight; no session is ever closed."""
        context = zmq.Context()
        sock = dealer_socket(context, self.endpoint)
        in_flight, request_id = 0, 0
        hello = {"client": "hostile flood", "pickle": False}
        while not self.stop.is_set():
            while in_flight < window:
                request_id += 1
                sock.send_multipart(
                    encode_request(request_id, Command.HELLO, None, hello, allow_pickle=False)
                )
                in_flight += 1
                self.count("hello_sent")
            if not sock.poll(CHECK_INTERVAL_S * 1000):
                continue
            reply = decode_reply(sock.recv_multipart(), allow_pickle=False)
            in_flight -= 1
            kind = "ok" if reply.status == Status.OK else str(reply.body.get("type"))
            self.count("hello_replies", kind)
            if kind == "LimitError" and self.stats["hello_refusal"] is None:
                self.stats["hello_refusal"] = reply.body.get("message")
            self.started["flood"].set()
        sock.close(0)
        context.term()

    def run(self, work: Path) -> None:
        """Attacks until ``stop-attack`` appears; ``attacking`` says every kind has begun."""
        self.check_raw_zmtp()
        threads = [threading.Thread(target=self._guarded(self.hold), daemon=True),
                   threading.Thread(target=self._guarded(self.oversize), daemon=True)]  # fmt: skip
        threads += [
            threading.Thread(target=self._guarded(self.flood), daemon=True)
            for _ in range(self.counts.get("flooders", 0))
        ]
        if not self.counts.get("flooders"):
            self.started["flood"].set()
        for thread in threads:
            thread.start()
        for name, event in self.started.items():
            if not event.wait(60) and not self.stop.is_set():
                raise RuntimeError(f"the {name} attack did not begin within 60 s")
        touch(work / "attacking")
        wait_for((work / "stop-attack").exists, "no stop-attack", 3600)
        self.stop.set()
        for thread in threads:
            thread.join(60)

    def _guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException:
                with self.lock:
                    self.stats["errors"].append(traceback.format_exc())
                for event in self.started.values():
                    event.set()

        return run


def attacker_main(argv: Sequence[str]) -> int:
    """Arguments: endpoint, max message bytes, work directory, counts as JSON."""
    endpoint, bound, work_text, counts_text = argv
    work = Path(work_text)
    attack = Attack(endpoint, int(bound), json.loads(counts_text))
    try:
        attack.run(work)
    except BaseException:
        attack.stats["errors"].append(traceback.format_exc())
        attack.stop.set()
        touch(work / "attacking")
    write_json(work / "attacker.json", attack.stats)
    return 0
