"""Settings from the environment: the ``ENVSERVER_*`` variables a trainer reads, and which wins.

A trainer script runs unchanged on a laptop and on a cluster when the cluster's hosts and keys
come from the environment, as Ray's ``RAY_ADDRESS`` does for Ray. Precedence, for every
setting: an explicit argument in code, then a command-line flag, then the environment, then
the default.

The trainer side (:class:`HostChoice`): ``ENVSERVER_HOSTS`` (comma-separated endpoints,
``dns://`` and ``slurm://`` specs; ``local`` starts local hosts), ``ENVSERVER_MIN_HOSTS``, and the
CURVE key files ``ENVSERVER_CURVE_SERVER_KEY`` and ``ENVSERVER_CURVE_CLIENT_KEY``. They describe a
cluster, so they apply only when the hosts are not local ones. Every host list (the variable,
``--hosts``, the client's ``hosts``) is read by :func:`host_list`. ``ENVSERVER_FORWARD_ENV_OUTPUT``
is a switch (:func:`switch`). The host side's variables, one per option of ``envserver serve``,
are the command line's (:mod:`envserver.cli.settings`), read with :func:`variable_value` and
:func:`yes_or_no`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from envserver.wire.endpoints import HostSpec

from .ray import is_ray_spec

__all__ = [
    "CURVE_CLIENT_KEY_VARIABLE",
    "CURVE_SERVER_KEY_VARIABLE",
    "FORWARD_ENV_OUTPUT_VARIABLE",
    "HOSTS_VARIABLE",
    "LOCAL",
    "MIN_HOSTS_VARIABLE",
    "NOT_A_SWITCH",
    "HostChoice",
    "at_least_one",
    "host_list",
    "hosts_from_environment",
    "switch",
    "variable_value",
    "yes_or_no",
]

#: The trainer's hosts: endpoints and ``dns://``, ``slurm://`` specs, separated by commas.
HOSTS_VARIABLE = "ENVSERVER_HOSTS"
#: How many hosts must answer before a trainer starts (``min_hosts``).
MIN_HOSTS_VARIABLE = "ENVSERVER_MIN_HOSTS"
#: The hosts' CURVE public key file (``curve_server_key``).
CURVE_SERVER_KEY_VARIABLE = "ENVSERVER_CURVE_SERVER_KEY"
#: The trainer's CURVE secret key file (``curve_client_key``).
CURVE_CLIENT_KEY_VARIABLE = "ENVSERVER_CURVE_CLIENT_KEY"
#: Whether what the envs say (warnings, output) reaches the trainer (``forward_env_output``).
FORWARD_ENV_OUTPUT_VARIABLE = "ENVSERVER_FORWARD_ENV_OUTPUT"
#: The host list that starts local hosts, whatever ``ENVSERVER_HOSTS`` says.
LOCAL = "local"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
#: Why a switch's variable was not taken.
NOT_A_SWITCH = "not a yes/no value (1, true, yes, on or 0, false, no, off)"


def variable_value(environ: Mapping[str, str], variable: str) -> str | None:
    """The variable's value, stripped; None when it is unset or blank."""
    value = environ.get(variable, "").strip()
    return value or None


# A comma that ends an entry: one followed by a scheme, by ``local`` alone, by another comma or
# by nothing (an empty entry, skipped).
_ENTRY_START = re.compile(r",(?=\s*(?:[A-Za-z][A-Za-z0-9+.-]*://|local\s*(?:,|$)|,|$))")
#: The schemes of entries whose text may hold a comma: a Slurm node list, a path.
_COMMAS_ALLOWED = ("slurm://", "ipc://", "inproc://")


def host_list(hosts: str | Sequence[str]) -> list[str]:
    """The entries of a host list, in order, each once: how every host list is read.

    ``ENVSERVER_HOSTS``, ``--hosts`` and the client's ``hosts`` argument all come here. A string
    (each string of a sequence) may hold several entries separated by commas. An entry begins
    with a scheme (``tcp://``, ``slurm://``, ...) or is ``local``; a comma splits entries only
    before one, so a Slurm node list keeps its own commas
    (``slurm://cpu[1-2],gpu01:5555,tcp://sim-a:5555`` is two entries). Blank entries are
    skipped. Every entry is checked now (:meth:`~envserver.wire.endpoints.HostSpec.parse`), so
    that a malformed list fails before anything starts.

    Raises:
        TypeError: If an entry is not a string.
        ValueError: In one line, if an entry is malformed or holds more than one host, or
            ``local`` is not the whole list.
    """
    texts = [hosts] if isinstance(hosts, str) else list(hosts)
    entries: list[str] = []
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"a host must be an endpoint string, got {text!r}")
        entries += (part.strip() for part in _ENTRY_START.split(text) if part.strip())
    for entry in entries:
        _check_entry(entry)
    if LOCAL in entries and len(entries) > 1:
        raise ValueError(f"{LOCAL} starts local hosts and is the whole host list, got {entries}")
    return list(dict.fromkeys(entries))


def _check_entry(entry: str) -> None:
    """Raises ValueError, in one line, if ``entry`` is not one well-formed host list entry."""
    if entry == LOCAL or is_ray_spec(entry):  # a ray:// spec is read where it starts hosts
        return
    if "://" in entry.split("://", 1)[-1]:
        raise ValueError(f"{entry!r} is more than one host: separate hosts with commas")
    if "," in entry and not entry.startswith(_COMMAS_ALLOWED):
        after = entry.split(",", 1)[1].strip()
        raise ValueError(
            f"{entry!r} is not one host: {after!r} after its comma is not a host (each host "
            f"of a list begins with a scheme, tcp://, ipc://, dns://, slurm://, or is {LOCAL})"
        )
    HostSpec.parse(entry)


