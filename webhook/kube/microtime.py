"""metav1.MicroTime as the API server parses it."""

from __future__ import annotations

import datetime


class MicroTime(datetime.datetime):
    """A metav1.MicroTime. The client writes times with isoformat(), which drops a zero
    fraction, while the API server parses MicroTime as RFC 3339 with exactly six digits."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return self.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @classmethod
    def of(cls, moment: datetime.datetime) -> MicroTime:
        zone = moment.tzinfo or datetime.UTC  # the client parses times with their zone
        return cls(*moment.timetuple()[:6], moment.microsecond, tzinfo=zone)
