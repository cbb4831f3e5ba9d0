"""A griffe extension: a parameter whose default is read from an object shows the value.

``RemoteVectorEnv(envs_per_host=DEFAULT_OPTIONS.envs_per_host, ...)`` keeps each default in one
place (the options' dataclass); a signature drawn from the source would show the expression,
and mkdocstrings shows only its last name (``envs_per_host=envs_per_host``), which reads as if
the parameter were its own default. This extension imports the module that defines the
function and shows the value instead (``envs_per_host=None``), when the default is such a
dotted name and its value is a plain one (None, a number, a string, a tuple of them, an enum
member). Other defaults keep their source text.

It is listed under the python handler's ``extensions`` in ``mkdocs.yml``, after the one that
reads the client in (``griffe_client.py``).
"""

from __future__ import annotations

import enum
import functools
import importlib
import logging
from typing import Any

import griffe

#: The values shown in place of the expression, and the longest text shown.
PLAIN = (type(None), bool, int, float, str)
LONGEST = 40

logger = logging.getLogger(__name__)


class DefaultValues(griffe.Extension):
    """Replaces ``NAME.attribute`` defaults by their values in the packages griffe reads."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Shows the values of the dotted-name defaults of every function in ``pkg``."""
        for function in _functions(pkg):
            for parameter in function.parameters:
                if isinstance(parameter.default, griffe.ExprAttribute):
                    value = _value(function.module.path, str(parameter.default))
                    if value is not None:
                        parameter.default = value


def _functions(obj: griffe.Object) -> list[griffe.Function]:
    """The functions and methods ``obj`` defines, at any depth (not the names it imports)."""
    found = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_function:
            found.append(member)
        found.extend(_functions(member))  # type: ignore[arg-type]
    return found


def _value(module: str, expression: str) -> str | None:
    """The value of ``expression`` (``NAME.attribute...``) in ``module``, as source text.

    None when it cannot be read or is not plain.
    """
    first, *rest = expression.split(".")
    try:
        value = functools.reduce(getattr, rest, vars(importlib.import_module(module))[first])
    except Exception as exc:  # not importable, or not a name of it: keep the expression
        logger.debug("%s in %s: %s", expression, module, exc)
        return None
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    plain = isinstance(value, PLAIN) or (
        isinstance(value, tuple) and all(isinstance(item, PLAIN) for item in value)
    )
    text = repr(value)
    return text if plain and len(text) <= LONGEST else None
