"""Runs the conformance suite with pytest against an endpoint."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "run"]


def run(
    endpoint: str | None = None,
    *,
    curve_server_key: str | None = None,
    curve_client_key: str | None = None,
    timeout_s: float = 30.0,
    pytest_args: Sequence[str] = (),
) -> int:
    """Runs the suite; returns pytest's exit status (0: the endpoint conforms).

    Args:
        endpoint: The host to test, e.g. ``tcp://127.0.0.1:5555``; None starts a local one.
        curve_server_key: The host's CURVE public key file, for a host that uses CURVE.
        curve_client_key: This client's CURVE secret key file (authorized on the host).
        timeout_s: How long to wait for each reply.
        pytest_args: More pytest arguments (``-x``, ``-k STEP``, ``-q``, ...).

    Raises:
        ImportError: If pytest is not installed.
    """
    import pytest

    # The package's directory, not --pyargs: pytest then loads its conftest (the options) first.
    args = [str(Path(__file__).parent), "-p", "no:cacheprovider"]
    args += ["--conformance-timeout", str(timeout_s)]
    if endpoint:
        args += ["--conformance-endpoint", endpoint]
    if curve_server_key:
        args += ["--conformance-curve-server-key", curve_server_key]
    if curve_client_key:
        args += ["--conformance-curve-client-key", curve_client_key]
    return int(pytest.main([*args, *pytest_args]))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m envserver.conformance``: parses the arguments and runs the suite."""
    parser = argparse.ArgumentParser(
        prog="python -m envserver.conformance",
        description="Check an env host against the envserver wire protocol (docs/protocol.md). "
        "Arguments after -- go to pytest.",
    )
    parser.add_argument("endpoint", nargs="?", help="the host to test (default: start one)")
    parser.add_argument("--curve-server-key", metavar="FILE", help="the host's public key file")
    parser.add_argument(
        "--curve-client-key", metavar="FILE", help="this client's secret key file (.key_secret)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="wait for each reply"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)
    try:
        return run(
            args.endpoint,
            curve_server_key=args.curve_server_key,
            curve_client_key=args.curve_client_key,
            timeout_s=args.timeout,
            pytest_args=extra,
        )
    except ImportError as exc:
        print(
            f"envserver conformance: ImportError: {exc} (pip install 'envserver[conformance]')",
            file=sys.stderr,
        )
        return 2
