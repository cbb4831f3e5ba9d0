"""What a wake-up between two local processes costs: pipe, eventfd, semaphore, futex, spin, ZeroMQ.

Groundwork for local hosts that carry the step in shared memory (issue 55). The trainer (this
process) and child processes started with multiprocessing's "spawn" share one block
(``multiprocessing.shared_memory``), a slot of it per child. A round trip: the trainer writes a
request (16 int64 actions) into each child's slot and wakes the child; the child copies the
actions, writes a reply (16x4 float32 observations, 16 float32 rewards, 16 + 16 flag bytes) and
wakes the trainer; the trainer copies the replies out. A request and its reply each end by
storing a sequence number in a 32-bit word of the slot: the flag a waiter polls (x86-64 keeps
stores in order, so a flag seen means its payload is there; elsewhere the pure spins would need
a barrier, which the other ways' calls give).

The ways to wake, each used in both directions:

- ``pipe`` (one byte down an ``os.pipe``), ``eventfd`` (``os.eventfd`` in semaphore mode),
  ``semaphore`` (``multiprocessing.Semaphore``: a POSIX sem_t in shared memory, posted and taken
  without a system call while nobody sleeps on it) and ``futex`` (FUTEX_WAIT and FUTEX_WAKE on
  the sequence word itself, through ``ctypes``; x86_64 and aarch64 only);
- each of those straight away ("no spin") or after polling the flag for up to S µs, with
  ``os.sched_yield()`` between polls or nothing ("spin S µs", "+ yield"). A waiter that sees
  the flag while it spins still takes the pipe's byte, the eventfd's count or the semaphore's
  token (there, or about to be), a futex waiter then makes no call; a waker always wakes;
- ``eventfd+router``: the eventfd again, the child waiting on it and on a ROUTER socket in one
  ``zmq_poll``, as a host's loop that serves both would (the trainer's side as ``eventfd``);
- ``spin``: polling the flag until it changes, PufferLib's way, and with a yield between polls;
- ``zeromq``: the same bytes over ``ipc://``, a DEALER per child to the child's ROUTER:
  today's floor.

Each cell is the median (min-max) over rounds of the wall µs per round trip, or of the CPU µs
per round trip of the trainer (``time.process_time``) and its children (``/proc`` schedstat of
each of their threads) together. Rounds interleave: a round runs every way once, each for
``--round-seconds`` after a few untimed round trips, starting one way further each round.
Columns: one child; one child with a busy process per core beside it (a ``while True`` loop);
2 and 16 children (the trainer wakes every child, then waits for all of them).

Every wait is bounded. A spin lasts its bound at most (the pure spins: until the wait's
deadline); a blocking wait sleeps in slices of 50 ms and checks its peer between them; pipe and
eventfd waits poll the peer's pidfd too, so a peer's exit ends them at once; a wait longer than
10 s is a frozen peer. The run ends by checking that: for each kind of wait, a child exits in
the middle of a round trip and the report says how long the trainer took to see it.

Usage::

    python benchmarks/wakeups.py                  # 5 rounds of 0.2 s, about 2 minutes
    python benchmarks/wakeups.py --quick          # a smoke run of a few seconds
    python benchmarks/wakeups.py --rounds 9 --round-seconds 0.5 --children 2 4 16
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import zmq

NUM_ENVS = 16
#: The reply: 16x4 float32 observations, 16 float32 rewards, 16 terminated and 16 truncated bytes.
REPLY_BYTES = NUM_ENVS * 4 * 4 + NUM_ENVS * 4 + NUM_ENVS + NUM_ENVS
#: A child's slot of the block: the request's sequence word, the reply's (each on its own cache
#: line), the request's command word, then the actions and the reply.
SLOT_BYTES = 1024
REQUEST_WORD, REPLY_WORD, COMMAND_WORD = 0, 16, 32  # indices of uint32 words
ACTIONS_OFFSET, REPLY_OFFSET = 256, 384
#: What a request asks: a step, the end of a round (answered), or to exit without answering.
STEP, END, DIE = 0, 1, 2
ZMQ_END, ZMQ_DIE = b"E", b"D"
#: A blocking wait's slice: between two, the waiter checks that its peer lives.
SLICE_S = 0.05
#: A wait longer than this is a frozen peer.
WAIT_TIMEOUT_S = 10.0
#: An idle child's wait for the next round's way, and how long a child may take to start.
CONTROL_SLICE_S, START_TIMEOUT_S = 0.5, 120.0
FUTEX_SYSCALLS = {"x86_64": 202, "aarch64": 98}
FUTEX_WAIT, FUTEX_WAKE = 0, 1
BLOCKING_KINDS = ("pipe", "eventfd", "semaphore", "futex")
#: An eventfd whose child waits on it and on a ROUTER socket at once (a host's loop would).
ROUTER_EVENTFD = "eventfd+router"
#: A busy process beside the benchmark, until its parent is gone.
HOG = """import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent = int(sys.argv[1])
while os.getppid() == parent:
    pass
