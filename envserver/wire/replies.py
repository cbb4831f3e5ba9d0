"""The OK reply body of each command a client reads by key, as a small typed value.

A host builds a reply body with ``to_wire()`` and a client may read it with ``from_wire()``;
the requests' bodies, and which reply answers which command, are :mod:`envserver.wire.bodies`'.
A ``from_wire()`` checks the keys a client relies on (their presence and types), ignores keys it
does not know, and raises :class:`~envserver.errors.ProtocolError` for a reply that does not fit
its command: the client must not trust that host's later replies. What only the reader can check
(observations against the spaces, the columns' lengths) stays the reader's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envserver.errors import ProtocolError

__all__ = ["HeartbeatReply", "HelloReply", "HostInfo", "MakeReply", "ResetReply", "StepReply"]


def _map(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} must be a map, got {body!r:.200}")
    return body


def _get(body: dict[str, Any], key: str, what: str, fits: Callable[[Any], bool]) -> Any:
    """``body[key]`` if it is there and ``fits``; ProtocolError otherwise."""
    if key not in body or not fits(body[key]):
        raise ProtocolError(f"{what}: {key!r} is missing or of the wrong type")
    return body[key]


def _is_int(value: Any) -> bool:
    return type(value) is int  # what msgpack decodes: int or bool, never another subclass


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_bool(value: Any) -> bool:
    return type(value) is bool


@dataclass(frozen=True, slots=True)
class HostInfo:
    """A host's description: PING's reply, and HELLO's with the session.

    Attributes:
        name: The host's name (its endpoint unless named).
        pid: Its process id.
        instance: A random token per host process (tells hosts apart where pids repeat).
        envserver: Its package version.
        protocol: Its protocol version.
        allow_pickle: Whether it accepts pickled values (its flag, not a session's).
        max_message_bytes: The largest request it accepts, all frames together.
        sessions: How many sessions it holds.
        envs: How many envs all its sessions hold.
        session_lease_s: Its session lease (0: none).
        uptime_s: Seconds since it started.
        curve: Whether it requires CURVE.
        slurm_job: The Slurm job it runs in (its ``SLURM_JOB_ID``; empty outside one): a
            trainer takes the hosts of its own job only from the nodes of its job.
        max_envs: The most envs it holds, all sessions together (0: it does not say).
        max_envs_per_session: The most envs one session may hold there (0: it does not say).
    """

    name: str
    pid: int
    instance: str
    envserver: str
    protocol: int
    allow_pickle: bool
    max_message_bytes: int
    sessions: int
    envs: int
    session_lease_s: float
    uptime_s: float
    curve: bool
    slurm_job: str = ""
    max_envs: int = 0
    max_envs_per_session: int = 0

    @classmethod
    def from_wire(cls, body: Any) -> HostInfo:
        """Reads a host info (keys it does not know are ignored).

        Raises:
            ProtocolError: If it is not a map, or a key is missing or of the wrong type.
        """
        info, what = _map(body, "the host info"), "the host info"
        return cls(
            _get(info, "name", what, _is_str),
            _get(info, "pid", what, _is_int),
            _get(info, "instance", what, _is_str),
            _get(info, "envserver", what, _is_str),
            _get(info, "protocol", what, _is_int),
            _get(info, "allow_pickle", what, _is_bool),
            _get(info, "max_message_bytes", what, _is_int),
            _get(info, "sessions", what, _is_int),
            _get(info, "envs", what, _is_int),
            _get(info, "session_lease_s", what, _is_number),
            _get(info, "uptime_s", what, _is_number),
            _get(info, "curve", what, _is_bool),
            _get(info, "slurm_job", what, _is_str) if "slurm_job" in info else "",
            _get(info, "max_envs", what, _is_int) if "max_envs" in info else 0,
            _get(info, "max_envs_per_session", what, _is_int)
            if "max_envs_per_session" in info
            else 0,
        )

    def to_wire(self) -> dict[str, Any]:
        """The body a host sends (``slurm_job`` only in a Slurm job, limits only when said)."""
        body = {
            "name": self.name,
            "pid": self.pid,
            "instance": self.instance,
            "envserver": self.envserver,
            "protocol": self.protocol,
            "allow_pickle": self.allow_pickle,
            "max_message_bytes": self.max_message_bytes,
            "sessions": self.sessions,
            "envs": self.envs,
            "session_lease_s": self.session_lease_s,
            "uptime_s": self.uptime_s,
            "curve": self.curve,
        }
        if self.slurm_job:
            body["slurm_job"] = self.slurm_job
        if self.max_envs:
            body["max_envs"] = self.max_envs
        if self.max_envs_per_session:
            body["max_envs_per_session"] = self.max_envs_per_session
        return body


@dataclass(frozen=True, slots=True)
class HelloReply:
    """HELLO's reply: the session opened, and the host info.

    Attributes:
        session: The session id every later request carries.
        info: The host info (its ``sessions`` count includes this session).
    """

    session: bytes
    info: HostInfo

    @classmethod
    def from_wire(cls, body: Any) -> HelloReply:
        """Reads a HELLO reply.

        Raises:
            ProtocolError: If it has no session id (bin), or its host info is not one.
        """
        reply = _map(body, "the HELLO reply")
        session = _get(reply, "session", "the HELLO reply", lambda v: type(v) is bytes)
        return cls(session, HostInfo.from_wire(reply))

    def to_wire(self) -> dict[str, Any]:
        """The body a host sends: the session first, then the host info."""
        return {"session": self.session, **self.info.to_wire()}


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """HEARTBEAT's reply: the lease, how many envs the session steps at once, and a drain.

    Attributes:
        session_lease_s: The host's session lease (0: none).
        env_threads: How many of the session's envs the host steps at once (None: it has no
            envs yet).
        draining_s: While the host drains: the seconds left before it stops (its client is to
            move the session's envs elsewhere and close it). None: it does not drain.
    """

    session_lease_s: float
    env_threads: int | None = None
    draining_s: float | None = None

    @classmethod
    def from_wire(cls, body: Any) -> HeartbeatReply:
        """Reads a HEARTBEAT reply.

        Raises:
            ProtocolError: If the lease is not a number of at least 0, or ``env_threads`` is
                there and not a positive integer.
        """
        reply, what = _map(body, "the HEARTBEAT reply"), "the HEARTBEAT reply"
        lease = _get(reply, "session_lease_s", what, lambda v: _is_number(v) and v >= 0)
        threads = draining = None
        if "env_threads" in reply:
            threads = _get(reply, "env_threads", what, lambda v: _is_int(v) and v >= 1)
        if "draining_s" in reply:
            draining = float(_get(reply, "draining_s", what, lambda v: _is_number(v) and v >= 0))
        return cls(float(lease), threads, draining)

    def to_wire(self) -> dict[str, Any]:
        """The body a host sends (``env_threads`` only for a session that has envs)."""
        reply: dict[str, Any] = {"session_lease_s": self.session_lease_s}
        if self.env_threads is not None:
            reply["env_threads"] = self.env_threads
        if self.draining_s is not None:
            reply["draining_s"] = self.draining_s
        return reply


@dataclass(frozen=True, slots=True)
class MakeReply:
    """MAKE's reply: the envs' spaces and how the host serves them.

    Attributes:
        observation_spaces: Each env's observation space, as plain data (or pickled).
        action_spaces: Each env's action space, likewise.
        metadata: Env 0's metadata (the entries that travel without pickle).
        render_mode: Env 0's render mode.
        env_threads: How many envs the host steps at once (1: one after another).
        env_threads_auto: Whether the host chooses that number.
        step_layout: The session's raw step layout (``StepLayout.describe``), or None.
        slab_offered: Whether MAKE offered an observation slab (only then is ``obs_slab``
            in the reply).
        obs_slab: The slab's size in bytes if the host took it, else None.
        channel_offered: Whether MAKE offered a channel (only then is ``channel`` in the
            reply).
        channel: The channel's size in bytes if the host took it, else None.
        more_channels: For each more channel MAKE offered, its size in bytes if the host
            took it, else None (in the order offered; empty if none was offered).
        first_env: The index in the session of the first env made (0 but for a MAKE that
            adds envs; the others follow it).
    """

    observation_spaces: list[Any]
    action_spaces: list[Any]
    metadata: dict[str, Any]
    render_mode: str | None
    env_threads: int
    env_threads_auto: bool
    step_layout: dict[str, Any] | None
    slab_offered: bool = False
    obs_slab: int | None = None
    channel_offered: bool = False
    channel: int | None = None
    first_env: int = 0
    more_channels: tuple[int | None, ...] = ()

    @classmethod
    def from_wire(cls, body: Any) -> MakeReply:
        """Reads a MAKE reply (the spaces stay plain data: ``space_from_data`` reads them).

        Raises:
            ProtocolError: If it is not a map, or a key is missing or of the wrong type.
        """
        reply, what = _map(body, "the MAKE reply"), "the MAKE reply"
        slab_offered, channel_offered = "obs_slab" in reply, "channel" in reply
        return cls(
            _get(reply, "observation_spaces", what, lambda v: isinstance(v, list)),
            _get(reply, "action_spaces", what, lambda v: isinstance(v, list)),
            _get(reply, "metadata", what, lambda v: isinstance(v, dict)),
            _get(reply, "render_mode", what, lambda v: v is None or _is_str(v)),
            _get(reply, "env_threads", what, _is_int),
            _get(reply, "env_threads_auto", what, _is_bool),
            _get(reply, "step_layout", what, lambda v: v is None or isinstance(v, dict)),
            slab_offered,
            _get(reply, "obs_slab", what, lambda v: v is None or _is_int(v))
            if slab_offered
            else None,
            channel_offered,
            _get(reply, "channel", what, lambda v: v is None or _is_int(v))
            if channel_offered
            else None,
            _get(reply, "first_env", what, lambda v: _is_int(v) and v >= 0)
            if "first_env" in reply
            else 0,
            tuple(_get(reply, "more_channels", what, _sizes) if "more_channels" in reply else ()),
        )

    def to_wire(self) -> dict[str, Any]:
        """The body a host sends (``obs_slab``, ``channel`` only when MAKE offered them)."""
        reply = {
            "observation_spaces": self.observation_spaces,
            "action_spaces": self.action_spaces,
            "metadata": self.metadata,
            "render_mode": self.render_mode,
            "env_threads": self.env_threads,
            "env_threads_auto": self.env_threads_auto,
            "step_layout": self.step_layout,
        }
        if self.slab_offered:
            reply["obs_slab"] = self.obs_slab
        if self.channel_offered:
            reply["channel"] = self.channel
        if self.first_env:
            reply["first_env"] = self.first_env
        if self.more_channels:
            reply["more_channels"] = list(self.more_channels)
        return reply


def _sizes(value: Any) -> bool:
    """Whether ``value`` is a list of sizes in bytes, each possibly None."""
    return isinstance(value, list) and all(v is None or _is_int(v) for v in value)


def _env_errors(reply: dict[str, Any], what: str) -> list[Any] | None:
    """A reply's ``env_errors``: ``[[env index, error body (a map)], ...]``, or None if absent.

    Raises:
        ProtocolError: If it is there and not of that shape.
    """
    errors = reply.get("env_errors")
    if errors is None:
        return None
    if not isinstance(errors, list) or not all(
        isinstance(e, list) and len(e) == 2 and _is_int(e[0]) and isinstance(e[1], dict)
        for e in errors
    ):
        raise ProtocolError(f"{what}: env_errors must be [[env index, error map], ...]")
    return errors


@dataclass(frozen=True, slots=True)
class ResetReply:
    """RESET's reply.

    Attributes:
        obs: The batch of the new observations of the envs reset.
        infos: Their info entries (``[[env index, info], ...]``).
        env_errors: For a RESET with ``env_errors``: ``[[env index, error body], ...]`` of the
            envs that raised (their observations in ``obs`` are their last ones); else None.
    """

    obs: Any
    infos: list[Any]
    env_errors: list[Any] | None = None

    @classmethod
    def from_wire(cls, body: Any) -> ResetReply:
        """Reads a RESET reply (the observations are checked against the spaces by the reader).

        Raises:
            ProtocolError: If it is not a map of ``obs`` and ``infos`` (a list).
        """
        reply, what = _map(body, "the RESET reply"), "the RESET reply"
        return cls(
            _get(reply, "obs", what, lambda v: True),
            _get(reply, "infos", what, lambda v: isinstance(v, list)),
            _env_errors(reply, what),
        )

    def to_wire(self) -> dict[str, Any]:
        """The body a host sends."""
        body = {"obs": self.obs, "infos": self.infos}
        if self.env_errors is not None:
            body["env_errors"] = self.env_errors
        return body


@dataclass(frozen=True, slots=True)
class StepReply:
    """STEP's reply.

    Attributes:
        obs: The batch of the new observations of the envs stepped.
        rewards: Their rewards (float64): a list or an array.
        terminations: Their terminations (bool): a list or an array.
        truncations: Their truncations (bool): a list or an array.
        infos: Their info entries (``[[env index, info], ...]``).
        env_errors: For a STEP with ``env_errors``: ``[[env index, error body], ...]`` of the
            envs that raised (their values in the batches are not results); else None.
    """

    obs: Any
    rewards: Any
    terminations: Any
    truncations: Any
    infos: list[Any]
    env_errors: list[Any] | None = None

    @classmethod
    def from_wire(cls, body: Any) -> StepReply:
        """Reads a STEP reply (the columns' types and lengths are the reader's to check).

        Raises:
            ProtocolError: If it is not a map of the five keys (``infos`` a list).
        """
        reply, what = _map(body, "the STEP reply"), "the STEP reply"
        return cls(
            _get(reply, "obs", what, lambda v: True),
            _get(reply, "rewards", what, lambda v: True),
            _get(reply, "terminations", what, lambda v: True),
            _get(reply, "truncations", what, lambda v: True),
            _get(reply, "infos", what, lambda v: isinstance(v, list)),
            _env_errors(reply, what),
        )

    @staticmethod
    def wire(
        obs: Any,
        rewards: Any,
        terminations: Any,
        truncations: Any,
        infos: Any,
        env_errors: list[Any] | None = None,
    ) -> dict[str, Any]:
        """The body a host sends, from the values without a :class:`StepReply` (the hot path)."""
        body = {
            "obs": obs,
            "rewards": rewards,
            "terminations": terminations,
            "truncations": truncations,
            "infos": infos,
        }
        if env_errors is not None:
            body["env_errors"] = env_errors
        return body

    def to_wire(self) -> dict[str, Any]:
        """The body a host sends."""
        return self.wire(
            self.obs,
            self.rewards,
            self.terminations,
            self.truncations,
            self.infos,
            self.env_errors,
        )
