"""The command line's settings: option values checked, and option defaults from the environment.

Each option of ``envserver serve`` that takes one value (or is a switch) takes its default from
``ENVSERVER_`` + its long name in capitals (``--max-sessions`` from ``ENVSERVER_MAX_SESSIONS``;
:class:`EnvironmentOptions`); the log options likewise. Precedence: a flag, then the variable,
then the default. The trainer's variables (``ENVSERVER_HOSTS`` and the others) are read by the
launching layer (:mod:`envserver.launch.environment`), which the client imports too.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from envserver.launch.environment import (
    NOT_A_SWITCH,
    at_least_one,
    host_list,
    variable_value,
    yes_or_no,
)

__all__ = [
    "MAX_SECONDS",
    "EnvironmentOptions",
    "HostList",
    "InvalidSetting",
    "check_settings",
    "positive_int",
    "positive_seconds",
    "variable_for",
]


def positive_int(text: str) -> int:
    """An option's text as an integer of at least 1 (an argparse ``type``).

    Raises:
        argparse.ArgumentTypeError: Saying what it must be.
    """
    try:
        return at_least_one(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


class HostList(argparse.Action):
    """An option that takes a host list, read as every host list is.

    Each of its arguments is one host or several separated by commas (see
    :func:`~envserver.launch.environment.host_list`). It takes every argument up to the next
    option, so a positional argument put after the hosts is taken for a host: given
    ``followed_by`` (that argument's name), the line that refuses it says where it goes.
    """

    def __init__(self, *args: Any, followed_by: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **{"nargs": "+", "metavar": "HOST", **kwargs})
        self.followed_by = followed_by

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        """Stores the host list, or refuses it in one line (an ``ArgumentError``)."""
        try:
            hosts = host_list(values)
        except ValueError as exc:
            last = values[-1]
            hint = ""
            if (
                self.followed_by is not None
                and getattr(namespace, self.followed_by, None) is None
                and repr(last) in str(exc)
            ):
                hint = (
                    f" (if it is the {self.followed_by}: put it before {option_string}, which "
                    "takes every argument up to the next option)"
                )
            raise argparse.ArgumentError(self, f"{exc}{hint}") from None
        setattr(namespace, self.dest, hosts)


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
        text = variable_value(self.environ, variable)
        if text is not None:
            action.default = _converted(action, variable, text)
        return action


def _converted(action: argparse.Action, variable: str, text: str) -> Any:
    """The variable's text as the option's value, or an :class:`InvalidSetting`."""
    if action.nargs == 0:  # a switch
        yes = yes_or_no(text)
        if yes is None:
            return InvalidSetting(variable, text, NOT_A_SWITCH)
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
