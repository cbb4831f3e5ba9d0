"""Load on one host: many trainer processes, a PING prober and a hostile client, measured.

One ``envserver serve`` process on a loopback TCP port serves N trainer processes at once (most
with one CartPole env, a few with many), each stepping as fast as it can and comparing every step
with a local ``SyncVectorEnv`` run with the same seed and actions. A prober process PINGs the
host all along. The run, in order:

1. Every trainer holds its session (the host runs with ``--max-sessions N``); one more trainer
   is refused with ``LimitError`` while the others step.
2. A few trainers are killed with SIGKILL; their sessions must be released by the lease
   (``--session-lease``), polled with ``envserver ping --json``.
3. Baseline: the survivors step for ``--seconds``.
4. Attack: for ``--seconds`` more (and until every survivor has stepped a few times since it
   began), a hostile process on the same network, without CURVE, holds TCP connections that
   never send, connections stalled halfway through the ZeroMQ handshake, connections stalled
   inside a multipart message or a frame, sends messages just over ``--max-message-bytes``
   (which the host's libzmq drops, connection and all) and floods HELLOs, opening sessions it
   never closes, beyond ``--max-sessions``.
5. The flood's sessions must be released by the lease; the trainers stop and report.

It reports PING round trips (p50/p99/max) without and with the attack, the host's RSS along the
run, the refusal, the release after the kills, and the survivors' throughput under attack as a
ratio of their throughput without it. ``tests/system/test_load.py`` runs a short version in ``make
test`` and asserts only what does not depend on timing; this script prints the numbers::

    python tests/harness/load.py --trainers 50 --seconds 60

The trainer, prober and attacker are this same file run with a role as first argument
(``python tests/harness/load.py trainer ...``), so that each is a process of its own. All
traffic goes to loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from envserver.testing import HostProcess, start_host

__all__ = [
    "LoadOptions",
    "LoadReport",
    "PingStats",
    "main",
    "run_load",
]

ENV_ID = "CartPole-v1"
#: A PING unanswered this long counts as a hang (the prober then rebuilds its socket).
PING_BOUND_S = 10.0
#: How often the prober PINGs, and the orchestrator samples the host's memory.
PING_INTERVAL_S = 0.02
RSS_INTERVAL_S = 0.2
#: How often trainers and the attacker look for the files that steer them.
CHECK_INTERVAL_S = 0.05
#: Trainers count their steps in bins of this many seconds of ``time.monotonic()`` (the same
#: clock in every process on Linux), so that any window of the run can be summed afterwards.
BIN_S = 0.1
POLL_S = 0.05


# ---------------------------------------------------------------- files that steer the processes


def touch(path: Path) -> None:
    """Creates ``path`` (a marker other processes poll for)."""
    path.touch()


def write_json(path: Path, value: Any) -> None:
    """Writes ``value`` as JSON atomically: a reader never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value))
    partial.rename(path)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Polls ``condition`` until it holds; returns when (monotonic), raises after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} (waited {timeout_s:.0f} s)")
        time.sleep(POLL_S)
    return time.monotonic()


def dealer_socket(context: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


# ---------------------------------------------------------------- the run


@dataclasses.dataclass
class LoadOptions:
    """What a run does.

    Attributes:
        trainers: Trainer processes, one session each (the host's ``--max-sessions``).
        many_env_trainers: Of those, how many hold ``many_envs`` envs (the others one).
        many_envs: The envs of each of those.
        victims: Of the one-env trainers, how many are killed with SIGKILL.
        seconds: Each measured phase: without the attack, and with it.
        session_lease_s: The host's ``--session-lease``.
        max_message_bytes: The host's ``--max-message-bytes``.
        silent: Connections that never send.
        half_handshakes: Connections stalled in the ZMTP greeting (half after its signature,
            half after the whole greeting, before READY).
        partial_messages: Connections stalled after the handshake (half inside a multipart
            message, half inside a frame just under the bound).
        flooders: Sockets flooding HELLOs.
        steps_under_attack: Every survivor steps this many times during the attack (the
            attack goes on until they have).
        deadline_s: The longest any one wait of the run may take before it counts as a hang.
    """

    trainers: int = 50
    many_env_trainers: int = 3
    many_envs: int = 16
    victims: int = 5
    seconds: float = 60.0
    session_lease_s: float = 3.0
    max_message_bytes: int = 1 << 20
    silent: int = 200
    half_handshakes: int = 50
    partial_messages: int = 50
    flooders: int = 2
    steps_under_attack: int = 20
    deadline_s: float = 120.0


@dataclasses.dataclass
class PingStats:
    """PING round trips in one window of the run, in milliseconds."""

    count: int
    unanswered: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, pings: Sequence[Sequence[Any]], start: float, end: float) -> PingStats:
        """The PINGs sent in ``[start, end)``."""
        inside = [rtt for sent, rtt in pings if start <= sent < end]
        answered = np.array([rtt for rtt in inside if rtt is not None]) * 1000
        if not len(answered):
            return cls(len(inside), len(inside), float("nan"), float("nan"), float("nan"))
        p50, p99 = np.percentile(answered, [50, 99])
        return cls(len(inside), len(inside) - len(answered), p50, p99, float(answered.max()))

    def line(self) -> str:
        return (
            f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, max {self.max_ms:.1f} ms "
            f"({self.count} PINGs, {self.unanswered} unanswered)"
        )


