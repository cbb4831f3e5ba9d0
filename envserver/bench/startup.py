"""Start-up: how long a vector env takes to construct, reset, step once and close.

What a short run, a test or an evaluation script pays before any training. Each variant is
timed two ways, interleaved (A B C A B C ...):

- *warm*: in the benchmark process, after one untimed cycle of each variant, so one-time costs
  of a process (imports, a fork server's first start) are left out;
- *first in a fresh process*: a new Python process per measurement runs a small script that
  imports what its variant needs, then times the cycle from inside and prints the seconds; the
  interpreter's start and the imports, the same for every variant, are not timed.

The script is a file, not ``python -c``: a ``forkserver`` context preloads the main module's
imports (here Gymnasium) into its server, as it would a user's training script's.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from envserver import client

__all__ = [
    "MAKE_VEC",
    "STARTUP_REFERENCE",
    "STARTUP_TITLE",
    "StartupResults",
    "StartupVariant",
    "make_vec_ratio",
    "startup_section",
    "startup_table",
    "startup_variants",
]

#: The section's title (``--only startup`` selects it).
STARTUP_TITLE = "start-up: construct + reset + one step + close, CartPole-v1"
#: The variant the others' times are divided by.
STARTUP_REFERENCE = "AsyncVectorEnv, default context"
MAKE_VEC = "make_vec, no options"
ENV_ID = "CartPole-v1"
#: A fresh process's measurement that takes longer than this is reported as failed.
FRESH_TIMEOUT_S = 180.0

#: The fresh process's script: ``{imports}`` and ``{construct}`` are its variant's.
FRESH_SCRIPT = """\
import sys
import time

{imports}


def main():
    n = int(sys.argv[1])
    start = time.perf_counter()
    envs = {construct}
    envs.reset(seed=0)
    envs.step(envs.action_space.sample())
    envs.close()
    print(time.perf_counter() - start, flush=True)


if __name__ == "__main__":
    main()
