"""The ``envserver`` command: ``serve``, ``rollout`` and ``ping``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import zmq

from envserver import __version__
from envserver.endpoints import prepare_socket
from envserver.errors import EnvServerError
from envserver.host import EnvHost, HostConfig, install_signal_handlers
from envserver.interrupts import Interrupted, exit_status, signals_interrupt
from envserver.logs import LOG_FORMATS, JsonFormatter
from envserver.logs import configure as configure_logs
from envserver.protocol import (
    Command,
    Status,
    decode_reply,
    encode_request,
)
from envserver.reach import MONITORED_EVENTS, Reachability, wait_for_reply
from envserver.rollout import RandomRollout, summary_lines
from envserver.security import exposure_warnings, load_curve_keys

__all__ = ["main"]

logger = logging.getLogger("envserver.cli")

#: Modules to import before serving (comma-separated): ``--import`` from the environment.
IMPORT_VARIABLE = "ENVSERVER_IMPORT"
#: ``serve``'s defaults: the host's own.
DEFAULTS = HostConfig()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="envserver", description="Serve Gymnasium environments over ZeroMQ."
    )
    parser.add_argument("--version", action="version", version=f"envserver {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default: INFO)"
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="plain",
        help="log lines as text, or one JSON object each for log shippers (default: plain)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run an env host")
    _serve_arguments(serve)
    _rollout_arguments(commands.add_parser("rollout", help="run random-action rollouts"))

    ping = commands.add_parser("ping", help="exit 0 if a host answers (health checks)")
    ping.add_argument("endpoint", help="the host's endpoint, e.g. tcp://127.0.0.1:5555")
    ping.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for an answer (default: 5)"
    )
    _curve_client_arguments(ping)
    _log_arguments(ping)

    keygen = commands.add_parser("keygen", help="make a CURVE key pair (NAME.key, NAME.key_secret)")
    keygen.add_argument("directory", help="where to write the key files")
    keygen.add_argument("--name", default="envserver", help="file name stem (default: envserver)")
    _log_arguments(keygen)
    return parser


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The options of ``serve``: every default is :class:`HostConfig`'s, defined there once."""
    serve.add_argument(
        "--bind",
        default=DEFAULTS.bind,
        help="endpoint to bind (default: %(default)s; loopback only)",
    )
    serve.add_argument(
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
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULTS.max_message_bytes,
        help="largest request accepted (default: %(default)s)",
    )
    serve.add_argument(
        "--name", default=DEFAULTS.name, help="host name for logs and error messages"
    )
    serve.add_argument(
        "--curve-secret-key",
        metavar="FILE",
        default=DEFAULTS.curve_secret_key,
        help="encrypt with CURVE using this key (a .key_secret file from `envserver keygen`)",
    )
    serve.add_argument(
        "--authorized-keys",
        metavar="DIR",
        default=DEFAULTS.authorized_keys,
        help="with CURVE: accept only clients whose public key file is in DIR",
    )
    serve.add_argument(
        "--max-sessions", type=int, default=DEFAULTS.max_sessions, help="(default: %(default)s)"
    )
    serve.add_argument(
        "--max-envs-per-session",
        type=int,
        default=DEFAULTS.max_envs_per_session,
        help="(default: %(default)s)",
    )
    serve.add_argument(
        "--max-envs",
        type=int,
        default=DEFAULTS.max_envs,
        help="all sessions (default: %(default)s)",
    )
    serve.add_argument(
        "--max-env-threads",
        type=int,
        default=DEFAULTS.max_env_threads,
        metavar="N",
        help="the most envs of a session stepped at once on threads, when its client asks "
        "(env_threads); 1 steps them in turn (default: %(default)s)",
    )
    serve.add_argument(
        "--session-idle-timeout",
        dest="session_idle_timeout_s",
        type=float,
        default=DEFAULTS.session_idle_timeout_s,
        metavar="SECONDS",
        help="close sessions idle this long (default: %(default)g)",
    )
    serve.add_argument(
        "--session-lease",
        dest="session_lease_s",
        type=float,
        default=DEFAULTS.session_lease_s,
        metavar="SECONDS",
        help="close a session (and its envs) whose client was not heard from this long: it "
        "is gone; clients heartbeat every third of it (default: %(default)g; 0: no lease)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULTS.metrics_port,
        metavar="PORT",
        help="serve Prometheus metrics over HTTP at /metrics on this port (default: none)",
    )
    serve.add_argument(
        "--metrics-bind",
        default=DEFAULTS.metrics_bind,
        metavar="ADDRESS",
        help="the address of the metrics server (default: %(default)s; 0.0.0.0 in a container)",
    )
    serve.add_argument(
        "--parent-pid", type=int, default=DEFAULTS.parent_pid, help=argparse.SUPPRESS
    )
    # Embedded hosts: files to remove when the parent is gone (then their directory, if empty).
    serve.add_argument("--orphan-cleanup", action="append", default=[], help=argparse.SUPPRESS)
    _import_argument(serve, "register the user's envs")
    _log_arguments(serve)