"""


class PeerGone(RuntimeError):
    """The process at the other end of a wait exited, or did not answer within the timeout."""


class Way(NamedTuple):
    """One way to wake: a kind of wait, and how long a waiter polls the flag before it."""

    kind: str  # pipe, eventfd, semaphore, futex, spin or zeromq
    spin_us: float = 0.0
    yields: bool = False

    @property
    def name(self) -> str:
        """The way's row in the tables."""
        if self.kind == "spin":
            return "spin + sched_yield" if self.yields else "spin (PufferLib's way)"
        if self.kind == "zeromq":
            return "zeromq ipc, DEALER/ROUTER"
        if self.kind == ROUTER_EVENTFD:
            return "eventfd, the child polling it with a ROUTER socket"
        if not self.spin_us:
            return f"{self.kind}, no spin"
        return f"{self.kind}, spin {self.spin_us:g} µs" + (" + yield" if self.yields else "")


class Column(NamedTuple):
    """One column of the tables: how many children, how many busy processes beside them."""

    children: int
    busy: int

    @property
    def name(self) -> str:
        """The column's heading."""
        name = "1 child" if self.children == 1 else f"{self.children} children"
        return f"{name}, {self.busy} busy" if self.busy else name


class InheritedFd:
    """A file descriptor for a spawned child: pickled, while spawning, as one the child inherits."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Callable[[Any], int], tuple[Any]]:
        return _detach, (multiprocessing.reduction.DupFd(self.fd),)


def _detach(duplicate: Any) -> int:
    return duplicate.detach()


class ChildSpec(NamedTuple):
    """What a child is given: its slot, its ends of every kind of wake-up, its ZeroMQ address."""

    slot: int
    block_name: str
    control: multiprocessing.connection.Connection
    #: File descriptors, given as InheritedFd, received as the child's numbers (ints).
    pipes: tuple[Any, Any]  # the requests' read end, the replies' write end
    eventfds: tuple[Any, Any]  # the requests', the replies'
    semaphores: tuple[Any, Any]  # the requests', the replies'
    endpoint: str
    parent_pid: int


class Timespec(ctypes.Structure):
    """``struct timespec``, a futex wait's relative timeout."""

    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def futex_syscall() -> Callable[..., int] | None:
    """The C library's ``syscall`` typed for the futex calls (None: no known number here)."""
    if platform.machine() not in FUTEX_SYSCALLS:
        return None
    call = ctypes.CDLL(None, use_errno=True).syscall
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
    call.argtypes += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
    return call


FUTEX = futex_syscall()
SLICE_TIMESPEC = Timespec(0, int(SLICE_S * 1e9))


