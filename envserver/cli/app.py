"""The ``envserver`` command: ``serve``, ``ping`` and ``keygen``, and those other packages add.

``rollout`` is the client's (see :mod:`envserver.cli.commands`): the host side never imports it.
A command is imported only when it runs, or for ``envserver --help``, which lists them all:
``envserver --version`` and a usage error load neither the host, the client, Gymnasium nor numpy.
``serve`` is here, the one module of the command line that may import the host: it imports it
when it builds its parser.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING, Any

from envserver import __version__
from envserver.cli.commands import (
    ENTRY_POINT_GROUP,
    Subcommand,
    add_import_argument,
    add_log_arguments,
    contributed_commands,
    import_modules,
    load_command,
    log_level,
    modules_to_import,
)
from envserver.cli.interrupts import exit_status
from envserver.cli.logs import LOG_FORMATS, JsonFormatter, plain_warnings
from envserver.cli.logs import configure as configure_logs
from envserver.cli.parser import Parser
from envserver.cli.settings import EnvironmentOptions, check_settings, positive_int
from envserver.errors import EnvServerError

if TYPE_CHECKING:
    from envserver.host.config import HostConfig
    from envserver.host.loop import EnvHost

__all__ = ["build_parser", "main"]

logger = logging.getLogger("envserver.cli")


class _HelpOfAll(argparse.Action):
    """``envserver --help``: it lists every command with its help, so it loads them all first.

    The parser of a run loads only the command it runs (none for ``--version``).
    """

    def __init__(self, option_strings: Sequence[str], dest: str) -> None:
        super().__init__(
            option_strings,
            dest,
            default=argparse.SUPPRESS,
            nargs=0,
            help="show this help message and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        build_parser().print_help()
        parser.exit()


def _parser(commands: dict[str, Subcommand], names: Sequence[str]) -> Parser:
    """The top parser: each loaded command with its arguments, the others only by name."""
    parser = Parser(
        prog="envserver", description="Serve Gymnasium environments over ZeroMQ.", add_help=False
    )
    parser.add_argument("-h", "--help", action=_HelpOfAll)
    parser.add_argument("--version", action="version", version=f"envserver {__version__}")
    option = EnvironmentOptions(parser).add
    option(
        "--log-level",
        type=log_level,
        default=None,
        help="DEBUG, INFO, WARNING or ERROR (default: INFO; WARNING for commands that print "
        "a report: rollout, bench)",
    )
    option(
        "--log-format",
        choices=LOG_FORMATS,
        default="plain",
        help="log lines as text, or one JSON object each for log shippers (default: plain)",
    )
    # Every command's name, loaded or not: a usage line lists them all.
    metavar = "{" + ",".join(names) + "}"
    subparsers = parser.add_subparsers(dest="command", required=True, metavar=metavar)
    parser.commands = {}
    parser.command_help = {}
    for name, command in commands.items():
        parser.command_help[name] = command.help
        subparser = parser.commands[name] = subparsers.add_parser(name, help=command.help)
        command.add_arguments(subparser)
        add_log_arguments(subparser)
    for name in names:  # a command not loaded is still a choice (argparse's usage errors say so)
        if name not in commands:
            subparsers.add_parser(name)
    return parser


def _all_commands(contributed: dict[str, EntryPoint]) -> dict[str, EntryPoint]:
    """Every command, in the order ``--help`` lists them: serve, the contributed, the rest."""
    return {"serve": BUILT_IN["serve"], **contributed, **BUILT_IN}


def _commands(points: dict[str, EntryPoint], chosen: str | None) -> dict[str, Subcommand]:
    """Loads (imports) the command ``chosen``, or every one without it (for ``--help``).

    A contributed command that cannot be loaded is left out of ``--help`` with a warning.

    Raises:
        Exception: Whatever the chosen command raised while being loaded.
    """
    if chosen is not None:
        return {chosen: load_command(points[chosen])}
    loaded = {}
    for name, point in points.items():
        try:
            loaded[name] = load_command(point)
        except Exception as exc:
            logger.warning("envserver %s is not available: %s: %s", name, type(exc).__name__, exc)
    return loaded


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The options of ``serve``: every default is :class:`HostConfig`'s, defined there once.

    Each option that takes one value, or is a switch, may take its default from the environment
    (``--max-sessions`` from ``ENVSERVER_MAX_SESSIONS``: see :mod:`envserver.cli.settings`).
    """
    from envserver.host.config import HostConfig

    defaults = HostConfig()
    option = EnvironmentOptions(serve).add
    option(
        "--bind",
        type=_bind,
        default=defaults.bind,
        help="endpoint to bind (default: %(default)s; loopback only)",
    )
    option(
        "--allow-pickle",
        action="store_true",
        help="accept cloudpickled env factories: anyone who can reach the host can then run "
        "code on it, so only for trusted networks",
    )
    serve.add_argument(
        "--env",
        dest="env_patterns",
        action="append",
        metavar="PATTERN",
        help="serve only env ids matching this fnmatch pattern (repeatable; default: all)",
    )
    option(
        "--max-message-bytes",
        type=_setting("max_message_bytes"),
        default=defaults.max_message_bytes,
        help="largest request accepted (default: %(default)s)",
    )
    option("--name", default=defaults.name, help="host name for logs and error messages")
    option(
        "--curve-secret-key",
        metavar="FILE",
        default=defaults.curve_secret_key,
        help="encrypt with CURVE using this key (a .key_secret file from `envserver keygen`)",
    )
    option(
        "--authorized-keys",
        metavar="DIR",
        default=defaults.authorized_keys,
        help="with CURVE: accept only clients whose public key file is in DIR",
    )
    _limit_arguments(option, defaults)
    option(
        "--metrics-port",
        type=_setting("metrics_port"),
        default=defaults.metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics over HTTP at /metrics on this port (default: none)",
    )
    option(
        "--metrics-bind",
        default=defaults.metrics_bind,
        metavar="ADDRESS",
        help="the address of the metrics server (default: %(default)s; 0.0.0.0 in a container)",
    )
    option(
        "--processes",
        type=positive_int,
        default=1,
        metavar="N",
        help="serve N hosts, forked from this process, which starts again one that dies: "
        "on ports counting up from --bind's (an ipc:// path gets .0, .1, ...) (default: 1)",
    )
    serve.add_argument(
        "--parent-pid", type=int, default=defaults.parent_pid, help=argparse.SUPPRESS
    )
    # Embedded hosts: files to remove when the parent is gone (then their directory, if empty).
    serve.add_argument("--orphan-cleanup", action="append", default=[], help=argparse.SUPPRESS)
    add_import_argument(serve, "register the user's envs")