"""


@dataclass
class StartupVariant:
    """One way to make the vector env, as code, so both measurements run the very same code.

    Attributes:
        name: The row's label.
        imports: Statements run before the clock starts.
        construct: An expression of ``n`` (the env count) that makes the vector env.
        warm: Seconds per cycle in the benchmark process, one per round.
        fresh: Seconds per cycle first in a fresh process, one per round.
        errors: Why a kind of measurement (``"warm"``, ``"fresh"``) failed, if it did: that
            kind is then not measured again.
    """

    name: str
    imports: str
    construct: str
    warm: list[float] = field(default_factory=list)
    fresh: list[float] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


#: The measured variants of each env count.
StartupResults = dict[int, list[StartupVariant]]


def startup_variants() -> list[StartupVariant]:
    """``make_vec`` with no options, ``AsyncVectorEnv`` with its defaults and with forkserver."""
    gym_imports = "import functools\n\nimport gymnasium as gym"
    fns = f"[functools.partial(gym.make, {ENV_ID!r})] * n"
    return [
        StartupVariant(
            MAKE_VEC,
            "from envserver import client",
            f"client.make_vec({ENV_ID!r}, n)",
        ),
        StartupVariant(STARTUP_REFERENCE, gym_imports, f"gym.vector.AsyncVectorEnv({fns})"),
        StartupVariant(
            'AsyncVectorEnv, context="forkserver"',
            gym_imports,
            f'gym.vector.AsyncVectorEnv({fns}, context="forkserver")',
        ),
    ]


def _warm_cycle(variant: StartupVariant, num_envs: int) -> float:
    """One construct + reset + step + close in this process; returns its seconds."""
    namespace: dict[str, Any] = {"client": client, "gym": gym, "n": num_envs}
    exec(variant.imports, namespace)  # modules the benchmark has imported already
    start = time.perf_counter()
    envs = eval(variant.construct, namespace)
    try:
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
    finally:  # closed even when stopped (Ctrl-C): no env processes left behind
        envs.close()
    return time.perf_counter() - start


def _fresh_cycle(variant: StartupVariant, num_envs: int, directory: Path) -> float:
    """One construct + reset + step + close first in a new Python process; returns its seconds.

    Raises:
        RuntimeError: The process failed or printed no time.
    """
    script = directory / f"startup_{re.sub(r'[^a-z]+', '_', variant.name.lower())}.py"
    if not script.exists():
        script.write_text(FRESH_SCRIPT.format(imports=variant.imports, construct=variant.construct))
    result = subprocess.run(
        [sys.executable, str(script), str(num_envs)],
        capture_output=True,
        text=True,
        timeout=FRESH_TIMEOUT_S,
        cwd=directory,
    )
    lines = result.stdout.split()
    if result.returncode != 0 or not lines:
        tail = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
        raise RuntimeError(f"fresh process: {tail[0]}")
    return float(lines[-1])


def _measure(variants: list[StartupVariant], num_envs: int, rounds: int, directory: Path) -> None:
    """Fills each variant's ``warm`` and ``fresh`` times, interleaved round by round."""
    for variant in variants:  # the untimed warm-up: one cycle each, in this process
        try:
            _warm_cycle(variant, num_envs)
        except Exception as exc:
            variant.errors["warm"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for kind in ("warm", "fresh"):
        for _ in range(rounds):
            for variant in variants:
                if kind in variant.errors:
                    continue
                try:
                    seconds = (
                        _warm_cycle(variant, num_envs)
                        if kind == "warm"
                        else _fresh_cycle(variant, num_envs, directory)
                    )
                except Exception as exc:
                    variant.errors[kind] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    print(
                        f"start-up, {num_envs} envs: {variant.name} ({kind}) failed: "
                        f"{variant.errors[kind]}",
                        file=sys.stderr,
                    )
                    continue
                getattr(variant, kind).append(seconds)


def time_ratio(variant: StartupVariant, reference: StartupVariant, kind: str) -> float | None:
    """The median per-round time ratio of ``variant`` to ``reference`` (None: not measured)."""
    ratios = [t / r for t, r in zip(getattr(variant, kind), getattr(reference, kind))]
    return statistics.median(ratios) if ratios else None


def make_vec_ratio(results: StartupResults, num_envs: int, kind: str) -> float | None:
    """``make_vec``'s time ratio to AsyncVectorEnv's default context (None: not measured)."""
    variants = results.get(num_envs, [])
    ours = next((v for v in variants if v.name == MAKE_VEC), None)
    reference = next((v for v in variants if v.name == STARTUP_REFERENCE), None)
    return None if ours is None or reference is None else time_ratio(ours, reference, kind)


def _median_and_ratio(variant: StartupVariant, reference: StartupVariant, kind: str) -> str:
    """``"median s | ratio"`` cells: the median time, and the median per-round time ratio."""
    times = getattr(variant, kind)
    if kind in variant.errors:
        return f"failed: {variant.errors[kind]} | -"
    if not times:
        return "- | -"
    ratio = time_ratio(variant, reference, kind)
    shown = "-" if ratio is None else f"{ratio:.2f}x"
    return f"{statistics.median(times):.3f} | {shown}"


def startup_table(results: StartupResults, rounds: int) -> str:
    """The markdown section of the start-up times, one block of rows per env count.

    Args:
        results: The measured variants of each env count.
        rounds: The measurements per variant and kind.

    Returns:
        The section, ending with a blank line.
    """
    lines = [
        f"### {STARTUP_TITLE}",
        "",
        f"Seconds for construct + reset + one step + close, median of {rounds} interleaved "
        f"measurements per variant; ratios are medians of per-round time ratios to "
        f"{STARTUP_REFERENCE} (above 1x: slower). *Warm*: in the benchmark process, after one "
        "untimed cycle of each variant. *First in a fresh process*: timed inside a new Python "
        "process, after its imports.",
        "",
        "| envs | variant | warm (s) | warm ratio | first in a fresh process (s) | fresh ratio |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for num_envs, variants in results.items():
        reference = next(v for v in variants if v.name == STARTUP_REFERENCE)
        for variant in variants:
            cells = [_median_and_ratio(variant, reference, kind) for kind in ("warm", "fresh")]
            lines.append(f"| {num_envs} | {variant.name} | {' | '.join(cells)} |")
    lines.append("")
    return "\n".join(lines)


def startup_section(
    directory: Path, rounds: int, sizes: tuple[int, ...] = (4, 16)
) -> tuple[str, StartupResults]:
    """Measures every start-up variant for each env count.

    Args:
        directory: Where the fresh processes' scripts go (and run).
        rounds: Measurements per variant, env count and kind (warm, fresh).
        sizes: The env counts.

    Returns:
        The markdown section (see :func:`startup_table`), and the measured variants.
    """
    directory.mkdir(parents=True, exist_ok=True)
    results: StartupResults = {}
    for num_envs in sizes:
        results[num_envs] = startup_variants()
        _measure(results[num_envs], num_envs, rounds, directory)
    return startup_table(results, rounds), results
