"""The one log line per review, written without the logging module's per-record cost.

At thousands of reviews a second a `logging` record (caller lookup, LogRecord, formatter) costs
as much as the review itself. Review lines have the same JSON shape as every other log line
(`logs.JsonFormatter`), are serialised once with orjson and written in one batch per event-loop
turn. Everything else still goes through `logging`.

The keys every line of a webhook starts with are serialised once (`head`): a line is its time,
that head and the review's own fields, the same bytes orjson would make of the whole line.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any, BinaryIO

import orjson

from .logs import utc_timestamp

LOGGER = "webhook.admission"


class ReviewLog:
    def __init__(self, stream: BinaryIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream
        self.enabled = (
            logging.getLogger(LOGGER).isEnabledFor(logging.INFO) if enabled is None else enabled
        )
        self._pending: list[bytes] = []

    @staticmethod
    def head(**fields: Any) -> bytes:
        """The serialised keys that follow `ts` on every line written with this head."""
        line = {"level": "info", "logger": LOGGER, "msg": "admission review", **fields}
        return orjson.dumps(line)[1:-1]

    def write(self, head: bytes, fields: dict[str, Any]) -> None:
        """One line: `ts`, the keys of `head`, then `fields` (which must not repeat them)."""
        rest = orjson.dumps(fields, option=orjson.OPT_APPEND_NEWLINE, default=str)
        ts = utc_timestamp(time.time()).encode()
        glue = b"," if fields else b""
        self._pending.append(b'{"ts":"%b",%b%b%b' % (ts, head, glue, rest[1:]))
        if len(self._pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a direct call): write now
                self.flush()

    def flush(self) -> None:
        lines, self._pending = self._pending, []
        stream = self.stream if self.stream is not None else sys.stderr.buffer
        try:
            stream.write(b"".join(lines))
            stream.flush()
        except (OSError, ValueError):  # a closed or full stream must not fail reviews
            pass