def _setting(name: str) -> Callable[[str], float]:
    """Reads an option's text as :class:`HostConfig`'s setting ``name``, within its range."""
    from envserver.host.config import LIMITS, check_limit

    convert = int if isinstance(LIMITS[name][0], int) else float

    def parse(text: str) -> float:
        try:
            value: Any = convert(text)
        except ValueError:
            value = text  # not a number: check_limit says what it must be
        try:
            return check_limit(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = convert.__name__
    return parse


def _bind(text: str) -> str:
    """Reads ``--bind``: an endpoint to bind (see ``check_endpoint``)."""
    from envserver.wire.endpoints import check_endpoint

    try:
        return check_endpoint(text, bind=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit_arguments(option: Callable[..., argparse.Action], defaults: HostConfig) -> None:
    """``serve``'s limits: sessions, envs, threads and how long a session lives."""
    option(
        "--max-sessions",
        type=_setting("max_sessions"),
        default=defaults.max_sessions,
        metavar="N",
        help="the most sessions (vector envs of trainers) held at once; one more is refused "
        "(default: %(default)s)",
    )
    option(
        "--max-envs-per-session",
        type=_setting("max_envs_per_session"),
        default=defaults.max_envs_per_session,
        metavar="N",
        help="the most envs one session may make on this host (default: %(default)s)",
    )
    option(
        "--max-envs",
        type=_setting("max_envs"),
        default=defaults.max_envs,
        metavar="N",
        help="the most envs of all sessions together (default: %(default)s)",
    )
    option(
        "--max-env-threads",
        type=_setting("max_env_threads"),
        default=defaults.max_env_threads,
        metavar="N",
        help="the most envs of a session stepped at once on threads: when its envs wait, or "
        "when its client asks (env_threads); 1 steps them in turn (default: %(default)s)",
    )
    option(
        "--session-idle-timeout",
        dest="session_idle_timeout_s",
        type=_setting("session_idle_timeout_s"),
        default=defaults.session_idle_timeout_s,
        metavar="SECONDS",
        help="close sessions idle this long (default: %(default)s)",
    )
    option(
        "--drain-grace",
        dest="drain_grace_s",
        type=_setting("drain_grace_s"),
        default=defaults.drain_grace_s,
        metavar="SECONDS",
        help="on SIGTERM, drain for up to this long first: open no new session and tell the "
        "clients, which move their envs (with their state) to other hosts; stop once none is "
        "left. Another SIGTERM changes nothing; SIGINT (Ctrl-C) stops at once "
        "(default: %(default)s: SIGTERM stops at once too)",
    )
    option(
        "--channel-spin",
        dest="channel_spin_s",
        type=_setting("channel_spin_s"),
        default=defaults.channel_spin_s,
        metavar="SECONDS",
        help="watch the channels of local sessions this long before a wait blocks, while it "
        "finds requests: for a host with a core of its own (default: %(default)s: block at "
        "once; local hosts get 0.0001 when each host and the trainer have a core)",
    )
    option(
        "--session-lease",
        dest="session_lease_s",
        type=_setting("session_lease_s"),
        default=defaults.session_lease_s,
        metavar="SECONDS",
        help="close a session (and its envs) whose client was not heard from this long: it "
        "is gone; clients heartbeat every third of it (default: %(default)s; 0: no lease)",
    )


def _serve(args: argparse.Namespace) -> int:
    from envserver.cli.processes import Supervisor

    if args.processes == 1:
        return _serve_host(args)
    try:
        supervisor = Supervisor(args, _serve_host)
    except ValueError as exc:  # endpoints that --processes cannot count up from
        _announce(args, logging.ERROR, f"envserver serve: {exc}")
        return 2
    try:
        import_modules(modules_to_import(args))  # once, for every host to share
    except ImportError as exc:
        _announce(args, logging.ERROR, f"envserver serve: {_line(exc)}")
        return 2
    return supervisor.run()


def _serve_host(args: argparse.Namespace) -> int:
    import zmq

    from envserver.curve.keys import exposure_warnings
    from envserver.host.loop import EnvHost, HostConfig
    from envserver.host.relay import Relay

    options = {field.name: getattr(args, field.name) for field in dataclasses.fields(HostConfig)}
    options["env_patterns"] = tuple(args.env_patterns or HostConfig().env_patterns)
    config = HostConfig(**options)
    relay = Relay()
    relay.install()  # from here the envs' output and warnings go to the clients and the log
    try:
        import_modules(modules_to_import(args))
        host = EnvHost(config, relay=relay)
    except zmq.ZMQError as exc:
        _announce(args, logging.ERROR, f"envserver serve: cannot bind {args.bind}: {exc}")
        return 2
    except (OSError, ValueError, ImportError) as exc:
        _announce(args, logging.ERROR, f"envserver serve: {_line(exc)}")
        return 2
    for warning in exposure_warnings(args.bind, bool(args.curve_secret_key), args.allow_pickle):
        _announce(args, logging.WARNING, warning)
    signals = _StopSignals(host)
    _announce(args, logging.INFO, f"envserver {__version__} serving on {host.endpoint}")
    if args.metrics_port is not None:
        _announce(
            args, logging.INFO, f"metrics on http://{args.metrics_bind}:{host.metrics.port}/metrics"
        )
    host.serve_forever()
    if received := signals.close():
        names = ", ".join(signum.name for signum in dict.fromkeys(received))
        logger.info("received %s; shut down", names)
    if args.parent_pid is not None and os.getppid() != args.parent_pid:
        _remove_orphaned(args.orphan_cleanup)
    return 0


def _remove_orphaned(paths: Sequence[str]) -> None:
    """Removes an embedded host's own files, and their directory when no other host's are left.

    Only when the trainer died without closing its hosts (a trainer that closes them removes
    the directory itself): every host removes its own files, so the last one out finds the
    directory empty.
    """
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    for directory in dict.fromkeys(os.path.dirname(os.path.abspath(p)) for p in paths):
        with contextlib.suppress(OSError):  # not empty: another host is still on its way out
            os.rmdir(directory)


def _announce(args: argparse.Namespace, level: int, text: str) -> None:
    """Prints a line on stderr whatever the log level: as a log record under --log-format json.

    A plain warning starts with ``WARNING: ``; under JSON the record's level says it.
    """
    if getattr(args, "log_format", "plain") == "json":
        text = JsonFormatter().format(logger.makeRecord(logger.name, level, "", 0, text, (), None))
    elif level == logging.WARNING:
        text = f"WARNING: {text}"
    print(text, file=sys.stderr, flush=True)


def _working_directory_importable() -> None:
    """Lets the working directory's modules be imported, as ``python -m envserver`` does.

    The console script's import path starts with its own directory, not the working one. The
    working directory is added last, so its files add modules but never replace installed ones
    (``python -m`` puts it first); not at all under ``python -P`` or ``PYTHONSAFEPATH``.
    """
    if getattr(sys.flags, "safe_path", False):
        return
    cwd = os.getcwd()
    if all(os.path.abspath(path or os.curdir) != cwd for path in sys.path):
        sys.path.append(cwd)


_SERVE = Subcommand("run an env host", _serve_arguments, _serve)

#: The built-in commands, loaded as the contributed ones are (only when run, or for --help).
BUILT_IN = {
    name: EntryPoint(name, value, ENTRY_POINT_GROUP)
    for name, value in (
        ("serve", f"{__name__}:_SERVE"),
        ("ping", "envserver.cli.ping:command"),
        ("keygen", "envserver.cli.keygen:command"),
    )
}


def build_parser() -> Parser:
    """The parser of ``envserver`` with every command, as ``envserver --help`` builds it.

    Every contributed command (entry point group ``envserver.commands``) is loaded; one that
    cannot be is left out with a warning. The command line's reference page is generated from
    it (``docs/hooks/cli_reference.py``). Defaults that come from ``ENVSERVER_*`` variables are
    read from the environment now.

    Returns:
        The parser: its ``commands`` (each command's parser, by name) and ``command_help``, and
        each parser's ``arguments`` (see :class:`envserver.cli.parser.Parser`).
    """
    points = _all_commands(contributed_commands())
    return _parser(_commands(points, None), [*points])


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``envserver`` command.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    points = _all_commands(contributed_commands())
    chosen = next((arg for arg in argv if arg in points), None)  # (options take no command names)
    try:
        commands = _commands(points, chosen) if chosen is not None else {}
    except Exception as exc:  # a contributed command that cannot be imported
        logger.debug("envserver %s cannot be loaded", chosen, exc_info=True)
        print(f"envserver {chosen}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    parser = _parser(commands, [*points])
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own parser says it, naming the command
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        check_settings(args)
    except ValueError as exc:  # an ENVSERVER_* variable the option cannot take
        print(f"envserver {args.command}: {exc}", file=sys.stderr)
        return 2
    configure_logs(args.log_level or commands[args.command].log_level, args.log_format)
    plain_warnings()
    _working_directory_importable()
    try:
        return commands[args.command].run(args)
    except KeyboardInterrupt as exc:  # outside a command's own handling (e.g. while closing)
        print(f"envserver {args.command}: interrupted", file=sys.stderr)
        return exit_status(exc)
    except Exception as exc:  # one clear line, never a traceback (--log-level DEBUG shows it)
        logger.debug("envserver %s failed", args.command, exc_info=True)
        print(f"envserver {args.command}: {_line(exc)}", file=sys.stderr)
        return 2 if _is_usage_error(exc) else 1


def _is_usage_error(exc: Exception) -> bool:
    """Whether ``exc`` says the command was given something it cannot take (exit status 2).

    A ``ValueError`` raised here, from the arguments; not one an env raised on a host (its
    message names the host), which is the env's error.
    """
    return type(exc) is ValueError and not isinstance(exc, EnvServerError)


def _line(exc: Exception) -> str:
    """One line for a command's error: its message, with its type where the type tells more.

    A usage error and an OS error read as plain words (``/some/dir: No such file or
    directory``); others keep their type (``HostUnavailableError``, an env's ``NameNotFound``).
    """
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else None
        message = f"{where}: {exc.strerror}" if where is not None else exc.strerror
    else:
        message = " ".join(str(exc).split())
    plain = isinstance(exc, (OSError, ImportError)) and not isinstance(exc, EnvServerError)
    if plain or _is_usage_error(exc):  # (an ImportError of --import says "cannot import")
        return message
    return f"{type(exc).__name__}: {message}"


class _StopSignals:
    """``serve``'s stop signals: SIGTERM stops the host gracefully, SIGINT (Ctrl-C) at once.

    Both stop it cleanly (envs closed, exit status 0), as gunicorn and other servers take them.

    With a drain grace (``--drain-grace``), SIGTERM drains the host first (see
    :mod:`envserver.host.drain`), and a SIGTERM that comes while it drains changes nothing (it
    is logged once): Slurm signals every process of a job step, so a host forked by
    ``--processes`` gets Slurm's SIGTERM and its parent's, and drains once. Kubernetes and
    Compose send SIGTERM once, then SIGKILL when their grace is over.

    A handler must not log: a signal that comes while the main thread writes a log line makes
    the write reentrant (the handler raised before it stopped the host, which then ran on). What
    is to be said while the host serves goes on a queue (``SimpleQueue.put`` is safe in a
    handler), which a thread of its own logs.

    Args:
        host: The host to stop; the handlers are installed at once (from the main thread).
    """

    def __init__(self, host: EnvHost) -> None:
        from envserver.host.drain import Answer  # (not in the handler: it must not import)

        self._answers = Answer
        self._host = host
        #: The signals received, in order.
        self.received: list[signal.Signals] = []
        self._noted_draining = False
        self._notes: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write, name="envserver-signals", daemon=True)
        self._writer.start()
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        host.wake_on_signals()

    def close(self) -> list[signal.Signals]:
        """Lets the thread log what it was given, and end; the signals received."""
        self._notes.put(None)
        self._writer.join()
        return self.received

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received.append(signal.Signals(signum))
        if signum == signal.SIGINT:
            self._host.stop()
            return
        answer = self._host.drain.request()
        if answer is self._answers.STOP:
            self._host.stop()
        elif answer is self._answers.DRAINING and not self._noted_draining:
            self._noted_draining = True
            self._notes.put(
                "received SIGTERM while draining: the drain goes on (SIGINT stops the host at once)"
            )

    def _write(self) -> None:
        while (note := self._notes.get()) is not None:
            logger.info("%s", note)
