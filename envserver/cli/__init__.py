"""The command-line layer: the ``envserver`` command and what running it as a process needs.

It owns the command and its built-in subcommands ``serve``, ``ping`` and ``keygen``
(:mod:`~envserver.cli.main`), the commands other packages contribute and the options they share
(:mod:`~envserver.cli.commands`), log output (:mod:`~envserver.cli.logs`), SIGINT and SIGTERM as
an exception (:mod:`~envserver.cli.interrupts`), and the command line that starts a host as a
child process (:mod:`~envserver.cli.spawn`).

:mod:`~envserver.cli.main` imports the host layer; the other modules import neither the host nor
the client, so the client adds its ``rollout`` command (an entry point) and starts local hosts
(:mod:`~envserver.cli.spawn`) through them without loading the host. Nothing here imports the
client.
"""
