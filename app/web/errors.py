"""The one translator from exceptions to ``application/problem+json`` (RFC 9457) answers.

Every error the service answers goes through ``problem()``: the web layer's own ``ApiError``, the
library's ``SpoError`` (stable codes from ``nlp.errors``), Werkzeug's HTTP errors (404, 405, 413...; never
its HTML page), and anything unexpected, which is logged with its traceback and answered with a generic
500 that names nothing but the request id. A problem body is::

    {"type": "about:blank", "title": "Unprocessable Content", "status": 422,
     "code": "text_too_long", "detail": "texts[1] has 10001 characters; the limit is 10000",
     "field": "texts[1]", "request_id": "..."}

Status, title and meaning of each ``code`` come from the one catalogue, ``app.core.problems.CATALOGUE``: a
library error is answered by its own ``code`` (a subclass whose code is not catalogued answers with the
status of its nearest catalogued ancestor). A 5xx answer never shows the exception's message, only the
code's meaning; the message is logged. ``request_too_large`` adds the extension members ``limit`` and
``tokens`` (RFC 9457 section 3.2).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, g, json
from werkzeug.exceptions import HTTPException

from app.core.problems import CATALOGUE, INTERNAL_ERROR, Problem, problem_for
from nlp.errors import RequestTooLarge, SpoError

logger = logging.getLogger(__name__)

PROBLEM_MIMETYPE = "application/problem+json"
# Werkzeug status -> our code, for errors raised by routing and request parsing (other 4xx: bad_request,
# as nginx answers them).
_HTTP_CODES = {
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """An error of the web layer with a code from ``app.core.problems.CATALOGUE``."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.problem = problem_for(code)
        if status is not None and status not in self.problem.statuses:
            raise ValueError(f"{code} is not answered with {status} (app.core.problems)")
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field
        self.headers = headers or {}
        self.extra = extra or {}


def problem(
    entry: Problem,
    detail: str,
    *,
    code: str | None = None,
    status: int | None = None,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Response:
    """The problem+json response for catalogue ``entry``; the only function that builds one.

    ``code`` overrides the entry's code (a library error whose own code is not catalogued), ``status``
    its status (an HTTP error of a status with no code of its own, answered as ``bad_request``);
    ``extra``: extension members (``limit`` and ``tokens`` of ``request_too_large``)."""
    status = status or entry.status
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "code": code or entry.code,
        "detail": detail,
    }
    if field is not None:
        body["field"] = field
    for key, value in (extra or {}).items():
        body.setdefault(key, value)
    request_id = g.get("request_id")
    if request_id:
        body["request_id"] = request_id
    response = Response(json.dumps(body), status=status, mimetype=PROBLEM_MIMETYPE)
    g.spo_problem_code = body[
        "code"
    ]  # for the metrics (app.web.metrics), which never re-parse the body
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def catalogued(exc: SpoError) -> Problem | None:
    """The catalogue entry of ``exc``'s own code, else of its nearest catalogued ancestor's."""
    for cls in type(exc).__mro__:
        entry = CATALOGUE.get(getattr(cls, "code", ""))
        if entry is not None:
            return entry
    return None


def _api_error(exc: ApiError) -> Response:
    return problem(
        exc.problem,
        exc.detail,
        status=exc.status,
        field=exc.field,
        headers=exc.headers,
        extra=exc.extra,
    )


def _spo_error(exc: SpoError) -> Response:
    entry = catalogued(exc)
    if entry is None:
        logger.error("error code %r is not catalogued (app.core.problems)", exc.code)
        return _unexpected(exc)
    if isinstance(exc, RequestTooLarge):
        return problem(
            entry,
            f"{exc.message[:1].upper()}{exc.message[1:]} (SPO_MAX_REQUEST_TOKENS). "
            "Send fewer or shorter texts per request.",
            extra={"limit": exc.limit, "tokens": exc.tokens},
        )
    if entry.status >= 500:
        # A deadline is the service working as configured (a warning); the rest are faults.
        log = logger.warning if entry.status == 504 else logger.error
        log("%s while serving a request: %s", exc.code, exc.message)
        return problem(
            entry, _SERVER_DETAILS.get(entry.code) or _sentence(entry.meaning), code=exc.code
        )
    return problem(entry, exc.message, code=exc.code, field=exc.field)


# Where the catalogue's meaning speaks of the batch command too, what a REST client is told instead.
_SERVER_DETAILS = {
    "deadline_exceeded": "The request ran past SPO_REQUEST_TIMEOUT and was stopped; "
    "send fewer or shorter texts per request.",
}


def _sentence(meaning: str) -> str:
    return f"{meaning[:1].upper()}{meaning[1:]}."


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    if status >= 500:
        return _unexpected(exc)
    entry = CATALOGUE[_HTTP_CODES.get(status, "bad_request")]
    headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
    detail = exc.description or HTTPStatus(status).phrase
    if status == 413:
        detail = "The request body is over the size limit."
    return problem(entry, detail, status=status, headers=headers)


def _unexpected(exc: BaseException) -> Response:
    logger.error("unhandled %s while serving a request", type(exc).__name__, exc_info=exc)
    return problem(
        INTERNAL_ERROR, "An unexpected error occurred. Quote the request id when reporting it."
    )


def init_app(app: Flask) -> None:
    """Route every error of ``app`` through this module."""
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(SpoError, _spo_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
