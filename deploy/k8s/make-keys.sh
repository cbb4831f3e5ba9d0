#!/bin/sh
# Makes the CURVE keys with `envserver keygen` and stores them in the two Secrets the manifests
# mount: envserver-host-keys (hosts) and envserver-trainer-keys (trainers). Run once, before
# `kubectl apply -k deploy/k8s`; KUBECTL_ARGS passes e.g. "-n envs".
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for name in server health trainer; do
    envserver --log-level WARNING keygen "$dir" --name "$name" >/dev/null
done
# shellcheck disable=SC2086
kubectl ${KUBECTL_ARGS:-} create secret generic envserver-host-keys \
    --from-file=server.key="$dir/server.key" \
    --from-file=server.key_secret="$dir/server.key_secret" \
    --from-file=health.key="$dir/health.key" \
    --from-file=health.key_secret="$dir/health.key_secret" \
    --from-file=trainer.key="$dir/trainer.key"
# shellcheck disable=SC2086
kubectl ${KUBECTL_ARGS:-} create secret generic envserver-trainer-keys \
    --from-file=server.key="$dir/server.key" \
    --from-file=trainer.key_secret="$dir/trainer.key_secret"
