"""The env host: one ROUTER socket, one single-threaded worker loop, many client sessions.

Each client opens a session with HELLO and gets its own envs; a session id is a random token
the client sends with every later request, so two trainers on one host never touch each other's
envs. Everything a client or an env does wrong becomes an error reply: the host keeps serving.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import zmq

from envserver import __version__
from envserver.curve.guard import RateLimitedLog
from envserver.errors import (
    HostUnavailableError,
    LimitError,
    MessageTooLargeError,
    PickleNotAllowedError,
    ProtocolError,
    UnsupportedSpaceError,
)
from envserver.host.config import HostConfig
from envserver.host.inbox import Inbox, bind_router
from envserver.host.metrics import HostMetrics, NoMetrics
from envserver.host.relay import Relay, Said
from envserver.host.sessions import Cached, Session, SessionTable
from envserver.host.worker import EnvBlock, EnvCallError
from envserver.wire import codec
from envserver.wire.bodies import Call, Hello, Make, Reset, SetAttr, Step, Wrappers
from envserver.wire.frames import recv_frames, send_frames
from envserver.wire.messages import (
    PROTOCOL_VERSION,
    Command,
    Request,
    Status,
    add_said,
    decode_request,
    encode_raw_reply,
    encode_reply,
    error_body,
    peek_request,
    request_id_of,
)
from envserver.wire.raw import StepLayout
from envserver.wire.replies import (
    HeartbeatReply,
    HelloReply,
    HostInfo,
    MakeReply,
    ResetReply,
    StepReply,
)
from envserver.wire.spaces import space_to_data

__all__ = ["EnvHost", "HostConfig"]

logger = logging.getLogger(__name__)

#: How often the loop wakes up to check for stop requests and a vanished parent.
POLL_INTERVAL_S = 0.25
#: Up to this many envs, a step's rewards and flags travel as plain lists, beyond as arrays:
#: for a few values a msgpack list costs less to encode and decode than an array extension;
#: for many, the array's raw bytes cost less than a list.
COLUMN_LIST_MAX = 64
#: The most queued requests read at once to learn whose clients are alive (see ``_drain``).
MAX_DRAIN = 10_000
#: The least time between two log lines of failed requests of one kind.
FAILURE_LOG_INTERVAL_S = 1.0


#: Runs a command: ``handler(session, body)`` returns its OK reply's body (the session is None
#: for a command that needs none; the body is read as its :class:`Entry` says).
Handler = Callable[..., Any]


class Body(enum.Enum):
    """How a command's body is read before its handler gets it."""

    MAP = "map"
    """A map (else a ``ProtocolError``), which the handler reads as its typed body
    (:mod:`envserver.wire.bodies`)."""
    IGNORED = "ignored"
    """Anything: decoded (so it must be valid), then not read."""
    FRAMES = "frames"
    """Raw frames in the session's step layout (STEP_RAW), not a codec body."""


@dataclass(frozen=True, slots=True)
class Entry:
    """What the host must know of one command to answer it: one row of the dispatch table.

    Attributes:
        handler: Runs the command (see :data:`Handler`).
        body: How its body is read.
        session: Whether it needs an open session (PING and HELLO do not).
        cached: Whether it is in its session's request order: its reply is kept for retries,
            and carries what the envs said. HEARTBEAT is not: it comes from a socket of its
            own, with ids of its own, where a said frame would reach no one.
        at_once: Whether it only renews its session's lease: it does not count as using the
            session (idle timeout), and a loop reading ahead answers it at once (HEARTBEAT).
        raw_reply: Whether its OK reply is raw frames (STEP_RAW) rather than a codec body
            (with pickled values where the session allows them).
    """

    handler: Handler
    body: Body = Body.MAP
    session: bool = True
    cached: bool = True
    at_once: bool = False
    raw_reply: bool = False


