"""Commands of ``envserver`` that other packages contribute, and the options commands share.

The host side never imports the client: ``envserver rollout`` is ``envserver.client``'s,
declared in ``pyproject.toml`` under the entry point group :data:`ENTRY_POINT_GROUP`::

    [project.entry-points."envserver.commands"]
    rollout = "envserver.client.commands:rollout"

Each entry point names a :class:`Subcommand`; its name is the command's. ``envserver`` loads
only the command it runs (all of them for ``--help``), so ``serve`` and ``ping`` never import
a contributed command's package.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from envserver.cli.logs import LOG_FORMATS
from envserver.launch.environment import CURVE_CLIENT_KEY_VARIABLE, CURVE_SERVER_KEY_VARIABLE

__all__ = [
    "ENTRY_POINT_GROUP",
    "IMPORT_VARIABLE",
    "LOG_LEVELS",
    "Subcommand",
    "add_curve_client_arguments",
    "add_import_argument",
    "add_log_arguments",
    "contributed_commands",
    "import_modules",
    "load_command",
    "log_level",
    "modules_to_import",
]

logger = logging.getLogger(__name__)

#: The entry point group of the commands other packages add to ``envserver``.
ENTRY_POINT_GROUP = "envserver.commands"
#: Modules to import before serving (comma-separated): ``--import`` from the environment.
IMPORT_VARIABLE = "ENVSERVER_IMPORT"


@dataclass(frozen=True)
class Subcommand:
    """One ``envserver`` command.

    Attributes:
        help: One line for ``envserver --help``.
        add_arguments: Adds the command's arguments to its subparser (the log options are
            added for every command).
        run: Runs the command with the parsed arguments and returns the exit status. An
            exception it raises is reported as one line, ``envserver NAME: message``.
        log_level: The log level without ``--log-level`` (a command that prints a report
            of its own, as ``rollout`` and ``bench`` do, keeps INFO lines out of it).
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    log_level: str = "INFO"


def contributed_commands() -> dict[str, EntryPoint]:
    """The contributed commands by name, not loaded yet (loading imports their package)."""
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def load_command(point: EntryPoint) -> Subcommand:
    """Imports a contributed command.

    Raises:
        TypeError: If the entry point does not name a :class:`Subcommand`.
        ImportError: If its package cannot be imported (any error it raises is passed on).
    """
    command = point.load()
    if not isinstance(command, Subcommand):
        raise TypeError(f"entry point {point.value} ({ENTRY_POINT_GROUP}) is not a Subcommand")
    return command


def add_import_argument(parser: argparse.ArgumentParser, where: str) -> None:
    """Adds ``--import MODULE`` (see :func:`modules_to_import`); ``where`` says where it applies."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE first, e.g. one that registers your envs ({where}; repeatable; "
        f"also from ${IMPORT_VARIABLE}, comma-separated)",
    )


#: The log levels ``--log-level`` takes.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(text: str) -> str:
    """``--log-level``'s text as a level's name (in any case).

    Raises:
        argparse.ArgumentTypeError: If it names none of :data:`LOG_LEVELS`.
    """
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return text.upper()


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """The global log options, also accepted after the command."""
    parser.add_argument(
        "--log-level",
        type=log_level,
        default=argparse.SUPPRESS,
        help="DEBUG, INFO, WARNING or ERROR",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="log lines as text, or one JSON object each",
    )


def add_curve_client_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the CURVE key files of a command that connects to hosts."""
    parser.add_argument(
        "--curve-server-key",
        metavar="FILE",
        help=f"the host's public key file (NAME.key) [env: {CURVE_SERVER_KEY_VARIABLE}]",
    )
    parser.add_argument(
        "--curve-client-key",
        metavar="FILE",
        help=f"this client's secret key file (.key_secret) [env: {CURVE_CLIENT_KEY_VARIABLE}]",
    )


def modules_to_import(args: argparse.Namespace) -> list[str]:
    """The modules of ``$ENVSERVER_IMPORT`` and then of ``--import``, each once."""
    listed = os.environ.get(IMPORT_VARIABLE, "").split(",") + args.imports
    return list(dict.fromkeys(name.strip() for name in listed if name.strip()))


def import_modules(modules: Sequence[str]) -> None:
    """Imports ``modules`` in order.

    Raises:
        ImportError: In one line, naming the module, whatever went wrong in it.
    """
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing module, or an error inside it
            logger.debug("cannot import %s", name, exc_info=True)
            raise ImportError(
                f"cannot import {name} (--import): {type(exc).__name__}: {exc}", name=name
            ) from exc
