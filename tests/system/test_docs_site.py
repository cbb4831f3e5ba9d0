"""The documentation site builds strictly, and its generated pages say what the code says.

The site is built once for the module, as ``make docs`` builds it (``mkdocs build --strict``):
any warning fails it (a broken link or anchor, a page out of the nav, a docstring griffe cannot
read, a cross-reference to nothing). The command line's page is generated from the parsers
(docs/hooks/cli_reference.py) and the API pages from the docstrings; each is checked against
the parsers and the objects themselves, so that an option or a method the generators drop
fails here. The site is read as the README says to read it, opened from the disk: its links
name files and its search needs no server.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import inspect
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from gymnasium.vector import AutoresetMode
from helpers import ROOT

import envserver.client
from envserver.cli.app import build_parser
from envserver.client._options import VectorOptions
from envserver.host import HostConfig

#: A variable the build's environment sets, which the CLI page must not take as the default.
BUILDER_SETTING = ("ENVSERVER_MAX_SESSIONS", "7")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, BUILDER_SETTING[0]: BUILDER_SETTING[1], "NO_MKDOCS_2_WARNING": "1"}
    started = time.monotonic()
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    built = subprocess.run(
        [*command, "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(f"mkdocs build --strict: {time.monotonic() - started:.1f} s")
    if built.returncode != 0:
        pytest.fail(f"mkdocs build --strict exited {built.returncode}:\n{built.stderr}")
    return out


def page(site: Path, path: str) -> str:
    return (site / f"{path}.html").read_text(encoding="utf-8")


def text(markup: str) -> str:
    """What a reader sees of some HTML: no tags, entities read, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", markup)).split())


def first_line(obj: object) -> str:
    """A docstring's first line as the site shows it: Sphinx roles and backquotes read."""
    line = (inspect.getdoc(obj) or "").splitlines()[0]
    line = re.sub(
        r":\w+:`(~?)([\w.]+)`",
        lambda m: m.group(2).rpartition(".")[2] if m.group(1) else m.group(2),
        line,
    )
    return " ".join(line.replace("`", "").split())


def section(markup: str, anchor: str) -> str:
    """The HTML from the heading ``anchor`` to the next heading of its level."""
    start = re.search(rf'<h([1-6]) id="{re.escape(anchor)}"', markup)
    assert start, f"no heading #{anchor}"
    end = markup.find(f"<h{start.group(1)} ", start.end())
    return markup[start.start() : end if end != -1 else len(markup)]


def parsers() -> dict[str, argparse.ArgumentParser]:
    """``envserver``'s parser and each command's, by the anchor of its section."""
    parser = build_parser()
    commands = {f"envserver-{name}": command for name, command in parser.commands.items()}
    return {"envserver": parser, **commands}


