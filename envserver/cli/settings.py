"""Settings from the environment: the ``ENVSERVER_*`` variables, and which setting wins.

A trainer script runs unchanged on a laptop and on a cluster when the cluster's hosts and keys
come from the environment, as Ray's ``RAY_ADDRESS`` does for Ray. Precedence, for every
setting: an explicit argument in code, then a command-line flag, then the environment, then
the default.

The trainer side (:class:`HostChoice`): ``ENVSERVER_HOSTS`` (comma-separated endpoints and
``dns://`` specs; ``local`` starts local hosts), ``ENVSERVER_MIN_HOSTS``, and the CURVE key
files ``ENVSERVER_CURVE_SERVER_KEY`` and ``ENVSERVER_CURVE_CLIENT_KEY``. They describe a
cluster, so they apply only when the hosts are not local ones.

The host side (:class:`EnvironmentOptions`): each option of ``envserver serve`` that takes one
value (or is a switch) takes its default from ``ENVSERVER_`` + its long name in capitals
(``--max-sessions`` from ``ENVSERVER_MAX_SESSIONS``); the log options likewise.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CURVE_CLIENT_KEY_VARIABLE",
    "CURVE_SERVER_KEY_VARIABLE",
    "FORWARD_ENV_OUTPUT_VARIABLE",
    "HOSTS_VARIABLE",
    "LOCAL",
    "MAX_SECONDS",
    "MIN_HOSTS_VARIABLE",
    "EnvironmentOptions",
    "HostChoice",
    "InvalidSetting",
    "check_settings",
    "hosts_from_environment",
    "positive_int",
    "positive_seconds",
    "switch",
    "variable_for",
]

#: The trainer's hosts, comma-separated endpoints and ``dns://NAME:PORT`` specs.
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
_NOT_A_SWITCH = "not a yes/no value (1, true, yes, on or 0, false, no, off)"


def _set(environ: Mapping[str, str], variable: str) -> str | None:
    """The variable's value, stripped; None when it is unset or blank."""
    value = environ.get(variable, "").strip()
    return value or None


def hosts_from_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """The entries of ``ENVSERVER_HOSTS``, in order, each once (none when unset)."""
    value = _set(os.environ if environ is None else environ, HOSTS_VARIABLE) or ""
    return list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))


def switch(
    value: bool | None, variable: str, default: bool, environ: Mapping[str, str] | None = None
) -> bool:
    """A yes/no setting: ``value`` if given, else the variable's, else ``default``.

    Raises:
        ValueError: If the variable is set to something else than a yes or a no.
    """
    if value is not None:
        return bool(value)
    text = _set(os.environ if environ is None else environ, variable)
    if text is None:
        return default
    yes = _yes_or_no(text)
    if yes is None:
        raise ValueError(f"{variable}={text!r}: {_NOT_A_SWITCH}")
    return yes


def _yes_or_no(text: str) -> bool | None:
    """True for a yes (1, true, yes, on), False for a no, None for anything else."""
    word = text.lower()
    return True if word in _TRUE else False if word in _FALSE else None


def positive_int(text: str) -> int:
    """An option's text as an integer of at least 1 (an argparse ``type``).

    Raises:
        argparse.ArgumentTypeError: Saying what it must be.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, got {text!r}")
    return value


#: The longest wait a command's option may ask for (some 11 days).
MAX_SECONDS = 1e6


def positive_seconds(text: str) -> float:
    """An option's text as a number of seconds above 0, at most :data:`MAX_SECONDS`.

    An argparse ``type``.

    Raises:
        argparse.ArgumentTypeError: Saying what it must be.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:  # (nan is neither)
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and at most {MAX_SECONDS:g}, got {text!r}"
        )
    return value


def _positive_int(environ: Mapping[str, str], variable: str) -> int | None:
    text = _set(environ, variable)
    if text is None:
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{variable} {exc}") from None


@dataclasses.dataclass(frozen=True)
class HostChoice:
    """Where a trainer's envs run and how it reaches the hosts, each setting from where it won.

    Attributes:
        hosts: The endpoints and ``dns://`` specs; None starts local hosts.
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
            hosts: Endpoints and ``dns://`` specs, ``"local"``, or None (``ENVSERVER_HOSTS``,
                else local hosts).
            min_hosts: As given to the vector env, or None.
            curve_server_key: As given, or None.
            curve_client_key: As given, or None.
            environ: The environment (default: ``os.environ``).

        Raises:
            ValueError: If ``ENVSERVER_MIN_HOSTS`` is not a positive integer.
        """
        environ = os.environ if environ is None else environ
        if hosts is None:
            listed = hosts_from_environment(environ)
            source = HOSTS_VARIABLE if listed else f"no hosts given, {HOSTS_VARIABLE} unset"
        else:
            listed = [hosts] if isinstance(hosts, str) else list(hosts)
            source = "the arguments"
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
            ("curve_server_key", CURVE_SERVER_KEY_VARIABLE, _set),
            ("curve_client_key", CURVE_CLIENT_KEY_VARIABLE, _set),
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


def variable_for(option: str) -> str:
    """The variable of a long option: ``--max-sessions`` -> ``ENVSERVER_MAX_SESSIONS``."""
    return "ENVSERVER_" + option.lstrip("-").replace("-", "_").upper()


@dataclasses.dataclass(frozen=True)
class InvalidSetting:
    """An option's default from a variable whose value does not fit the option.

    It stays the option's value only when the flag is not given; :func:`check_settings` then
    reports it (a bad variable breaks only a command that would use it).
    """

    variable: str
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.variable}={self.text!r}: {self.why}"


class EnvironmentOptions:
    """Adds a command's options whose defaults come from ``ENVSERVER_*`` variables.

    Args:
        parser: The command's parser.
        environ: The environment (default: ``os.environ``).
    """

    def __init__(
        self, parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
    ) -> None:
        self.parser = parser
        self.environ = os.environ if environ is None else environ

    def add(self, *flags: str, **kwargs: Any) -> argparse.Action:
        """``parser.add_argument``, the default taken from the option's variable when it is set.

        Only for options that take one value or are switches (``store_true``): a repeatable
        option would mix the variable's values with the flags' instead of being replaced.
        """
        action = self.parser.add_argument(*flags, **kwargs)
        variable = variable_for(max(action.option_strings, key=len))
        if action.help is not argparse.SUPPRESS:
            action.help = f"{action.help or ''} [env: {variable}]".strip()
        text = _set(self.environ, variable)
        if text is not None:
            action.default = _converted(action, variable, text)
        return action


def _converted(action: argparse.Action, variable: str, text: str) -> Any:
    """The variable's text as the option's value, or an :class:`InvalidSetting`."""
    if action.nargs == 0:  # a switch
        yes = _yes_or_no(text)
        if yes is None:
            return InvalidSetting(variable, text, _NOT_A_SWITCH)
        return action.const if yes else action.default
    convert = action.type or str
    try:
        value = convert(text)
    except argparse.ArgumentTypeError as exc:
        return InvalidSetting(variable, text, str(exc))
    except (ValueError, TypeError):
        return InvalidSetting(variable, text, f"not a valid {convert.__name__} value")
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        return InvalidSetting(variable, text, f"not one of {choices}")
    return value


def check_settings(args: argparse.Namespace) -> None:
    """Raises for the first option whose value is a variable that did not fit it.

    Raises:
        ValueError: Naming the variable, its value and why it does not fit.
    """
    for value in vars(args).values():
        if isinstance(value, InvalidSetting):
            raise ValueError(str(value))