class Peer:
    """The process at the other end: whether it lives, and its pidfd (None where there is none)."""

    def __init__(self, alive: Callable[[], bool], pid: int) -> None:
        self.alive = alive
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def check(self, deadline: float) -> None:
        """Raises PeerGone if the peer exited or the deadline passed."""
        if not self.alive():
            raise PeerGone("the peer exited")
        if time.perf_counter() > deadline:
            raise PeerGone(f"no answer in {WAIT_TIMEOUT_S:g} s")

    def close(self) -> None:
        """Closes the pidfd."""
        if self.pidfd is not None:
            os.close(self.pidfd)


class FdBell:
    """Wakes through a file descriptor (one each way); a wait polls it and the peer's pidfd."""

    tokens = True  # every ring is one token to take, seen while spinning or not

    def __init__(self, ring_fd: int, take_fd: int, peer: Peer) -> None:
        self.ring_fd, self.take_fd, self.peer = ring_fd, take_fd, peer
        self.poller = select.poll()
        self.poller.register(take_fd, select.POLLIN)
        if peer.pidfd is not None:
            self.poller.register(peer.pidfd, select.POLLIN)

    def ring(self) -> None:
        """Wakes the peer."""
        os.write(self.ring_fd, b"\0")

    def read(self) -> None:
        """Takes one token (it is there), or finds the peer's end closed."""
        if not os.read(self.take_fd, 1):
            raise PeerGone("the peer exited (its end of the pipe closed)")

    def take(self, words: memoryview, index: int, old: int, deadline: float) -> None:
        """Takes one token, waiting for it in slices until the deadline."""
        while True:
            events = self.poller.poll(SLICE_S * 1000)
            if any(fd == self.take_fd for fd, _ in events):
                self.read()
                return
            if events:  # the pidfd: the peer exited
                raise PeerGone("the peer exited (its pidfd)")
            self.peer.check(deadline)


class EventfdBell(FdBell):
    """Wakes through an eventfd in semaphore mode: a write adds one, a read takes one."""

    def ring(self) -> None:
        """Wakes the peer."""
        os.eventfd_write(self.ring_fd, 1)

    def read(self) -> None:
        """Takes one token (it is there)."""
        os.eventfd_read(self.take_fd)


class RouterEventfdBell(EventfdBell):
    """A host's side of an eventfd bell: waited on with its ROUTER socket, in one ``zmq_poll``.

    The wait a host's loop makes to serve a step in shared memory and its ZeroMQ requests with
    one thread (nothing comes on the socket here: the cost is the pair's wait).
    """

    def __init__(self, ring_fd: int, take_fd: int, peer: Peer, router: zmq.Socket) -> None:
        super().__init__(ring_fd, take_fd, peer)
        self.items: list[tuple[Any, int]] = [(router, zmq.POLLIN), (take_fd, zmq.POLLIN)]
        if peer.pidfd is not None:
            self.items.append((peer.pidfd, zmq.POLLIN))

    def take(self, words: memoryview, index: int, old: int, deadline: float) -> None:
        """Takes one token, waiting for it in slices until the deadline."""
        while True:
            ready = {source for source, _ in zmq.zmq_poll(self.items, int(SLICE_S * 1000))}
            if self.take_fd in ready:
                self.read()
                return
            if self.peer.pidfd is not None and self.peer.pidfd in ready:
                raise PeerGone("the peer exited (its pidfd)")
            self.peer.check(deadline)


class SemaphoreBell:
    """Wakes through a POSIX semaphore each way (sem_post, sem_trywait then sem_timedwait)."""

    tokens = True

    def __init__(self, ring_semaphore: Any, take_semaphore: Any, peer: Peer) -> None:
        self.ring_semaphore, self.take_semaphore, self.peer = ring_semaphore, take_semaphore, peer

    def ring(self) -> None:
        """Wakes the peer."""
        self.ring_semaphore.release()

    def take(self, words: memoryview, index: int, old: int, deadline: float) -> None:
        """Takes one token, waiting for it in slices until the deadline."""
        while not self.take_semaphore.acquire(timeout=SLICE_S):
            self.peer.check(deadline)


