"""The launching layer: starting hosts as processes, and the settings that say where they are.

- :mod:`~envserver.launch.spawn`: the one command line that starts ``envserver serve`` as a
  child process (the client's local hosts, :func:`envserver.testing.start_host`).
- :mod:`~envserver.launch.forkserver`: the trainer's fork server, which forks local hosts from
  a process that imported what a host needs once (its process is
  :mod:`envserver.cli.forkhost`, started by module name).
- :mod:`~envserver.launch.forked`: what a process forked to serve does first and last.
- :mod:`~envserver.launch.launcher`: what a launcher is (starts hosts, says their endpoints,
  replaces a lost one, stops them all); :mod:`~envserver.launch.ray` starts hosts as actors on
  a Ray cluster (``ray://``; the ``ray`` extra, imported only there).
- :mod:`~envserver.launch.specs`: what a ``dns://`` or ``slurm://`` host spec names now;
  :mod:`~envserver.launch.slurm`: the nodes of a Slurm job (its node lists, expanded by
  ``scontrol``).
- :mod:`~envserver.launch.environment`: the ``ENVSERVER_*`` variables a trainer reads (its
  hosts, ``min_hosts``, CURVE keys) and which setting wins.

It imports the errors and the wire layers only, and never loads the host: the client imports
it. Launchers that start hosts elsewhere belong here, one module each.
"""
