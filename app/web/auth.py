"""Who may call what: the API's bearer tokens, checked for every request in one place.

The tokens come from ``SPO_AUTH_TOKENS`` or, one a line, from ``SPO_AUTH_TOKENS_FILE`` (read when the
settings are made: at start and on each reload, whose new workers serve what it says then;
``app.core.settings``, ``app.serving.master``). What they guard depends
on ``SPO_PAGES``:

- ``open`` (the default, for the local demo): ``/v1/*`` only; the demo page, ``/docs`` and
  ``/openapi.json`` stay open;
- ``auth``: every path but the probes (``/healthz``, ``/readyz``) and ``/metrics`` (which has its own
  token, ``SPO_METRICS_TOKEN``); an unknown path without a token is a 401, not a 404;
- ``off``: as ``open``, and the pages are not served at all (``app.web.pages``).

Tokens are compared in constant time (``hmac.compare_digest``) and never logged. Under ``spo serve``
the master reads the file and hands the tokens to its workers by the fork (a recycled worker serves its
generation's tokens); a start or a reload on a file it cannot read is refused. An app made otherwise
(``create_app()`` reading ``SPO_*`` itself) whose tokens file is unreadable stays up and fails closed:
every request that needs a token gets 503 ``service_unavailable``.
"""

from __future__ import annotations

import hmac
import logging

from flask import Flask, current_app, request

from app.core.settings import Settings
from app.web.errors import ApiError

logger = logging.getLogger(__name__)

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


def _preflight() -> bool:
    """A browser's CORS preflight: browsers send it without credentials (the Fetch standard), so
    guarding it would keep every allowed origin (``SPO_CORS_ORIGINS``) from calling a guarded API.
    It reaches no view: Flask answers it with the route's ``Allow``, flask-cors adds its headers."""
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def _authenticate() -> None:
    settings: Settings = current_app.extensions["spo.settings"]
    if not guarded(request.path, settings) or _preflight():
        return
    if not settings.api_tokens:  # SPO_AUTH_TOKENS_FILE unreadable when this worker started
        raise ApiError(
            "service_unavailable",
            "This worker cannot check tokens now (its tokens file could not be read); retry later.",
            headers={"Retry-After": "5"},
        )
    if not authorized(request.headers.get("Authorization", ""), settings.api_tokens):
        raise ApiError(
            "unauthorized",
            "A valid bearer token is required (Authorization: Bearer <token>).",
            headers={"WWW-Authenticate": 'Bearer realm="spo"'},
        )


def init_app(app: Flask) -> None:
    settings: Settings = app.extensions["spo.settings"]
    if settings.auth_tokens_problem:
        logger.error(
            "SPO_AUTH_TOKENS_FILE: %s: every request that needs a token is refused (503) until the "
            "file is fixed and the app made again (a restart)",
            settings.auth_tokens_problem,
        )
    # After the request id and the metrics timer (app.core.logs, app.web.metrics, registered before): a
    # refused request is logged and counted like any other.
    app.before_request(_authenticate)
