"""The raw step layout (STEP_RAW): round trips for every kind of leaf, and fuzzed frames.

A frame that does not fit the layout (wrong length, missing or extra frames, bad env ids, flag
bytes other than 0 or 1, unreadable info entries) must raise ProtocolError, on either side,
and a host must answer it with an error reply and step on: never a crash, never a wrong batch.
"""

from __future__ import annotations

import copy
import itertools
import os

import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from envserver.errors import ProtocolError
from envserver.host.loop import EnvHost, HostConfig
from envserver.wire.batching import merge
from envserver.wire.codec import pack_plain
from envserver.wire.messages import (
    PROTOCOL_VERSION,
    Command,
    RawStepEnvelopes,
    Status,
    decode_reply,
    encode_raw_request,
    encode_request,
    raw_reply_envelope,
)
from envserver.wire.raw import StepLayout
from envserver.wire.slab import SLAB_DIRECTORY, SlabOffer

LEAF_SPACES = [
    spaces.Box(-1, 1, (3,), np.float32),
    spaces.Box(0, 255, (2, 2), np.uint8),
    spaces.Box(-1, 1, (), np.float64),
    spaces.Box(-1, 1, (0,), np.float32),  # no bytes per env
    spaces.Box(0, 1, (2,), np.bool_),
    spaces.Discrete(5),
    spaces.MultiDiscrete([3, 4]),
    spaces.MultiBinary(3),
]


def nested() -> st.SearchStrategy[spaces.Space]:
    """Array spaces, and Tuples and Dicts of them (two levels)."""
    leaf = st.sampled_from(LEAF_SPACES)
    level = st.one_of(
        leaf,
        st.lists(leaf, min_size=1, max_size=3).map(lambda s: spaces.Tuple(s)),
        st.dictionaries(st.sampled_from("abc"), leaf, min_size=1).map(spaces.Dict),
    )
    return st.one_of(level, st.lists(level, min_size=1, max_size=2).map(lambda s: spaces.Tuple(s)))


def batch(space: spaces.Space, count: int, seed: int) -> object:
    """A batch of ``count`` samples, as Gymnasium batches them."""
    from gymnasium.vector.utils import batch_space

    batched = batch_space(space, count)
    batched.seed(seed)
    return batched.sample()


def assert_same(a: object, b: object) -> None:
    """``b`` has ``a``'s nesting, and arrays of its dtypes, shapes and values."""
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, tuple):
        assert type(b) is tuple and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert type(b) is np.ndarray and b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_array_equal(a, b)


@settings(max_examples=150, deadline=None)
@given(nested(), nested(), st.integers(0, 5), st.integers(0, 2**16))
def test_values_round_trip_exactly(obs_space, action_space, count, seed) -> None:
    """Actions and observations of every kind of leaf arrive as they left: dtype, shape, bytes."""
    layout = StepLayout.of(obs_space, action_space)
    assert layout is not None
    actions = batch(action_space, count, seed)
    frames = layout.request_frames(actions, count, None)
    got, env_ids = layout.read_request(frames, count)
    assert env_ids is None
    assert_same(actions, got)
    obs = batch(obs_space, count, seed + 1)
    rewards = np.linspace(-1, 1, count)
    flags = np.arange(2 * count) % 3 == 0
    entries = [[0, {"x": np.arange(300)}]] if count else []
    reply = layout.reply_frames(
        obs, rewards, flags[:count], flags[count:], entries, allow_pickle=False
    )
    body = layout.read_reply(reply, count, allow_pickle=False, writable=True)
    assert_same(obs, body.obs)
    assert body.rewards.tolist() == rewards.tolist()
    assert body.terminations.tolist() == flags[:count].tolist()
    assert body.truncations.tolist() == flags[count:].tolist()
    assert len(body.infos) == len(entries)


