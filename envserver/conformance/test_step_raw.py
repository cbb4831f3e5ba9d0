"""Conformance: STEP_RAW, its layout in the MAKE reply, and refusals of frames that do not fit.

The frames are built and read here from the documented layout (CartPole-v1: one float32 leaf of
shape [4] for observations, one int64 scalar leaf for actions), not with envserver's own code.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

import numpy as np
import pytest

from envserver.conformance.conftest import Session
from envserver.conformance.wire import WireReply, envelope
from envserver.wire import codec
from envserver.wire.messages import PROTOCOL_VERSION, Command

#: CartPole-v1's layout, as the MAKE reply must state it.
LAYOUT = {"obs": [["<f4", [4]]], "actions": [["<i8", []]]}


#: The cases of test_step_raw_refuses_frames_that_do_not_fit.
REFUSED = [
    "short",
    "long",
    "short-actions",
    "more-actions",
    "empty-ids",
    "ids-3",
    "twice",
    "range",
    "neg",
]


def step_raw(envs: Session, actions: list[int], env_ids: list[int] | None = None) -> WireReply:
    """Sends a STEP_RAW with int64 actions (and int32 env ids) and returns its reply."""
    request_id = envs.wire.next_id()
    frames = [envelope(PROTOCOL_VERSION, request_id, int(Command.STEP_RAW), envs.session_id)]
    if env_ids is not None:
        frames.append(np.array(env_ids, "<i4").tobytes())
    frames.append(np.array(actions, "<i8").tobytes())
    reply = envs.wire.ask(frames, raw=True)
    assert reply.request_id == request_id
    return reply


def read(reply: WireReply, count: int) -> dict[str, Any]:
    """The values of an OK STEP_RAW reply, each frame's length checked against the layout."""
    frames = reply.ok()
    assert len(frames) >= 2, f"an OK STEP_RAW reply has at least 2 frames, got {len(frames)}"
    obs, columns = frames[:2]
    assert len(obs) == count * 16, f"observations of {len(obs)} bytes for {count} envs"
    assert len(columns) == count * 10, f"rewards and flags of {len(columns)} bytes, {count} envs"
    rewards, flags = columns[: 8 * count], columns[8 * count :]
    assert set(flags) <= {0, 1}, f"flag bytes must be 0 or 1, got {sorted(set(flags))}"
    infos = codec.decode(frames[2:]) if len(frames) > 2 else []
    if len(frames) > 2:
        assert isinstance(infos, list) and infos, "info entries, when sent, are a non-empty array"
    flag_array = np.frombuffer(flags, np.uint8).astype(bool)
    return {
        "obs": np.frombuffer(obs, "<f4").reshape(count, 4),
        "rewards": np.frombuffer(rewards, "<f8"),
        "terminations": flag_array[:count],
        "truncations": flag_array[count:],
        "infos": infos,
    }


def test_make_states_the_step_layout(session: Session) -> None:
    """A MAKE reply states the layout of spaces made of arrays."""
    assert session.make(2)["step_layout"] == LAYOUT


def test_step_raw_answers_what_step_answers(open_wire: Any) -> None:
    """Two sessions, same seeds and actions: STEP_RAW's values are STEP's, step after step,
    through episode ends (SameStep: the ending step's info entry travels in the reply)."""
    with open_wire() as wire:
        plain, raw = Session(wire, wire.hello()), Session(wire, wire.hello())
        for envs in (plain, raw):
            envs.make(2, autoreset_mode="SameStep")
            envs.request(Command.RESET, {"seeds": [7, 8]}).ok()
        ended = 0
        for t in range(60):
            actions = [t % 2, 1]
            expected = plain.request(Command.STEP, {"actions": np.array(actions, np.int64)}).ok()
            got = read(step_raw(raw, actions), 2)
            np.testing.assert_array_equal(got["obs"], expected["obs"])
            for key in ("rewards", "terminations", "truncations"):
                assert np.asarray(expected[key]).tolist() == got[key].tolist(), key
            assert len(got["infos"]) == len(expected["infos"])
            for mine, theirs in zip(got["infos"], expected["infos"]):
                assert mine[0] == theirs[0]
                np.testing.assert_array_equal(mine[1]["final_obs"], theirs[1]["final_obs"])
            ended += len(got["infos"])
        assert ended, "no episode ended: the infos frames were not seen"
        for envs in (plain, raw):
            envs.request(Command.CLOSE)


