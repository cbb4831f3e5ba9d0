"""The options of a :class:`~envserver.client.RemoteVectorEnv`, in one frozen dataclass, checked.

Each is written once, as a field of :class:`VectorOptions`, which :func:`takes_options` makes a
keyword argument, an entry of the docs and an attribute of the vector env (:class:`FromOptions`,
the options' case of :class:`FromPart`: an attribute of the env that one of its parts holds). Also
the checks of its other arguments: ``AsyncVectorEnv``'s, the env count, the envs' spread over
hosts, env indices.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import itertools
import operator
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import zmq
from gymnasium.vector import AutoresetMode

from envserver.launch.environment import LOCAL, host_list

from ._infos import check_info_format
from ._transport.local import default_host_count
from ._transport.settings import ConnectionSettings

__all__ = [
    "DEFAULT_OPTIONS",
    "FromOptions",
    "FromPart",
    "VectorOptions",
    "call_rounds",
    "check_option_names",
    "checked_async_arguments",
    "checked_env_ids",
    "count_envs",
    "distinct_env_ids",
    "per_env",
    "split_envs",
    "takes_options",
    "values_by_env",
]


@dataclasses.dataclass(frozen=True)
class VectorOptions:
    """How a vector env lays out, batches, waits for and recovers its envs.

    Each field is :class:`~envserver.client.RemoteVectorEnv`'s keyword argument of that name,
    written once here: type, default and doc (the string under it). Values are checked and
    normalized here, sizes once the env and host counts are known (:meth:`batch_size_for`,
    :meth:`sub_batch_size_for`, ``split_envs``), the observation mode against the envs' spaces.

    Raises:
        ValueError: For an invalid value.
    """

    envs_per_host: Sequence[int] | None = None
    """How many envs each host gets, in host order."""
    num_local_hosts: int | None = None
    """How many local hosts to start when ``hosts`` is None (default: one per CPU core, never more
    than ``num_envs``)."""
    copy: bool = True
    """Whether ``reset`` and ``step`` return copies of the observation batch."""
    observation_mode: str | tuple[gym.Space, gym.Space] = "same"
    """``"same"``, ``"different"``, or a ``(batch, single)`` space pair, as in Gymnasium."""
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP
    """Gymnasium's autoreset mode, applied on the hosts."""
    info_format: str = "dict"
    """``"dict"``: infos batched as Gymnasium does (a dict of arrays with ``_key`` masks);
    ``"list"``: one dict per env, holding what the env returned (its step's and, when autoreset in
    SAME_STEP mode, its reset's infos, merged)."""
    batch_size: int | None = None
    """How many envs :meth:`recv` returns: the first to finish (default: all)."""
    sub_batch_size: int | None = None
    """How many envs a host steps per request in :meth:`send`, so that it can answer part of its
    envs early (default: ``batch_size`` divided by the host count)."""
    env_threads: int | None = None
    """How many of its envs each host steps at once, on threads (capped by the host's
    ``--max-env-threads``); 1 steps them one after another. Default None: each host chooses, and
    keeps choosing as the envs change: one after another while they compute (CartPole), all at once
    while they wait (I/O, sleeps, C code that waits with the GIL released). See
    :meth:`env_threads_in_use`."""
    allow_pickle: bool | None = None
    """Whether hosts may send values that only travel pickled, and this client may unpickle them.
    Default: True for local hosts, False for remote ones."""
    min_hosts: int | None = None
    """Wait (within ``connect_timeout_s``) until this many distinct hosts answer, counting every
    host of the ``dns://`` and ``slurm://`` specs; default: ``$ENVSERVER_MIN_HOSTS``, else one per
    ``dns://`` spec and every host of a ``slurm://`` spec."""
    connect_timeout_s: float = 60.0
    """How long a host may take to accept the first connection."""
    host_timeout_s: float = 5.0
    """How long a connected host may go without answering heartbeats (dead, frozen or unreachable)
    before waits on it fail with ``HostUnavailableError``; the bound holds even for
    ``*_wait(timeout=None)``."""
    request_timeout_s: float | None = None
    """How long a live host may take to answer one request (a hung env step); None for no bound.
    Exceeding it raises ``RequestTimeoutError``."""
    on_host_failure: str = "raise"
    """``"raise"`` (``HostUnavailableError``) or ``"restart"``: reconnect (resuming the session if
    the host still has it), else re-make the lost envs on the same endpoint (a respawned process for
    local hosts) or a spare, and go on. The interrupted step reports those envs as truncated, with
    ``infos["host_failure"]``. Or ``"restore"``: as ``"restart"``, but the envs made anew are
    restored from the snapshots the vector env keeps (see ``snapshot_every``) and sent again what
    they were sent since, checked against what this trainer was given or received: the episodes go
    on as if the host had not failed, with no truncation (lockstep steps and first-ready batches
    alike). An env whose state cannot be restored so is reported lost, as with ``"restart"``."""
    spare_hosts: Sequence[str] = ()
    """Endpoints (or ``dns://`` and ``slurm://`` specs, resolved when needed; a list, or one string
    of them separated by commas, as ``hosts``) to re-make lost envs on when their own host does not
    come back, and to move envs of hosts that drain to (remote hosts only: a local host is
    respawned in place). A host found through a ``dns://`` spec is replaced by resolving the name
    again first; one of a ``slurm://`` spec by another node of the job (or another host on one)."""
    restart_timeout_s: float = 60.0
    """How long recovering one failed host may take before giving up."""
    snapshot_every: int = 100
    """With ``on_host_failure="restore"``: how many steps (and resets) an env takes between two of
    its snapshots, at most; the vector env keeps its last one and what it was sent since. A recovery
    sends at most this many requests again. Lockstep steps take every env's snapshot at once;
    first-ready batches take those of the envs a ``send`` sends, before sending them."""
    forward_env_output: bool | None = None
    """Whether what the envs say on their hosts reaches this process: their warnings (re-raised
    here) and output (on stderr). Default: ``$ENVSERVER_FORWARD_ENV_OUTPUT`` (``0`` turns it off),
    else True."""
    shared_memory: bool = True
    """Whether local hosts take steps and resets through a channel in shared memory rather than
    their ZeroMQ socket, and write large observations (a host's batch of 64 KiB or more, in a raw
    step layout) into shared memory, as ``AsyncVectorEnv``'s workers do. No effect on remote
    hosts."""

    def __post_init__(self) -> None:
        if self.on_host_failure not in ("raise", "restart", "restore"):
            raise ValueError(
                "on_host_failure must be 'raise', 'restart' or 'restore', got "
                f"{self.on_host_failure!r}"
            )
        if type(self.snapshot_every) is not int or self.snapshot_every < 1:
            raise ValueError(
                f"snapshot_every must be a positive integer, got {self.snapshot_every!r}"
            )
        if self.env_threads is not None and (
            type(self.env_threads) is not int or self.env_threads < 1
        ):
            raise ValueError(
                f"env_threads must be a positive integer or None, got {self.env_threads!r}"
            )
        check_info_format(self.info_format)
        if not isinstance(self.autoreset_mode, AutoresetMode):
            object.__setattr__(self, "autoreset_mode", AutoresetMode(self.autoreset_mode))
        # Read as every host list is (refused now, not at the recovery that needs it).
        spares = tuple(host_list(self.spare_hosts))
        if LOCAL in spares:
            raise ValueError(
                f"spare_hosts are remote hosts (a local host is respawned), got {LOCAL}"
            )
        object.__setattr__(self, "spare_hosts", spares)
        if self.envs_per_host is not None:
            object.__setattr__(self, "envs_per_host", tuple(self.envs_per_host))

    def batch_size_for(self, num_envs: int) -> int:
        """How many envs ``recv`` returns (default: all), checked against ``num_envs``."""
        batch_size = num_envs if self.batch_size is None else int(self.batch_size)
        if not 1 <= batch_size <= num_envs:
            raise ValueError(f"batch_size must be between 1 and num_envs={num_envs}")
        return batch_size

    def sub_batch_size_for(self, batch_size: int, num_hosts: int) -> int:
        """How many envs a host steps per first-ready request (default: a host's share)."""
        sub_batch_size = self.sub_batch_size
        if sub_batch_size is None:
            sub_batch_size = max(1, batch_size // num_hosts)
        if sub_batch_size < 1:
            raise ValueError("sub_batch_size must be positive")
        return int(sub_batch_size)

    def connection_settings(
        self,
        *,
        allow_pickle: bool,
        curve: tuple[bytes, bytes, bytes] | None,
        local: bool,
        reply_spin_s: float = 0.0,
    ) -> ConnectionSettings:
        """How the vector env's connections behave, from these options.

        Args:
            allow_pickle: Whether replies may carry pickled values (see ``EnvRecipe``).
            curve: The CURVE keys, or None.
            local: Whether the hosts are local ones (only they may share memory).
            reply_spin_s: How long a wait for a reply in their channels spins (``LocalHosts``).
        """
        return ConnectionSettings(
            allow_pickle=allow_pickle,
            host_timeout_s=self.host_timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
            curve=curve,
            shared_memory=self.shared_memory and local,
            recovers=self.on_host_failure != "raise",
            reply_spin_s=reply_spin_s if local and self.shared_memory else 0.0,
        )

    def local_host_count(self, num_envs: int) -> int:
        """How many local hosts to start (when no hosts are given)."""
        if self.envs_per_host is not None:
            return len(self.envs_per_host)
        return self.num_local_hosts or default_host_count(num_envs)


#: Every option at its default (``envserver rollout``'s flags show them).
DEFAULT_OPTIONS = VectorOptions()


class FromPart:
    """An attribute of a vector env that one of its parts holds (``envs.copy``: its results').

    Read there on every access, so it is never stale; assigning sets it there when the part lets
    it change (``settable``), and raises otherwise.

    Args:
        part: The env's attribute that holds the part (``"_results"``).
        name: The part's attribute (default: the name this descriptor is assigned to).
        settable: Whether assigning sets the part's attribute.
    """

    def __init__(self, part: str, name: str | None = None, *, settable: bool = False) -> None:
        self.part = part
        self.name = self.attribute = name
        self.settable = settable

    def __set_name__(self, owner: type, attribute: str) -> None:
        self.attribute = attribute
        if self.name is None:
            self.name = attribute

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else getattr(getattr(instance, self.part), self.name)

    def __set__(self, instance: Any, value: Any) -> None:
        if not self.settable:
            raise AttributeError(f"{self.attribute} of {type(instance).__name__} is read-only")
        setattr(getattr(instance, self.part), self.name, value)


class FromOptions(FromPart):
    """A read-only attribute of the vector env: its option of that name, set when it is made.

    Assigning one afterwards raises, rather than leaving the parts that use it with the old value.
    """

    def __init__(self, name: str) -> None:
        super().__init__("options", name)

    def __set__(self, instance: Any, value: Any) -> None:
        raise AttributeError(
            f"{self.name} is set when the env is made (RemoteVectorEnv(..., {self.name}=...)) "
            "and cannot change afterwards"
        )


def _field_docs() -> dict[str, str]:
    """Each field's doc: the string under it in :class:`VectorOptions`, as griffe reads it."""
    try:
        body = ast.parse(inspect.getsource(VectorOptions)).body[0].body
    except OSError:  # no source (an app frozen without it): help() shows no option docs
        return {}
    return {
        field.target.id: inspect.cleandoc(doc.value.value)
        for field, doc in itertools.pairwise(body)
        if isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr)
    }


