"""envserver.client._infos: the batch's infos built as SyncVectorEnv builds them, for any infos.

The oracle is SyncVectorEnv itself: envs that return generated infos from step, and the infos it
returns, compared exactly (types, dtypes, masks, key order) with ours built from the same dicts.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from helpers import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from envserver.client._infos import InfoBatch, add_env_info


class ScriptedInfos(gym.Env):
    """Returns the info it is given from every step."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, info: dict) -> None:
        self.info = info

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        return 0, 0.0, False, False, copy.deepcopy(self.info)


# Python numbers mix under one key (a column of the first one's type takes the others, as ints
# and floats convert); a numpy number fixes its own dtype, so a key holds numpy numbers of one
# dtype only (SyncVectorEnv itself raises OverflowError for 2**15 in an int16 column).
PYTHON_NUMBERS = st.one_of(
    st.integers(-(2**31), 2**31), st.floats(-1e6, 1e6, allow_nan=False), st.booleans()
)
NUMPY_NUMBERS = [
    st.floats(-1e3, 1e3, allow_nan=False, width=32).map(np.float32),
    st.integers(-100, 100).map(np.int16),
]
OBJECTS = st.one_of(st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=2))


@st.composite
def kinds(draw, depth=0):
    """A value generator for one key: each env's value under that key has one kind."""
    options = ["number", "numpy number", "array", "object", "numpy bool"]
    kind = draw(st.sampled_from(options + (["dict"] if depth < 2 else [])))
    if kind == "number":
        return PYTHON_NUMBERS
    if kind == "numpy number":
        return draw(st.sampled_from(NUMPY_NUMBERS))
    if kind == "object":
        return OBJECTS
    if kind == "numpy bool":
        return st.booleans().map(np.bool_)
    if kind == "array":
        dtype = draw(st.sampled_from([np.float32, np.int64, np.uint8, np.bool_]))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
        return hnp.arrays(dtype, shape)
    return draw(layouts(depth + 1))


@st.composite
def layouts(draw, depth=0):
    """The keys of an info dict and how each key's values are made (each env sets some)."""
    keys = draw(st.lists(st.sampled_from(["a", "b", "final_obs", "c", "_d"]), unique=True))
    members = {key: draw(kinds(depth)) for key in keys}
    return st.fixed_dictionaries({}, optional=members)


@st.composite
def batches(draw):
    layout = draw(layouts())
    return draw(st.lists(layout, min_size=1, max_size=4))


@settings(max_examples=150, deadline=None)
@given(batches())
def test_infos_are_built_as_sync_vector_env_builds_them(env_infos):
    oracle = gym.vector.SyncVectorEnv([lambda info=info: ScriptedInfos(info) for info in env_infos])
    oracle.reset(seed=0)
    *_, expected = oracle.step(np.zeros(len(env_infos), dtype=np.int64))
    infos = {}
    for position, info in enumerate(env_infos):
        infos = add_env_info(infos, copy.deepcopy(info), position, len(env_infos))
    assert_same(infos, expected)


def test_columns_take_the_type_of_the_first_env_that_sets_them():
    infos = {}
    for position, info in enumerate([{}, {"n": 2, "x": np.ones(2, np.float32)}, {"n": 3.7}]):
        infos = add_env_info(infos, info, position, 3)
    assert list(infos) == ["n", "_n", "x", "_x"]
    assert infos["n"].dtype == np.int64 and infos["n"].tolist() == [0, 2, 3]
    assert infos["_n"].tolist() == [False, True, True]
    assert infos["x"].shape == (3, 2) and infos["x"].dtype == np.float32


@pytest.mark.parametrize("info_format", ["dict", "list"])
def test_info_batch_in_either_format(info_format):
    batch = InfoBatch(2, info_format)
    infos = batch.add(batch.start(), {"a": 1}, 1)
    infos = batch.label(infos, np.array([5, 6]))
    if info_format == "list":
        assert infos == [{"env_id": 5}, {"a": 1, "env_id": 6}]
    else:
        assert infos["a"].tolist() == [0, 1] and infos["env_id"].tolist() == [5, 6]
