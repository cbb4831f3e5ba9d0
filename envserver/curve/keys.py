"""CURVE keys and exposure checks, shared by the host, the client and the CLI."""

from __future__ import annotations

import os

import zmq
import zmq.auth

__all__ = ["exposure_warnings", "load_curve_keys"]


def load_curve_keys(
    server_key: str | os.PathLike | None, client_key: str | os.PathLike | None
) -> tuple[bytes, bytes, bytes] | None:
    """Loads the CURVE keys a client needs: the host's public key, this client's key pair.

    Args:
        server_key: The host's public key file (``NAME.key`` from ``envserver keygen``).
        client_key: This client's secret key file (``NAME.key_secret``).

    Returns:
        ``(server_public, client_public, client_secret)``, or None when neither is given.

    Raises:
        ValueError: If only one is given, or a file holds no usable key.
        FileNotFoundError: If a key file does not exist.
    """
    if server_key is None and client_key is None:
        return None
    if server_key is None or client_key is None:
        raise ValueError(
            "CURVE needs both the host's public key file and this client's secret key file"
        )
    for path in (server_key, client_key):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no such CURVE key file: {os.fspath(path)}")
    server_public, _ = zmq.auth.load_certificate(server_key)
    client_public, client_secret = zmq.auth.load_certificate(client_key)
    if client_secret is None:
        raise ValueError(f"{client_key} holds no secret key (use the .key_secret file)")
    return server_public, client_public, client_secret


def exposure_warnings(bind: str, curve: bool, allow_pickle: bool) -> list[str]:
    """Warnings for a host reachable from other machines without protection.

    Args:
        bind: The endpoint the host binds.
        curve: Whether CURVE is on.
        allow_pickle: Whether the host accepts pickled factories.

    Returns:
        The warnings, most serious last; none for loopback and ipc endpoints.
    """
    if not bind.startswith("tcp://"):
        return []
    address = bind[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
    if address == "localhost" or address == "::1" or address.startswith("127."):
        return []
    warnings = []
    if not curve:
        warnings.append(
            f"{bind} is reachable from other machines and CURVE is off: anyone who can reach "
            "it can use its envs (see --curve-secret-key and --authorized-keys)"
        )
        if allow_pickle:
            warnings.append(
                "--allow-pickle without CURVE on a non-loopback address: anyone who can reach "
                "this port can run any code on this machine"
            )
    return warnings