def hosts_from_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """The entries of ``ENVSERVER_HOSTS`` (see :func:`host_list`); none when it is unset.

    Raises:
        ValueError: If the variable's list is malformed, naming the variable.
    """
    value = variable_value(os.environ if environ is None else environ, HOSTS_VARIABLE) or ""
    try:
        return host_list(value)
    except ValueError as exc:
        raise ValueError(f"{HOSTS_VARIABLE}: {exc}") from None


def switch(
    value: bool | None, variable: str, default: bool, environ: Mapping[str, str] | None = None
) -> bool:
    """A yes/no setting: ``value`` if given, else the variable's, else ``default``.

    Raises:
        ValueError: If the variable is set to something else than a yes or a no.
    """
    if value is not None:
        return bool(value)
    text = variable_value(os.environ if environ is None else environ, variable)
    if text is None:
        return default
    yes = yes_or_no(text)
    if yes is None:
        raise ValueError(f"{variable}={text!r}: {NOT_A_SWITCH}")
    return yes


def yes_or_no(text: str) -> bool | None:
    """True for a yes (1, true, yes, on), False for a no, None for anything else."""
    word = text.lower()
    return True if word in _TRUE else False if word in _FALSE else None


def at_least_one(text: str) -> int:
    """``text`` as an integer of at least 1 (a count: hosts, processes, rounds).

    Raises:
        ValueError: Saying what it must be.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"must be an integer of at least 1, got {text!r}")
    return value


def _positive_int(environ: Mapping[str, str], variable: str) -> int | None:
    """The variable's value as an integer of at least 1; None when it is unset or blank."""
    text = variable_value(environ, variable)
    if text is None:
        return None
    try:
        return at_least_one(text)
    except ValueError as exc:
        raise ValueError(f"{variable} {exc}") from None


@dataclasses.dataclass(frozen=True)
class HostChoice:
    """Where a trainer's envs run and how it reaches the hosts, each setting from where it won.

    Attributes:
        hosts: The endpoints and specs; None starts local hosts.
        source: Where the hosts came from, for the log line (:meth:`describe`).
        min_hosts: How many hosts must answer (None: the default).
        curve_server_key: The hosts' CURVE public key file, or None.
        curve_client_key: The trainer's CURVE secret key file, or None.
        from_environment: The variables that supplied a setting.
    """

    hosts: tuple[str, ...] | None
    source: str
    min_hosts: int | None = None
    curve_server_key: str | os.PathLike | None = None
    curve_client_key: str | os.PathLike | None = None
    from_environment: tuple[str, ...] = ()

    @property
    def local(self) -> bool:
        """Whether local hosts are to be started."""
        return self.hosts is None

    @classmethod
    def of(
        cls,
        hosts: Sequence[str] | str | None,
        min_hosts: int | None = None,
        curve_server_key: str | os.PathLike | None = None,
        curve_client_key: str | os.PathLike | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> HostChoice:
        """Each setting as given, else from the environment (for hosts that are not local).

        Args:
            hosts: Endpoints and specs (a string may hold several, separated by commas: see
                :func:`host_list`), ``"local"``, or None (``ENVSERVER_HOSTS``, else local
                hosts).
            min_hosts: As given to the vector env, or None.
            curve_server_key: As given, or None.
            curve_client_key: As given, or None.
            environ: The environment (default: ``os.environ``).

        Raises:
            ValueError: If the host list is malformed (see :func:`host_list`), or
                ``ENVSERVER_MIN_HOSTS`` is not a positive integer.
        """
        environ = os.environ if environ is None else environ
        if hosts is None:
            listed = hosts_from_environment(environ)
            source = HOSTS_VARIABLE if listed else f"no hosts given, {HOSTS_VARIABLE} unset"
        else:
            given = [hosts] if isinstance(hosts, str) else list(hosts)
            listed = host_list(given)
            source = "the arguments"
            if given and not listed:
                raise ValueError(f"hosts={hosts!r} names no host (local hosts: {LOCAL!r})")
        if not listed or listed == [LOCAL]:
            if listed:
                source = f"{source if hosts is None else 'hosts'}={LOCAL}"
            return cls(None, source, min_hosts, curve_server_key, curve_client_key)
        used = [HOSTS_VARIABLE] if source == HOSTS_VARIABLE else []
        settings: dict[str, Any] = {
            "min_hosts": min_hosts,
            "curve_server_key": curve_server_key,
            "curve_client_key": curve_client_key,
        }
        for name, variable, read in (
            ("min_hosts", MIN_HOSTS_VARIABLE, _positive_int),
            ("curve_server_key", CURVE_SERVER_KEY_VARIABLE, variable_value),
            ("curve_client_key", CURVE_CLIENT_KEY_VARIABLE, variable_value),
        ):
            if settings[name] is None and (value := read(environ, variable)) is not None:
                settings[name] = value
                used.append(variable)
        return cls(tuple(listed), source, **settings, from_environment=tuple(used))

    def describe(self) -> str:
        """One line: where the hosts came from, and which settings the environment gave."""
        if self.local:
            return f"starting local hosts ({self.source})"
        line = f"hosts from {self.source}: {', '.join(self.hosts)}"
        others = [v for v in self.from_environment if v != HOSTS_VARIABLE]
        if others:
            line += f" (also from the environment: {', '.join(others)})"
        return line
