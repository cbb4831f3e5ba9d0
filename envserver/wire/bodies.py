"""The request body of each command, as a small typed value: what a client sends, checked.

A client builds a body with ``to_wire()`` and a host reads it with ``from_wire()``; the replies'
bodies are :mod:`envserver.wire.replies`'. The keys of every body are written in these two
modules and nowhere else in the code (``docs/protocol.md`` is their prose). A ``to_wire()``
leaves out an optional key the way the reference client does: absent where the value is the
default.

=============  ====================  ===========================================
Command        Request body          OK reply body (:mod:`~envserver.wire.replies`)
=============  ====================  ===========================================
HELLO          :class:`Hello`        ``HelloReply`` (a ``HostInfo`` and the session)
MAKE           :class:`Make`         ``MakeReply``
RESET          :class:`Reset`        ``ResetReply``
STEP           :class:`Step`         ``StepReply``
CALL           :class:`Call`         one result per env
SET_ATTR       :class:`SetAttr`      nil
WRAPPERS       :class:`EnvIds`       one wrapper chain per env
GET_STATE      :class:`EnvIds`       one snapshot (bytes) per env
SET_STATE      :class:`SetState`     one ``[obs, info, ended]`` per env
PING           ignored               ``HostInfo``
HEARTBEAT      ignored               ``HeartbeatReply``
RENDER         :class:`Empty`        one frame per env
CLOSE          ignored               nil
=============  ====================  ===========================================

STEP_RAW's frames are not a body: :mod:`envserver.wire.raw` reads and writes them.

Every value read comes from a peer: each is checked, and a bad one raises
:class:`~envserver.errors.ProtocolError` (or the error the protocol names), which a host answers
as an error reply. A body arrives as a map (the host checks that first). Where a check needs
what only the host knows, the reader takes it as an argument: the env-id patterns it serves
(MAKE), and the number of envs a request may address, asked through a callable where the checks
come to it (a host's raises for a session without envs, so a request with several defects is
refused for the one it always was).
"""

from __future__ import annotations

import fnmatch
import logging
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from envserver.errors import EnvNotAllowedError, ProtocolError
from envserver.wire.messages import MAX_RETRY_WINDOW
from envserver.wire.slab import check_name

__all__ = [
    "GYM",
    "KINDS",
    "PARALLEL",
    "Call",
    "Close",
    "Empty",
    "EnvIds",
    "EnvSpecs",
    "FirstReset",
    "GetState",
    "Hello",
    "MainEntryPoint",
    "Make",
    "NumEnvs",
    "RequestBody",
    "Reset",
    "SetAttr",
    "SetState",
    "Step",
    "Wrappers",
]

logger = logging.getLogger(__name__)

#: The number of envs a request may address: asked once its body's checks need it.
NumEnvs = Callable[[], int]
#: MAKE's ``kind``: Gymnasium envs (the default), or PettingZoo Parallel envs.
GYM, PARALLEL = "gym", "parallel"
KINDS = (GYM, PARALLEL)
#: The seed and options of an env's first reset (MAKE's ``first_resets``).
FirstReset = tuple[int | None, dict[str, Any] | None]
#: The env id and kwargs of one env (MAKE's ``envs``).
EnvMade = tuple[str, dict[str, Any]]


def _env_ids(body: dict[str, Any], num_envs: int) -> list[int] | None:
    """Reads the optional ``env_ids`` of a request: distinct env indices of the block."""
    env_ids = body.get("env_ids")
    if env_ids is None:
        return None
    if (
        not isinstance(env_ids, list)
        or not env_ids
        or not all(type(i) is int and 0 <= i < num_envs for i in env_ids)
        or len(set(env_ids)) != len(env_ids)
    ):
        raise ProtocolError(
            f"env_ids must be a non-empty list of distinct env indices below {num_envs}"
        )
    return env_ids


def _env_errors(body: dict[str, Any]) -> bool:
    """Reads the ``env_errors`` of a STEP or RESET that has one (a bool); callers look first."""
    value = body["env_errors"]
    if type(value) is not bool:
        raise ProtocolError("env_errors must be a boolean")
    return value


