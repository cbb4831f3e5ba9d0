"""A MkDocs hook: the command line's reference, generated from the ``envserver`` parsers.

``docs/reference/cli.md`` holds a marker line, ``<!-- cli-reference -->``; at build time this
hook replaces it with a section for ``envserver`` and one for each of its commands (the built-in
ones and those other packages contribute through the ``envserver.commands`` entry points): the
usage line, the description, and a table per argument group of every argument that ``--help``
shows, with its value, its default, the ``ENVSERVER_*`` variable its default comes from, and
its help text. The parser is the one ``envserver --help`` prints
(:func:`envserver.cli.app.build_parser`), built with no ``ENVSERVER_*`` variable set, so that
the defaults are the code's own and not the builder's environment's. Nothing is copied by hand:
an option added to a parser is on the page at the next build.

argparse has no public way to read a parser's arguments back, so ``envserver``'s parsers keep
what they are given (``arguments``, ``command_help``: see :class:`envserver.cli.parser.Parser`).
tests/system/test_docs_site.py checks the page holds every option string of every parser.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from envserver.cli.app import build_parser
from envserver.cli.commands import contributed_commands
from envserver.cli.parser import ArgumentGroup

#: The line of a page that the reference replaces.
MARKER = "<!-- cli-reference -->"
#: The page that must hold the marker.
PAGE = "reference/cli.md"
#: The width the usage lines are wrapped at.
WIDTH = 88
#: The variable an option's default comes from, as argparse's help shows it (``[env: NAME]``:
#: see envserver.cli.settings.EnvironmentOptions), and a variable the help text names.
ENV_SUFFIX = re.compile(r"\s*\[env: (ENVSERVER_\w+)\]$")
ENV_NAMED = re.compile(r"\$(ENVSERVER_\w+)")
#: Characters Markdown would read as markup in help text (outside its `code spans`); ``<`` and
#: ``&`` are escaped as HTML.
MARKUP = re.compile(r"([\\*_\[\]|])")

# A warning on a logger under "mkdocs" fails a strict build.
log = logging.getLogger("mkdocs.hooks.cli_reference")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Replaces the marker line with the reference (a warning if the CLI page lost it)."""
    if MARKER not in markdown:
        if page.file.src_uri == PAGE:
            log.warning("%s has no %s line: the command line reference is missing", PAGE, MARKER)
        return markdown
    return markdown.replace(MARKER, reference())


def reference() -> str:
    """The reference of ``envserver`` and its commands, as Markdown."""
    with _without_settings():
        parser = build_parser()
        contributed = contributed_commands()
    for name in contributed.keys() - parser.commands.keys():
        log.warning("envserver %s could not be loaded: it is not in the CLI reference", name)
    helps = parser.command_help
    sections = [_section(parser, "envserver", parser.description or "", commands=helps)]
    for name, command in parser.commands.items():
        sections.append(_section(command, name, command.description or _sentence(helps[name])))
    return "\n".join(sections)


@contextlib.contextmanager
def _without_settings() -> Iterator[None]:
    """The environment without ``ENVSERVER_*`` variables, for the parser's defaults."""
    saved = {name: value for name, value in os.environ.items() if name.startswith("ENVSERVER_")}
    for name in saved:
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update(saved)


