"""envserver.client._options: RemoteVectorEnv's options (frozen, checked once), argument checks."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest
from gymnasium.vector import AutoresetMode

from envserver import client
from envserver.client import RemoteVectorEnv
from envserver.client._options import (
    DEFAULT_OPTIONS,
    VectorOptions,
    _field_docs,
    call_rounds,
    checked_async_arguments,
    checked_env_ids,
    count_envs,
    split_envs,
    values_by_env,
)


def test_defaults_and_normalization():
    options = VectorOptions(autoreset_mode="SameStep", spare_hosts=["tcp://a:1"])
    assert options.autoreset_mode is AutoresetMode.SAME_STEP
    assert options.spare_hosts == ("tcp://a:1",)
    assert VectorOptions().autoreset_mode is AutoresetMode.NEXT_STEP


def test_spare_hosts_are_read_as_every_host_list_is():
    """One string may name several spares, as hosts= does; a malformed list is one line now."""
    assert VectorOptions(spare_hosts="tcp://a:1,tcp://b:2").spare_hosts == (
        "tcp://a:1",
        "tcp://b:2",
    )
    assert VectorOptions(spare_hosts=["tcp://a:1", "tcp://a:1"]).spare_hosts == ("tcp://a:1",)
    for bad in ("local", "tcp://a:1,local", "tcp://a:1,sim-b:2"):
        with pytest.raises(ValueError) as refused:
            VectorOptions(spare_hosts=bad)
        assert "\n" not in str(refused.value)


def test_each_option_is_written_once_as_a_field_with_its_default_and_doc():
    # RemoteVectorEnv.__init__ takes **options and names none of them ...
    fields = dataclasses.fields(VectorOptions)
    (init,) = [
        node
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(RemoteVectorEnv))))
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    ]
    assert init.args.kwarg.arg == "options"
    assert not {arg.arg for arg in init.args.kwonlyargs} & {field.name for field in fields}
    # ... and its signature, docstring and make_vec's vector_kwargs are made from the fields.
    parameters = inspect.signature(RemoteVectorEnv).parameters
    doc = " ".join(inspect.getdoc(RemoteVectorEnv).split())
    docs = _field_docs()
    for field in fields:
        parameter = parameters[field.name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, field.name
        assert parameter.default == field.default == getattr(DEFAULT_OPTIONS, field.name)
        assert parameter.annotation == field.type, field.name
        assert docs[field.name], field.name
        assert f"{field.name}: {' '.join(docs[field.name].split())}" in doc, field.name
        assert field.name in client.VECTOR_KEYWORDS, field.name
    assert "**options" not in doc and list(parameters)[-1] == fields[-1].name


def test_every_option_reads_back_as_an_attribute_set_once():
    envs = RemoteVectorEnv(
        env_id="CartPole-v1", num_envs=2, num_local_hosts=2, snapshot_every=7, shared_memory=False
    )
    try:
        for field in dataclasses.fields(VectorOptions):
            value = getattr(envs, field.name)  # the value in use (sizes as they came out)
            assert value == getattr(envs.options, field.name), field.name
            if field.name != "copy":  # it may change, as AsyncVectorEnv's
                with pytest.raises(AttributeError, match=f"{field.name} is set when the env"):
                    setattr(envs, field.name, value)
        assert (envs.snapshot_every, envs.shared_memory, envs.envs_per_host) == (7, False, (1, 1))
        assert (envs.batch_size, envs.sub_batch_size) == (2, 1)  # all envs, a host's share
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"host_timeout": 3}, "'host_timeout'; did you mean 'host_timeout_s'?"),
        ({"copy": False, "env_kwarg": {}}, "'env_kwarg'; did you mean 'env_kwargs'?"),
        ({"turbo": True}, "'turbo'"),
    ],
)
def test_an_unknown_option_is_refused_in_one_line_naming_the_closest(kwargs, message):
    asked: list[str] = []

    def resolver(name: str, port: int) -> list[str]:
        asked.append(name)
        return ["127.0.0.1"]

    expected = f"RemoteVectorEnv got an unexpected keyword argument {message}"
    for make in [
        lambda: RemoteVectorEnv(
            env_id="CartPole-v1", num_envs=2, hosts="dns://sim:5555", resolver=resolver, **kwargs
        ),
        lambda: client.make_vec(
            "CartPole-v1", 2, hosts="dns://sim:5555", vector_kwargs={"resolver": resolver, **kwargs}
        ),
    ]:
        with pytest.raises(TypeError) as raised:
            make()
        assert str(raised.value) == expected and asked == []  # before any host is asked


def test_rollout_flags_default_to_the_options():
    import argparse

    from envserver.client.commands import rollout

    parser = argparse.ArgumentParser()
    rollout.add_arguments(parser)
    args = parser.parse_args(["CartPole-v1"])
    assert args.connect_timeout == DEFAULT_OPTIONS.connect_timeout_s
    assert args.on_host_failure == DEFAULT_OPTIONS.on_host_failure


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


def test_sizes_and_local_host_count():
    options = VectorOptions()
    assert options.batch_size_for(8) == 8
    assert VectorOptions(batch_size=3).batch_size_for(8) == 3
    with pytest.raises(ValueError, match="batch_size must be between 1 and num_envs=8"):
        VectorOptions(batch_size=9).batch_size_for(8)
    assert options.sub_batch_size_for(8, 3) == 2  # a host's share of a batch
    assert options.sub_batch_size_for(2, 4) == 1
    with pytest.raises(ValueError, match="sub_batch_size must be positive"):
        VectorOptions(sub_batch_size=0).sub_batch_size_for(8, 2)
    assert VectorOptions(num_local_hosts=3).local_host_count(8) == 3
    assert VectorOptions(envs_per_host=[5, 3]).local_host_count(8) == 2
    assert 1 <= options.local_host_count(2) <= 2  # one per core, never more than the envs


def test_env_count_and_split():
    assert count_envs([lambda: None] * 3, None, None) == 3
    assert count_envs(None, "CartPole-v1", 4) == 4
    with pytest.raises(ValueError, match="exactly one of env_fns and env_id"):
        count_envs(None, None, 4)
    with pytest.raises(ValueError, match="num_envs=2 but 3 env_fns"):
        count_envs([lambda: None] * 3, None, 2)
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        count_envs(None, "CartPole-v1", 0)
    assert split_envs(16, 3, None) == [6, 5, 5]
    assert split_envs(4, 2, [3, 1]) == [3, 1]
    with pytest.raises(ValueError, match="3 hosts for 2 envs"):
        split_envs(2, 3, None)
    with pytest.raises(ValueError, match="summing to num_envs=4"):
        split_envs(4, 2, [2, 1])


def test_env_ids_rounds_and_values():
    assert checked_env_ids([0, -1, 2], 4) == [0, 3, 2]
    with pytest.raises(ValueError, match="env_ids must be integers"):
        checked_env_ids([0.5], 4)
    with pytest.raises(ValueError, match="below 4"):
        checked_env_ids([4], 4)
    # An env named twice is called in a second round; positions keep their order.
    assert call_rounds([1, 2, 1, 1]) == [[0, 1], [2], [3]]
    assert values_by_env(7, [0, 2]) == {0: 7, 2: 7}
    assert values_by_env([1, 2, 3], [0, 1, 0]) == {0: 3, 1: 2}  # the last value wins
    with pytest.raises(ValueError, match="Got `1` values for 2 environments"):
        values_by_env([1], [0, 1])


def test_asyncvectorenv_arguments():
    with pytest.raises(TypeError, match="no worker function"):
        checked_async_arguments(None, print, None)
    with pytest.raises(TypeError, match="no max_concurrency"):
        checked_async_arguments(None, None, 2)
    with pytest.warns(UserWarning, match="ignores context='spawn'"):
        assert checked_async_arguments("spawn", None, None) is None
    with pytest.raises(TypeError, match=r"context must be a zmq\.Context"):
        checked_async_arguments(object(), None, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"connect_timeout_s": 3},
            "make_vec got connect_timeout_s among the env's keyword arguments, but "
            "connect_timeout_s is an option of the vector env: pass "
            "vector_kwargs={'connect_timeout_s': 3}",
        ),
        (
            {"copy": False, "render_mode": None, "autoreset_mode": "SameStep"},
            "make_vec got copy and autoreset_mode among the env's keyword arguments, but copy "
            "and autoreset_mode are options of the vector env: pass "
            "vector_kwargs={'copy': False, 'autoreset_mode': 'SameStep'}",
        ),
    ],
)
def test_make_vec_refuses_vector_options_among_env_kwargs_before_any_host(kwargs, message):
    asked: list[str] = []

    def resolver(name: str, port: int) -> list[str]:
        asked.append(name)
        return ["127.0.0.1"]

    with pytest.raises(TypeError) as raised:
        client.make_vec(
            "CartPole-v1", 2, hosts="dns://sim:5555", vector_kwargs={"resolver": resolver}, **kwargs
        )
    assert str(raised.value) == message and asked == []