def takes_options(cls: type) -> type:
    """Makes ``cls.__init__``'s ``**options`` (its last parameter) :class:`VectorOptions`' fields.

    Its signature (``help()``, ``inspect``) gets a keyword-only parameter per field, the
    docstring's ``**options:`` entry (in Args) an entry per field with its doc, and ``cls`` a
    read-only attribute per field it has none of (:class:`FromOptions`).
    """
    signature = inspect.signature(cls.__init__)
    *named, _ = signature.parameters.values()
    fields = dataclasses.fields(VectorOptions)
    kind = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter(f.name, kind, default=f.default, annotation=f.type) for f in fields]
    cls.__init__.__signature__ = signature.replace(parameters=[*named, *params])
    docs = _field_docs()
    if cls.__doc__ and docs:
        wrap = textwrap.TextWrapper(100, subsequent_indent=" " * 8, break_on_hyphens=False).fill
        entries = "\n".join(wrap(f"    {f.name}: {docs[f.name]}") for f in fields)
        doc = inspect.cleandoc(cls.__doc__)
        cls.__doc__ = re.sub(r"^    \*\*options:.*$", lambda _: entries, doc, flags=re.M)
    for field in fields:
        if not hasattr(cls, field.name):
            setattr(cls, field.name, FromOptions(field.name))
    return cls