@settings(max_examples=150, deadline=None)
@given(nested(), st.integers(0, 4), st.integers(0, 2), st.integers(0, 2**16))
def test_replies_written_into_a_batch_are_exact(obs_space, count, at, seed) -> None:
    """The lean step's write: a reply's rows land in the whole batch exactly, others untouched."""
    layout = StepLayout.of(obs_space, spaces.Discrete(2))
    num_envs = at + count + 1
    observations = batch(obs_space, num_envs, seed)
    rewards, flags = np.full(num_envs, 7.0), np.ones((2, num_envs), np.bool_)
    before = copy.deepcopy(observations)
    obs = batch(obs_space, count, seed + 1)
    reply = layout.reply_frames(
        obs,
        np.linspace(-1, 1, count),
        np.arange(count) % 2 == 0,
        np.zeros(count, np.bool_),
        [[0, {"x": np.arange(300)}]] if count else [],
        allow_pickle=False,
    )
    into = layout.reply_views(observations, rewards, flags)
    entries = layout.write_reply(reply, into, at, count, allow_pickle=False)
    body = layout.read_reply(reply, count, allow_pickle=False, writable=True)
    rows = slice(at, at + count)
    assert_same(observations, merge(obs_space, before, body.obs, rows))  # the general merge
    assert rewards[rows].tolist() == body.rewards.tolist() and rewards[at + count] == 7.0
    assert flags[0, rows].tolist() == body.terminations.tolist()
    assert flags[1, rows].tolist() == body.truncations.tolist() and flags[:, -1].all()
    assert len(entries) == len(body.infos)


def test_reply_views_need_the_layouts_batches() -> None:
    """A batch of other dtypes, shapes or memory order has no views (steps go the general way)."""
    obs = {"a": np.zeros((4, 2), np.float32), "b": np.zeros(4, np.int64)}
    rewards, flags = np.zeros(4), np.zeros((2, 4), np.bool_)
    assert LAYOUT.reply_views(obs, rewards, flags) is not None
    assert LAYOUT.reply_views({**obs, "b": np.zeros(4, np.int32)}, rewards, flags) is None
    assert LAYOUT.reply_views({**obs, "a": np.zeros((2, 4), np.float32).T}, rewards, flags) is None
    assert LAYOUT.reply_views(obs, rewards.astype(np.float32), flags) is None
    assert LAYOUT.reply_views(obs, rewards, np.zeros((4, 2), np.bool_)) is None


@pytest.mark.parametrize("request_id", [1, 127, 128, 2**16, 2**40])
def test_the_lean_steps_envelopes_are_the_encoders_bytes(request_id) -> None:
    # A client's lean step packs them with a packer of its own; a host reads either the same.
    envelopes = RawStepEnvelopes()
    for _ in range(2):  # (a held packer starts each message afresh)
        request, reply = envelopes.of(request_id, b"session")
        assert request == encode_raw_request(request_id, b"session", [])[0]
        assert reply == raw_reply_envelope(request_id)


def test_spaces_without_a_layout() -> None:
    """Spaces that are not made of arrays, big-endian or empty nests have no layout."""
    box = spaces.Box(-1, 1, (2,), np.float32)
    for space in (
        spaces.Text(5),
        spaces.Tuple([]),
        spaces.Dict({}),
        spaces.Tuple([box, spaces.Text(3)]),
        spaces.Box(-1, 1, (2,), np.dtype(">f4")),
        spaces.Sequence(box),
    ):
        assert StepLayout.of(space, box) is None
        assert StepLayout.of(box, space) is None


def test_a_session_whose_envs_differ_has_no_layout() -> None:
    """A host offers a layout only when every env of the session has the same spaces."""
    box, wide = spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-2, 2, (2,), np.float32)

    class Env:
        def __init__(self, observation_space: spaces.Space) -> None:
            self.observation_space, self.action_space = observation_space, spaces.Discrete(2)

    assert StepLayout.shared_by([Env(box), Env(box)]).describe() == {
        "obs": [["<f4", [2]]],
        "actions": [["<i8", []]],
    }
    assert StepLayout.shared_by([Env(box), Env(wide)]) is None
    assert StepLayout.shared_by([Env(spaces.Text(3))]) is None


def test_actions_that_do_not_fit_go_as_step() -> None:
    """Actions of another dtype or shape, or not arrays, are not sent raw (nothing is cast)."""
    layout = StepLayout.of(spaces.Discrete(2), spaces.Box(-1, 1, (2,), np.float32))
    assert layout.request_frames(np.zeros((3, 2), np.float32), 3, None) is not None
    assert layout.request_frames(np.zeros((3, 2), np.float64), 3, None) is None
    assert layout.request_frames(np.zeros((3, 3), np.float32), 3, None) is None
    assert layout.request_frames([[0.0, 0.0]] * 3, 3, None) is None
    # A view that is not contiguous travels as its values.
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    frames = layout.request_frames(strided, 3, [2, 0, 1])
    actions, env_ids = layout.read_request(frames, 3)
    np.testing.assert_array_equal(actions, strided)
    assert env_ids == [2, 0, 1]


