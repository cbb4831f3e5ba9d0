"""deploy/k8s: every manifest validated offline and strictly against a pinned Kubernetes
version, and the manifests agree with each other (labels and selectors, ports, the Secrets'
keys and the files hosts and trainers read, the keys make-keys.sh stores)."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers import settings_of

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.34.0"
PROBES = ("readinessProbe", "livenessProbe")


def manifests() -> dict[str, dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return {name: yaml.safe_load((K8S / name).read_text()) for name in kustomization["resources"]}


def pod(manifest: dict) -> dict:
    return manifest["spec"]["template"]


def container_settings(container: dict) -> dict[str, str]:
    """The container's envserver settings: its ENVSERVER_* variables, then its flags."""
    environment = {v["name"]: v["value"] for v in container.get("env", [])}
    return settings_of(container["args"], environment)


def test_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("name", sorted(manifests()))
def test_manifest_is_valid_kubernetes(name):
    kubernetes_validate.validate(manifests()[name], KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field():
    broken = copy.deepcopy(manifests()["deployment.yaml"])
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_service_deployment_policy_and_job_agree():
    m = manifests()
    service, hosts = m["service.yaml"], m["deployment.yaml"]
    policy, job = m["networkpolicy.yaml"], m["trainer-job.yaml"]
    host_labels = pod(hosts)["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"  # headless: every pod's address
    assert service["metadata"]["name"] == "envhost"
    assert service["spec"]["selector"].items() <= host_labels.items()
    assert hosts["spec"]["selector"]["matchLabels"].items() <= host_labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= host_labels.items()
    (container,) = pod(hosts)["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == ports
    settings = container_settings(container)
    assert container["args"][0] == "serve"
    assert settings["ENVSERVER_BIND"] == f"tcp://0.0.0.0:{ports['envs']}"
    assert int(settings["ENVSERVER_METRICS_PORT"]) == ports["metrics"]
    annotations = pod(hosts)["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    # Only trainer pods reach the env port, and the Job's pods are trainer pods.
    env_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == ports["envs"])
    (source,) = env_rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= pod(job)["metadata"]["labels"].items()
    assert not source["podSelector"]["matchLabels"].items() <= host_labels.items()
    trainer = container_settings(pod(job)["spec"]["containers"][0])
    assert trainer["ENVSERVER_HOSTS"] == f"dns://envhost:{ports['envs']}"
    assert int(trainer["ENVSERVER_MIN_HOSTS"]) == hosts["spec"]["replicas"]
    for probe in PROBES:  # each probe's ping gives up before Kubernetes does
        command = container[probe]["exec"]["command"]
        assert command[:3] == ["envserver", "ping", f"tcp://127.0.0.1:{ports['envs']}"]
        timeout = float(command[command.index("--timeout") + 1])
        assert timeout < container[probe]["timeoutSeconds"]


def test_pods_run_locked_down():
    for manifest in (manifests()["deployment.yaml"], manifests()["trainer-job.yaml"]):
        spec = pod(manifest)["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"] and container["resources"]["limits"]


def secrets_made_by_make_keys(tmp_path: Path) -> dict[str, set[str]]:
    """Runs make-keys.sh with a kubectl that records what it is asked to create."""
    record = tmp_path / "kubectl.log"
    fake = tmp_path / "bin" / "kubectl"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    fake.chmod(0o755)
    path = f"{fake.parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    subprocess.run(
        ["sh", str(K8S / "make-keys.sh")], check=True, timeout=120, env={**os.environ, "PATH": path}
    )
    secrets = {}
    for line in record.read_text().splitlines():
        name = re.search(r"create secret generic (\S+)", line).group(1)
        secrets[name] = set(re.findall(r"--from-file=([^=]+)=", line))
    return secrets


def mounted_files(manifest: dict) -> tuple[str, dict[str, str], list[str]]:
    """The Secret a pod mounts at /keys, its items (key -> path), and the /keys files it reads."""
    spec = pod(manifest)["spec"]
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/keys"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    items = {item["key"]: item["path"] for item in volume["secret"]["items"]}
    arguments = [*container["args"], *container_settings(container).values()]
    for probe in PROBES:
        arguments += container.get(probe, {}).get("exec", {}).get("command", [])
    read = [a for a in arguments if a.startswith("/keys/")]
    return volume["secret"]["secretName"], items, read


def test_secrets_hold_exactly_the_files_hosts_and_trainers_read(tmp_path):
    secrets = secrets_made_by_make_keys(tmp_path)
    for name in ("deployment.yaml", "trainer-job.yaml"):
        secret, items, read = mounted_files(manifests()[name])
        assert set(items) == secrets[secret], name
        paths = {f"/keys/{path}" for path in items.values()}
        for file in read:
            if file == "/keys/authorized":  # a directory: the authorized public keys
                assert {p for p in paths if p.startswith("/keys/authorized/")}
            else:
                assert file in paths, (name, file)
    _, host_items, _ = mounted_files(manifests()["deployment.yaml"])
    authorized = {k for k, p in host_items.items() if p.startswith("authorized/")}
    assert authorized == {"trainer.key", "health.key"}  # the trainer's and the probe's keys