class FutexBell:
    """Wakes through a futex on each sequence word: FUTEX_WAKE after a store, FUTEX_WAIT for one."""

    tokens = False  # a waiter that saw the flag has nothing to take

    def __init__(self, ring_address: int, take_address: int, peer: Peer) -> None:
        if FUTEX is None:
            raise RuntimeError(f"no futex system call number known for {platform.machine()}")
        self.call, self.number = FUTEX, FUTEX_SYSCALLS[platform.machine()]
        self.ring_address, self.take_address, self.peer = ring_address, take_address, peer
        self.timeout = ctypes.addressof(SLICE_TIMESPEC)

    def ring(self) -> None:
        """Wakes the peer (a cheap call when nobody sleeps on the word)."""
        self.call(self.number, self.ring_address, FUTEX_WAKE, 1, None, None, 0)

    def take(self, words: memoryview, index: int, old: int, deadline: float) -> None:
        """Sleeps while the word holds ``old``, in slices until the deadline."""
        while words[index] == old:
            self.call(self.number, self.take_address, FUTEX_WAIT, old, self.timeout, None, 0)
            if words[index] == old:
                self.peer.check(deadline)


class SpinBell:
    """The pure spins: nothing to ring, nothing to take (the waiter's spin has no bound)."""

    tokens = False

    def ring(self) -> None:
        """Nothing: the peer is polling."""

    def take(self, words: memoryview, index: int, old: int, deadline: float) -> None:
        """Never called: a pure spin ends when the flag changes."""
        raise AssertionError("a pure spin does not block")


Bell = FdBell | SemaphoreBell | FutexBell | SpinBell


class Link:
    """One side's view of one child's slot: its words, actions and reply, a bell per kind."""

    def __init__(self, block: SharedMemory, slot: int, trainer: bool, peer: Peer) -> None:
        base = slot * SLOT_BYTES
        self.words = block.buf[base : base + SLOT_BYTES].cast("I")
        self.actions = np.frombuffer(block.buf, np.int64, NUM_ENVS, base + ACTIONS_OFFSET)
        self.reply = np.frombuffer(block.buf, np.uint8, REPLY_BYTES, base + REPLY_OFFSET)
        self.sends, self.receives = (
            (REQUEST_WORD, REPLY_WORD) if trainer else (REPLY_WORD, REQUEST_WORD)
        )
        self.peer = peer
        self.last = self.words[self.receives]  # the receiving word's value last seen
        self.anchor = (ctypes.c_char * SLOT_BYTES).from_buffer(self.words)  # for futex addresses
        self.bells: dict[str, Bell] = {"spin": SpinBell()}

    def address(self, index: int) -> int:
        """The address of word ``index``, for the futex calls."""
        return ctypes.addressof(self.anchor) + 4 * index

    def send(self, way: Way, value: int) -> None:
        """Stores ``value`` in the sending word (the payload is written), then wakes the peer."""
        self.words[self.sends] = value
        self.bells[way.kind].ring()

    def close(self) -> None:
        """Lets go of the block's memory (the block cannot close while views of it live)."""
        del self.anchor, self.actions, self.reply
        self.words.release()
        self.peer.close()


def spin(links: list[Link], spin_s: float, yields: bool, deadline: float) -> list[Link]:
    """Polls the links' receiving words for up to ``spin_s``; returns the links still unchanged.

    A spin longer than a slice (the pure spins) checks the peers between slices.
    """
    now = time.perf_counter()
    end, check_at = now + spin_s, now + SLICE_S
    if len(links) == 1:  # the common case, without a list per poll
        (link,) = links
        words, index, old = link.words, link.receives, link.last
        while words[index] == old:
            if yields:
                os.sched_yield()
            now = time.perf_counter()
            if now >= end:
                return links
            if now >= check_at:
                link.peer.check(deadline)
                check_at = now + SLICE_S
        return []
    pending = [link for link in links if link.words[link.receives] == link.last]
    while pending:
        if yields:
            os.sched_yield()
        pending = [link for link in pending if link.words[link.receives] == link.last]
        now = time.perf_counter()
        if now >= end:
            break
        if now >= check_at:
            for link in pending:
                link.peer.check(deadline)
            check_at = now + SLICE_S
    return pending