def shown(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments ``--help`` shows (not the hidden ones, not the command choice)."""
    return [
        argument.action
        for argument in parser.arguments
        if argument.action.help is not argparse.SUPPRESS
    ]


def test_the_site_builds_strictly_with_every_page(site):
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    pages = {"index.html", "reference/cli.html", "reference/api/client.html"}
    assert pages | {"reference/exceptions.html"} <= locations
    cli = " ".join(
        doc["text"] for doc in index["docs"] if doc["location"].startswith("reference/cli.html")
    )
    assert "--max-sessions" in cli and "ENVSERVER_MAX_SESSIONS" in cli


def test_the_cli_page_holds_every_command_and_every_option_of_its_parser(site):
    cli = page(site, "reference/cli")
    commands = parsers()
    assert set(commands) == {"envserver"} | {
        f"envserver-{name}" for name in ("serve", "ping", "keygen", "rollout", "bench")
    }
    for anchor, parser in commands.items():
        part = section(cli, anchor)
        assert text(parser.format_usage().split(maxsplit=1)[1]) in text(part), anchor
        for action in shown(parser):
            for flag in action.option_strings:
                assert f"<code>{html.escape(flag)}</code>" in part, (anchor, flag)
            if not action.option_strings:  # a positional, as usage writes it: [HOST ...]
                name = re.escape(html.escape(action.metavar or action.dest))
                assert re.search(rf"<code>[^<]*\b{name}\b[^<]*</code>", part), (anchor, name)


def test_the_cli_page_names_the_variable_of_each_option_and_the_code_s_defaults(site):
    cli = page(site, "reference/cli")
    named = 0
    for anchor, parser in parsers().items():
        rows = re.findall(r"<tr>.*?</tr>", section(cli, anchor), re.DOTALL)
        for action in shown(parser):
            variable = re.search(r"\[env: (ENVSERVER_\w+)\]", action.help or "")
            if variable and action.option_strings:
                row = next(r for r in rows if f"<code>{action.option_strings[-1]}</code>" in r)
                assert f"<code>{variable.group(1)}</code>" in row, (anchor, action.option_strings)
                named += 1
    assert named >= 15  # serve's options, the log options, the CURVE keys of rollout and ping
    serve = section(cli, "envserver-serve")
    row = next(r for r in re.findall(r"<tr>.*?</tr>", serve, re.DOTALL) if "--max-sessions<" in r)
    # The build ran with ENVSERVER_MAX_SESSIONS=7: the page shows the code's default.
    assert f"<code>{HostConfig().max_sessions}</code>" in row
    assert f"<code>{BUILDER_SETTING[1]}</code>" not in row


def test_build_parser_is_the_parser_of_envserver_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    printed = subprocess.run(
        [Path(sys.executable).with_name("envserver"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
        timeout=60,
        check=True,
    ).stdout
    assert build_parser().format_help() == printed


def test_the_api_pages_document_the_public_api_from_the_docstrings(site):
    client = page(site, "reference/api/client")
    for name in envserver.client.__all__:
        assert name in text(client), name
    remote = envserver.client.RemoteVectorEnv
    for anchor, obj in {
        "envserver.client.RemoteVectorEnv": remote,
        "envserver.client.RemoteVectorEnv.step": remote.step,
        "envserver.client.RemoteVectorEnv.call_async": remote.call_async,  # inherited
        "envserver.client.make_vec": envserver.client.make_vec,
    }.items():
        assert first_line(obj) in text(section(client, anchor)), anchor
    for path, anchors in {
        "reference/api/sb3": ["envserver.client.sb3.RemoteVecEnv"],
        "reference/api/aio": [
            "envserver.client.aio.EnvPool",
            "envserver.client.aio.EnvPool.make",
            "envserver.client.aio.AsyncEnv.step",
        ],
        "reference/api/host": ["envserver.host.EnvHost", "envserver.host.HostConfig"],
        "reference/api/launch": [
            "envserver.launch.spawn.serve_command",
            "envserver.launch.spawn.spawn_host",
        ],
        "reference/api/testing": ["envserver.testing.start_host"],
    }.items():
        markup = page(site, path)
        for anchor in anchors:
            assert f'id="{anchor}"' in markup, (path, anchor)


def test_sphinx_roles_read_as_links_or_code(site):
    client = page(site, "reference/api/client")
    assert not re.search(r":(class|meth|func|mod|data|attr):", text(client))
    # batch_size's :meth:`recv` links to the method on the same page.
    assert '<a class="autorefs autorefs-internal"' in client
    assert 'href="#envserver.client.RemoteVectorEnv.recv"' in client


#: The links and the scripts, stylesheets and images of a page.
LINK = re.compile(r'<(?:a|link|script|img)\b[^>]*?\b(?:href|src)="([^"]*)"')


def test_the_site_opened_from_the_disk_links_files_and_loads_nothing_from_the_network(site):
    # Opened as file:// (site/index.html), a link to a folder shows a directory listing.
    broken, fetched = [], []
    for path in sorted(set(site.rglob("*.html")) - {site / "404.html"}):  # a server's page
        markup = path.read_text(encoding="utf-8")
        for target in LINK.findall(markup):
            url = urllib.parse.urlsplit(html.unescape(target))
            if url.scheme or url.netloc or not url.path:  # another site, mailto:, #anchor
                continue
            if not (path.parent / urllib.parse.unquote(url.path)).is_file():
                broken.append(f"{path.relative_to(site)}: {target}")
        fetched += re.findall(r'<script\b[^>]*\bsrc="((?:https?:)?//[^"]*)"', markup)
    assert not broken, f"{len(broken)} links to no file, as: {broken[:5]}"
    assert not fetched, f"scripts from the network: {sorted(set(fetched))}"


def test_search_runs_on_the_site_opened_from_the_disk(site):
    # A browser starts no web worker from file://: the shim runs the search worker in an
    # iframe, and the index comes as a script (a fetch of search_index.json fails there).
    index = page(site, "index")
    shim = re.search(r'<script src="([^"]*iframe-worker[^"]*)"', index)
    assert shim and (site / shim.group(1)).is_file()
    assert index.find(shim.group(0)) < index.find("assets/javascripts/bundle.")  # it runs first
    script = (site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert script.startswith("var __index = ")
    assert json.loads(script.removeprefix("var __index = ")) == json.loads(
        (site / "search" / "search_index.json").read_text(encoding="utf-8")
    )


def test_each_api_page_is_titled_as_the_nav_names_it(site):
    entries = re.findall(
        r'<a href="(reference/api/[\w-]+\.html)" class="md-nav__link">\s*'
        r'<span class="md-ellipsis">\s*(envserver[\w.]*)\s*</span>',
        page(site, "index"),
    )
    assert len(entries) == 8, entries
    for path, title in entries:
        heading = re.search(r"<h1\b[^>]*>(.*?)</h1>", (site / path).read_text(encoding="utf-8"))
        assert heading and text(heading.group(1)).rstrip("¶") == title, (path, title)


def test_a_parameter_s_type_and_default_stay_beside_its_description(site):
    # Four columns (name, type, description, default) cut the Default one off the page.
    for path in sorted((site / "reference" / "api").glob("*.html")):
        for head in re.findall(r"<thead>(.*?)</thead>", path.read_text(encoding="utf-8"), re.S):
            assert len(re.findall(r"<th\b", head)) <= 2, (path.name, text(head))
    remote = section(page(site, "reference/api/client"), "envserver.client.RemoteVectorEnv")
    row = next(r for r in re.findall(r"<tr\b.*?</tr>", remote, re.S) if "<code>info_format<" in r)
    assert "TYPE: str" in text(row) and "DEFAULT: 'dict'" in text(row)
    # Each option, taken as **options: its doc and default, from its field (griffe_options.py).
    rows = [text(r) for r in re.findall(r"<tr\b.*?</tr>", remote, re.S)]
    for field in dataclasses.fields(VectorOptions):
        value = field.default
        shown = f"AutoresetMode.{value.name}" if isinstance(value, AutoresetMode) else repr(value)
        row = next(r for r in rows if r.startswith(f"{field.name} "))
        assert f"DEFAULT: {shown}" in row and row.split(" TYPE:")[0] != field.name, row


def test_a_code_line_that_wraps_is_indented_past_its_own_indent(site):
    # docs/stylesheets/extra.css wraps a line too long for the page, four columns past the
    # line's own leading spaces, which docs/hooks/code_lines.py gives each line's span.
    guide = page(site, "guides/trainers")
    lines = re.findall(r'<span id="__span-[\d-]+"( style="--indent: \d+")?>([^\n]*)', guide)
    indented = [(style, line) for style, line in lines if text(line).startswith("obs, rewards")]
    assert indented, "the CleanRL example's step line"
    for style, line in indented:
        assert style == f' style="--indent: {len(line) - len(line.lstrip(" "))}"', line
    assert all(not style for style, line in lines if not line.startswith(" "))
