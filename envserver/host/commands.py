"""What each command does on a host: the dispatch table and its handlers.

A handler gets the request's session and body, reads the body as its typed value
(:mod:`envserver.wire.bodies`), acts on the session's envs
(:class:`~envserver.host.worker.EnvBlock`) and returns the OK reply's body
(:mod:`envserver.wire.replies`). Everything around it (the session lookup, the retry cache, what
the envs say, errors, encoding) is the same for every command: the dispatch table says what
differs (:class:`~envserver.host.service.Entry`), :class:`~envserver.host.service.CommandService`
does it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Any

import gymnasium as gym

from envserver import __version__
from envserver.errors import HostUnavailableError, LimitError, ProtocolError, UnsupportedSpaceError
from envserver.host.config import HostConfig
from envserver.host.drain import Drain
from envserver.host.metrics import NoMetrics
from envserver.host.parallel import adapted, make_parallel_env
from envserver.host.registry import hinted, registered
from envserver.host.service import Body, Entry
from envserver.host.sessions import Session, SessionTable
from envserver.host.worker import EnvBlock, EnvCallError
from envserver.wire import codec
from envserver.wire.bodies import (
    PARALLEL,
    Call,
    Close,
    GetState,
    Hello,
    Make,
    Reset,
    SetAttr,
    SetState,
    Step,
    Wrappers,
)
from envserver.wire.channel import MOST_CHANNELS, Channel
from envserver.wire.messages import PROTOCOL_VERSION, Command, error_body
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

__all__ = ["HostCommands"]

logger = logging.getLogger(__name__)

#: Up to this many envs, a step's rewards and flags travel as plain lists, beyond as arrays:
#: for a few values a msgpack list costs less to encode and decode than an array extension;
#: for many, the array's raw bytes cost less than a list.
COLUMN_LIST_MAX = 64
#: The room a channel's reply area has beyond the observations of every env (its request
#: area a sixteenth of it beyond the actions): for info entries and other commands' replies.
CHANNEL_SPARE_BYTES = 1 << 20


class HostCommands:
    """The commands of one host, run on its sessions.

    Args:
        config: How the host serves (its pickle flag, env patterns and limits here).
        sessions: The host's sessions.
        metrics: What counts env steps and thread switches.
        name: The host's name (for the host info).
        instance: The random token that tells this host apart from others.
        curve: Whether the host requires CURVE.
        drain: The host's drain (HELLO refused and HEARTBEAT told while it drains).
    """

    def __init__(
        self,
        config: HostConfig,
        sessions: SessionTable,
        metrics: NoMetrics,
        *,
        name: str,
        instance: str,
        curve: bool,
        drain: Drain | None = None,
    ) -> None:
        self._config = config
        self._drain = drain or Drain(0.0)
        self._sessions = sessions
        self._metrics = metrics
        self._name = name
        self._instance = instance
        self._curve = curve
        self._started = time.monotonic()

    def table(self) -> dict[Command, Entry]:
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
            Command.GET_STATE: Entry(self._get_state),
            Command.SET_STATE: Entry(self._set_state),
        }

    def host_info(self) -> HostInfo:
        """What this host is and holds now (PING's reply, and HELLO's)."""
        return HostInfo(
            name=self._name,
            pid=os.getpid(),
            instance=self._instance,
            envserver=__version__,
            protocol=PROTOCOL_VERSION,
            allow_pickle=self._config.allow_pickle,
            max_message_bytes=self._config.max_message_bytes,
            sessions=len(self._sessions),
            envs=self._sessions.envs_held(),
            session_lease_s=self._sessions.lease_s,
            uptime_s=round(time.monotonic() - self._started, 3),
            curve=self._curve,
            slurm_job=os.environ.get("SLURM_JOB_ID", ""),
            max_envs=self._config.max_envs,
            max_envs_per_session=self._config.max_envs_per_session,
        )

    # ------------------------------------------------------------ sessions

    def _ping(self, session: None, body: Any) -> dict[str, Any]:
        return self.host_info().to_wire()

    def _hello(self, session: None, body: dict[str, Any]) -> dict[str, Any]:
        hello = Hello.from_wire(body)
        left = self._drain.remaining(time.monotonic())
        if left is not None:
            raise HostUnavailableError(
                f"this host is draining (it stops within {left:.0f} s): it opens no session"
            )
        opened = self._sessions.open(
            hello.client, pickle=self._config.allow_pickle and hello.pickle, said=hello.said
        )
        return HelloReply(opened.session_id, self.host_info()).to_wire()

    def _heartbeat(self, session: Session, body: Any) -> dict[str, Any]:
        """The lease, and how many envs the session steps at once."""
        threads = None if session.block is None else session.block.env_threads
        draining_s = self._drain.remaining(time.monotonic())
        return HeartbeatReply(self._sessions.lease_s, threads, draining_s).to_wire()

    def _close(self, session: Session, body: Any) -> None:
        """Closes the session, or only the envs a body ``{"env_ids": [...]}`` names."""
        if isinstance(body, dict) and body.get("env_ids") is not None:
            close = Close.from_wire(body, session.num_envs)
            session.envs().close_envs(close.env_ids)
            if self._drain.until is not None:
                self._metrics.envs_moved(len(close.env_ids))
            return
        if self._drain.until is not None and session.block is not None:
            self._metrics.envs_moved(session.block.open_envs)
        self._sessions.close(session)

    # ------------------------------------------------------------ making envs

    def _make(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        make = Make.from_wire(body, self._config.env_patterns)
        if session.block is not None:
            if not make.add:
                raise ProtocolError('this session already has envs (more: MAKE with "add")')
            return self._add(session, make).to_wire()
        block = self._new_block(make)
        try:
            reply = self._made(session, block, block.envs, make.obs_slab)
        except Exception:
            block.close()
            raise
        if make.channel is not None:
            reply = self._channels(session, reply, make, block.num_envs)
        session.block = block
        session.retry_window = make.retry_window
        if make.overlap:
            self._sessions.overlap(session)
        count = block.num_envs
        logger.info(
            "session %s made %d env%s", session.session_id.hex(), count, "" if count == 1 else "s"
        )
        return reply.to_wire()

    def _add(self, session: Session, make: Make) -> MakeReply:
        """MAKE with ``"add"`` on a session that has envs: more envs after them."""
        block = session.envs()
        if make.autoreset_mode != block.autoreset_mode:
            raise ProtocolError(
                f"the session's envs reset in mode {block.autoreset_mode.value}: "
                f"envs added to it cannot reset in mode {make.autoreset_mode.value}"
            )
        if session.channels or (
            session.step_layout is not None and session.step_layout.slab is not None
        ):
            raise ProtocolError("a session whose steps travel in shared memory cannot grow")
        factories = self._factories(make)
        self._check_env_limits(len(factories), block.open_envs)
        with registered(make.specs):
            added = block.extend(factories)
        session.retry_window = max(session.retry_window, make.retry_window)
        try:
            reply = self._made(session, block, [block.envs[i] for i in added], None)
        except Exception:
            block.close_envs(added)
            raise
        reply = dataclasses.replace(reply, first_env=added.start)
        logger.debug("session %s added %d env(s)", session.session_id.hex(), len(added))
        return reply

    def _new_block(self, make: Make) -> EnvBlock:
        """The envs MAKE asks for, within this host's limits, set to reset as it says."""
        factories = self._factories(make)
        self._check_env_limits(len(factories))
        most = self._config.max_env_threads
        threads = None if make.env_threads is None else min(make.env_threads, most)
        with registered(make.specs):
            block = EnvBlock.make(
                factories,
                make.autoreset_mode,
                threads,
                most,
                allow_pickle=self._config.allow_pickle,
                overlap=make.overlap,
            )
        if make.autoreset_pending:  # replacing lost envs: reset them on their next step
            block.mark_for_autoreset()
        if make.first_resets is not None:
            block.set_first_resets(make.first_resets)
        return block

    def _factories(self, make: Make) -> list[Any]:
        """What makes each env MAKE asks for (call them within ``registered(make.specs)``).

        The specs MAKE carries are Gymnasium's while the envs are made; without them, an id
        the host does not know fails with a hint on how to register it here.
        """
        factories, parallel = make.factories, make.kind == PARALLEL
        ids: list[str | None] = [None] * len(factories or ())  # a factory's id: unknown here
        if factories is None:
            ids = [env_id for env_id, _ in make.pairs()]
            if parallel:
                trusted = self._config.allow_pickle  # trusted with code: any callable
                factories = [
                    functools.partial(make_parallel_env, env_id, kwargs, any_callable=trusted)
                    for env_id, kwargs in make.pairs()
                ]
            else:
                factories = [functools.partial(gym.make, i, **kw) for i, kw in make.pairs()]
        elif parallel:  # pickled factories of Parallel envs: each env adapted as it is made
            factories = [functools.partial(adapted, factory) for factory in factories]
        if not parallel and not make.specs:
            factories = [hinted(factory, env_id) for factory, env_id in zip(factories, ids)]
        return list(factories)

    def _check_env_limits(self, count: int, held_by_session: int = 0) -> None:
        if held_by_session + count > self._config.max_envs_per_session:
            held = f" (the session holds {held_by_session})" if held_by_session else ""
            raise LimitError(
                f"{count} envs asked{held}, but this host allows at most "
                f"{self._config.max_envs_per_session} per session"
            )
        held = self._sessions.envs_held()
        if held + count > self._config.max_envs:
            raise LimitError(
                f"already holds {held} envs; {count} more would pass its maximum of "
                f"{self._config.max_envs}"
            )

    def _made(
        self, session: Session, block: EnvBlock, envs: list[Any], slab_name: str | None
    ) -> MakeReply:
        """MAKE's reply: the spaces of the envs made, and how their steps travel.

        Steps travel in the session's step layout, with the observations in the client's slab
        if it offered one the host takes.

        Raises:
            UnsupportedSpaceError: If a space cannot be sent (the caller closes the envs).
        """
        observation_spaces = [self._space(session, e.observation_space) for e in envs]
        action_spaces = [self._space(session, e.action_space) for e in envs]
        metadata = _encodable(dict(envs[0].metadata))
        render_mode, threads = envs[0].render_mode, block.env_threads
        threads_auto = block.concurrency.auto
        layout = session.step_layout = StepLayout.shared_by(envs)
        slabbed = None
        if slab_name is not None:  # the client shares this machine: observations in its slab?
            slabbed = None if layout is None else layout.slab_for_host(slab_name, len(envs))
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

    def _channels(self, session: Session, reply: MakeReply, make: Make, count: int) -> MakeReply:
        """MAKE's reply with the client's channels taken for the session, those that can be.

        Each one's request area holds a raw step of every env with room to spare, its reply
        area an observation of each with 1 MiB more (the file is sparse: pages cost only once
        used).
        """
        layout = session.step_layout
        actions = 0 if layout is None else (layout.action_bytes + 4) * count
        obs = 0 if layout is None else layout.obs_bytes * count
        spare = CHANNEL_SPARE_BYTES
        sizes = []
        for k, name in enumerate((make.channel, *make.more_channels)):
            channel = None
            if k < MOST_CHANNELS:  # (each costs two pipes: a bound per session)
                channel = Channel.for_host(name, spare // 16 + actions, spare + obs)
            if channel is not None:
                self._sessions.attach(session, channel)
            sizes.append(None if channel is None else len(channel))
        return dataclasses.replace(
            reply, channel_offered=True, channel=sizes[0], more_channels=tuple(sizes[1:])
        )

    def _space(self, session: Session, space: gym.Space) -> Any:
        try:
            return space_to_data(space)
        except UnsupportedSpaceError as exc:
            if session.pickle:
                return space  # travels pickled: both sides allowed it
            fix = (
                "give the client allow_pickle=True"
                if self._config.allow_pickle
                else "start the host with --allow-pickle and give the client allow_pickle=True"
            )
            raise UnsupportedSpaceError(
                f"{exc}: a user-defined space travels only pickled; {fix} (trusted networks only)"
            ) from None

    # ------------------------------------------------------------ using envs

    def _reset(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        reset = Reset.from_wire(body, session.num_envs)
        errors = [] if reset.env_errors else None
        obs, infos = session.envs().reset(reset.seeds, reset.options, reset.env_ids, errors)
        env_errors = None if errors is None else self._env_errors(session, errors)
        return ResetReply(obs, infos, env_errors).to_wire()

    def _step(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        step = Step.from_wire(body, session.num_envs)
        errors = [] if step.env_errors else None
        obs, rewards, terminations, truncations, infos = self._stepped(
            session, session.envs(), step.actions, step.env_ids, errors=errors
        )
        if len(rewards) <= COLUMN_LIST_MAX:
            rewards, terminations = rewards.tolist(), terminations.tolist()
            truncations = truncations.tolist()
        env_errors = None if errors is None else self._env_errors(session, errors)
        return StepReply.wire(obs, rewards, terminations, truncations, infos, env_errors)

    def _env_errors(self, session: Session, errors: list[EnvCallError]) -> list[Any]:
        """A reply's ``env_errors``, each failure logged and counted."""
        for failure in errors:
            logger.info(
                "session %s env %d raised %s: %s",
                session.session_id.hex(),
                failure.index,
                type(failure.error).__name__,
                failure.error,
            )
            self._metrics.env_error()
        return [[failure.index, error_body(failure.error, failure.index)] for failure in errors]

    def _step_raw(self, session: Session, frames: list[Any]) -> list[Any]:
        """STEP with raw frames in the session's layout (see ``envserver.wire.raw``)."""
        block, layout = session.envs(), session.step_layout
        if layout is None:
            raise ProtocolError("this session's spaces have no step layout: send STEP")
        actions, env_ids = layout.read_request(frames, block.num_envs)
        out = None if env_ids is not None or layout.slab is None else layout.slab_batch()
        results = self._stepped(session, block, actions, env_ids, out, checked=True)
        return layout.reply_frames(*results, allow_pickle=session.pickle, env_ids=env_ids)

    def _stepped(
        self,
        session: Session,
        block: EnvBlock,
        actions: Any,
        env_ids: Any,
        obs_out: Any = None,
        errors: list[EnvCallError] | None = None,
        *,
        checked: bool = False,
    ) -> tuple[Any, Any, Any, Any, Any]:
        """``EnvBlock.step`` (its arguments), counting the steps and noting a thread switch."""
        threads = block.concurrency.threads  # (attributes, not the env_threads property)
        results = block.step(actions, env_ids, obs_out, errors, checked=checked)
        self._metrics.env_steps(len(results[1]))
        if block.concurrency.threads != threads:
            self._threads_switched(session, block)
        return results

    def _threads_switched(self, session: Session, block: EnvBlock) -> None:
        self._metrics.env_threads_switched()
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

    def _get_state(self, session: Session, body: dict[str, Any]) -> list[bytes]:
        """A snapshot of each env (see ``EnvBlock.get_states``)."""
        get = GetState.from_wire(body, session.num_envs)
        return session.envs().get_states(get.env_ids)

    def _set_state(self, session: Session, body: dict[str, Any]) -> list[list[Any]]:
        """Each env restored, and its values of the snapshot's moment (``EnvBlock.set_states``)."""
        put = SetState.from_wire(body, session.num_envs)
        return session.envs().set_states(put.states, put.env_ids)


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
