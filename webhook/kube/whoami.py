"""Whom the API server takes the service's credential for: a SelfSubjectReview, as
`kubectl auth whoami` asks. Any authenticated user may create one (the API server's default
`system:basic-user` role grants it to everyone), so it needs no RBAC rule of the service's own."""

from __future__ import annotations

import asyncio

import aiohttp
from kubernetes.aio.client import ApiClient, AuthenticationV1Api, V1SelfSubjectReview
from kubernetes.aio.client.exceptions import ApiException

TIMEOUT = 5.0  # start-up waits no longer than this for the answer


class WhoAmIError(Exception):
    """The API server did not say; the message says why, fit for a log line."""


async def who_am_i(api: ApiClient, timeout: float = TIMEOUT) -> str:
    """The username the API server authenticates `api`'s requests as."""
    body = V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
    authentication = AuthenticationV1Api(api)
    try:
        async with asyncio.timeout(timeout):  # the whole call, reading the answer included
            review = await authentication.create_self_subject_review(body, _request_timeout=timeout)
    except TimeoutError:
        raise WhoAmIError(f"no answer within {timeout:g}s") from None
    except ApiException as err:
        # 404: a server older than 1.28, or with the API turned off.
        raise WhoAmIError(f"the API server answered {err.status} {err.reason}") from None
    except (aiohttp.ClientConnectionError, OSError) as err:
        raise WhoAmIError(f"{type(err).__name__}: {err}") from None
    except Exception as err:  # e.g. an answer that does not parse
        raise WhoAmIError(type(err).__name__) from None
    info = review.status.user_info if review.status is not None else None
    username = info.username if info is not None else None
    if not isinstance(username, str) or not username:
        raise WhoAmIError("the answer names no username")
    return username