def wait(links: list[Link], way: Way, deadline: float) -> None:
    """Waits until every link's receiving word changed: spin, then each kind's wait."""
    spin_s = math.inf if way.kind == "spin" else way.spin_us / 1e6
    pending = spin(links, spin_s, way.yields, deadline) if spin_s else links
    for link in links:
        bell = link.bells[way.kind]
        if bell.tokens or link in pending:
            bell.take(link.words, link.receives, link.last, deadline)
        value = link.words[link.receives]
        if value == link.last:
            raise RuntimeError(f"{way.name}: woken, but the flag did not change")
        link.last = value


def child_main(spec: ChildSpec) -> None:
    """A child: serves rounds in the way the trainer names, until told to stop or orphaned.

    Ctrl-C is the trainer's: it stops the children itself.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    block = SharedMemory(spec.block_name)
    peer = Peer(lambda: os.getppid() == spec.parent_pid, spec.parent_pid)
    link = Link(block, spec.slot, trainer=False, peer=peer)
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    try:
        (request_read, reply_write), (request_fd, reply_fd) = spec.pipes, spec.eventfds
        link.bells["pipe"] = FdBell(reply_write, request_read, peer)
        link.bells["eventfd"] = EventfdBell(reply_fd, request_fd, peer)
        link.bells["semaphore"] = SemaphoreBell(spec.semaphores[1], spec.semaphores[0], peer)
        if FUTEX is not None:
            ring, take = link.address(REPLY_WORD), link.address(REQUEST_WORD)
            link.bells["futex"] = FutexBell(ring, take, peer)
        link.bells[ROUTER_EVENTFD] = RouterEventfdBell(reply_fd, request_fd, peer, router)
        router.linger = 0
        router.bind(spec.endpoint)
        spec.control.send("hello")
        while True:
            while not spec.control.poll(CONTROL_SLICE_S):
                if not peer.alive():
                    return
            way = spec.control.recv()
            if way is None:
                return
            spec.control.send("ready")
            if way.kind == "zeromq":
                serve_zeromq(router, peer)
            else:
                serve_block(link, way)
    except (PeerGone, EOFError, BrokenPipeError):
        return
    finally:
        router.close()
        context.term()
        link.close()
        block.close()


def serve_block(link: Link, way: Way) -> None:
    """Answers requests through the block until the end of the round."""
    reply = np.zeros(REPLY_BYTES, np.uint8)
    actions = np.empty(NUM_ENVS, np.int64)
    while True:
        wait([link], way, time.perf_counter() + WAIT_TIMEOUT_S)
        command = link.words[COMMAND_WORD]
        if command == DIE:
            os._exit(0)
        np.copyto(actions, link.actions)
        np.copyto(link.reply, reply)
        link.send(way, link.last)  # the reply carries the request's number
        if command == END:
            return


def serve_zeromq(router: zmq.Socket, peer: Peer) -> None:
    """Answers requests on the ROUTER until the end of the round."""
    reply = np.zeros(REPLY_BYTES, np.uint8)
    actions = np.empty(NUM_ENVS, np.int64)
    while True:
        deadline = time.perf_counter() + WAIT_TIMEOUT_S
        while not router.poll(SLICE_S * 1000):
            peer.check(deadline)
        identity, message = router.recv_multipart()
        if message == ZMQ_DIE:
            os._exit(0)
        if message == ZMQ_END:
            router.send_multipart([identity, b""])
            return
        np.copyto(actions, np.frombuffer(message, np.int64))
        router.send_multipart([identity, reply])


class Child:
    """The trainer's side of one child: its process, link, dealer and control connection."""

    def __init__(self, process: Any, link: Link, control: Any, dealer: zmq.Socket) -> None:
        self.process, self.link, self.control, self.dealer = process, link, control, dealer
        self.sequence = link.words[REQUEST_WORD]

    def cpu_ns(self) -> int:
        """The CPU time of every thread of the child so far."""
        total, tasks = 0, f"/proc/{self.process.pid}/task"
        for task in os.listdir(tasks):
            with contextlib.suppress(FileNotFoundError):
                total += int(Path(tasks, task, "schedstat").read_text().split()[0])
        return total

    def receive_control(self) -> str:
        """The child's next control message, waited for in slices."""
        deadline = time.perf_counter() + START_TIMEOUT_S
        try:
            while not self.control.poll(SLICE_S):
                self.link.peer.check(deadline)
            return self.control.recv()
        except EOFError as exc:
            raise PeerGone("the child closed its control connection") from exc


