"""The command-line layer: the ``envserver`` command and what running it as a process needs.

It owns the command and its built-in subcommands ``serve``, ``ping`` and ``keygen``
(:mod:`~envserver.cli.app`, whose :func:`~envserver.cli.app.main` is the console script), the
commands other packages contribute and the options they share (:mod:`~envserver.cli.commands`),
log output (:mod:`~envserver.cli.logs`), SIGINT and SIGTERM as an exception
(:mod:`~envserver.cli.interrupts`), and the command line that starts a host as a child process
(:mod:`~envserver.cli.spawn`).

Only :mod:`~envserver.cli.app` imports the host layer (and may import every layer but the
client). The other modules import the errors, the wire and CURVE layers and each other, never
``app``, the host or the client: the client adds its ``rollout`` command (an entry point) and
starts local hosts through them without loading the host.
"""