def test_step_raw_of_some_envs(envs: Session) -> None:
    """Int32 env ids step those envs, in that order."""
    envs.request(Command.RESET, {"seeds": [1, 2]}).ok()
    got = read(step_raw(envs, [0], env_ids=[1]), 1)
    assert got["rewards"].tolist() == [1.0]
    read(step_raw(envs, [1, 0], env_ids=[1, 0]), 2)


@pytest.mark.parametrize(
    "frames",
    [
        [],  # no action frame
        [np.array([0], "<i4").tobytes(), b"\0" * 8, b""],  # one frame too many
        [b"\0" * 15],  # an action frame one byte short
        [b"\0" * 24],  # three actions for two envs
        [b"", b"\0" * 16],  # an empty env ids frame
        [b"\0" * 3, b"\0" * 8],  # env ids of 3 bytes
        [np.array([1, 1], "<i4").tobytes(), b"\0" * 16],  # an env twice
        [np.array([2], "<i4").tobytes(), b"\0" * 8],  # an env out of range
        [np.array([-1], "<i4").tobytes(), b"\0" * 8],  # a negative env
    ],
    ids=REFUSED,
)
def test_step_raw_refuses_frames_that_do_not_fit(envs: Session, frames: list[bytes]) -> None:
    """Frames that do not fit the layout are a ProtocolError, and no env was stepped."""
    envs.request(Command.RESET, {"seeds": [1, 2]}).ok()
    before = envs.request(Command.CALL, {"name": "state"}).ok()
    request_id = envs.wire.next_id()
    head = envelope(PROTOCOL_VERSION, request_id, int(Command.STEP_RAW), envs.session_id)
    envs.wire.ask([head, *frames], raw=True).error("ProtocolError")
    after = envs.request(Command.CALL, {"name": "state"}).ok()
    np.testing.assert_array_equal(np.array(before), np.array(after))
    read(step_raw(envs, [0, 1]), 2)  # the session steps on


def test_step_raw_needs_envs(session: Session) -> None:
    """STEP_RAW before MAKE is a ProtocolError, as STEP is."""
    step_raw(session, [0]).error("ProtocolError")


def test_make_refuses_an_obs_slab_that_is_not_a_slab_name(session: Session) -> None:
    """``obs_slab`` must be a bare slab name: a path is a ProtocolError, and no envs are made."""
    body = {"env_id": "CartPole-v1", "kwargs": None, "num_envs": 1, "obs_slab": "../envserver"}
    session.request(Command.MAKE, body).error("ProtocolError")
    session.make(1)  # the session has no envs yet


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no shared-memory directory here")
def test_an_obs_slab_is_taken_at_its_size_or_declined(open_wire: Any) -> None:
    """A slab offered in MAKE is answered with its size or nil; taken, STEP_RAW replies carry
    no observation frame and the slab holds STEP's observations (a twin session's)."""
    path = f"/dev/shm/envserver-slab-{os.getpid()}-{secrets.token_hex(8)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open_wire() as wire:
            plain, slabbed = Session(wire, wire.hello()), Session(wire, wire.hello())
            plain.make(2)
            made = slabbed.make(2, obs_slab=os.path.basename(path))
            assert "obs_slab" in made, "a MAKE with obs_slab is answered with obs_slab"
            size = made["obs_slab"]
            assert size in (None, 32), f"CartPole's slab of 2 envs is 32 bytes, not {size!r}"
            for envs in (plain, slabbed):
                envs.request(Command.RESET, {"seeds": [3, 4]}).ok()
            for t in range(5):
                expected = plain.request(Command.STEP, {"actions": np.array([t % 2, 1])}).ok()
                reply = step_raw(slabbed, [t % 2, 1])
                if size is None:
                    np.testing.assert_array_equal(read(reply, 2)["obs"], expected["obs"])
                    continue
                assert len(reply.ok()[0]) == 20, "with a slab the first frame is the columns"
                slab = np.frombuffer(os.pread(fd, 32, 0), "<f4").reshape(2, 4)
                np.testing.assert_array_equal(slab, expected["obs"])
            for envs in (plain, slabbed):
                envs.request(Command.CLOSE)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