def check_option_names(options: Mapping[str, Any], owner: type) -> None:
    """Raises TypeError for a keyword of ``owner`` that is no option, naming the closest keyword."""
    fields = {field.name for field in dataclasses.fields(VectorOptions)}
    unknown = [name for name in options if name not in fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], inspect.signature(owner).parameters, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(f"{owner.__name__} got an unexpected keyword argument {unknown[0]!r}{hint}")


def checked_async_arguments(
    context: Any, worker: Any, max_concurrency: int | None
) -> zmq.Context | None:
    """Checks the arguments only ``AsyncVectorEnv`` has, so a swapped call fails helpfully.

    Returns:
        The ZeroMQ context to use (None: a new one).
    """
    if worker is not None:
        raise TypeError(
            "RemoteVectorEnv has no worker function to replace: each host runs its envs in its "
            "own loop; put custom per-env logic in a gymnasium.Wrapper instead"
        )
    if max_concurrency is not None:
        raise TypeError(
            "RemoteVectorEnv has no max_concurrency: each host steps its envs one after "
            "another, so concurrency is the number of hosts (num_local_hosts, envs_per_host)"
        )
    if isinstance(context, str):
        gym.logger.warn(
            f"RemoteVectorEnv ignores context={context!r} (a multiprocessing start method): its "
            "hosts are processes of their own; `context` takes a zmq.Context"
        )
        return None
    if context is not None and not isinstance(context, zmq.Context):
        raise TypeError(f"context must be a zmq.Context or None, got {type(context).__name__}")
    return context


