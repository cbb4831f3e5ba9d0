"""The ``envserver`` command's argument parser: usage errors in one line, arguments kept.

argparse has no public way to read a parser's arguments back; :class:`Parser` keeps each one as
it is added (and the group it was added to), so that the command line's reference page
(``docs/hooks/cli_reference.py``) is generated from the parsers themselves.
"""

from __future__ import annotations

import argparse
from typing import Any, NamedTuple, NoReturn

__all__ = ["Argument", "ArgumentGroup", "Parser"]


class ArgumentGroup(NamedTuple):
    """A titled group of a command's arguments (``add_argument_group``'s title and description)."""

    title: str | None
    description: str | None


class Argument(NamedTuple):
    """One argument of a command, in the order it was added.

    Attributes:
        action: What ``add_argument`` returned: its flags, value, default and help.
        group: The titled group it was added to; None for the parser's own arguments.
    """

    action: argparse.Action
    group: ArgumentGroup | None


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (and the way to the help).

    It also keeps what it was given (argparse has no public way to read it back), for the
    command line's reference page.

    Attributes:
        commands: The top parser's subparsers, by command name.
        command_help: The top parser's commands' one-line help, by command name.
        arguments: Every argument added (``-h`` first), in order.
    """

    commands: dict[str, argparse.ArgumentParser]
    command_help: dict[str, str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arguments: list[Argument] = []  # before argparse's __init__ adds -h
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """``ArgumentParser.add_argument``, kept in :attr:`arguments`."""
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(Argument(action, None))
        return action

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        """``ArgumentParser.add_argument_group``, whose arguments are kept in :attr:`arguments`."""
        group = super().add_argument_group(*args, **kwargs)
        named = dict(zip(("title", "description"), args)) | kwargs
        return _KeptGroup(group, self, ArgumentGroup(named.get("title"), named.get("description")))

    def error(self, message: str) -> NoReturn:
        """Prints ``PROG: MESSAGE (see PROG --help)`` on stderr and exits with status 2."""
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


class _KeptGroup:
    """An argument group of a :class:`Parser` that keeps each argument it is given there."""

    def __init__(self, group: Any, parser: Parser, kept: ArgumentGroup) -> None:
        self._group = group
        self._parser = parser
        self._kept = kept

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = self._group.add_argument(*args, **kwargs)
        self._parser.arguments.append(Argument(action, self._kept))
        return action

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)
