"""The CURVE layer: keys, and who a host lets in.

It owns loading and checking key files and the exposure warnings of a plaintext host
(:mod:`~envserver.curve.keys`, used by the host, the client and the CLI), and the host's ZAP
handler and handshake monitor (:mod:`~envserver.curve.guard`).

It imports :mod:`envserver.errors` and the wire layer at most; never the host, the CLI or the
client.
"""