@dataclasses.dataclass
class LoadReport:
    """What a run measured (see :func:`run_load`)."""

    options: LoadOptions
    sessions_before_refusal: int = 0
    refusal: dict[str, Any] = dataclasses.field(default_factory=dict)
    newcomer: dict[str, Any] = dataclasses.field(default_factory=dict)
    sessions_after_kills: int = 0
    release_s: float = float("nan")
    ping_baseline: PingStats | None = None
    ping_attack: PingStats | None = None
    ping_all: PingStats | None = None
    rss_kb: dict[str, int] = dataclasses.field(default_factory=dict)
    steps_per_s_baseline: float = 0.0
    steps_per_s_attack: float = 0.0
    survivors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    attack: dict[str, Any] = dataclasses.field(default_factory=dict)
    sessions_after_attack: int = 0
    flood_release_s: float = float("nan")
    host_env_steps: float = 0.0
    host_evicted_lease: float = 0.0
    host_refused: float = 0.0
    host_alive_after_attack: bool = False
    host_exit: int | None = None
    log_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    log_levels: dict[str, int] = dataclasses.field(default_factory=dict)
    windows_s: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """The survivors' throughput under attack over their throughput without it."""
        return self.steps_per_s_attack / self.steps_per_s_baseline

    def text(self) -> str:
        """The report, for a person."""
        o, a = self.options, self.attack
        rss = self.rss_kb
        released = o.trainers - self.sessions_after_kills

        def total(key: str) -> int:
            return sum(t.get(key, 0) for t in self.survivors)

        lifetimes = {
            kind: f"{len(v)} closed by the host after {min(v):.1f}-{max(v):.1f} s"
            for kind, v in a.get("lifetimes_s", {}).items()
        }
        lines = [
            f"load on one host: {o.trainers} trainer processes ({o.many_env_trainers} with "
            f"{o.many_envs} envs, the others 1), {o.victims} killed; phases of {o.seconds:.0f} s; "
            f"lease {o.session_lease_s} s, --max-message-bytes {o.max_message_bytes}",
            f"sessions held: {self.sessions_before_refusal} of --max-sessions {o.trainers}",
            f"session {o.trainers + 1} refused: {self.refusal.get('type')}: "
            f"{self.refusal.get('message')}",
            f"SIGKILLed trainers' sessions released by the lease: {released} of {o.victims}, "
            f"{self.release_s:.2f} s after the kills",
            f"PING without attack: {self.ping_baseline.line() if self.ping_baseline else '-'}",
            f"PING under attack:   {self.ping_attack.line() if self.ping_attack else '-'}",
            f"PING whole run:      {self.ping_all.line() if self.ping_all else '-'}",
            "host RSS: " + ", ".join(f"{k} {v / 1024:.1f} MiB" for k, v in rss.items()),
            f"survivors' steps/s: {self.steps_per_s_baseline:.0f} without attack, "
            f"{self.steps_per_s_attack:.0f} under attack: ratio {self.ratio:.2f}",
            f"survivors: {len(self.survivors)}, steps {total('steps')}, env steps "
            f"{total('env_steps')} (host counted "
            f"{self.host_env_steps:.0f} with the killed ones'), steps differing from a local "
            f"SyncVectorEnv {total('mismatches')}, errors "
            f"{sum(1 for t in self.survivors if t.get('error'))}",
            f"attack: connections opened {dict(a.get('opened', {}))}, failed to open "
            f"{dict(a.get('open_failures', {}))}",
            f"  held connections: {lifetimes or 'none closed by the host'}",
            f"  frames over the bound: {a.get('oversized_frames_sent')} sent, "
            f"{a.get('oversized_dropped')} connections dropped by the host, "
            f"{a.get('oversized_kept')} kept; by a libzmq DEALER {a.get('oversized_dealer_sent')} "
            f"sent, {a.get('oversized_dealer_replies')} answered",
            f"  requests over the bound in total (every frame under): {a.get('over_total_sent')}"
            f" sent, replies {dict(a.get('over_total_replies', {}))}",
            f"  HELLO flood: {a.get('hello_sent')} sent, replies {dict(a.get('hello_replies', {}))}"
            f"; refusal {a.get('hello_refusal')!r}",
            f"  a new trainer during the flood: {self.newcomer.get('type') or 'admitted'}: "
            f"{self.newcomer.get('message')}",
            f"  attacker errors: {len(a.get('errors', []))}",
            f"host alive and answering after the attack: {self.host_alive_after_attack}; flood "
            f"sessions released {self.flood_release_s:.2f} s after it stopped "
            f"(sessions then {self.sessions_after_attack})",
            f"host metrics: sessions evicted by lease {self.host_evicted_lease:.0f}, refused "
            f"{self.host_refused:.0f}; exit status {self.host_exit}",
            "host log: "
            + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in self.log_bytes.items())
            + f"; lines by level {self.log_levels}",
            "windows: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.windows_s.items()),
        ]
        return "\n".join(lines)


