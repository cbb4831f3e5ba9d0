"""A griffe extension: the Sphinx roles of envserver's docstrings read as Markdown.

The docstrings are Google style, written to read well in the source and in ``help()``; their
cross-references are Sphinx roles (``:class:`HostConfig```, ``:meth:`recv```,
``:mod:`~envserver.host.loop```), which Markdown would show as they are typed. This extension
rewrites each role, once griffe has read the package, as a cross-reference that mkdocstrings
links where the target is documented on the site and leaves as code where it is not (a
private module, Gymnasium's classes): the name is resolved in the docstring's own scope, as
Sphinx does. A literal block's ``::`` becomes ``:``, and its indented block a fenced one, shown
as Python unless it reads as a shell command (``python -m ...``, ``envserver ...``) or a drawing
(box-drawing characters).

It is listed under the python handler's ``extensions`` in ``mkdocs.yml``, after the one that
reads the client in (``griffe_client.py``), so the client's docstrings are rewritten too.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

#: ``:role:`target``` and ``:role:`~target```, with Sphinx's ``py:`` domain optional.
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([\w.]+)`")
#: A paragraph that ends with ``::``, introducing a literal block (alone on its line, or not).
LITERAL = re.compile(r"(^|\S)::$", re.MULTILINE)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring in the packages griffe reads."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Rewrites the docstrings of ``pkg`` and everything in it (imported names aside)."""
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = markdown(obj.docstring.value, obj)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    """``obj`` and the objects it defines, at any depth (not the names it imports)."""
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_objects(member))  # type: ignore[arg-type]
    return found


def markdown(text: str, scope: griffe.Object) -> str:
    """``text`` with its roles as cross-references resolved in ``scope``, and ``::`` as ``:``."""

    def crossref(match: re.Match[str]) -> str:
        short, target = match.group(1) == "~", match.group(2).lstrip(".")
        shown = f"<code>{html.escape(target.rpartition('.')[2] if short else target)}</code>"
        path = _resolved(target, scope)
        if path is None:
            return shown
        return f'<autoref identifier="{html.escape(path)}" optional>{shown}</autoref>'

    text = _fenced(ROLE.sub(crossref, text))
    return LITERAL.sub(lambda m: m.group(1) + (":" if m.group(1) else ""), text)


def _fenced(text: str) -> str:
    """``text`` with the indented block after each ``::`` paragraph as a fenced code block."""
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        if not LITERAL.search(line) or index >= len(lines) or lines[index].strip():
            continue
        base = len(line) - len(line.lstrip())
        block_end = index + 1
        while block_end < len(lines) and (
            not lines[block_end].strip()
            or len(lines[block_end]) - len(lines[block_end].lstrip()) > base
        ):
            block_end += 1
        block = lines[index + 1 : block_end]
        while block and not block[-1].strip():
            block.pop()
        if not block:
            continue
        indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
        code = [b[indent:] for b in block]
        pad = " " * base
        out += ["", f"{pad}```{_language(code)}", *(pad + c if c else c for c in code), f"{pad}```"]
        out.append("")
        index = block_end
    return "\n".join(out)


def _language(code: list[str]) -> str:
    """How a literal block is highlighted: ``sh``, ``text`` or ``python``."""
    first = code[0].lstrip()
    if first.startswith(("python -m", "envserver ", "pip ", "make ", "$ ")):
        return "sh"
    if any(ch in "\n".join(code) for ch in "│├└─"):
        return "text"
    return "python"


def _resolved(target: str, scope: griffe.Object) -> str | None:
    """The full path of ``target`` seen from ``scope``: its first name resolved there, or a package.

    None when the first name is neither defined nor imported in ``scope`` or around it.
    """
    first, _, rest = target.partition(".")
    try:
        base = scope.resolve(first)
    except griffe.NameResolutionError:
        if first not in scope.modules_collection:
            return None
        base = first  # a package griffe read: envserver
    return f"{base}.{rest}" if rest else base
