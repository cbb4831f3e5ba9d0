"""A MkDocs hook: a code line too long for the page wraps four columns in from its own indent.

pymdownx.highlight puts each line of a code block in a span of its own (``line_spans`` in
``mkdocs.yml``), and ``docs/stylesheets/extra.css`` wraps a line that does not fit rather than
cut it off at the page's edge. What wraps is indented four columns past the line's own leading
spaces, as a continuation line is written in Python, so that it never reads as a statement of
its own; this hook gives each indented line's span those spaces, as ``--indent``.
"""

from __future__ import annotations

import re
from typing import Any

#: A line's span and the spaces it starts with (the shell lexer puts them in a span of theirs).
INDENTED = re.compile(r'(<span id="__span-\d+-\d+")>((?:<span class="w">)?)( +)')


def on_page_content(html: str, **kwargs: Any) -> str:
    """Sets ``--indent`` on the span of every code line that starts with spaces."""
    return INDENTED.sub(lambda m: f'{m[1]} style="--indent: {len(m[3])}">{m[2]}{m[3]}', html)