def _rollout_arguments(rollout: argparse.ArgumentParser) -> None:
    rollout.add_argument("env_id", help="registered env id, e.g. CartPole-v1")
    rollout.add_argument("--num-envs", type=int, default=8, help="number of envs (default: 8)")
    rollout.add_argument(
        "--steps", type=int, default=1000, help="vector steps; each steps every env (default: 1000)"
    )
    rollout.add_argument(
        "--hosts",
        nargs="+",
        metavar="HOST",
        help="env hosts: endpoints (tcp://sim-a:5555) or dns://NAME:PORT for every address of "
        "NAME (default: start local hosts)",
    )
    rollout.add_argument(
        "--min-hosts",
        type=int,
        metavar="N",
        help="wait until N hosts answer (dns:// addresses included; default: one per dns:// name)",
    )
    rollout.add_argument(
        "--connect-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the hosts (default: 60)",
    )
    rollout.add_argument(
        "--on-host-failure",
        choices=("raise", "restart"),
        default="raise",
        help="stop at a lost host, or re-make its envs and go on (default: raise)",
    )
    rollout.add_argument("--seed", type=int, default=0, help="seed for envs and actions")
    _curve_client_arguments(rollout)
    _import_argument(rollout, "in this process and in its local hosts")
    rollout.add_argument(
        "--json", action="store_true", help="print one JSON object (no progress bar)"
    )
    rollout.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _log_arguments(rollout)


def _import_argument(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE first, e.g. one that registers your envs ({where}; repeatable; "
        f"also from ${IMPORT_VARIABLE}, comma-separated)",
    )


def _log_arguments(parser: argparse.ArgumentParser) -> None:
    """The global log options, also accepted after the command."""
    parser.add_argument(
        "--log-level", default=argparse.SUPPRESS, help="DEBUG, INFO, WARNING or ERROR"
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="log lines as text, or one JSON object each",
    )


def _curve_client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--curve-server-key", metavar="FILE", help="the host's public key file (NAME.key)"
    )
    parser.add_argument(
        "--curve-client-key", metavar="FILE", help="this client's secret key file (.key_secret)"
    )


def _serve(args: argparse.Namespace) -> int:
    options = {field.name: getattr(args, field.name) for field in dataclasses.fields(HostConfig)}
    options["env_patterns"] = tuple(args.env_patterns or DEFAULTS.env_patterns)
    config = HostConfig(**options)
    try:
        _import_modules(_modules_to_import(args))
        host = EnvHost(config)
    except zmq.ZMQError as exc:
        _announce(args, logging.ERROR, f"envserver serve: cannot bind {args.bind}: {exc}")
        return 2
    except (OSError, ValueError, ImportError) as exc:
        _announce(args, logging.ERROR, f"envserver serve: {type(exc).__name__}: {exc}")
        return 2
    for warning in exposure_warnings(args.bind, bool(args.curve_secret_key), args.allow_pickle):
        _announce(args, logging.WARNING, warning)
    install_signal_handlers(host)
    _announce(args, logging.INFO, f"envserver {__version__} serving on {host.endpoint}")
    if args.metrics_port is not None:
        _announce(
            args, logging.INFO, f"metrics on http://{args.metrics_bind}:{host.metrics.port}/metrics"
        )
    host.serve_forever()
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


