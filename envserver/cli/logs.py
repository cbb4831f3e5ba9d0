"""Log output of the ``envserver`` command: plain lines, or one JSON object per line.

``--log-format json`` is for log shippers (Loki, Elasticsearch, Cloud Logging): each record is a
JSON object with ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus the
structured fields the host attaches (``session``, ``env_index``, ``exception``, ``client``;
``host_index`` for each host of ``serve --processes``) and ``traceback`` when there is one.
Warnings are shown as Python shows them, less the colour codes some carry
(:func:`plain_warnings`).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import re
import warnings
from typing import Any

__all__ = ["FIELDS", "LOG_FORMATS", "JsonFormatter", "configure", "plain_warnings"]

#: Structured fields a record may carry (``extra=``), copied into the JSON object.
FIELDS = ("session", "env_index", "exception", "client", "host_index")
#: The values of ``--log-format``.
LOG_FORMATS = ("plain", "json")
PLAIN_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON object on one line."""
        entry = {
            "time": datetime.datetime.fromtimestamp(
                record.created, datetime.timezone.utc
            ).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in FIELDS:
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, log_format: str, host_index: int | None = None) -> None:
    """Sends the root logger's records to stderr, as plain lines or JSON.

    Args:
        level: The log level's name.
        log_format: One of :data:`LOG_FORMATS`.
        host_index: Marks every record as host ``host_index``'s (``[host N]`` in a plain line):
            one of the hosts of ``serve --processes``, which share a stderr.
    """
    handler = logging.StreamHandler()
    plain = PLAIN_FORMAT
    if host_index is not None:
        plain = plain.replace("%(message)s", "[host %(host_index)d] %(message)s")
        handler.addFilter(functools.partial(_mark, host_index=host_index))
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(plain))
    logging.basicConfig(  # a forked host's handler replaces its parent's
        level=getattr(logging, level.upper(), logging.INFO),
        handlers=[handler],
        force=host_index is not None,
    )


def _mark(record: logging.LogRecord, host_index: int) -> bool:
    record.host_index = host_index
    return True


#: An ANSI colour sequence, as ``gymnasium.logger.warn`` puts around a warning's message.
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def plain_warnings() -> None:
    """Shows this process's warnings without colour codes, in a terminal or a file alike.

    ``gymnasium.logger.warn`` colours the message of the warning it gives; an env's (relayed
    from its host) or Gymnasium's own would reach a log or a pipe as raw escape codes.
    """
    show = warnings.formatwarning
    if getattr(show, "plain", False):
        return

    def formatwarning(*args: Any, **kwargs: Any) -> str:
        return ANSI_COLOUR.sub("", show(*args, **kwargs))

    formatwarning.plain = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning
