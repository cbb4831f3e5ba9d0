"""The wire layer: everything that travels between a client and a host, and how it travels.

It owns the message layout and protocol version (:mod:`~envserver.wire.messages`), the msgpack
codec with raw array frames (:mod:`~envserver.wire.codec`), multipart sends and receives
(:mod:`~envserver.wire.frames`), spaces as plain data (:mod:`~envserver.wire.spaces`), each
command's request and reply bodies as typed values (:mod:`~envserver.wire.bodies`,
:mod:`~envserver.wire.replies`), Gymnasium's batch layout
(:mod:`~envserver.wire.batching`), endpoints and sockets (:mod:`~envserver.wire.endpoints`), and
why a host cannot be reached (:mod:`~envserver.wire.reach`: what the transport's monitor events
say, which ``envserver ping`` and the client both report). ``docs/protocol.md`` is its prose.

Both sides import it. It imports only :mod:`envserver.errors` and itself: never the host, the
CLI or the client.
"""
