"""The command-line layer: the ``envserver`` command.

It owns the command and its built-in subcommands ``serve``, ``ping`` and ``keygen``
(:mod:`~envserver.cli.app`, whose :func:`~envserver.cli.app.main` is the console script;
:mod:`~envserver.cli.ping`, :mod:`~envserver.cli.keygen`), the
commands other packages contribute and the options they share (:mod:`~envserver.cli.commands`),
option values and their defaults from ``ENVSERVER_*`` variables (:mod:`~envserver.cli.settings`),
the argument parser that keeps what it is given, for the reference page
(:mod:`~envserver.cli.parser`), log output (:mod:`~envserver.cli.logs`), SIGINT and SIGTERM as
an exception (:mod:`~envserver.cli.interrupts`), ``serve --processes``
(:mod:`~envserver.cli.processes`) and the fork server's process (:mod:`~envserver.cli.forkhost`),
both of which serve hosts.

Only :mod:`~envserver.cli.app` (and the fork server's process, which runs it) imports the host
layer. The other modules import the errors, wire, CURVE and launching layers and each other,
never ``app``, the host or the client: the client's ``rollout`` command (an entry point) uses
them without loading the host.
"""
