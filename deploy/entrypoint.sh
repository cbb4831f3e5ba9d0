#!/bin/sh
# The image's entrypoint. An envserver command (or option) runs envserver:
#   docker run IMAGE serve ...          docker compose run trainer rollout CartPole-v1
# any other program on PATH runs as it is, with the same environment (ENVSERVER_HOSTS, keys):
#   docker compose run trainer python train.py
set -e
case "${1:-}" in
    "" | -* | serve | ping | keygen | rollout | bench) exec envserver "$@" ;;
esac
if command -v "$1" >/dev/null 2>&1; then
    exec "$@"
fi
exec envserver "$@"  # a command another package adds to envserver, or a clear error
