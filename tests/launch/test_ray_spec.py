"""ray:// specs read without Ray: what they ask for, and one clear error for what they cannot be.

Hosts on real Ray clusters are in tests/cluster/test_ray.py (make test-ray).
"""

from __future__ import annotations

import re

import pytest
from helpers import run_envserver

from envserver import client
from envserver.errors import HostUnavailableError
from envserver.launch import ray as ray_launch
from envserver.launch.ray import RaySpec


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ray://", RaySpec("ray://")),
        ("ray://head:6379", RaySpec("ray://head:6379", "head:6379")),
        ("ray://?hosts=8", RaySpec("ray://?hosts=8", hosts=8)),
        (
            "ray://10.0.0.1:6379/?hosts=4&cpus=0.5&strategy=STRICT_SPREAD",
            RaySpec(
                "ray://10.0.0.1:6379/?hosts=4&cpus=0.5&strategy=STRICT_SPREAD",
                "10.0.0.1:6379",
                4,
                0.5,
                "STRICT_SPREAD",
            ),
        ),
    ],
)
def test_ray_specs_parse(text, expected):
    assert RaySpec.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ray://head/x", "is not a Ray host spec: expected ray://[HEAD:PORT][?hosts=N]"),
        ("ray://?hosts=0", "hosts must be a positive integer, got '0'"),
        ("ray://?hosts=two", "hosts must be a positive integer, got 'two'"),
        ("ray://?cpus=-1", "cpus must be a positive number, got '-1'"),
        ("ray://?cpus=nan", "cpus must be a positive number, got 'nan'"),
        ("ray://?strategy=RANDOM", "strategy must be one of SPREAD, STRICT_SPREAD, PACK"),
        ("ray://?gpus=1", "unknown option(s) gpus (hosts, cpus, strategy)"),
        ("ray://?hosts=1&hosts=2", "hosts given 2 times"),
        ("ray://head", "(the address is HEAD:PORT, got 'head')"),
        ("ray://user@head:6379", "(the address is HEAD:PORT, got 'user@head:6379')"),
        ("ray://head:port", "(the address is HEAD:PORT, got 'head:port')"),
        ("ray://?hosts", "options are NAME=VALUE, joined by &"),
    ],
)
def test_bad_ray_specs_are_refused_before_any_cluster_is_asked(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        client.make_vec("CartPole-v1", num_envs=2, hosts=text)


def test_a_ray_spec_is_the_whole_host_list():
    with pytest.raises(ValueError, match="a ray:// spec is the whole host list"):
        client.make_vec("CartPole-v1", num_envs=2, hosts=["ray://", "tcp://127.0.0.1:5555"])
    with pytest.raises(ValueError, match=r"envs_per_host with ray:// needs the host count"):
        client.make_vec(
            "CartPole-v1", num_envs=2, hosts="ray://", vector_kwargs={"envs_per_host": [1, 1]}
        )


def test_a_bad_spec_is_one_line_from_the_command_line():
    result = run_envserver("rollout", "CartPole-v1", "--hosts", "ray://?hosts=0")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "envserver rollout: 'ray://?hosts=0': hosts must be a positive integer, got '0'"
    )


class _FlakyRay:
    """Ray's ``init`` through a Ray Client proxy whose forked servers die ``deaths`` times."""

    def __init__(self, deaths: list[str]) -> None:
        self.deaths = deaths
        self.inits = self.shutdowns = 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **_: object) -> None:
        self.inits += 1
        if self.deaths:
            raise ConnectionError(f"Initialization failure from server:\n{self.deaths.pop(0)}")

    def shutdown(self) -> None:
        self.shutdowns += 1


#: Both forms of the proxy's answer when the server it forked for a trainer dies at its start.
DIED = [
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23001.err",
    'Traceback (most recent call last): File "proxier.py", line 765, in Datapath if not '
    "self.proxy_manager.start_specific_server( ...",
]


def test_a_ray_client_connection_whose_server_died_at_its_start_is_made_again(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    flaky = _FlakyRay(list(DIED))
    ray_launch._connect(flaky, RaySpec("ray://"), 1.0)
    assert (flaky.inits, flaky.shutdowns) == (3, 2)


def test_a_ray_client_server_that_keeps_dying_or_another_failure_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    flaky = _FlakyRay(list(DIED) * 2)
    with pytest.raises(HostUnavailableError, match="no Ray cluster reached at auto"):
        ray_launch._connect(flaky, RaySpec("ray://"), 1.0)
    assert flaky.inits == ray_launch.CLIENT_SERVER_ATTEMPTS
    other = _FlakyRay(["PermissionError: not allowed"])
    with pytest.raises(HostUnavailableError, match="not allowed"):
        ray_launch._connect(other, RaySpec("ray://"), 1.0)
    assert other.inits == 1