class Run:
    """The processes of one run, and their files in ``work``; :meth:`close` ends them all."""

    def __init__(self, work: Path, options: LoadOptions) -> None:
        self.work = work
        self.options = options
        self.processes: list[subprocess.Popen] = []
        self.host: HostProcess | None = None
        self.rss: list[tuple[float, int]] = []
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def spawn(self, role: str, *args: object) -> subprocess.Popen:
        """This file run as ``role`` (its output to ``ROLE-N.log``)."""
        log = self.work / f"{role}-{len(self.processes)}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [sys.executable, __file__, role, *map(str, args)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        process.log = log  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def result(self, name: str, process: subprocess.Popen) -> Any:
        """A process's JSON result, once written (fails at once if it exited without one)."""
        path = self.work / f"{name}.json"

        def written() -> bool:
            if path.exists():
                return True
            if process.poll() is not None and not path.exists():
                raise RuntimeError(f"{name} exited {process.returncode}: {process.log.read_text()}")
            return False

        wait_for(written, f"{name} wrote no result", self.options.deadline_s)
        return json.loads(path.read_text())

    def start_sampling(self) -> None:
        """Samples the host's RSS every ``RSS_INTERVAL_S`` from /proc."""

        def sample() -> None:
            while not self._sampling.wait(RSS_INTERVAL_S):
                with_rss = host_rss_kb(self.host)
                if with_rss is not None:
                    self.rss.append((time.monotonic(), with_rss))

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()

    def rss_at(self, moment: float) -> int:
        """The first sample from ``moment`` on (the last one if none)."""
        return next((kb for t, kb in self.rss if t >= moment), self.rss[-1][1])

    def rss_max(self, start: float, end: float) -> int:
        return max((kb for t, kb in self.rss if start <= t <= end), default=0)

    def close(self) -> None:
        """Kills whatever still runs, host included."""
        self._sampling.set()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        if self.host is not None and self.host.process.poll() is None:
            self.host.stop(signal.SIGKILL)