def _with_env_ids(body: dict[str, Any], env_ids: list[int] | None) -> dict[str, Any]:
    """``body`` with ``env_ids`` last, unless it addresses every env (None: left out)."""
    if env_ids is not None:
        body["env_ids"] = env_ids
    return body


def _is_seed(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _first_resets(value: Any, num_envs: int) -> tuple[FirstReset, ...]:
    """MAKE's ``first_resets``: one ``[seed, options]`` per env, checked."""
    if not isinstance(value, list) or len(value) != num_envs:
        raise ProtocolError(f"first_resets must be a list of {num_envs} [seed, options] pairs")
    resets = []
    for item in value:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ProtocolError("each of first_resets must be a [seed, options] pair")
        seed, options = item
        if not _is_seed(seed):
            raise ProtocolError("a first_resets seed must be an integer or nil")
        if options is not None and not isinstance(options, dict):
            raise ProtocolError("first_resets options must be a map or nil")
        resets.append((seed, options))
    return tuple(resets)


def _envs(value: Any, env_patterns: Sequence[str]) -> tuple[EnvMade, ...]:
    """MAKE's ``envs``: one ``[env_id, kwargs]`` per env, each id one the host serves."""
    if not isinstance(value, list) or not value:
        raise ProtocolError("envs must be a non-empty list of [env_id, kwargs] pairs")
    envs = []
    for item in value:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], dict)
        ):
            raise ProtocolError("each of envs must be an [env_id string, kwargs map] pair")
        envs.append((_served(item[0], env_patterns), item[1]))
    return tuple(envs)


def _served(env_id: str, env_patterns: Sequence[str]) -> str:
    """``env_id``, if it matches one of the host's patterns."""
    if not any(fnmatch.fnmatchcase(env_id, p) for p in env_patterns):
        raise EnvNotAllowedError(
            f"this host does not serve {env_id!r}: allowed patterns are {list(env_patterns)}"
        )
    return env_id


