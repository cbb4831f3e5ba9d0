"""``envserver keygen``: a CURVE key pair, ``NAME.key`` (public) and ``NAME.key_secret``."""

from __future__ import annotations

import argparse
import os

from envserver.cli.commands import Subcommand

__all__ = ["KEY_FILE_ENDS", "command"]

#: The ends of the names of a key pair's files (``NAME.key``, ``NAME.key_secret``).
KEY_FILE_ENDS = ("key", "key_secret")


def _arguments(keygen: argparse.ArgumentParser) -> None:
    keygen.add_argument("directory", help="where to write the key files")
    keygen.add_argument("--name", default="envserver", help="file name stem (default: envserver)")
    keygen.add_argument(
        "--force",
        action="store_true",
        help="replace a key pair of that name (every copy of its public key must then be "
        "replaced too)",
    )


def _run(args: argparse.Namespace) -> int:
    import zmq.auth

    if not args.directory.strip():
        raise ValueError("name the directory to write the key files into")
    existing = [
        path
        for path in (os.path.join(args.directory, f"{args.name}.{end}") for end in KEY_FILE_ENDS)
        if os.path.lexists(path)
    ]
    if existing and not args.force:
        raise ValueError(
            f"{existing[0]} exists; --force replaces the key pair (every copy of its public key "
            "must then be replaced too)"
        )
    os.makedirs(args.directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(args.directory, args.name)
    os.chmod(secret, 0o600)
    print(f"public key (give to the other side): {public}")
    print(f"secret key (keep private):           {secret}")
    return 0


command = Subcommand("make a CURVE key pair (NAME.key, NAME.key_secret)", _arguments, _run)
