"""JSON logs, one object per line, for log pipelines (Loki, Cloud Logging, ...)."""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

import orjson

FIELDS = "fields"  # `logger.info(msg, extra={FIELDS: {...}})` adds these keys to the line


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


def configure(level: str = "info") -> None:
    """Route every logger (ours, uvicorn's, the Kubernetes client's) through one JSON handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # one line per review is ours
