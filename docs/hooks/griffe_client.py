"""A griffe extension: ``envserver.client`` read from the ``client/`` folder, where it lives.

setuptools installs the folder as ``envserver.client`` (``package-dir`` in ``pyproject.toml``),
so Python imports it under that name; griffe reads the source tree, where ``envserver/`` has
no ``client/`` beside its other subpackages, and would not find it. Once griffe has read the
``envserver`` package, this extension reads ``client/`` (beside ``envserver/``, as
``envserver.client`` itself expects in a source tree) into it, by griffe's own visitor, so
``::: envserver.client.RemoteVectorEnv`` and cross-references to it resolve as for any other
module. It is listed under the python handler's ``extensions`` in ``mkdocs.yml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe

#: The package to read the client into, and the folder that holds it, beside the package.
PACKAGE = "envserver"
CLIENT = "client"


class ClientPackage(griffe.Extension):
    """Reads ``client/`` into the ``envserver`` package as its ``client`` subpackage."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Adds ``envserver.client`` once ``envserver`` is read, unless griffe found it there.

        An installed (not editable) envserver has it in place; a source tree has it beside.
        """
        if pkg.name != PACKAGE or CLIENT in pkg.members or not isinstance(pkg.filepath, Path):
            return
        folder = pkg.filepath.parent.parent / CLIENT
        if not (folder / "__init__.py").is_file():
            return
        client = _read_package(loader, CLIENT, folder, pkg)
        loader.expand_exports(client)  # as griffe does for the package it loaded
        loader.expand_wildcards(client, external=False)


def _read_package(
    loader: griffe.GriffeLoader, name: str, folder: Path, parent: griffe.Module
) -> griffe.Module:
    """Reads a package folder (``__init__.py``, its modules, its subpackages) into ``parent``."""
    package = _read_module(loader, name, folder / "__init__.py", parent)
    for path in sorted(folder.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file():
            _read_package(loader, path.name, path, package)
        elif path.suffix == ".py" and path.stem != "__init__":
            _read_module(loader, path.stem, path, package)
    return package


def _read_module(
    loader: griffe.GriffeLoader, name: str, path: Path, parent: griffe.Module
) -> griffe.Module:
    """A module's file, read with the loader's parser and extensions, into ``parent``."""
    code = path.read_text(encoding="utf-8-sig")
    loader.lines_collection[path] = code.splitlines(keepends=False)
    module = griffe.visit(
        name,
        filepath=path,
        code=code,
        extensions=loader.extensions,
        parent=parent,
        docstring_parser=loader.docstring_parser,
        docstring_options=loader.docstring_options,
        lines_collection=loader.lines_collection,
        modules_collection=loader.modules_collection,
    )
    parent.set_member(name, module)
    return module
