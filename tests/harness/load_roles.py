"""The trainer and prober processes of ``tests/harness/load.py`` (run as
``python tests/harness/load.py trainer ...`` and ``... prober ...``, each a process of its own);
see ``tests/harness/load.py``.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from load import (
    BIN_S,
    CHECK_INTERVAL_S,
    ENV_ID,
    PING_BOUND_S,
    PING_INTERVAL_S,
    dealer_socket,
    touch,
    wait_for,
    write_json,
)

from envserver.wire.messages import Command, Status, decode_reply, encode_request

# ---------------------------------------------------------------- trainer


def trainer_main(argv: Sequence[str]) -> int:
    """A trainer: steps ``num_envs`` CartPoles on the host, each step checked against a local run.

    Arguments: endpoint, name, num_envs, seed, work directory, role (``steady``, ``victim``: as
    steady, to be killed; ``extra``: only tries to open a session, and reports the refusal).
    Marker files in the work directory: it touches ``ready-NAME`` once its envs are reset, waits
    for ``go``, steps until ``stop``, and touches ``attacked-NAME`` once it has stepped
    ``steps_under_attack`` times since ``attack`` appeared. Its result goes to ``NAME.json``.
    """
    endpoint, name, num_envs_text, seed_text, work, role, under_attack_text = argv
    work_dir, num_envs, seed = Path(work), int(num_envs_text), int(seed_text)
    from envserver import client

    if role == "extra":
        try:
            envs = client.make_vec(ENV_ID, num_envs=num_envs, hosts=[endpoint])
        except client.EnvServerError as exc:
            write_json(work_dir / f"{name}.json", {"type": type(exc).__name__, "message": str(exc)})
            return 0
        envs.close()
        write_json(work_dir / f"{name}.json", {"type": None, "message": "a session was opened"})
        return 0
    result: dict[str, Any] = {"name": name, "num_envs": num_envs, "role": role}
    try:
        result.update(_step_and_check(client, endpoint, name, num_envs, seed, work_dir,
                                      int(under_attack_text)))  # fmt: skip
    except BaseException:
        result["error"] = traceback.format_exc()
        write_json(work_dir / f"{name}.json", result)
        return 1
    write_json(work_dir / f"{name}.json", result)
    return 0


def _step_and_check(
    client: Any, endpoint: str, name: str, num_envs: int, seed: int, work: Path, under_attack: int
) -> dict[str, Any]:
    """The trainer's loop; returns its counts (steps, mismatches, steps per time bin)."""
    import gymnasium as gym

    envs = client.make_vec(ENV_ID, num_envs=num_envs, hosts=[endpoint])
    oracle = gym.make_vec(ENV_ID, num_envs=num_envs, vectorization_mode="sync")
    mismatches, first_mismatch, steps = 0, None, 0
    bins: Counter[int] = Counter()
    try:
        if not _same(envs.reset(seed=seed)[0], oracle.reset(seed=seed)[0]):
            mismatches, first_mismatch = 1, "reset"
        actions = np.random.default_rng(seed)
        touch(work / f"ready-{name}")
        wait_for((work / "go").exists, "no go", 600)
        attacked_at: int | None = None
        next_check = 0.0
        while True:
            now = time.monotonic()
            if now >= next_check:
                if (work / "stop").exists():
                    break
                if attacked_at is None and (work / "attack").exists():
                    attacked_at = steps
                if attacked_at is not None and steps - attacked_at >= under_attack:
                    touch(work / f"attacked-{name}")
                    attacked_at = -(2**62)  # told once
                next_check = now + CHECK_INTERVAL_S
            action = actions.integers(0, 2, size=num_envs)
            got, want = envs.step(action), oracle.step(action)
            if not all(_same(g, w) for g, w in zip(got[:4], want[:4])):
                mismatches += 1
                first_mismatch = first_mismatch or f"step {steps}"
            steps += 1
            bins[int(time.monotonic() / BIN_S)] += 1
    finally:
        envs.close()
        oracle.close()
    return {
        "steps": steps,
        "env_steps": steps * num_envs,
        "mismatches": mismatches,
        "first_mismatch": first_mismatch,
        "bins": {str(k): v for k, v in bins.items()},
    }


def _same(a: Any, b: Any) -> bool:
    """Exact equality of two batched arrays (dtype, shape, values)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


# ---------------------------------------------------------------- prober


def prober_main(argv: Sequence[str]) -> int:
    """PINGs the host every ``PING_INTERVAL_S`` until ``stop-prober``; writes ``prober.json``.

    Each PING is ``[sent_at, round_trip_s]``, or ``[sent_at, None]`` when no answer came within
    ``PING_BOUND_S`` (the socket is then rebuilt).
    """
    endpoint, work = argv[0], Path(argv[1])
    context = zmq.Context()
    pings: list[tuple[float, float | None]] = []
    sock = dealer_socket(context, endpoint)
    request_id = 0
    while not (work / "stop-prober").exists():
        request_id += 1
        sent = time.monotonic()
        sock.send_multipart(encode_request(request_id, Command.PING, None, {}, allow_pickle=False))
        if sock.poll(PING_BOUND_S * 1000):
            reply = decode_reply(sock.recv_multipart(), allow_pickle=False)
            ok = reply.status == Status.OK and reply.request_id == request_id
            pings.append((sent, time.monotonic() - sent if ok else None))
        else:
            pings.append((sent, None))
            sock.close(0)
            sock = dealer_socket(context, endpoint)
        time.sleep(PING_INTERVAL_S)
    sock.close(0)
    context.term()
    write_json(work / "prober.json", pings)
    return 0