def _rollout(args: argparse.Namespace) -> int:
    import client

    if args.imports and args.hosts:
        raise ValueError(
            "--import applies to this process and its local hosts; the hosts given with "
            "--hosts import their own modules (envserver serve --import)"
        )
    if not args.hosts:
        modules = _modules_to_import(args)
        _import_modules(modules)
        if modules:  # the local hosts inherit the environment
            os.environ[IMPORT_VARIABLE] = ",".join(modules)

    summary: dict[str, Any] = {"env_id": args.env_id, "num_envs": args.num_envs}
    started = time.perf_counter()
    envs = rollout = progress = None
    try:
        with signals_interrupt():
            try:
                envs = client.make_vec(
                    args.env_id,
                    num_envs=args.num_envs,
                    hosts=args.hosts,
                    vector_kwargs={
                        "curve_server_key": args.curve_server_key,
                        "curve_client_key": args.curve_client_key,
                        "min_hosts": args.min_hosts,
                        "connect_timeout_s": args.connect_timeout,
                        "on_host_failure": args.on_host_failure,
                    },
                )
                summary["setup_seconds"] = time.perf_counter() - started
                progress = _progress_bar(args.steps * args.num_envs, args.no_progress or args.json)
                rollout = RandomRollout(envs, args.seed)
                rollout.run(args.steps, progress)
            finally:
                if progress is not None:
                    progress.close()
                if envs is not None:
                    summary.update(rollout.summary() if rollout is not None else {})
                    summary["host_restarts"] = envs.host_restarts
                    summary["hosts"] = [
                        {"endpoint": endpoint, "num_envs": count}
                        for endpoint, count in zip(envs.hosts, envs.envs_per_host)
                    ]
                    envs.close()
    except Interrupted as exc:
        steps = summary.get("env_steps", 0)
        print(
            f"envserver rollout: interrupted ({exc.signal_name}) after {steps} env steps",
            file=sys.stderr,
            flush=True,
        )
        _print_summary(args, {**summary, "interrupted": True, "signal": exc.signal_name})
        return exit_status(exc)
    _print_summary(args, summary)
    return 0


def _progress_bar(total: int, quiet: bool) -> Any:
    """A tqdm bar over ``total`` env steps, or None when quiet."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return None if quiet else tqdm(total=total, unit="step", unit_scale=True)


def _print_summary(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print("\n".join(summary_lines(summary)), flush=True)


def _keygen(args: argparse.Namespace) -> int:

    import zmq.auth

    os.makedirs(args.directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(args.directory, args.name)
    os.chmod(secret, 0o600)
    print(f"public key (give to the other side): {public}")
    print(f"secret key (keep private):           {secret}")
    return 0


def _ping(args: argparse.Namespace) -> int:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    monitor = None
    try:
        curve = load_curve_keys(args.curve_server_key, args.curve_client_key)
        if curve is not None:
            socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = curve
        prepare_socket(socket, args.endpoint)
        monitor = socket.get_monitor_socket(MONITORED_EVENTS)
        socket.connect(args.endpoint)
        socket.send_multipart(encode_request(1, Command.PING, None, {}, allow_pickle=False))
        reach = Reachability(args.endpoint, uses_curve=curve is not None)
        if not wait_for_reply(socket, monitor, reach, args.timeout):
            if reach.refusal is None:
                why = f"no answer from {args.endpoint} within {args.timeout:g} s: "
                why += reach.why_silent()
            else:
                why = f"host {args.endpoint} {reach.refusal}"
                if curve is None:
                    why += "; pass --curve-server-key and --curve-client-key"
            print(f"envserver ping: {why}", file=sys.stderr)
            return 1
        reply = decode_reply(socket.recv_multipart(), allow_pickle=False)
        if reply.status != Status.OK:
            print(
                f"envserver ping: {args.endpoint} answered with an error: {reply.body}",
                file=sys.stderr,
            )
            return 1
        info = reply.body
        print(
            f"{args.endpoint}: envserver {info.get('envserver')} (protocol "
            f"{info.get('protocol')}), pid {info.get('pid')}, {info.get('sessions')} session(s)"
        )
        return 0
    except (zmq.ZMQError, EnvServerError, OSError, ValueError) as exc:
        print(f"envserver ping: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if monitor is not None:
            socket.disable_monitor()
            monitor.close(linger=0)
        socket.close(linger=0)
        context.term()


def _modules_to_import(args: argparse.Namespace) -> list[str]:
    """The modules of ``$ENVSERVER_IMPORT`` and then of ``--import``, each once."""
    listed = os.environ.get(IMPORT_VARIABLE, "").split(",") + args.imports
    return list(dict.fromkeys(name.strip() for name in listed if name.strip()))


def _import_modules(modules: Sequence[str]) -> None:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``envserver`` command.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    args = _parser().parse_args(argv)
    configure_logs(str(args.log_level), args.log_format)
    _working_directory_importable()
    handlers = {"serve": _serve, "rollout": _rollout, "ping": _ping, "keygen": _keygen}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt as exc:  # outside a command's own handling (e.g. while closing)
        print(f"envserver {args.command}: interrupted", file=sys.stderr)
        return exit_status(exc)
    except Exception as exc:  # one clear line, never a traceback (--log-level DEBUG shows it)
        logger.debug("envserver %s failed", args.command, exc_info=True)
        message = " ".join(str(exc).split())
        print(f"envserver {args.command}: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1
