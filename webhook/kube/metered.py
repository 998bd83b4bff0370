"""Every request the service makes of the API server, counted by verb and HTTP status code.

All of them (the watches, the reconciler's writes, the Lease, TokenReviews, Events, the
self-managed certificate) go through `ApiClient.call_api`: the client's generated methods call
it, and so does `rest.request`. The client answers there with the response's status, whatever
it is (it raises only later, when a typed method decodes the answer), so one override sees
every code, 429 and 5xx included; a request that got no answer at all counts as `error`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from kubernetes.aio.client import ApiClient

Answered = Callable[[str, str], None]  # (verb, code)
_WATCH = re.compile(r"[?&]watch=(true|1)(&|$)", re.IGNORECASE)


def verb_of(method: str, url: str) -> str:
    """The HTTP method, except a GET that is a watch (its code comes when the stream starts)."""
    method = method.upper()
    return "WATCH" if method == "GET" and _WATCH.search(url) else method


class MeteredApiClient(ApiClient):
    """The official client, telling `on_answer` of each request's verb and code."""

    on_answer: Answered | None = None

    async def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb = verb_of(method, url)
        try:
            response = await super().call_api(method, url, *args, **kwargs)
        except asyncio.CancelledError:
            raise  # the caller gave up: not the API server's answer
        except Exception:
            self._answered(verb, "error")
            raise
        status = getattr(response, "status", None)
        self._answered(verb, str(status) if isinstance(status, int) else "error")
        return response

    def _answered(self, verb: str, code: str) -> None:
        if self.on_answer is not None:
            self.on_answer(verb, code)