@dataclass(frozen=True, slots=True)
class Hello:
    """HELLO: open a session.

    Attributes:
        client: A label for the host's logs.
        pickle: Whether replies may carry pickled values (if the host allows pickle).
        said: Whether replies carry what the envs said (only ``true`` counts).
    """

    client: str = ""
    pickle: bool = False
    said: bool = False

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> Hello:
        """Reads a HELLO body (a map); nothing in it is refused."""
        return cls(
            str(body.get("client", "")), bool(body.get("pickle", False)), body.get("said") is True
        )

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends."""
        return {"client": self.client, "pickle": self.pickle, "said": self.said}


@dataclass(frozen=True)
class EnvSpecs:
    """MAKE's ``specs``: env specs, sent as one pickled value that holds each spec's own pickle.

    Each spec is read back on its own, and one the host cannot read (its entry point's module is
    not importable there, say) is left out: a factory's envs may use any spec the trainer
    registered, and one they never use must not refuse their MAKE. A spec that cannot be
    pickled stays behind likewise (the host then says how to register it).
    """

    specs: tuple[EnvSpec, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        pickles = []
        for spec in self.specs:
            try:
                pickles.append(cloudpickle.dumps(spec))
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                logger.debug("the spec of %s cannot travel to the hosts: %s", spec.id, exc)
        return _readable_specs, (tuple(pickles),)


def _readable_specs(pickles: tuple[bytes, ...]) -> EnvSpecs:
    """The specs of ``pickles`` this process can read.

    Called as MAKE's pickled value is read: only where pickle is allowed.
    """
    specs = []
    for data in pickles:
        try:
            specs.append(cloudpickle.loads(data))
        except Exception as exc:  # any error of the spec's own code
            logger.debug(
                "a spec the trainer sent cannot be read here: %s: %s", type(exc).__name__, exc
            )
    return EnvSpecs(tuple(specs))


class MainEntryPoint(str):
    """A spec's entry point ``"__main__:Name"``, with the trainer's callable it names.

    In MAKE's ``specs``: it reads as the text in the envs' specs (as the trainer's spec has it),
    and ``gymnasium.make`` calls it, as it would call the callable on the trainer.
    """

    creator: Callable[..., Any]

    def __new__(cls, text: str, creator: Callable[..., Any]) -> MainEntryPoint:
        """The entry point ``text``, which makes envs with ``creator``."""
        entry_point = super().__new__(cls, text)
        entry_point.creator = creator
        return entry_point

    def __call__(self, **kwargs: Any) -> Any:
        """An env, made by the creator."""
        return self.creator(**kwargs)

    def __getattr__(self, name: str) -> Any:  # metadata: gymnasium.make reads the creator's
        if name == "metadata":
            return self.creator.metadata
        raise AttributeError(name)

    def __reduce__(self) -> tuple[Any, ...]:
        return MainEntryPoint, (str(self), self.creator)


@dataclass(frozen=True, slots=True)
class Make:
    """MAKE: create the session's envs, from an env id or from factories.

    Attributes:
        autoreset_mode: How finished envs are reset.
        num_envs: How many envs (one per factory when there are factories).
        env_id: The env id each env is ``gymnasium.make``'d from (None: from factories); for
            Parallel envs, the ``package.module[:callable]`` that makes one.
        kwargs: The keyword arguments of ``gymnasium.make`` (or of that callable).
        factories: One callable per env (they travel pickled), or None.
        env_threads: Step up to this many envs at once (None: the host chooses).
        retry_window: How many of the latest replies the host keeps for retries.
        autoreset_pending: Whether every new env is reset on its first step (lost envs
            replaced).
        first_resets: The seed and options of each env's first reset, or None.
        obs_slab: The name of the observation slab the client offers, or None.
        channel: The name of the channel the client offers (:mod:`envserver.wire.channel`),
            or None.
        more_channels: The names of more channels it offers beside ``channel``, for the
            requests it has under way at once beyond the first (at most ``retry_window - 1``).
        kind: What the envs are: :data:`GYM` envs, or :data:`PARALLEL` (PettingZoo Parallel
            envs, each served as one env in the agents layout, :mod:`envserver.wire.agents`).
        envs: Each env's own id and kwargs (envs that differ), in place of ``env_id`` and
            ``kwargs``; or None.
        specs: Env specs (they travel pickled) that ``gymnasium.make`` finds while these envs
            are made, in place of the host's specs of the same ids: what the trainer
            registered.
        add: Whether the envs are added to those the session holds (a session that grows,
            one env at a time: the agent-loop pool's), rather than its first ones.
        overlap: Whether the session's steps and resets run on threads, overlapping (a
            session's first MAKE only).
    """

    autoreset_mode: AutoresetMode
    num_envs: int
    env_id: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    factories: list[Callable[[], Any]] | None = None
    env_threads: int | None = None
    retry_window: int = 1
    autoreset_pending: bool = False
    first_resets: tuple[FirstReset, ...] | None = None
    obs_slab: str | None = None
    kind: str = GYM
    envs: tuple[EnvMade, ...] | None = None
    specs: tuple[EnvSpec, ...] = ()
    channel: str | None = None
    add: bool = False
    overlap: bool = False
    more_channels: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, body: dict[str, Any], env_patterns: Sequence[str]) -> Make:
        """Reads a MAKE body (a map).

        Args:
            body: The body.
            env_patterns: The ``fnmatch`` patterns of the env ids the host serves (they do
                not apply to factories).

        Raises:
            ProtocolError: If a value is missing or of the wrong type.
            ValueError: If the autoreset mode is not one of Gymnasium's.
            EnvNotAllowedError: If the env id matches none of ``env_patterns``.
        """
        mode = AutoresetMode(body.get("autoreset_mode", AutoresetMode.NEXT_STEP.value))
        kind = body.get("kind", GYM)
        if kind not in KINDS:
            raise ProtocolError(f"kind must be one of {list(KINDS)}, got {kind!r}")
        env_id, kwargs, factories = None, {}, body.get("factories")
        envs = None if body.get("envs") is None else _envs(body["envs"], env_patterns)
        if factories is not None:
            if not isinstance(factories, list) or not factories:
                raise ProtocolError("factories must be a non-empty list")
            if not all(callable(f) for f in factories):
                raise ProtocolError("every factory must be callable")
            num_envs = len(factories)
        elif envs is not None:
            num_envs = len(envs)
        else:
            env_id, kwargs, num_envs = (
                body.get("env_id"),
                body.get("kwargs") or {},
                body.get("num_envs"),
            )
            if not isinstance(env_id, str) or not isinstance(kwargs, dict):
                raise ProtocolError("MAKE needs an env_id string and a kwargs map, or factories")
            if not isinstance(num_envs, int) or num_envs < 1:
                raise ProtocolError("num_envs must be a positive integer")
            num_envs = int(num_envs)  # (a bool is an int: true is 1)
            _served(env_id, env_patterns)
        specs = body.get("specs", EnvSpecs(()))  # pickled: only where the host allows pickle
        if not (
            isinstance(specs, EnvSpecs)
            and isinstance(specs.specs, tuple)
            and all(isinstance(x, EnvSpec) for x in specs.specs)
        ):
            raise ProtocolError("specs must be EnvSpecs of gymnasium EnvSpecs")
        threads = body.get("env_threads")  # the trainer's wish, within the host's cap
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ProtocolError("env_threads must be a positive integer, or absent (automatic)")
        first_resets = body.get("first_resets")
        if first_resets is not None:
            first_resets = _first_resets(first_resets, num_envs)
        obs_slab = None if "obs_slab" not in body else check_name(body["obs_slab"])
        channel = None if "channel" not in body else check_name(body["channel"], "chan")
        window = body.get("retry_window", 1)  # requests the client may have under way at once
        if type(window) is not int or not 1 <= window <= MAX_RETRY_WINDOW:
            raise ProtocolError(f"retry_window must be an integer from 1 to {MAX_RETRY_WINDOW}")
        more = body.get("more_channels", [])
        if not isinstance(more, list) or len(more) >= window or (more and channel is None):
            raise ProtocolError(
                "more_channels must be a list of at most retry_window - 1 channel names, "
                "beside a channel"
            )
        more = tuple(check_name(name, "chan") for name in more)
        add, overlap = body.get("add", False), body.get("overlap", False)
        if type(add) is not bool or type(overlap) is not bool:
            raise ProtocolError("add and overlap must be booleans")
        if overlap and channel is not None:
            raise ProtocolError("a session that overlaps takes no channel")
        if add:
            keys = ("obs_slab", "channel", "more_channels", "first_resets", "autoreset_pending")
            given = [key for key in keys if key in body]
            if given:
                raise ProtocolError(f"a MAKE that adds envs takes no {', '.join(given)}")
        return cls(
            mode,
            num_envs,
            env_id,
            kwargs,
            factories,
            threads,
            window,
            bool(body.get("autoreset_pending")),
            first_resets,
            obs_slab,
            kind,
            envs,
            tuple(specs.specs),
            channel,
            add,
            overlap,
            more,
        )

    def pairs(self) -> list[EnvMade]:
        """Each env's id and kwargs (for a MAKE without factories)."""
        if self.envs is not None:
            return list(self.envs)
        return [(self.env_id, self.kwargs)] * self.num_envs

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends: optional keys only where their value is not the default."""
        body: dict[str, Any] = {"autoreset_mode": self.autoreset_mode.value}
        if self.kind != GYM:
            body["kind"] = self.kind
        if self.env_threads is not None:  # absent: the host chooses
            body["env_threads"] = self.env_threads
        if self.factories is not None:
            body["factories"] = list(self.factories)
        elif self.envs is not None:
            body["envs"] = [[env_id, kwargs] for env_id, kwargs in self.envs]
        else:
            body.update(env_id=self.env_id, kwargs=self.kwargs, num_envs=self.num_envs)
        if self.specs:
            body["specs"] = EnvSpecs(self.specs)
        if self.retry_window != 1:
            body["retry_window"] = self.retry_window
        if self.autoreset_pending:
            body["autoreset_pending"] = True
        if self.first_resets is not None:
            body["first_resets"] = [[seed, options] for seed, options in self.first_resets]
        if self.obs_slab is not None:
            body["obs_slab"] = self.obs_slab
        if self.channel is not None:
            body["channel"] = self.channel
        if self.more_channels:
            body["more_channels"] = list(self.more_channels)
        if self.add:
            body["add"] = True
        if self.overlap:
            body["overlap"] = True
        return body


@dataclass(frozen=True, slots=True)
class Reset:
    """RESET: reset envs.

    Attributes:
        seeds: One seed (an integer or None) per env reset.
        options: The options of every env's reset, or None.
        env_ids: The envs reset, in order (None: every env of the block).
        env_errors: Whether an env that raises is reported in the reply, beside the others'
            results, rather than failing the request.
    """

    seeds: list[int | None]
    options: dict[str, Any] | None = None
    env_ids: list[int] | None = None
    env_errors: bool = False

    @classmethod
    def from_wire(cls, body: dict[str, Any], num_envs: NumEnvs) -> Reset:
        """Reads a RESET body (a map) for a block of ``num_envs()`` envs.

        Raises:
            ProtocolError: If the env ids, the seeds or the options are not as above.
        """
        count = num_envs()
        env_ids = _env_ids(body, count)
        if env_ids is not None:
            count = len(env_ids)
        seeds = body.get("seeds")
        options = body.get("options")
        if not isinstance(seeds, list) or len(seeds) != count:
            raise ProtocolError(f"seeds must be a list of {count} items, one per env reset")
        if not all(_is_seed(s) for s in seeds):
            raise ProtocolError("each seed must be an integer or nil")
        if options is not None and not isinstance(options, dict):
            raise ProtocolError("options must be a map or nil")
        return cls(seeds, options, env_ids, "env_errors" in body and _env_errors(body))

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends."""
        body = _with_env_ids({"seeds": self.seeds, "options": self.options}, self.env_ids)
        if self.env_errors:
            body["env_errors"] = True
        return body


@dataclass(frozen=True, slots=True)
class Step:
    """STEP: step envs.

    Attributes:
        actions: The batched actions of the envs stepped.
        env_ids: The envs stepped, in order (None: every env of the block).
        env_errors: Whether every env is stepped and one that raises is reported in the
            reply, beside the others' results, rather than failing the request.
    """

    actions: Any
    env_ids: list[int] | None = None
    env_errors: bool = False

    @classmethod
    def from_wire(cls, body: dict[str, Any], num_envs: NumEnvs) -> Step:
        """Reads a STEP body (a map) for a block of ``num_envs()`` envs.

        ``num_envs`` is asked first (a session without envs is refused before its body is
        read); the actions are checked against the envs' space when they are stepped.

        Raises:
            ProtocolError: If there are no actions, or the env ids are not as above.
        """
        count = num_envs()
        if "actions" not in body:
            raise ProtocolError("STEP needs actions")
        errors = "env_errors" in body and _env_errors(body)
        return cls(body["actions"], _env_ids(body, count), errors)

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends."""
        body = _with_env_ids({"actions": self.actions}, self.env_ids)
        if self.env_errors:
            body["env_errors"] = True
        return body


@dataclass(frozen=True, slots=True)
class Call:
    """CALL: call a method of each env, or read an attribute.

    Attributes:
        name: The method or attribute.
        args: The positional arguments of the call.
        kwargs: Its keyword arguments.
        env_ids: The envs called, in order (None: every env of the block).
    """

    name: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_ids: list[int] | None = None

    @classmethod
    def from_wire(cls, body: dict[str, Any], num_envs: NumEnvs) -> Call:
        """Reads a CALL body (a map) for a block of ``num_envs()`` envs.

        ``num_envs`` is asked once the name and the arguments are checked.

        Raises:
            ProtocolError: If a value is not as above.
        """
        name, args, kwargs = body.get("name"), body.get("args", []), body.get("kwargs", {})
        if not isinstance(name, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ProtocolError("CALL needs a name string, an args list and a kwargs map")
        return cls(name, args, kwargs, _env_ids(body, num_envs()))

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends."""
        body = {"name": self.name, "args": list(self.args), "kwargs": self.kwargs}
        return _with_env_ids(body, self.env_ids)


@dataclass(frozen=True, slots=True)
class SetAttr:
    """SET_ATTR: set an attribute of each env.

    Attributes:
        name: The attribute.
        values: One value per env set.
        env_ids: The envs set, in order (None: every env of the block).
        outermost: Set it on the outermost wrapper (as SB3 does), not where Gymnasium's
            ``set_wrapper_attr`` puts it.
    """

    name: str
    values: list[Any]
    env_ids: list[int] | None = None
    outermost: bool = False

    @classmethod
    def from_wire(cls, body: dict[str, Any], num_envs: NumEnvs) -> SetAttr:
        """Reads a SET_ATTR body (a map) for a block of ``num_envs()`` envs.

        ``num_envs`` is asked once the name, the values and ``outermost`` are checked.

        Raises:
            ProtocolError: If a value is not as above.
        """
        name, values = body.get("name"), body.get("values")
        outermost = body.get("outermost", False)
        if not isinstance(name, str) or not isinstance(values, list) or type(outermost) is not bool:
            raise ProtocolError("SET_ATTR needs a name string, a values list, outermost a bool")
        return cls(name, values, _env_ids(body, num_envs()), outermost)

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends (``outermost`` only when true)."""
        body: dict[str, Any] = {"name": self.name, "values": self.values}
        if self.outermost:
            body["outermost"] = True
        return _with_env_ids(body, self.env_ids)


@dataclass(frozen=True, slots=True)
class EnvIds:
    """A body that only names envs: WRAPPERS' and GET_STATE's.

    WRAPPERS asks for each env's wrapper chain, GET_STATE for each env's snapshot.

    Attributes:
        env_ids: The envs asked about, in order (None: every env of the block).
    """

    env_ids: list[int] | None = None

    @classmethod
    def from_wire(cls, body: dict[str, Any], num_envs: NumEnvs) -> EnvIds:
        """Reads the body (a map) for a block of ``num_envs()`` envs.

        Raises:
            ProtocolError: If the env ids are not as above.
        """
        return cls(_env_ids(body, num_envs()))

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends."""
        return _with_env_ids({}, self.env_ids)


#: WRAPPERS' body, GET_STATE's, and CLOSE's when it closes some envs, not the session.
Wrappers = GetState = Close = EnvIds


@dataclass(frozen=True, slots=True)
class SetState:
    """SET_STATE: restore each env from a snapshot.

    Attributes:
        states: One snapshot's bytes per env.
        env_ids: The envs, in the order of ``states`` (None: every env of the block).
    """

    states: list[bytes]
    env_ids: list[int] | None = None

    @classmethod
    def from_wire(cls, body: dict[str, Any], num_envs: NumEnvs) -> SetState:
        """Reads a SET_STATE body (a map) for a block of ``num_envs()`` envs.

        Raises:
            ProtocolError: If the states are not one byte string per env addressed.
        """
        env_ids = _env_ids(body, num_envs())
        states = body.get("states")
        count = num_envs() if env_ids is None else len(env_ids)
        if (
            not isinstance(states, list)
            or len(states) != count
            or not all(isinstance(state, bytes) for state in states)
        ):
            raise ProtocolError(f"states must be a list of {count} byte strings, one per env")
        return cls(states, env_ids)

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends."""
        return _with_env_ids({"states": list(self.states)}, self.env_ids)


@dataclass(frozen=True, slots=True)
class Empty:
    """The empty map a command sends that needs no body but a map (RENDER)."""

    def to_wire(self) -> dict[str, Any]:
        """The body a client sends: ``{}``."""
        return {}


#: A request body a client sends (PING, HEARTBEAT and CLOSE send none).
RequestBody = Hello | Make | Reset | Step | Call | SetAttr | EnvIds | SetState | Empty
