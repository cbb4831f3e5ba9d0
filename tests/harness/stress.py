"""Runs the test suite with a CPU load beside it, to find the tests that fail by chance.

CI runs on a machine that may still be busy, and a test that passes on an idle machine can fail
there: a deadline too short for a descheduled process, a wait on one of two threads, a message
that comes in another order. This runs pytest several times with busy loops on every core it
asks for and says which tests failed in which run. `make test-stress` is the usual way in
(CONTRIBUTING.md, "Running tests"); to hammer a few tests, give pytest's own arguments::

    python tests/harness/stress.py --load 2 --runs 3 -- -n 2 --dist loadgroup --no-loadscope-reorder
    python tests/harness/stress.py --runs 1 -- tests/host/test_security.py -k refused --count 50

``--count`` comes from pytest-repeat (in the test extra). Not part of ``make test``: it takes
several times as long, and its load would slow every other job on the machine.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time

#: A failing test in pytest's short summary (``-ra``): ``FAILED path::name - reason``.
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
#: pytest's closing line: ``== 3 failed, 1150 passed in 512.3s ==`` (no ``=`` with ``-q``).
_CLOSING = re.compile(
    r"^=* ?(\d+ (?:passed|failed|errors?|skipped|deselected)\b.* in [\d.]+s.*?) ?=*$", re.M
)


def busy_loops(count: int) -> list[subprocess.Popen]:
    """Starts ``count`` processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run_pytest(args: list[str]) -> tuple[int, str]:
    """Runs pytest once with ``args``, its output passing through; returns (exit code, output)."""
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        lines = []
        for line in process.stdout:
            sys.stdout.write(line)
            lines.append(line)
    return process.returncode, "".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the suite ``--runs`` times under ``--load`` busy loops; 1 if any run failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", type=int, default=2, help="busy loops beside pytest")
    parser.add_argument("--runs", type=int, default=3, help="how many times to run pytest")
    parser.add_argument("pytest_args", nargs="*", help="pytest's arguments (after --)")
    options = parser.parse_args(argv)
    failures: collections.Counter[str] = collections.Counter()
    summaries = []
    codes = []
    loops = busy_loops(options.load)
    try:
        for run in range(1, options.runs + 1):
            started = time.monotonic()
            code, output = run_pytest(options.pytest_args)
            closing = _CLOSING.findall(output)
            failed = sorted(set(_FAILED.findall(output)))
            failures.update(failed)
            codes.append(code)
            summaries.append(
                f"run {run}: exit {code}, {closing[-1] if closing else 'no closing line'}"
                f" ({time.monotonic() - started:.0f} s wall)"
                + "".join(f"\n    {test}" for test in failed)
            )
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    print(f"\nstress: {options.runs} run(s) of pytest beside {options.load} busy loop(s)")
    print("\n".join(summaries))
    for test, count in failures.most_common():
        print(f"failed in {count} of {options.runs} run(s): {test}")
    return int(any(codes))


if __name__ == "__main__":
    sys.exit(main())
