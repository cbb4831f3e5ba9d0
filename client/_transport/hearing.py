"""What the envs said on their hosts, told to the trainer: warnings raised, output written.

Replies carry what envs said while their host ran the command (see
:mod:`envserver.wire.said`). :class:`Hearing` gathers it from every host's reply to one call
and, when the call's replies are in, tells it:

- each warning with ``warnings.warn_explicit``: its own category when it is a builtin or a
  Gymnasium warning (so the trainer's filters and ``pytest.warns`` apply), else ``UserWarning``
  naming it; the env's file and line kept; the message prefixed with where it came from. The
  same warning from many envs and hosts is told once, with how many envs said it; a registry
  of the vector env's own dedupes further calls as Python does per location.
- each line of output on ``sys.stderr``, prefixed with where it came from, as Ray prints its
  workers' lines: a line many envs printed in one call once, with ``[repeated Nx]``.
"""

from __future__ import annotations

import builtins
import sys
import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["Hearing", "describe_envs"]


def _ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    values = sorted(set(indices))
    start = previous = None
    for value in [*values, None]:
        if start is not None and value == previous + 1:
            previous = value
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = value
    return ",".join(parts)


def describe_envs(envs: Iterable[int], hosts: Iterable[str]) -> str:
    """Where something was said: ``env 3, local host 0``; ``envs 0-15 on 4 hosts``."""
    envs, hosts = sorted(set(envs)), sorted(set(hosts))
    where = hosts[0] if len(hosts) == 1 else f"{len(hosts)} hosts"
    if not envs:
        return where
    noun = "env" if len(envs) == 1 else "envs"
    return (
        f"{noun} {_ranges(envs)}, {where}"
        if len(hosts) == 1
        else f"{noun} {_ranges(envs)} on {where}"
    )


def warning_category(name: str) -> type[Warning] | None:
    """The warning class named ``module.QualName``, if it is a builtin or Gymnasium's.

    Nothing is imported: a Gymnasium module counts only if the trainer has it loaded.
    """
    module, _, qualname = name.rpartition(".")
    if module == "builtins":
        found: Any = getattr(builtins, qualname, None)
    elif module == "gymnasium" or module.startswith("gymnasium."):
        found = sys.modules.get(module)
        for part in qualname.split("."):
            found = getattr(found, part, None)
    else:
        return None
    return found if isinstance(found, type) and issubclass(found, Warning) else None


class Hearing:
    """Gathers what the envs said in the replies to one call, and tells it when told to."""

    def __init__(self) -> None:
        #: Warnings already shown, as ``warnings.warn_explicit`` keeps them (per location).
        self.registry: dict[Any, Any] = {}
        self._heard: list[tuple[str, int, dict[str, Any]]] = []

    def heard(self, host: str, start: int, said: dict[str, Any]) -> None:
        """Takes what a host's reply said (``start``: its first env's global index)."""
        self._heard.append((host, start, said))

    def tell(self) -> None:
        """Tells the trainer what was heard since the last time, and forgets it."""
        if not self._heard:
            return
        heard, self._heard = self._heard, []
        warned: dict[tuple[Any, ...], list[Any]] = {}
        lines: dict[str, list[Any]] = {}
        for host, start, said in heard:
            for entry in said["warnings"]:
                key = (entry["category"], entry["message"], entry["filename"], entry["lineno"])
                _gather(warned.setdefault(key, [set(), set(), 0]), host, start, entry)
            for entry in said["output"]:
                _gather(lines.setdefault(entry["text"], [set(), set(), 0]), host, start, entry)
        for (category, message, filename, lineno), (envs, hosts, count) in warned.items():
            self._warn(category, message, filename, lineno, describe_envs(envs, hosts), count)
        stream = sys.stderr
        for text, (envs, hosts, count) in lines.items():
            repeated = f" [repeated {count}x]" if count > 1 else ""
            stream.write(f"({describe_envs(envs, hosts)}) {text}{repeated}\n")
        for host, _, said in heard:
            cut = said["cut"]
            if any(cut.values()):
                stream.write(
                    f"({host}) cut to stay within bounds: {cut['lines']} line(s) of env output "
                    f"({cut['bytes']} characters), {cut['warnings']} warning(s)\n"
                )
        stream.flush()

    def _warn(
        self, category: str, message: str, filename: str, lineno: int, where: str, count: int
    ) -> None:
        found = warning_category(category)
        text = f"[{where}{f', {count}x' if count > 1 else ''}] {message}"
        if found is None:
            found, text = UserWarning, f"{text} ({category})"
        warnings.warn_explicit(text, found, filename, lineno, registry=self.registry)


def _gather(seen: list[Any], host: str, start: int, entry: dict[str, Any]) -> None:
    """Adds a said entry to what was gathered of it: ``[envs, hosts, count]``."""
    seen[0].update(start + index for index in entry["envs"])
    seen[1].add(host)
    seen[2] += entry["count"]