def host_rss_kb(host: HostProcess | None) -> int | None:
    """The host process's resident memory (VmRSS), or None once it is gone."""
    if host is None:
        return None
    try:
        status = Path(f"/proc/{host.process.pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def ping_json(endpoint: str) -> dict[str, Any]:
    """What ``envserver ping --json`` says of the host (``ok``, ``sessions``, ...)."""
    done = subprocess.run(
        [sys.executable, "-m", "envserver", "ping", "--json", "--timeout", str(PING_BOUND_S),
         endpoint],
        capture_output=True, text=True, timeout=PING_BOUND_S + 60,
    )  # fmt: skip
    return json.loads(done.stdout)[0]


def sessions_become(endpoint: str, count: int, what: str, timeout_s: float) -> float:
    """Polls ``envserver ping --json`` until the host holds ``count`` sessions; returns when."""
    return wait_for(lambda: ping_json(endpoint).get("sessions") == count, what, timeout_s)


def scrape(log_text: str) -> dict[str, float]:
    """The host's metrics, by name with labels (``name{label="value"}``)."""
    from prometheus_client.parser import text_string_to_metric_families

    url = log_text.split("metrics on ", 1)[1].split()[0]
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def steps_per_s(results: Sequence[dict[str, Any]], start: float, end: float) -> float:
    """The trainers' steps per second in the whole bins inside ``[start, end)``."""
    first, last = int(np.ceil(start / BIN_S)), int(end / BIN_S)
    steps = sum(
        count
        for result in results
        for key, count in result.get("bins", {}).items()
        if first <= int(key) < last
    )
    return steps / max(BIN_S, (last - first) * BIN_S)


def start_trainers(run: Run) -> dict[str, subprocess.Popen]:
    """Every trainer, each once its envs are reset (``ready-NAME``), by name."""
    o = run.options
    trainers = {}
    for index in range(o.trainers):
        many = index >= o.trainers - o.many_env_trainers
        role = "victim" if index < o.victims else "steady"
        name = f"{role}-{index}"
        trainers[name] = run.spawn(
            "trainer", run.host.endpoint, name, o.many_envs if many else 1, index, run.work,
            role, o.steps_under_attack,
        )  # fmt: skip
    for name, process in trainers.items():
        ready = run.work / f"ready-{name}"

        def started(ready: Path = ready, process: subprocess.Popen = process) -> bool:
            if process.poll() is not None:
                raise RuntimeError(
                    f"trainer exited {process.returncode}: {process.log.read_text()}"
                )
            return ready.exists()

        wait_for(started, f"trainer {name} never got ready", o.deadline_s)
    return trainers


def run_load(directory: Path, options: LoadOptions) -> LoadReport:
    """Runs the load (see the module docstring) with its files in ``directory``.

    Raises:
        TimeoutError: If some wait took longer than ``options.deadline_s`` (a hang).
        RuntimeError: If a process of the run failed.
    """
    if not 0 <= options.victims <= options.trainers - options.many_env_trainers - 1:
        raise ValueError("the victims are one-env trainers, and one must survive")
    directory.mkdir(parents=True, exist_ok=True)
    run = Run(directory, options)
    report = LoadReport(options)
    try:
        _run_phases(run, report)
    finally:
        run.close()
    return report


def _run_phases(run: Run, report: LoadReport) -> None:
    o, work = run.options, run.work
    run.host = start_host(
        work, "--max-sessions", str(o.trainers), "--session-lease", str(o.session_lease_s),
        "--max-message-bytes", str(o.max_message_bytes), "--metrics-port", "0",
        bind="tcp://127.0.0.1:*",
    )  # fmt: skip
    endpoint = run.host.endpoint
    prober = run.spawn("prober", endpoint, work)
    run.start_sampling()
    trainers = start_trainers(run)
    report.sessions_before_refusal = ping_json(endpoint)["sessions"]
    touch(work / "go")
    marks = {"go": time.monotonic()}
    extra = run.spawn("trainer", endpoint, "extra", 1, 0, work, "extra", 0)
    report.refusal = run.result("extra", extra)

    victims = {n: p for n, p in trainers.items() if n.startswith("victim")}
    marks["kill"] = time.monotonic()
    for process in victims.values():
        process.send_signal(signal.SIGKILL)
    for process in victims.values():
        process.wait(o.deadline_s)
    survivors = {n: p for n, p in trainers.items() if n not in victims}
    marks["released"] = sessions_become(
        endpoint, len(survivors), "the killed trainers' sessions were never released",
        o.deadline_s + o.session_lease_s,
    )  # fmt: skip
    report.release_s = marks["released"] - marks["kill"]
    report.sessions_after_kills = len(survivors)
    log_size = {"released": run.host.log.stat().st_size}

    time.sleep(o.seconds)  # the baseline: a measurement, nothing waited for
    marks["baseline_end"] = time.monotonic()
    log_size["baseline_end"] = run.host.log.stat().st_size
    _attack_phase(run, report, survivors, marks)
    log_size["attack_end"] = run.host.log.stat().st_size

    marks["flood_released"] = sessions_become(
        endpoint, len(survivors), "the flood's sessions were never released",
        o.deadline_s + o.session_lease_s,
    )  # fmt: skip
    report.flood_release_s = marks["flood_released"] - marks["attack_end"]
    report.sessions_after_attack = len(survivors)
    marks["end"] = time.monotonic()
    touch(work / "stop")
    report.survivors = [run.result(name, process) for name, process in survivors.items()]
    touch(work / "stop-prober")
    pings = run.result("prober", prober)
    _summarize(run, report, marks, pings, log_size)


def _attack_phase(
    run: Run, report: LoadReport, survivors: dict[str, subprocess.Popen], marks: dict[str, float]
) -> None:
    """Runs the attacker for ``seconds``, and until every survivor has stepped under it."""
    o, work = run.options, run.work
    half, partial = o.half_handshakes // 2, o.partial_messages // 2
    counts = {
        "silent": o.silent, "half-signature": half, "half-greeting": o.half_handshakes - half,
        "partial-multipart": partial, "partial-frame": o.partial_messages - partial,
        "flooders": o.flooders,
    }  # fmt: skip
    attacker = run.spawn("attacker", run.host.endpoint, o.max_message_bytes, work,
                         json.dumps(counts))  # fmt: skip
    wait_for((work / "attacking").exists, "the attack never began", o.deadline_s)
    touch(work / "attack")
    marks["attack"] = time.monotonic()
    newcomer = run.spawn("trainer", run.host.endpoint, "newcomer", 1, 0, work, "extra", 0)
    time.sleep(o.seconds)  # the attack's measurement
    report.newcomer = run.result("newcomer", newcomer)
    wait_for(
        lambda: all((work / f"attacked-{name}").exists() for name in survivors),
        f"some trainers did not step {o.steps_under_attack} times under the attack",
        o.deadline_s,
    )
    marks["attack_end"] = time.monotonic()
    report.host_alive_after_attack = run.host.process.poll() is None
    touch(work / "stop-attack")
    report.attack = run.result("attacker", attacker)
    answer = ping_json(run.host.endpoint)
    report.host_alive_after_attack &= bool(answer.get("ok"))


def _summarize(
    run: Run,
    report: LoadReport,
    marks: dict[str, float],
    pings: list[list[Any]],
    log_size: dict[str, int],
) -> None:
    """Fills the report from the marks, the PINGs, the samples and the host's metrics."""
    baseline, attack = (
        (marks["released"], marks["baseline_end"]),
        (
            marks["attack"],
            marks["attack_end"],
        ),
    )
    report.ping_baseline = PingStats.of(pings, *baseline)
    report.ping_attack = PingStats.of(pings, *attack)
    report.ping_all = PingStats.of(pings, 0.0, float("inf"))
    report.steps_per_s_baseline = steps_per_s(report.survivors, *baseline)
    report.steps_per_s_attack = steps_per_s(report.survivors, *attack)
    report.rss_kb = {
        "start": run.rss_at(marks["released"]),
        "baseline end": run.rss_at(marks["baseline_end"]),
        **{
            f"attack {q}/4": run.rss_at(attack[0] + (attack[1] - attack[0]) * q / 4)
            for q in (1, 2, 3)
        },
        "attack max": run.rss_max(*attack),
        "attack end": run.rss_at(marks["attack_end"]),
        "end": run.rss_at(marks["end"]),
    }
    metrics = scrape(run.host.log_text())
    report.host_env_steps = metrics.get("envserver_env_steps_total", 0.0)
    report.host_evicted_lease = metrics.get('envserver_sessions_evicted_total{reason="lease"}', 0)
    report.host_refused = metrics.get("envserver_sessions_refused_total", 0.0)
    report.host_exit = run.host.stop()
    report.log_bytes = {
        "baseline": log_size["baseline_end"] - log_size["released"],
        "attack": log_size["attack_end"] - log_size["baseline_end"],
    }
    levels: Counter[str] = Counter()
    for line in run.host.log_text().splitlines():
        for level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "Traceback"):
            if f" {level} " in line or line.startswith(level):
                levels[level] += 1
    report.log_levels = dict(levels)
    report.windows_s = {
        "baseline": baseline[1] - baseline[0],
        "attack": attack[1] - attack[0],
    }


# ---------------------------------------------------------------- the script

ROLES: dict[str, Callable[[Sequence[str]], int]] = {
    "trainer": lambda argv: importlib.import_module("load_roles").trainer_main(argv),
    "prober": lambda argv: importlib.import_module("load_roles").prober_main(argv),
    "attacker": lambda argv: importlib.import_module("load_attack").attacker_main(argv),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the load and prints the report (or runs one process of it, by role)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ROLES:
        return ROLES[argv[0]](argv[1:])
    defaults = LoadOptions()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(LoadOptions):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=type(getattr(defaults, field.name)),
            default=getattr(defaults, field.name),
        )
    parser.add_argument("--keep", type=Path, help="keep the run's files (logs) in this folder")
    options = parser.parse_args(argv)
    keep = options.__dict__.pop("keep")
    load = LoadOptions(**vars(options))
    with _work_dir(keep) as work:
        report = run_load(work, load)
    print(report.text())
    return 0


@contextlib.contextmanager
def _work_dir(keep: Path | None) -> Iterator[Path]:
    """``keep`` if given, else a temporary folder removed after."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="envserver-load-") as temp:
        yield Path(temp)


if __name__ == "__main__":
    sys.exit(main())
