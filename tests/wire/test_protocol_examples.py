"""The example messages of docs/protocol.md are the bytes the protocol module encodes today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_same

from envserver.conformance import examples
from envserver.conformance.examples import EXAMPLES, Example
from envserver.wire.messages import PROTOCOL_VERSION, Command, decode_reply, decode_request
from envserver.wire.replies import StepReply

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def test_the_documented_examples_are_up_to_date():
    text = DOC.read_text(encoding="utf-8")
    assert examples.rewrite(text) == text, (
        "docs/protocol.md's example messages are out of date: run "
        "python -m envserver.conformance.examples docs/protocol.md"
    )


def test_the_page_states_the_version_the_code_speaks():
    text = DOC.read_text(encoding="utf-8")
    assert f"specifies protocol version **{PROTOCOL_VERSION}**" in text
    assert f"this side speaks version {PROTOCOL_VERSION}," in text


def test_every_command_has_an_example():
    documented = {example.command for example in EXAMPLES}
    assert documented == set(Command), f"no example for {set(Command) - documented}"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.title)
def test_examples_decode_to_their_values(example: Example):
    request = decode_request(example.request_frames(), allow_pickle=False)
    assert (request.request_id, request.command, request.session) == (
        example.request_id,
        example.command,
        example.session,
    )
    layout, read = examples.CARTPOLE_LAYOUT, None
    body = request.body
    if example.raw is not None:  # raw frames: read in CartPole's layout
        actions, env_ids = layout.read_request(body, 1)
        body = {"actions": actions, "env_ids": env_ids}

        def read(frames):  # the reply's values, as the example's body has them
            step = layout.read_reply(frames, 1, allow_pickle=False, writable=True)
            return StepReply.wire(
                step.obs, step.rewards, step.terminations, step.truncations, step.infos
            )

    assert_same(body, example.request)
    reply = decode_reply(example.reply_frames(), allow_pickle=False, raw=read)
    assert (reply.request_id, reply.status) == (example.request_id, example.status)
    assert_same(reply.body, example.reply)


def documented_frames() -> list[bytes]:
    """Every fully shown frame of the documented block, read back from its hex."""
    text = DOC.read_text(encoding="utf-8")
    block = text[text.index(examples.BEGIN) : text.index(examples.END)]
    frames, current = [], None
    for line in block.splitlines():
        if line.startswith("frame "):
            current = bytearray()
            frames.append(current)
        elif current is not None and re.fullmatch(r"    ([0-9a-f]{2} ?)+", line):
            current.extend(bytes.fromhex(line))
        elif line.startswith("    ... ("):
            frames.pop()  # shortened: only its first bytes are shown
            current = None
    return [bytes(frame) for frame in frames]


def test_the_documented_hex_is_the_encoded_bytes():
    encoded = [
        frame
        for example in EXAMPLES
        for frame in example.request_frames() + example.reply_frames()
        if len(frame) <= examples.FULL_HEX_MAX_BYTES
    ]
    assert documented_frames() == encoded


def test_the_check_mode_reports_a_stale_document(tmp_path):
    stale = tmp_path / "protocol.md"
    stale.write_text(f"before\n{examples.BEGIN}\nold\n{examples.END}\nafter\n", encoding="utf-8")
    assert examples.main([str(stale), "--check"]) == 1
    assert examples.main([str(stale)]) == 0
    assert examples.main([str(stale), "--check"]) == 0
    text = stale.read_text(encoding="utf-8")
    assert text.startswith("before\n") and text.endswith("after\n") and "\nold\n" not in text
