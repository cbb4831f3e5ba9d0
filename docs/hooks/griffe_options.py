"""A griffe extension: ``RemoteVectorEnv``'s options in its signature and docstring.

Each option is written once, as a field of ``VectorOptions`` (``client/_options.py``) with its
type, default and doc. ``RemoteVectorEnv.__init__`` takes the options as ``**options``, and
``takes_options`` gives the class, once imported, a parameter per option (``__signature__``) and
an Args entry per option in its docstring. griffe reads the source, which has neither: this
extension gives ``__init__`` the options' parameters in place of ``**options`` (the fields'
types, and their defaults' values: ``'dict'``, ``AutoresetMode.NEXT_STEP``), and the class the
docstring it has once imported.

The faces also read some attributes from their parts through ``FromPart`` descriptors
(``copy = FromPart("_results", settable=True)``), which griffe reads as class attributes with
that value: this extension shows them as what they are to a user, properties (``writable`` where
settable), without the wiring.

It is listed under the python handler's ``extensions`` in ``mkdocs.yml``, after the one that
reads the client in (``griffe_client.py``) and before the one that rewrites the Sphinx roles
(``griffe_roles.py``), which the options' docs have too.
"""

from __future__ import annotations

import enum
import importlib
import inspect
from typing import Any

import griffe

#: The module and class that take the options, and the dataclass whose fields they are.
MODULE, CLASS, FIELDS = "client._vector", "RemoteVectorEnv", "client._options.VectorOptions"
#: The descriptor a face reads a part's attribute with, and how its call says it may be set.
PART, SETTABLE = "FromPart", "settable=True"


class Options(griffe.Extension):
    """Puts the options, as the class has them once imported, in ``RemoteVectorEnv``'s page."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Rewrites the class's ``__init__`` parameters and docstring, once the client is read."""
        if pkg.name != "envserver":  # the package griffe_client.py reads the client into
            return
        cls, fields = pkg[f"{MODULE}.{CLASS}"], pkg[FIELDS].members
        runtime = getattr(importlib.import_module(f"envserver.{MODULE}"), CLASS)
        init = cls.members["__init__"]
        named = [p for p in init.parameters if p.kind is not griffe.ParameterKind.var_keyword]
        options = [
            griffe.Parameter(
                p.name,
                annotation=fields[p.name].annotation,
                kind=griffe.ParameterKind.keyword_only,
                default=_source(p.default),
            )
            for p in inspect.signature(runtime).parameters.values()
            if p.name in fields
        ]
        init.parameters = griffe.Parameters(*named, *options)
        cls.docstring.value = inspect.cleandoc(runtime.__doc__)
        _parts_as_properties(pkg["client"])


def _parts_as_properties(package: griffe.Module) -> None:
    """Shows every class attribute of ``package`` that is a ``FromPart`` as a property."""
    for module in package.modules.values():
        for cls in module.classes.values():
            if cls.is_alias:  # imported: its module of origin has it
                continue
            for attribute in cls.attributes.values():
                value = str(attribute.value or "")
                if not attribute.is_alias and value.startswith(f"{PART}("):
                    attribute.value = None
                    attribute.labels = {"property"} | ({"writable"} if SETTABLE in value else set())


def _source(value: Any) -> str:
    """A default's value as source text: ``'dict'``, ``None``, ``AutoresetMode.NEXT_STEP``."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)