class Children:
    """The pool of children: started once, their slots in one block, shared by every column."""

    def __init__(self, count: int, directory: str) -> None:
        self.block = SharedMemory(create=True, size=count * SLOT_BYTES)
        self.block.buf[:] = bytes(count * SLOT_BYTES)
        self.context = zmq.Context()
        self.fds: list[int] = []
        self.children: list[Child] = []
        spawn = multiprocessing.get_context("spawn")
        try:
            for slot in range(count):
                self.children.append(self._start(spawn, slot, directory))
            for child in self.children:
                if child.receive_control() != "hello":
                    raise RuntimeError("a child did not start")
        except BaseException:
            self.close()
            raise

    def _start(self, spawn: Any, slot: int, directory: str) -> Child:
        requests, replies = os.pipe(), os.pipe()
        flags = os.EFD_SEMAPHORE | os.EFD_NONBLOCK
        request_fd, reply_fd = os.eventfd(0, flags), os.eventfd(0, flags)
        semaphores = (spawn.Semaphore(0), spawn.Semaphore(0))
        control, child_control = spawn.Pipe()
        endpoint = f"ipc://{directory}/child-{slot}.sock"
        spec = ChildSpec(
            slot,
            self.block.name,
            child_control,
            (InheritedFd(requests[0]), InheritedFd(replies[1])),
            (InheritedFd(request_fd), InheritedFd(reply_fd)),
            semaphores,
            endpoint,
            os.getpid(),
        )
        process = spawn.Process(target=child_main, args=(spec,), daemon=True)
        process.start()
        os.close(requests[0])
        os.close(replies[1])
        child_control.close()
        self.fds += [requests[1], replies[0], request_fd, reply_fd]
        peer = Peer(lambda: process.exitcode is None, process.pid)
        link = Link(self.block, slot, trainer=True, peer=peer)
        link.bells["pipe"] = FdBell(requests[1], replies[0], peer)
        link.bells["eventfd"] = link.bells[ROUTER_EVENTFD] = EventfdBell(request_fd, reply_fd, peer)
        link.bells["semaphore"] = SemaphoreBell(semaphores[0], semaphores[1], peer)
        if FUTEX is not None:
            ring, take = link.address(REQUEST_WORD), link.address(REPLY_WORD)
            link.bells["futex"] = FutexBell(ring, take, peer)
        dealer = self.context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(endpoint)
        return Child(process, link, control, dealer)

    def close(self) -> None:
        """Stops the children (killing those still there after 2 s) and frees the block."""
        for child in self.children:
            with contextlib.suppress(OSError):
                child.control.send(None)
        deadline = time.perf_counter() + 2
        for child in self.children:
            child.process.join(max(0.0, deadline - time.perf_counter()))
            if child.process.exitcode is None:
                child.process.kill()
                child.process.join(5)
            child.dealer.close()
            child.control.close()
            child.link.close()
        self.context.term()
        for fd in self.fds:
            os.close(fd)
        self.block.close()
        self.block.unlink()


