"""``python -m envserver``: the same as the ``envserver`` command."""

from envserver.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
