"""The one log line per review, written without the logging module's per-record cost.

At thousands of reviews a second a `logging` record (caller lookup, LogRecord, formatter) costs
as much as the review itself. Review lines have the same JSON shape as every other log line
(`logs.JsonFormatter`), are serialised once with orjson and written together: one write when
64 KiB have gathered or 50 ms after the first line waiting, whichever is first (a write per
event-loop turn cost about 12 µs a review, a system call each). Order is kept: any other log line
written from the event loop first writes the review lines waiting (`logs.write_before`), and the
service writes what is left when it stops. A process killed outright loses at most 50 ms of them.

The keys every line of a webhook starts with are serialised once (`head`): a line is its time,
that head and the review's own fields, the same bytes orjson would make of the whole line.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from typing import Any, BinaryIO

import orjson

from .logs import utc_timestamp, write_before

LOGGER = "webhook.admission"
FLUSH_BYTES = 64 * 1024
FLUSH_AFTER = 0.05  # seconds


class ReviewLog:
    def __init__(self, stream: BinaryIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream
        self.enabled = (
            logging.getLogger(LOGGER).isEnabledFor(logging.INFO) if enabled is None else enabled
        )
        self._pending: list[bytes] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._thread: int | None = None  # the event loop's, once a line waits for company
        write_before(self)

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
        line = b'{"ts":"%b",%b%b%b' % (ts, head, glue, rest[1:])
        self._pending.append(line)
        self._size += len(line)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a direct call): write now
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_AFTER, self.flush)
            self._thread = threading.get_ident()

    def flush(self) -> None:
        """Writes the lines waiting (from the event loop's thread: it alone appends)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        lines, self._pending, self._size = self._pending, [], 0
        stream = self.stream if self.stream is not None else sys.stderr.buffer
        try:
            stream.write(b"".join(lines))
            stream.flush()
        except (OSError, ValueError):  # a closed or full stream must not fail reviews
            pass

    def flush_before_other_lines(self) -> None:
        """Called before another log line is written: lines waiting go first, when that line
        comes from the event loop's thread (elsewhere they would race its appends)."""
        if self._pending and threading.get_ident() == self._thread:
            self.flush()
