"""Load on one host, short: a dozen trainer processes, a PING prober and a hostile client.

The run is ``tests/harness/load.py``'s (see its docstring), in phases of a few seconds. Only what
cannot depend on timing is asserted: every PING is answered (within ``load.PING_BOUND_S``, a hang
detector), the session past ``--max-sessions`` is refused with ``LimitError`` naming the limit,
the sessions of trainers killed with SIGKILL and of the HELLO flood are released by the lease
(polled with a deadline), the host lives through the attack with its memory bounded, and every
trainer stepped under the attack, its every step equal to a local ``SyncVectorEnv``'s. The
throughput and PING numbers are measured, not asserted: ``python tests/harness/load.py`` prints
them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from load import PING_BOUND_S, LoadOptions, LoadReport, run_load

#: Whole programs under test: `make test-long` (CI) runs them.
pytestmark = pytest.mark.long

#: Growth of the host's resident memory that would mean a leak (a run this short allocates a
#: few MiB at most; the stalled frames the attacker holds are 32 KiB each).
RSS_GROWTH_BOUND_KB = 64 * 1024

OPTIONS = LoadOptions(
    trainers=12,
    many_env_trainers=2,
    many_envs=8,
    victims=2,
    seconds=3.0,
    session_lease_s=2.0,
    max_message_bytes=64 * 1024,
    silent=40,
    half_handshakes=10,
    partial_messages=10,
    flooders=2,
    steps_under_attack=20,
    deadline_s=60.0,
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_many_trainers_and_a_hostile_client_on_one_host(tmp_path: Path) -> None:
    """One run, and every check of it.

    One test rather than one per check around a module fixture: make test spreads slow tests
    over its workers one by one, and xdist_group cannot keep them together with this pytest
    (pytest-dev/pytest-xdist#1386), so each worker would make a run of its own.
    """
    report = run_load(tmp_path, OPTIONS)  # raises if a wait hangs
    check_every_ping_is_answered(report)
    check_the_session_past_max_sessions_is_refused(report)
    check_sessions_are_released_by_the_lease(report)
    check_the_host_survives_the_attack_with_bounded_memory(report)
    check_every_trainer_stepped_under_the_attack_with_the_right_results(report)
    text = report.text()
    assert report.refusal["message"] in text
    assert "PING under attack:   p50" in text and "under attack: ratio" in text


def check_every_ping_is_answered(report: LoadReport) -> None:
    pings = report.ping_all
    assert pings is not None and pings.count > 0
    assert pings.unanswered == 0, f"PINGs unanswered for {PING_BOUND_S} s: {pings.line()}"
    assert report.ping_attack is not None and report.ping_attack.count > 0


def check_the_session_past_max_sessions_is_refused(report: LoadReport) -> None:
    assert report.sessions_before_refusal == OPTIONS.trainers
    assert report.refusal["type"] == "LimitError"
    assert f"already serves {OPTIONS.trainers} sessions, its maximum" in report.refusal["message"]
    assert report.host_refused >= 1


def check_sessions_are_released_by_the_lease(report: LoadReport) -> None:
    # run_load polled `envserver ping --json` until the host held only the survivors' sessions,
    # after the kills and after the flood, and raised TimeoutError if it never did. The host's
    # own count of evictions agrees:
    hello = report.attack["hello_replies"]
    assert hello.get("ok", 0) >= OPTIONS.victims  # the flood took the freed slots...
    assert hello.get("LimitError", 0) >= 1  # ...and was refused beyond --max-sessions
    assert report.host_evicted_lease >= OPTIONS.victims + hello["ok"]


def check_the_host_survives_the_attack_with_bounded_memory(report: LoadReport) -> None:
    attack = report.attack
    assert attack["errors"] == []
    opened = attack["opened"]
    assert opened.get("silent", 0) >= OPTIONS.silent
    assert sum(opened.get(k, 0) for k in ("half-signature", "half-greeting")) >= (
        OPTIONS.half_handshakes
    )
    assert sum(opened.get(k, 0) for k in ("partial-multipart", "partial-frame")) >= (
        OPTIONS.partial_messages
    )
    # Frames over --max-message-bytes: libzmq drops the connection; the whole request over it
    # (each frame under): the host answers MessageTooLargeError.
    assert attack["oversized_frames_sent"] >= 1
    assert attack["oversized_dropped"] == attack["oversized_frames_sent"]
    assert attack["oversized_dealer_replies"] == 0
    assert set(attack["over_total_replies"]) == {"MessageTooLargeError"}
    assert report.host_alive_after_attack
    assert report.host_exit == 0
    rss = report.rss_kb
    assert rss["attack max"] - rss["start"] < RSS_GROWTH_BOUND_KB, rss
    assert rss["end"] - rss["start"] < RSS_GROWTH_BOUND_KB, rss


def check_every_trainer_stepped_under_the_attack_with_the_right_results(report: LoadReport) -> None:
    survivors = report.survivors
    assert len(survivors) == OPTIONS.trainers - OPTIONS.victims
    for trainer in survivors:
        assert trainer.get("error") is None, trainer["error"]
        # Each stepped under the attack (run_load waited for it), every step as a local
        # SyncVectorEnv's with the same seed and actions.
        assert trainer["steps"] >= OPTIONS.steps_under_attack
        assert trainer["mismatches"] == 0, trainer["first_mismatch"]
    many = [t for t in survivors if t["num_envs"] == OPTIONS.many_envs]
    assert len(many) == OPTIONS.many_env_trainers
    # The host counted every env step the survivors made, and the killed trainers' too.
    assert report.host_env_steps >= sum(t["env_steps"] for t in survivors)
