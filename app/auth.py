"""Who may call what: the API's bearer tokens, checked for every request in one place.

The tokens come from ``SPO_AUTH_TOKENS`` or, one a line, from ``SPO_AUTH_TOKENS_FILE`` (read by each
worker when it starts: a reload's new workers read it again; ``app.settings``). What they guard depends
on ``SPO_PAGES``:

- ``open`` (the default, for the local demo): ``/v1/*`` only; the demo page, ``/docs`` and
  ``/openapi.json`` stay open;
- ``auth``: every path but the probes (``/healthz``, ``/readyz``) and ``/metrics`` (which has its own
  token, ``SPO_METRICS_TOKEN``); an unknown path without a token is a 401, not a 404;
- ``off``: as ``open``, and the pages are not served at all (``app.web``).

Tokens are compared in constant time (``hmac.compare_digest``) and never logged.
"""

from __future__ import annotations

import hmac

from flask import Flask, current_app, request

from app.errors import ApiError
from app.settings import Settings

# Paths that never need an API token: the orchestrator's probes, and /metrics (its own token).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def guarded(path: str, settings: Settings) -> bool:
    """Whether a request for ``path`` needs one of the API tokens under ``settings``.

    >>> s = Settings(auth_tokens=("a-token-of-16-chars",), pages="auth")
    >>> [guarded(p, s) for p in ("/v1/extract", "/docs/", "/", "/healthz", "/metrics")]
    [True, True, True, False, False]
    >>> [guarded(p, s.replace(pages="open")) for p in ("/v1/extract", "/docs/", "/openapi.json")]
    [True, False, False]
    """
    if not settings.auth_enabled or path in OPEN_PATHS:
        return False
    return settings.pages == "auth" or path.startswith("/v1/")


def authorized(header: str, tokens: tuple[str, ...]) -> bool:
    """Whether an ``Authorization`` header carries one of ``tokens`` as a bearer token."""
    scheme, _, given = header.partition(" ")
    given = given.strip()
    # Every token is compared, so the time taken tells nothing about which one came close.
    matches = [hmac.compare_digest(given.encode(), t.encode()) for t in tokens]
    return scheme.lower() == "bearer" and any(matches)


def _authenticate() -> None:
    settings: Settings = current_app.extensions["spo.settings"]
    if not guarded(request.path, settings):
        return
    if not authorized(request.headers.get("Authorization", ""), settings.api_tokens):
        raise ApiError(
            "unauthorized",
            "A valid bearer token is required (Authorization: Bearer <token>).",
            headers={"WWW-Authenticate": 'Bearer realm="spo"'},
        )


def init_app(app: Flask) -> None:
    # After the request id and the metrics timer (app.logging, app.metrics, registered before): a
    # refused request is logged and counted like any other.
    app.before_request(_authenticate)