LAYOUT = StepLayout.of(
    spaces.Dict({"a": spaces.Box(-1, 1, (2,), np.float32), "b": spaces.Discrete(3)}),
    spaces.Tuple([spaces.Discrete(2), spaces.Box(-1, 1, (2,), np.float64)]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6), st.integers(0, 3))
def test_fuzzed_replies_are_refused_or_exact(frames, count) -> None:
    """Any frames either decode to a batch of exactly ``count`` envs, or raise ProtocolError."""
    try:
        body = LAYOUT.read_reply(frames, count, allow_pickle=False, writable=False)
    except ProtocolError:
        return
    assert body.obs["a"].shape == (count, 2) and body.obs["b"].shape == (count,)
    assert len(body.rewards) == len(body.terminations) == count
    assert set(np.frombuffer(bytes(frames[2]), np.uint8, offset=8 * count)) <= {0, 1}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=6), st.integers(0, 3), st.integers(0, 2))
def test_fuzzed_replies_are_written_whole_or_not_at_all(frames, count, at) -> None:
    """The lean step's write: ProtocolError with the batches untouched, or read_reply's values."""
    num_envs = at + count + 1
    obs = {"a": np.full((num_envs, 2), 5, np.float32), "b": np.full(num_envs, 5, np.int64)}
    written_whole_or_not_at_all(LAYOUT, obs, frames, at, count)


def written_whole_or_not_at_all(
    layout: StepLayout, obs: dict[str, np.ndarray], frames: list[bytes], at: int, count: int
) -> dict[str, object] | None:
    """Writes a reply into batches of fives; None if refused (ProtocolError, nothing written),
    else read_reply's body, which the rows written must equal."""
    num_envs = len(obs["b"])
    rewards, flags = np.full(num_envs, 5.0), np.ones((2, num_envs), np.bool_)
    into = layout.reply_views(obs, rewards, flags)
    try:
        layout.write_reply(frames, into, at, count, allow_pickle=False)
    except ProtocolError:
        assert all((values == 5).all() for values in obs.values())
        assert (rewards == 5).all() and flags.all()
        return None
    body = layout.read_reply(frames, count, allow_pickle=False, writable=True)
    rows = slice(at, at + count)
    for key, values in obs.items():
        assert values[rows].tobytes() == body.obs[key].tobytes()
    assert rewards[rows].tobytes() == body.rewards.tobytes()
    assert flags[0, rows].tolist() == body.terminations.tolist()
    assert flags[1, rows].tolist() == body.truncations.tolist()
    return body


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=5), st.integers(1, 4))
def test_fuzzed_requests_are_refused_or_exact(frames, num_envs) -> None:
    """Any request frames either decode to actions for the envs named, or raise ProtocolError."""
    try:
        actions, env_ids = LAYOUT.read_request(frames, num_envs)
    except ProtocolError:
        return
    count = num_envs if env_ids is None else len(env_ids)
    assert env_ids is None or (len(set(env_ids)) == count and max(env_ids) < num_envs)
    assert actions[0].shape == (count,) and actions[1].shape == (count, 2)
    assert actions[0].flags.writeable and actions[1].flags.writeable


REQUEST_IDS = itertools.count(100)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory):
    """An in-process host with one session of two CartPole envs."""
    directory = tmp_path_factory.mktemp("raw")
    host = EnvHost(HostConfig(bind=f"ipc://{directory}/h.sock"))
    hello = host.handle(encode_request(1, Command.HELLO, None, {}, allow_pickle=False))
    session = decode_reply(hello, allow_pickle=False).body["session"]
    make = {"env_id": "CartPole-v1", "kwargs": {}, "num_envs": 2}
    host.handle(encode_request(2, Command.MAKE, session, make, allow_pickle=False))
    host.handle(encode_request(3, Command.RESET, session, {"seeds": [0, 1]}, allow_pickle=False))
    yield host, session
    host.close()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.binary(max_size=24), max_size=4))
