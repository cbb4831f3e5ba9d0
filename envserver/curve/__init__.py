"""The CURVE layer: keys, and who a host lets in.

It owns loading and checking key files and the exposure warnings of a plaintext host
(:mod:`~envserver.curve.keys`, used by the client, the CLI and the conformance suite), and the
host's ZAP handler and handshake monitor (:mod:`~envserver.curve.guard`, used by the host).

It imports :mod:`envserver.errors` and the wire layer at most; never the host, the CLI or the
client.
"""