def _section(
    parser: argparse.ArgumentParser,
    name: str,
    description: str,
    commands: dict[str, str] | None = None,
) -> str:
    """One command's section: heading, description, usage, then its arguments by group."""
    title = name if name == "envserver" else f"envserver {name}"
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)
    lines = [f"## {title}", "", _markdown(description), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    if commands:
        lines += ["**Commands**", "", "| Command | Description |", "|---|---|"]
        lines += [
            f"| [`{c}`](#envserver-{c}) | {_markdown(h or '')} |" for c, h in commands.items()
        ]
        lines.append("")
    shown = [a for a in parser.arguments if a.action.help is not argparse.SUPPRESS]
    own = [a.action for a in shown if a.group is None]
    groups = [
        (ArgumentGroup("Arguments", None), [a for a in own if not a.option_strings]),
        (ArgumentGroup("Options", None), [a for a in own if a.option_strings]),
    ]
    for group in dict.fromkeys(a.group for a in shown if a.group is not None):
        groups.append((group, [a.action for a in shown if a.group == group]))
    for group, actions in groups:
        if actions:
            lines += _group_table(parser, name, group, actions)
    return "\n".join(lines)


def _group_table(
    parser: argparse.ArgumentParser,
    name: str,
    group: ArgumentGroup,
    actions: list[argparse.Action],
) -> list[str]:
    title = group.title or ""
    lines = [f"**{_markdown(title[:1].upper() + title[1:])}**", ""]
    if group.description:
        lines += [_markdown(group.description), ""]
    lines += ["| Argument | Default | Description |", "|---|---|---|"]
    for action in actions:
        help_text, variables = _help(action, parser.prog)
        argument = _argument(action, name)
        if action.option_strings and _value(action):
            argument += " " + _code(_value(action))
        default = _default(action)
        if default:  # the Default column says it: "(default: 64)" is not repeated
            help_text = help_text.replace(f" (default: {default})", "")
        description = _markdown(help_text)
        if variables:
            named = ", ".join(_code(v) for v in variables)
            description += ("" if description.endswith(".") else ".") + f" Environment: {named}."
        lines.append(f"| {argument} | {_code(default)} | {description} |")
    lines.append("")
    return lines


def _argument(action: argparse.Action, name: str) -> str:
    """The flags (``-n``, ``--num-envs``) or the positional's name, with an anchor to link."""
    shown = action.option_strings or [_value(action)]
    anchor = f"{name}-{(max(shown, key=len) if action.option_strings else action.dest)}"
    anchor = re.sub(r"[^a-z0-9]+", "-", anchor.lower()).strip("-")
    return f'<span id="{anchor}"></span>' + ", ".join(_code(flag) for flag in shown)


def _value(action: argparse.Action) -> str:
    """What the argument takes, as argparse's usage writes it (``N``, ``[ENDPOINT ...]``)."""
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        metavar = action.metavar
    elif action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper() if action.option_strings else action.dest
    if isinstance(metavar, tuple):
        return " ".join(metavar)
    forms = {
        None: metavar,
        argparse.OPTIONAL: f"[{metavar}]",
        argparse.ZERO_OR_MORE: f"[{metavar} ...]",
        argparse.ONE_OR_MORE: f"{metavar} [{metavar} ...]",
        argparse.REMAINDER: "...",
    }
    if action.nargs in forms:
        return forms[action.nargs]
    return " ".join([metavar] * int(action.nargs))  # type: ignore[call-overload]


def _default(action: argparse.Action) -> str:
    """The default worth showing: not a switch's, not None, not an empty list."""
    default = action.default
    if action.nargs == 0 or default is None or default is argparse.SUPPRESS or default == []:
        return ""
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


def _help(action: argparse.Action, prog: str) -> tuple[str, list[str]]:
    """The help text as ``--help`` shows it, and the ``ENVSERVER_*`` variables it names.

    A default from a variable (``[env: NAME]`` at the end) is named once, out of the text.
    """
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    text = " ".join(((action.help or "") % params).split())
    suffix = ENV_SUFFIX.search(text)
    if suffix:
        return text[: suffix.start()], [suffix.group(1)]
    return text, list(dict.fromkeys(ENV_NAMED.findall(text)))


def _sentence(text: str | None) -> str:
    """A command's one-line help as a sentence: ``run an env host`` -> ``Run an env host.``."""
    text = (text or "").strip()
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _code(text: str) -> str:
    if not text:
        return ""
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def _markdown(text: str) -> str:
    """Help text in a Markdown table cell: `code spans` kept, markup characters escaped."""
    parts = re.split(r"(`[^`]+`)", " ".join(text.split()))
    return "".join(
        part if part.startswith("`") else MARKUP.sub(r"\\\1", html.escape(part, quote=False))
        for part in parts
    )
