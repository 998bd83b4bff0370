"""JSON logs, one object per line, for log pipelines (Loki, Cloud Logging, ...)."""

from __future__ import annotations

import functools
import logging
import sys
import time
import weakref
from typing import Any, Protocol, TextIO

import orjson

FIELDS = "fields"  # `logger.info(msg, extra={FIELDS: {...}})` adds these keys to the line


class Buffered(Protocol):
    def flush_before_other_lines(self) -> None: ...


# Lines gathered elsewhere (the review log) that must reach the stream before any other line.
_before: weakref.WeakSet[Buffered] = weakref.WeakSet()


def write_before(buffered: Buffered) -> None:
    """Every log line written through `configure`'s handler first lets `buffered` write."""
    _before.add(buffered)


class _OrderedHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def emit(self, record: logging.LogRecord) -> None:
        for buffered in list(_before):
            buffered.flush_before_other_lines()
        super().emit(record)


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def utc_timestamp(t: float) -> str:
    """`2026-11-29T16:26:20.043Z`; the seconds part is formatted once a second."""
    second = int(t)
    return f"{_utc_second(second)}.{int((t - second) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def json_handler(stream: TextIO) -> logging.Handler:
    """A handler writing JSON lines to `stream`, after the lines `write_before` gathers."""
    handler = _OrderedHandler(stream)
    handler.setFormatter(JsonFormatter())
    return handler


def configure(level: str = "info") -> None:
    """Route every logger (ours, uvicorn's, the Kubernetes client's) through one JSON handler."""
    handler = json_handler(sys.stderr)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # one line per review is ours
