"""Which pod a log line is about, on every line, and the JSON log format (`bindery run --log-format json`).

A scheduling cycle runs in one asyncio task (and the tasks it starts inherit its context), so the pod,
its ResourceManager and, once reserved, the reservation id are set once per cycle in a context
variable; every line logged meanwhile carries them, whoever logs it (the cycle, a plugin, the RM
client, Kopf). The text format is unchanged; the JSON format writes them as fields, so a log search
for one pod's UID or one reservation finds its whole story; with tracing on (bindery.tracing) it adds
the `trace_id` of the attempt the line belongs to.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import types
from collections.abc import Iterator, Mapping

from bindery import tracing

__all__ = ["JsonFormatter", "add_log_context", "log_context", "log_fields"]

_NONE: Mapping[str, str] = types.MappingProxyType({})
_FIELDS: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "bindery_log_fields", default=_NONE
)


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Every line logged in this block (and in tasks started from it) carries `fields`."""
    token = _FIELDS.set({**_FIELDS.get(), **fields})
    try:
        yield
    finally:
        _FIELDS.reset(token)


def add_log_context(**fields: str) -> None:
    """Add fields for the rest of the enclosing `log_context` block (e.g. the reservation, once made)."""
    _FIELDS.set({**_FIELDS.get(), **fields})


def log_fields() -> Mapping[str, str]:
    return _FIELDS.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields, the exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **log_fields(),
        }
        if tracing.state.on and (trace_id := tracing.current_trace_id()) is not None:
            entry["trace_id"] = trace_id  # the attempt's trace (bindery.tracing), when tracing is on
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