def per_env(
    env_id: str | Sequence[str] | None, env_kwargs: Mapping[str, Any] | Sequence[Any] | None
) -> tuple[str | tuple[str, ...] | None, dict[str, Any] | tuple[dict[str, Any], ...]]:
    """``env_id`` and ``env_kwargs``, checked: one for every env, or a tuple of one per env.

    Raises:
        TypeError: If an id is not a string or kwargs are not a dict (or a list of them).
        ValueError: If a list of them is empty.
    """
    if env_id is not None and not isinstance(env_id, str):
        if not isinstance(env_id, Sequence) or not all(isinstance(i, str) for i in env_id):
            raise TypeError(f"env_id must be a string or a list of strings, got {env_id!r}")
        if not env_id:
            raise ValueError("env_id is an empty list")
        env_id = tuple(env_id)
    if env_kwargs is None or isinstance(env_kwargs, Mapping):
        return env_id, dict(env_kwargs or {})
    if not isinstance(env_kwargs, Sequence) or not all(isinstance(k, Mapping) for k in env_kwargs):
        raise TypeError(f"env_kwargs must be a dict or a list of dicts, got {env_kwargs!r}")
    if not env_kwargs:
        raise ValueError("env_kwargs is an empty list")
    return env_id, tuple(dict(kwargs) for kwargs in env_kwargs)