ACTIONS = np.arange(NUM_ENVS, dtype=np.int64) % 2


def trip_block(children: list[Child], way: Way, replies: np.ndarray, command: int) -> None:
    """One round trip through the block: wake every child, wait for all, copy the replies."""
    deadline = time.perf_counter() + WAIT_TIMEOUT_S
    for child in children:
        link = child.link
        np.copyto(link.actions, ACTIONS)
        link.words[COMMAND_WORD] = command
        child.sequence = (child.sequence + 1) & 0xFFFFFFFF
        link.send(way, child.sequence)
    wait([child.link for child in children], way, deadline)
    for child, reply in zip(children, replies):
        if child.link.last != child.sequence:
            raise RuntimeError(f"{way.name}: the reply of another request")
        np.copyto(reply, child.link.reply)


def trip_zeromq(children: list[Child], replies: np.ndarray, message: Any) -> None:
    """One round trip over ZeroMQ: a request to every child, then every reply."""
    deadline = time.perf_counter() + WAIT_TIMEOUT_S
    for child in children:
        child.dealer.send(message)
    for child, reply in zip(children, replies):
        while not child.dealer.poll(SLICE_S * 1000):
            child.link.peer.check(deadline)
        answer = child.dealer.recv()
        if answer:
            np.copyto(reply, np.frombuffer(answer, np.uint8))


def begin(children: list[Child], way: Way) -> Callable[[], None]:
    """Tells the children the round's way; returns one round trip in that way."""
    for child in children:
        child.control.send(way)
    for child in children:
        if child.receive_control() != "ready":
            raise RuntimeError("a child is not ready")
    replies = np.empty((len(children), REPLY_BYTES), np.uint8)
    if way.kind == "zeromq":
        return lambda: trip_zeromq(children, replies, ACTIONS)
    return lambda: trip_block(children, way, replies, STEP)


def end(children: list[Child], way: Way) -> None:
    """Ends the round: the children answer and go back to their control connections."""
    replies = np.empty((len(children), REPLY_BYTES), np.uint8)
    if way.kind == "zeromq":
        trip_zeromq(children, replies, ZMQ_END)
    else:
        trip_block(children, way, replies, END)