class EnvHost:
    """Serves Gymnasium envs to remote clients over one ROUTER socket.

    Args:
        config: How to serve.
        context: The ZeroMQ context to use (a new one by default).
        relay: What the envs say, collected per command and sent to the sessions that ask
            (installed in this process: ``envserver serve`` makes one); None: not collected.
    """

    def __init__(
        self, config: HostConfig, context: zmq.Context | None = None, relay: Relay | None = None
    ) -> None:
        self.config = config
        #: Collects what the envs say per command (None: nothing is collected).
        self.relay = relay
        self.sessions = SessionTable(
            config.max_sessions, config.session_lease_s, config.session_idle_timeout_s
        )
        self._own_context = context is None
        self._context = context or zmq.Context()
        try:
            # The CURVE guard (None: no CURVE) logs the clients it refuses.
            self._socket, self._curve = bind_router(self._context, config)
        except BaseException:  # nothing left open (a CLI error is one line, no warnings)
            if self._own_context:
                self._context.term()
            raise
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.name = config.name or self.endpoint
        #: Tells this host apart from others (pids repeat across containers): a random token.
        self.instance = secrets.token_hex(8)
        self._started = time.monotonic()
        self.metrics: NoMetrics = NoMetrics()
        self._stop = threading.Event()
        self._inbox = Inbox(self._socket, POLL_INTERVAL_S)
        self._failures = RateLimitedLog(logger, FAILURE_LOG_INTERVAL_S)
        self._table = self._commands()
        if config.metrics_port is not None:
            try:
                self.metrics = HostMetrics(
                    lambda: len(self.sessions), self.sessions.envs_held,
                    self.sessions.envs_on_threads, config.metrics_port, config.metrics_bind,
                )  # fmt: skip
            except BaseException:
                self.close()
                raise
        logger.info(
            "env host %s serving (pickle %s, envs %s)",
            self.endpoint,
            "allowed" if config.allow_pickle else "refused",
            ", ".join(config.env_patterns),
        )

    # ------------------------------------------------------------------ loop

    def stop(self) -> None:
        """Asks the loop to finish; safe from signal handlers and other threads."""
        self._stop.set()

    def wake_on_signals(self) -> None:
        """Makes a signal handler's :meth:`stop` take effect at once (main thread only).

        Without it, a stop is seen when the wait for a request ends (:data:`POLL_INTERVAL_S`).
        """
        self._inbox.wake_on_signals()

    def serve_forever(self) -> None:
        """Answers requests until :meth:`stop` is called or the parent process is gone."""
        housekeeping_due = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= housekeeping_due:
                    if self._parent_gone():
                        logger.warning("parent process %s is gone; exiting", self.config.parent_pid)
                        break
                    self._reap_sessions(now)
                    housekeeping_due = now + POLL_INTERVAL_S
                frames = self._inbox.next(self._stop)
                if frames is not None:
                    self._serve_one(frames)
            # Requests on their way when the stop came are refused too, while clients may
            # still send them (a trainer that closed its sessions sends no more).
            self._refuse_queued(POLL_INTERVAL_S if len(self.sessions) else 0.0)
        finally:
            self.close()

    def _refuse_queued(self, grace_s: float) -> None:
        """Answers with a "shutting down" error the requests that arrive until ``grace_s``.

        Those already queued are answered in any case.
        """
        error = HostUnavailableError("this host is shutting down")
        deadline = time.monotonic() + grace_s
        while (frames := self._inbox.next(None, deadline - time.monotonic())) is not None:
            request_id = request_id_of([frame.buffer for frame in frames[1:]] or [b""])
            reply = encode_reply(request_id, Status.ERROR, error_body(error))
            with contextlib.suppress(zmq.ZMQError):
                send_frames(self._socket, [frames[0], *reply])

    def _reap_sessions(self, now: float) -> None:
        """Closes the sessions whose lease or idle timeout passed (:mod:`envserver.host.sessions`).

        The requests queued while the loop was busy (one long env step, say) are read first:
        their clients are alive, though the loop could not hear them in time.
        """
        if not self.sessions.expired(now):
            return
        self._drain()
        for reason in self.sessions.reap(time.monotonic()):
            self.metrics.session_evicted(reason.value)

    def _drain(self) -> None:
        """Reads the queued requests: each renews its session's lease.

        Requests go to the backlog, served in arrival order before anything newer; those the
        dispatch table answers at once (HEARTBEAT: see ``Entry.at_once``) are answered now
        instead, unless their connection has requests in the backlog (a reply may overtake
        other connections' replies, never its own connection's).
        """
        waiting = {frames[0].bytes for frames in self._inbox.backlog}  # those with a backlog
        for _ in range(MAX_DRAIN):
            try:
                frames = recv_frames(self._socket, zmq.NOBLOCK)
            except zmq.Again:
                return
            command, session_id = peek_request([frame.buffer for frame in frames[1:]] or [b""])
            entry = self._table.get(command)
            at_once = entry is not None and entry.at_once
            self.sessions.heard(session_id, time.monotonic(), used=not at_once)
            if at_once and frames[0].bytes not in waiting:
                self._serve_one(frames)
            else:
                waiting.add(frames[0].bytes)
                self._inbox.backlog.append(frames)

    def _parent_gone(self) -> bool:
        return self.config.parent_pid is not None and os.getppid() != self.config.parent_pid

    def _serve_one(self, frames: list[zmq.Frame]) -> None:
        identity, payload = frames[0], [frame.buffer for frame in frames[1:]]
        reply = self.handle(payload)
        if reply is None:
            return
        try:
            send_frames(self._socket, [identity, *reply])
        except zmq.ZMQError as exc:
            logger.warning("could not send a reply: %s", exc)

    def handle(self, frames: list[Any]) -> list[Any] | None:
        """Answers one request.

        Args:
            frames: The request's frames, without the ROUTER identity.

        Returns:
            The reply frames, or None for input that cannot be framed as a request.
        """
        if not frames:
            return None
        if type(self.metrics) is NoMetrics:  # nothing counted: no clock read
            return self._answer(frames)[0]
        started = time.perf_counter()
        reply, command, ok = self._answer(frames)
        self.metrics.request(command, ok, time.perf_counter() - started)
        return reply

    def _answer(self, frames: list[Any]) -> tuple[list[Any], Command | None, bool]:
        """The reply to a request, the request's command (None if unreadable), and whether OK."""
        request_id: int | None = None  # read from the envelope when decoding failed
        command: Command | None = None
        cached = False  # whether the request is in its session's order (see Entry.cached)
        session: Session | None = None
        kept: Cached | None = None  # the reply kept for a retry of this request
        said: Said | None = None  # what the envs say while the command runs
        ok = False
        try:
            request = self._decoded(frames)
            request_id, command = request.request_id, request.command
            entry = self._table[command]
            cached = entry.cached
            if entry.session:
                session = self.sessions.of(request.session, used=not entry.at_once)
            if cached and session is not None:
                kept = session.cached(request_id, command)
            if kept is not None:
                reply, ok = kept.frames, kept.ok
            else:
                if cached and session is not None and session.said and self.relay is not None:
                    said = self.relay.listen(session.warned)
                body = request.body
                if entry.body is Body.MAP and not isinstance(body, dict):
                    raise ProtocolError(f"the body of {command.name} must be a map")
                result = entry.handler(session, body)
                if entry.raw_reply:
                    reply = encode_raw_reply(request_id, result)
                else:
                    pickle = session is not None and session.pickle
                    reply = encode_reply(request_id, Status.OK, result, allow_pickle=pickle)
                ok = True
        except EnvCallError as failure:
            reply = self._env_failed(failure, request_id, session)
        except Exception as exc:
            reply = self._failed(exc, request_id, frames)
        finally:
            if said is not None:
                self.relay.done()
        if said is not None:
            reply = self._with_said(reply, said, session)
        if cached and session is not None and kept is None:
            session.answered(request_id, command, reply, ok, time.monotonic())
        return reply, command, ok

    def _decoded(self, frames: list[Any]) -> Request:
        """The request, if the message is within the host's bound and decodes.

        Raises:
            MessageTooLargeError: If its frames together pass the bound.
            PickleNotAllowedError: If it carries pickle and the host does not allow it.
            ProtocolError: If it is not a well-formed request.
        """
        size = sum([memoryview(frame).nbytes for frame in frames])
        if size > self.config.max_message_bytes:
            raise MessageTooLargeError(
                f"request of {size} bytes exceeds this host's bound of "
                f"{self.config.max_message_bytes} bytes"
            )
        try:
            return decode_request(frames, allow_pickle=self.config.allow_pickle)
        except PickleNotAllowedError as exc:
            raise PickleNotAllowedError(
                "this host refuses pickled data: it was not started with "
                "--allow-pickle; make envs from a registered env id instead"
            ) from exc

    def _env_failed(
        self, failure: EnvCallError, request_id: int | None, session: Session | None
    ) -> list[Any]:
        """The error reply to a command an env raised in, logged and counted."""
        where = session.session_id.hex() if session is not None else "-"
        logger.info(
            "session %s env %d raised %s: %s",
            where,
            failure.index,
            type(failure.error).__name__,
            failure.error,
            extra={
                "session": where,
                "env_index": failure.index,
                "exception": type(failure.error).__name__,
            },
        )
        self.metrics.env_error()
        return _error_reply(request_id, failure.error, failure.index)

    def _failed(self, exc: Exception, request_id: int | None, frames: list[Any]) -> list[Any]:
        """The error reply to a request that failed otherwise, logged (rate-limited), counted."""
        if request_id is None:
            request_id = request_id_of(frames)
        # At most a line a second per kind: a client may send failing requests in a flood.
        self._failures.log(
            logging.INFO, type(exc).__name__, f"request {request_id} failed: {exc!r}"
        )
        if isinstance(exc, LimitError):
            self.metrics.session_refused()
        return _error_reply(request_id, exc)

    def _with_said(self, reply: list[Any], said: Said, session: Session) -> list[Any]:
        """The reply, with what the envs said (which the log gets too)."""
        frame = self.relay.send(said, {"session": session.session_id.hex()})
        return reply if frame is None else add_said(reply, frame)

    def close(self) -> None:
        """Closes every session's envs and the socket."""
        self.sessions.close_all()
        self._socket.close(linger=1000)
        if self._curve is not None:
            self._curve.close()
        self.metrics.close()
        if self._own_context:
            self._context.term()
        self._inbox.close()
        logger.info("env host %s closed", self.endpoint)

    # -------------------------------------------------------------- commands

    def _commands(self) -> dict[Command, Entry]:
        """Every command's entry: its handler, and how the host reads it and answers it."""
        return {
            # Lease renewals, from a socket of their own: outside the request order.
            Command.HEARTBEAT: Entry(self._heartbeat, Body.IGNORED, cached=False, at_once=True),
            Command.PING: Entry(self._ping, Body.IGNORED, session=False),
            Command.HELLO: Entry(self._hello, session=False),
            Command.CLOSE: Entry(self._close, Body.IGNORED),
            Command.MAKE: Entry(self._make),
            Command.RESET: Entry(self._reset),
            Command.STEP: Entry(self._step),
            Command.STEP_RAW: Entry(self._step_raw, Body.FRAMES, raw_reply=True),
            Command.CALL: Entry(self._call),
            Command.SET_ATTR: Entry(self._set_attr),
            Command.RENDER: Entry(self._render),
            Command.WRAPPERS: Entry(self._wrappers),
        }

    def _host_info(self) -> HostInfo:
        """What this host is and holds now (PING's reply, and HELLO's)."""
        return HostInfo(
            name=self.name,
            pid=os.getpid(),
            instance=self.instance,
            envserver=__version__,
            protocol=PROTOCOL_VERSION,
            allow_pickle=self.config.allow_pickle,
            max_message_bytes=self.config.max_message_bytes,
            sessions=len(self.sessions),
            envs=self.sessions.envs_held(),
            session_lease_s=self.sessions.lease_s,
            uptime_s=round(time.monotonic() - self._started, 3),
            curve=self._curve is not None,
        )

    def _ping(self, session: None, body: Any) -> dict[str, Any]:
        return self._host_info().to_wire()

    def _hello(self, session: None, body: dict[str, Any]) -> dict[str, Any]:
        hello = Hello.from_wire(body)
        opened = self.sessions.open(
            hello.client, pickle=self.config.allow_pickle and hello.pickle, said=hello.said
        )
        return HelloReply(opened.session_id, self._host_info()).to_wire()

    def _heartbeat(self, session: Session, body: Any) -> dict[str, Any]:
        """The lease, and how many envs the session steps at once."""
        threads = None if session.block is None else session.block.env_threads
        return HeartbeatReply(self.sessions.lease_s, threads).to_wire()

    def _close(self, session: Session, body: Any) -> None:
        self.sessions.close(session)

    def _make(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        if session.block is not None:
            raise ProtocolError("this session already has envs")
        make = Make.from_wire(body, self.config.env_patterns)
        block = self._new_block(make)
        reply = self._made(session, block, make.obs_slab)
        session.block = block
        session.retry_window = make.retry_window
        count = block.num_envs
        logger.info(
            "session %s made %d env%s", session.session_id.hex(), count, "" if count == 1 else "s"
        )
        return reply.to_wire()

    def _new_block(self, make: Make) -> EnvBlock:
        """The envs MAKE asks for, within this host's limits, set to reset as it says."""
        factories = make.factories
        if factories is None:
            factories = [functools.partial(gym.make, make.env_id, **make.kwargs)] * make.num_envs
        self._check_env_limits(len(factories))
        most = self.config.max_env_threads
        threads = None if make.env_threads is None else min(make.env_threads, most)
        block = EnvBlock.make(factories, make.autoreset_mode, threads, most)
        if make.autoreset_pending:  # replacing lost envs: reset them on their next step
            block.mark_for_autoreset()
        if make.first_resets is not None:
            block.set_first_resets(make.first_resets)
        return block

    def _check_env_limits(self, count: int) -> None:
        if count > self.config.max_envs_per_session:
            raise LimitError(
                f"{count} envs asked, but this host allows at most "
                f"{self.config.max_envs_per_session} per session"
            )
        held = self.sessions.envs_held()
        if held + count > self.config.max_envs:
            raise LimitError(
                f"already holds {held} envs; {count} more would pass its maximum of "
                f"{self.config.max_envs}"
            )

    def _made(self, session: Session, block: EnvBlock, slab_name: str | None) -> MakeReply:
        """MAKE's reply: the envs' spaces, and how their steps travel.

        The envs are closed if a space cannot be sent. Steps travel in the session's step
        layout, with the observations in the client's slab if it offered one the host takes.
        """
        try:
            observation_spaces = [self._space(session, e.observation_space) for e in block.envs]
            action_spaces = [self._space(session, e.action_space) for e in block.envs]
            metadata = _encodable(dict(block.envs[0].metadata))
            render_mode, threads = block.envs[0].render_mode, block.env_threads
            threads_auto = block.concurrency.auto
        except Exception:
            block.close()
            raise
        layout = session.step_layout = StepLayout.shared_by(block.envs)
        slabbed = None
        if slab_name is not None:  # the client shares this machine: observations in its slab?
            slabbed = None if layout is None else layout.slab_for_host(slab_name, block.num_envs)
            session.step_layout = slabbed or layout
        return MakeReply(
            observation_spaces=observation_spaces,
            action_spaces=action_spaces,
            metadata=metadata,
            render_mode=render_mode,
            env_threads=threads,
            env_threads_auto=threads_auto,
            step_layout=None if layout is None else layout.describe(),
            slab_offered=slab_name is not None,
            obs_slab=None if slabbed is None else slabbed.slab.size,
        )

    def _space(self, session: Session, space: gym.Space) -> Any:
        try:
            return space_to_data(space)
        except UnsupportedSpaceError as exc:
            if session.pickle:
                return space  # travels pickled: both sides allowed it
            fix = (
                "give the client allow_pickle=True"
                if self.config.allow_pickle
                else "start the host with --allow-pickle and give the client allow_pickle=True"
            )
            raise UnsupportedSpaceError(
                f"{exc}: a user-defined space travels only pickled; {fix} (trusted networks only)"
            ) from None

    def _reset(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        reset = Reset.from_wire(body, session.num_envs)
        obs, infos = session.envs().reset(reset.seeds, reset.options, reset.env_ids)
        return ResetReply(obs, infos).to_wire()

    def _step(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        step = Step.from_wire(body, session.num_envs)
        obs, rewards, terminations, truncations, infos = self._stepped(
            session, session.envs(), step.actions, step.env_ids
        )
        if len(rewards) <= COLUMN_LIST_MAX:
            rewards, terminations = rewards.tolist(), terminations.tolist()
            truncations = truncations.tolist()
        return StepReply.wire(obs, rewards, terminations, truncations, infos)

    def _step_raw(self, session: Session, frames: list[Any]) -> list[Any]:
        """STEP with raw frames in the session's layout (see ``envserver.wire.raw``)."""
        block, layout = session.envs(), session.step_layout
        if layout is None:
            raise ProtocolError("this session's spaces have no step layout: send STEP")
        actions, env_ids = layout.read_request(frames, block.num_envs)
        out = None if env_ids is not None or layout.slab is None else layout.slab_batch()
        results = self._stepped(session, block, actions, env_ids, out)
        return layout.reply_frames(*results, allow_pickle=session.pickle, env_ids=env_ids)

    def _stepped(
        self, session: Session, block: EnvBlock, actions: Any, env_ids: Any, obs_out: Any = None
    ) -> tuple[Any, Any, Any, Any, Any]:
        """``EnvBlock.step`` (its arguments), counting the steps and noting a thread switch."""
        threads = block.env_threads
        results = block.step(actions, env_ids, obs_out)
        self.metrics.env_steps(len(results[1]))
        if block.env_threads != threads:
            self._threads_switched(session, block)
        return results

    def _threads_switched(self, session: Session, block: EnvBlock) -> None:
        self.metrics.env_threads_switched()
        logger.info(
            "session %s: its %d envs %s",
            session.session_id.hex(),
            block.num_envs,
            f"wait: now stepped {block.env_threads} at once on threads"
            if block.env_threads > 1
            else "compute: now stepped one after another",
        )

    def _call(self, session: Session, body: dict[str, Any]) -> list[Any]:
        call = Call.from_wire(body, session.num_envs)
        return session.envs().call(call.name, call.args, call.kwargs, call.env_ids)

    def _set_attr(self, session: Session, body: dict[str, Any]) -> None:
        set_attr = SetAttr.from_wire(body, session.num_envs)
        session.envs().set_attr(
            set_attr.name, set_attr.values, set_attr.env_ids, set_attr.outermost
        )

    def _render(self, session: Session, body: dict[str, Any]) -> list[Any]:
        return session.envs().render()

    def _wrappers(self, session: Session, body: dict[str, Any]) -> list[list[list[str]]]:
        """Each env's wrapper chain (see ``EnvBlock.wrappers``)."""
        wrappers = Wrappers.from_wire(body, session.num_envs)
        return session.envs().wrappers(wrappers.env_ids)


def _error_reply(
    request_id: int | None, exc: BaseException, env_index: int | None = None
) -> list[Any]:
    """The error reply describing ``exc``; one whose text will not encode keeps its type only."""
    body = error_body(exc, env_index)
    try:
        return encode_reply(request_id, Status.ERROR, body)
    except Exception:
        logger.exception("could not encode an error reply")
        return encode_reply(request_id, Status.ERROR, error_body(exc, env_index, texts=False))


def _encodable(metadata: dict[str, Any]) -> dict[str, Any]:
    """Keeps the metadata entries that travel without pickle; logs the others."""
    kept = {}
    for key, value in metadata.items():
        try:
            codec.encode([key, value])
        except TypeError:
            logger.debug("metadata entry %r does not travel without pickle; left out", key)
            continue
        kept[key] = value
    return kept