def count_envs(
    env_fns: Sequence[Callable[[], gym.Env]] | None,
    env_id: str | tuple[str, ...] | None,
    num_envs: int | None,
    env_kwargs: dict[str, Any] | tuple[dict[str, Any], ...] | None = None,
) -> int:
    """The number of envs asked for, checked.

    Raises:
        ValueError: If not exactly one of ``env_fns`` and ``env_id`` is given, or the count is
            not a positive integer (or disagrees with ``env_fns``, or with a list of ids or
            kwargs, one per env).
    """
    if (env_fns is None) == (env_id is None):
        raise ValueError("give exactly one of env_fns and env_id")
    if env_fns is not None:
        count = len(list(env_fns))
        if num_envs is not None and num_envs != count:
            raise ValueError(f"num_envs={num_envs} but {count} env_fns were given")
        num_envs = count
    elif isinstance(env_id, tuple) or isinstance(env_kwargs, tuple):
        for name, listed in [("env_id", env_id), ("env_kwargs", env_kwargs)]:
            if not isinstance(listed, tuple):
                continue
            if num_envs is not None and num_envs != len(listed):
                raise ValueError(f"num_envs={num_envs} but {name} lists {len(listed)} envs")
            num_envs = len(listed)
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    return num_envs


def split_envs(num_envs: int, num_hosts: int, envs_per_host: Sequence[int] | None) -> list[int]:
    """How many envs each host gets: as even as possible, or as the user said."""
    if envs_per_host is not None:
        counts = [int(c) for c in envs_per_host]
        if len(counts) != num_hosts:
            raise ValueError(f"envs_per_host has {len(counts)} entries for {num_hosts} hosts")
        if any(c < 1 for c in counts) or sum(counts) != num_envs:
            raise ValueError(
                f"envs_per_host must be positive counts summing to num_envs={num_envs}, "
                f"got {counts}"
            )
        return counts
    if num_hosts > num_envs:
        raise ValueError(f"{num_hosts} hosts for {num_envs} envs: each host needs at least one")
    base, extra = divmod(num_envs, num_hosts)
    return [base + (1 if i < extra else 0) for i in range(num_hosts)]


def checked_env_ids(env_ids: Sequence[int], num_envs: int) -> list[int]:
    """Env indices as ints; negative ones count from the end, as in Python indexing.

    Raises:
        ValueError: If one is not an integer in ``-num_envs..num_envs-1``.
    """
    try:
        ids = [operator.index(i) for i in env_ids]
    except TypeError:
        raise ValueError(f"env_ids must be integers, got {env_ids!r}") from None
    if not all(-num_envs <= i < num_envs for i in ids):
        raise ValueError(f"env_ids must be env indices below {num_envs}, got {env_ids!r}")
    return [i % num_envs for i in ids]


def distinct_env_ids(env_ids: Sequence[int] | None, num_envs: int) -> list[int]:
    """Distinct env indices (default: all), checked as :func:`checked_env_ids` checks them.

    Raises:
        ValueError: If one is not an env index, or one is given twice.
    """
    ids = range(num_envs) if env_ids is None else checked_env_ids(env_ids, num_envs)
    if len(set(ids)) != len(ids):
        raise ValueError(f"env_ids must be distinct, got {list(env_ids or [])}")
    return list(ids)


def call_rounds(ids: Sequence[int]) -> list[list[int]]:
    """Positions of ``ids`` grouped into rounds in which no env appears twice, in order."""
    rounds: list[list[int]] = []
    for position, env in enumerate(ids):
        for positions in rounds:
            if all(ids[p] != env for p in positions):
                positions.append(position)
                break
        else:
            rounds.append([position])
    return rounds


def values_by_env(values: list[Any] | tuple[Any, ...] | Any, ids: Sequence[int]) -> dict[int, Any]:
    """``set_attr``'s values by env: one per entry of ``ids`` (a list or tuple), or one for all.

    An env named twice gets its last value.

    Raises:
        ValueError: If a list or tuple does not have one value per entry of ``ids``.
    """
    if not isinstance(values, (list, tuple)):
        values = [values for _ in ids]
    if len(values) != len(ids):
        raise ValueError(
            "Values must be a list or tuple with length equal to the number of "
            f"environments. Got `{len(values)}` values for {len(ids)} environments."
        )
    return dict(zip(ids, values))