def measure(children: list[Child], way: Way, round_s: float, warmup: int) -> tuple[float, float]:
    """One round of one way: wall and CPU µs per round trip."""
    trip = begin(children, way)
    for _ in range(warmup):
        trip()
    cpu_before = sum(child.cpu_ns() for child in children) / 1e9
    own_before, started = time.process_time(), time.perf_counter()
    trips, now = 0, started
    while now - started < round_s or trips == 0:
        trip()
        trips += 1
        now = time.perf_counter()
    own = time.process_time() - own_before
    cpu = sum(child.cpu_ns() for child in children) / 1e9 - cpu_before + own
    end(children, way)
    return (now - started) / trips * 1e6, cpu / trips * 1e6


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` busy processes beside the benchmark while the block runs, each seen running."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(os.getpid())]) for _ in range(count)]
    try:
        deadline = time.perf_counter() + START_TIMEOUT_S
        for hog in hogs:  # each has run for 50 ms of CPU (its interpreter started)
            stat = Path(f"/proc/{hog.pid}/schedstat")
            while int(stat.read_text().split()[0]) < 50_000_000:
                if hog.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError("a busy process did not start")
                time.sleep(0.01)  # polls a condition, not a wait for readiness by time
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(5)


def dead_child_check(children: list[Child], kinds: list[str]) -> dict[str, float]:
    """For each kind of wait, one child exits during a round trip: ms until the trainer saw it."""
    seen_ms = {}
    for kind, child in zip(kinds, children):
        way = Way(kind)
        trip = begin([child], way)
        for _ in range(3):
            trip()
        replies = np.empty((1, REPLY_BYTES), np.uint8)
        started = time.perf_counter()
        try:
            if kind == "zeromq":
                trip_zeromq([child], replies, ZMQ_DIE)
            else:
                trip_block([child], way, replies, DIE)
        except PeerGone:
            seen_ms[kind] = (time.perf_counter() - started) * 1000
        else:
            raise RuntimeError(f"{kind}: a dead child answered")
        child.process.join(5)
    return seen_ms


def ways(spins: list[float], kinds: list[str]) -> list[Way]:
    """Every way measured, in table order."""
    listed = []
    for kind in kinds:
        for spin_us in spins:
            listed += [
                Way(kind, spin_us, yields) for yields in ((False, True) if spin_us else (False,))
            ]
    return [*listed, Way(ROUTER_EVENTFD), Way("spin"), Way("spin", yields=True), Way("zeromq")]


def cell(values: list[float]) -> str:
    """A median (min-max) cell."""
    median, low, high = statistics.median(values), min(values), max(values)
    digits = 1 if median < 100 else 0
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def table(
    title: str, rows: list[Way], columns: list[Column], values: dict[Any, list[float]]
) -> str:
    """A markdown table: a row per way, a column per column."""
    lines = [f"## {title}", "", "| way | " + " | ".join(c.name for c in columns) + " |"]
    lines.append("|---|" + "---:|" * len(columns))
    for way in rows:
        lines.append(f"| {way.name} | " + " | ".join(cell(values[way, c]) for c in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the rounds and prints the two tables and the dead-child check."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="rounds per way and column (default 5)")
    parser.add_argument("--round-seconds", type=float, help="seconds per round (default 0.2)")
    parser.add_argument("--children", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--spins", type=float, nargs="+", default=[0, 20, 100], help="µs")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 0.02 s: a smoke run")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    round_s = args.round_seconds or (0.02 if args.quick else 0.2)
    warmup = 2 if args.quick else 5
    notes = []
    kinds = list(BLOCKING_KINDS)
    if FUTEX is None:
        kinds.remove("futex")
        notes.append(f"futex: skipped, no futex system call number known for {platform.machine()}")
    rows = ways(args.spins, kinds)
    columns = [Column(1, 0), Column(1, args.busy)] + [Column(n, 0) for n in args.children]
    wall: dict[Any, list[float]] = {}
    cpu: dict[Any, list[float]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        pool = Children(max(max(args.children), len(kinds) + 2), directory)
        try:
            for column in columns:
                with busy(column.busy):
                    for r in range(rounds):
                        for way in rows[r % len(rows) :] + rows[: r % len(rows)]:
                            us, cpu_us = measure(
                                pool.children[: column.children], way, round_s, warmup
                            )
                            wall.setdefault((way, column), []).append(us)
                            cpu.setdefault((way, column), []).append(cpu_us)
                print(f"wakeups: {column.name} measured", file=sys.stderr, flush=True)
            seen = dead_child_check(pool.children, [*kinds, "spin", "zeromq"])
        finally:
            pool.close()
    print("# Wake-ups between local processes\n")
    print(
        f"Python {platform.python_version()}, {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs; {rounds} rounds of {round_s:g} s per way and column, "
        f"{time.perf_counter() - started:.0f} s in all. Median (min-max) over rounds.\n"
    )
    for note in notes:
        print(f"{note}\n")
    print(table("Wall µs per round trip", rows, columns, wall) + "\n")
    print(table("CPU µs per round trip, trainer and children", rows, columns, cpu) + "\n")
    print(
        "A child that exits in the middle of a round trip is seen after: "
        + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in seen.items())
        + f" (pipe and eventfd waits poll the child's pidfd; the others check it every "
        f"{SLICE_S * 1000:g} ms)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