def test_a_host_answers_fuzzed_step_raw_and_steps_on(host, frames) -> None:
    """A host answers every STEP_RAW (OK only for frames that fit) and keeps its session."""
    env_host, session = host
    request_id = next(REQUEST_IDS)
    head = pack_plain([PROTOCOL_VERSION, request_id, int(Command.STEP_RAW), session])
    reply = decode_reply(
        env_host.handle([head, *frames]), allow_pickle=False, raw=lambda f: list(f)
    )
    if reply.status is Status.OK:  # it fitted: 8 bytes of int64 per env stepped
        assert (len(frames) == 1 and len(frames[0]) == 16) or (
            len(frames) == 2 and len(frames[1]) == 8 * (len(frames[0]) // 4)
        )
    else:
        assert reply.body["type"] in ("ProtocolError", "AssertionError", "ValueError"), reply.body
    ok = env_host.handle(
        [
            pack_plain([PROTOCOL_VERSION, next(REQUEST_IDS), int(Command.STEP_RAW), session]),
            np.zeros(2, "<i8").tobytes(),
        ]
    )
    assert decode_reply(ok, allow_pickle=False, raw=lambda f: list(f)).status is Status.OK


#: A layout large enough for a slab with 4 envs: 16 KiB and 8 bytes per env.
SLAB_SPACE = spaces.Dict({"a": spaces.Box(0, 255, (64, 64, 4), np.uint8), "b": spaces.Discrete(3)})


@pytest.fixture(scope="module")
def slabbed():
    """``SLAB_SPACE``'s layout with a slab of 4 envs, its rows filled with random values."""
    offer = SlabOffer.make()
    layout = StepLayout.of(SLAB_SPACE, spaces.Discrete(2)).slab_for_host(offer.name, 4)
    offer.withdraw()
    rng = np.random.default_rng(0)
    for rows in layout.slab.arrays:
        rows[...] = rng.integers(0, 100, rows.shape)
    return layout


#: Frames of random bytes, and columns frames of 1 to 4 envs of zeros.
FRAME = st.one_of(st.binary(max_size=50), st.integers(1, 4).map(lambda n: b"\0" * 10 * n))


@pytest.mark.skipif(not os.path.isdir(SLAB_DIRECTORY), reason="no shared memory")
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(FRAME, max_size=4), st.integers(1, 4), st.integers(0, 2), st.booleans())
def test_fuzzed_slab_replies_are_written_whole_or_not_at_all(slabbed, frames, count, at, fits):
    """With a slab, a reply has no observation frames: ProtocolError and nothing written, or the
    slab's rows and the frames' columns, exactly as read_reply reads them. With ``fits``, the
    first frame is a columns frame of ``count`` envs (rewards, then flags of 0 and 1)."""
    if fits:
        columns = np.arange(count, dtype="<f8").tobytes() + bytes(i % 2 for i in range(2 * count))
        frames = [columns, *frames[1:]]
    num_envs = at + count
    obs = {"a": np.full((num_envs, 64, 64, 4), 5, np.uint8), "b": np.full(num_envs, 5, np.int64)}
    body = written_whole_or_not_at_all(slabbed, obs, frames, at, count)
    event("refused" if body is None else "written")
    if body is not None:
        for rows, key in zip(slabbed.slab.arrays, ("a", "b")):
            np.testing.assert_array_equal(body.obs[key], rows[:count])


@pytest.mark.skipif(not os.path.isdir(SLAB_DIRECTORY), reason="no shared memory")
def test_a_slab_reply_of_some_envs_reads_their_rows(slabbed) -> None:
    """A step of env ids reads those rows of the slab, in that order; a host writes them."""
    columns = np.zeros(2, "<f8").tobytes() + b"\0" * 4
    body = slabbed.read_reply([columns], 2, allow_pickle=False, writable=True, env_ids=[3, 1])
    np.testing.assert_array_equal(body.obs["a"], slabbed.slab.arrays[0][[3, 1]])
    new = {"a": np.full((2, 64, 64, 4), 9, np.uint8), "b": np.array([1, 2])}
    frames = slabbed.reply_frames(
        new, np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), [], allow_pickle=False,
        env_ids=[2, 0],
    )  # fmt: skip
    assert len(frames) == 1  # the columns only: the observations are in the slab
    assert (slabbed.slab.arrays[0][[2, 0]] == 9).all()
    assert slabbed.slab.arrays[1][[2, 0]].tolist() == [1, 2]
