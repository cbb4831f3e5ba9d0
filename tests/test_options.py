"""client._options.VectorOptions: RemoteVectorEnv's options, frozen and checked once."""

from __future__ import annotations

import dataclasses

import pytest
from gymnasium.vector import AutoresetMode

from client._options import VectorOptions


def test_defaults_and_normalization():
    options = VectorOptions(autoreset_mode="SameStep", spare_hosts=["tcp://a:1"])
    assert options.autoreset_mode is AutoresetMode.SAME_STEP
    assert options.spare_hosts == ("tcp://a:1",)
    assert VectorOptions().autoreset_mode is AutoresetMode.NEXT_STEP


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        VectorOptions().copy = False


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"on_host_failure": "retry"}, "on_host_failure must be"),
        ({"env_threads": 0}, "env_threads must be a positive integer"),
        ({"env_threads": 2.0}, "env_threads must be a positive integer"),
        ({"info_format": "table"}, "info_format"),
        ({"autoreset_mode": "bogus"}, "'bogus' is not a valid AutoresetMode"),
    ],
)
def test_invalid_values_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VectorOptions(**kwargs)
