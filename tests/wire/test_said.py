"""The said frame under hostile input: a client decodes what a host says its envs said into a
valid document or refuses it with a ProtocolError; nothing is unpickled or imported, and what
it accepts can always be told to the trainer."""

from __future__ import annotations

import pickle
import warnings

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envserver.client._transport.hearing import Hearing
from envserver.errors import ProtocolError
from envserver.wire.codec import Ext
from envserver.wire.messages import Status, add_said, decode_reply, encode_reply
from envserver.wire.said import LIMITS, decode_said, encode_said

GOOD = {
    "warnings": [
        {
            "category": "builtins.UserWarning",
            "message": "careful",
            "filename": "/srv/env.py",
            "lineno": 3,
            "envs": [0, 2],
            "count": 2,
        }
    ],
    "output": [{"text": "hello", "envs": [], "count": 1}],
    "cut": {"warnings": 0, "lines": 1, "bytes": 9},
}


def tell(said: dict) -> list[warnings.WarningMessage]:
    hearing = Hearing()
    hearing.heard("h", 0, said)
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        hearing.tell()
    return heard


def test_a_good_document_round_trips_and_is_told(capsys):
    assert decode_said(encode_said(GOOD)) == GOOD
    (warning,) = tell(GOOD)
    assert str(warning.message) == "[envs 0,2, h, 2x] careful"
    err = capsys.readouterr().err
    assert "(h) hello\n" in err and "(h) cut to stay within bounds: 1 line(s)" in err


def test_unknown_keys_are_ignored_and_missing_ones_are_empty():
    said = decode_said(msgpack.packb({"future": [1, 2], "output": []}))
    assert said == {"warnings": [], "output": [], "cut": {"warnings": 0, "lines": 0, "bytes": 0}}


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ([], "must be a map"),
        ({"warnings": {}}, "must be an array"),
        ({"output": [{"text": "x", "envs": [], "count": 0}]}, "bad env indices or count"),
        ({"output": [{"text": "x", "envs": [-1], "count": 1}]}, "bad env indices or count"),
        ({"output": [{"text": "x", "envs": [True], "count": 1}]}, "bad env indices or count"),
        ({"output": [{"text": b"x", "envs": [], "count": 1}]}, "'text' of type str"),
        ({"output": [{"text": "x", "envs": [], "count": True}]}, "'count' of type int"),
        ({"output": [{"text": "x" * 2001, "envs": [], "count": 1}]}, "longer than 2000"),
        ({"output": [{"text": "x", "envs": [], "count": 1}] * 201}, "more than 200"),
        ({"warnings": [{**GOOD["warnings"][0], "lineno": "3"}]}, "'lineno' of type int"),
        ({"warnings": [{**GOOD["warnings"][0], "lineno": 2**31}]}, "'lineno' out of range"),
        ({"warnings": [{**GOOD["warnings"][0], "lineno": -1}]}, "'lineno' out of range"),
        ({"cut": {"lines": -1}}, "'cut' must map"),
        ({"cut": [1, 2]}, "'cut' must map"),
    ],
)
def test_documents_that_break_the_shape_are_refused(document, why):
    with pytest.raises(ProtocolError, match=why):
        decode_said(msgpack.packb(document, use_bin_type=True))


def test_pickle_and_extension_types_are_refused_never_unpickled():
    pickled = msgpack.packb({"output": msgpack.ExtType(int(Ext.PICKLE), pickle.dumps(1))})
    with pytest.raises(ProtocolError, match="no extension types"):
        decode_said(pickled)


def test_an_oversized_or_unreadable_frame_is_refused():
    with pytest.raises(ProtocolError, match="exceeds"):
        decode_said(b"\x80" + b" " * LIMITS.frame_bytes)
    with pytest.raises(ProtocolError, match="unreadable said frame"):
        decode_said(b"\xc1")


def test_the_envelope_flag_must_match_a_said_frame():
    reply = encode_reply(4, Status.OK, [1, 2])
    assert decode_reply(reply, allow_pickle=False).said is None
    said = add_said(reply, encode_said(GOOD))
    decoded = decode_reply(said, allow_pickle=False)
    assert decoded.body == [1, 2] and decoded.said == GOOD
    for flag in (2, True, None, "1"):
        bad = [msgpack.packb([*msgpack.unpackb(reply[0])[:3], flag]), *reply[1:]]
        with pytest.raises(ProtocolError, match="said must be 0, or 1"):
            decode_reply(bad, allow_pickle=False)
    lonely = [msgpack.packb([*msgpack.unpackb(reply[0])[:3], 1]), reply[1]]
    with pytest.raises(ProtocolError, match="said must be 0, or 1"):
        decode_reply(lonely, allow_pickle=False)


plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20)
    | st.binary(max_size=20) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)  # fmt: skip
entries = st.fixed_dictionaries(
    {"text": st.text(max_size=30), "envs": st.lists(st.integers(-2, 40), max_size=4),
     "count": st.integers(-1, 5)},
    optional={"extra": plain},
)  # fmt: skip
warning_entries = st.fixed_dictionaries(
    {"category": st.sampled_from(["builtins.UserWarning", "os.system", "no.such.Warning", "x"]),
     "message": st.text(max_size=30), "filename": st.text(max_size=20),
     "lineno": st.integers(-5, 10**12) | st.booleans(), "envs": st.lists(st.integers(0, 9)),
     "count": st.integers(0, 3)},
)  # fmt: skip
documents = st.fixed_dictionaries(
    {},
    optional={
        "warnings": st.lists(warning_entries, max_size=3) | plain,
        "output": st.lists(entries, max_size=3) | plain,
        "cut": st.dictionaries(st.sampled_from(["warnings", "lines", "bytes"]), plain) | plain,
    },
)


@settings(
    max_examples=500, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(document=documents | plain)
def test_any_document_is_decoded_and_told_or_refused(document):
    try:
        said = decode_said(msgpack.packb(document, use_bin_type=True))
    except ProtocolError:
        return
    tell(said)  # whatever was accepted can be told (a bad category becomes a UserWarning)
