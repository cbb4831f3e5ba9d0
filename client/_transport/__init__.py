"""The client's transport: everything that speaks ZeroMQ to env hosts, and nothing of Gymnasium.

- :mod:`.link`: one DEALER socket, its monitor, whole messages in and out.
- :mod:`.session`: a session on a host as the client holds it (id, HELLO's answers, step layout).
- :mod:`.requests`: one record per request in flight (:class:`~.requests.Pending`) and a failed
  host's state (:class:`~.requests.Failure`).
- :mod:`.block`: the host a connection reaches and the envs it holds there (how messages name them).
- :mod:`.health`: a connection's failure, and the liveness verdicts (:mod:`.liveness`) that find it.
- :mod:`.tracker`: a connection's requests under way, their replies taken into them, and what an
  interruption cut sent again.
- :mod:`.connection`: one host's connection, composed of those, and the session it holds.
- :mod:`.error_replies`: what an error reply says (the exception to raise, or that envs are
  gone); the typed OK replies are the wire layer's (:mod:`envserver.wire.replies`).
- :mod:`.pool`: every connection of a vector env, and requests sent to all of them or none.
- :mod:`.waits`: the two waits (any, all) over one poller, which return what happened (the
  caller decides on recovery).
- :mod:`.raw_step`: the lean step, an encoding and a fast receive of the same requests.
- :mod:`.lease`, :mod:`.discovery`, :mod:`.local`, :mod:`.hearing`: session leases, hosts found
  by DNS, local hosts started as processes, what envs said told to the trainer.

It imports the wire and launch layers and :mod:`envserver.errors`; never Gymnasium, and never
the client's semantic modules beside it (tests/system/test_layers.py pins both).
"""
