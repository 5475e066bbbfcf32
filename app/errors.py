"""The one translator from exceptions to ``application/problem+json`` (RFC 9457) answers.

Every error the service answers goes through ``problem()``: the web layer's own ``ApiError``, the
library's ``SpoError`` (stable codes from ``nlp.errors``), Werkzeug's HTTP errors (404, 405, 413...; never
its HTML page), and anything unexpected, which is logged with its traceback and answered with a generic
500 that names nothing but the request id. A problem body is::

    {"type": "about:blank", "title": "Unprocessable Content", "status": 422,
     "code": "text_too_long", "detail": "texts[1] has 10001 characters; the limit is 10000",
     "field": "texts[1]", "request_id": "..."}

``code`` values are part of the API (listed in ``CODES``, documented in ``/openapi.json``): never rename one.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, g, json
from werkzeug.exceptions import HTTPException

from nlp.errors import InvalidInput, ModelLoadError, SpoError, TextTooLong

logger = logging.getLogger(__name__)

PROBLEM_MIMETYPE = "application/problem+json"

# code -> (status, what it means). The single catalogue of the codes this service answers with.
CODES: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "the body is not a UTF-8 JSON document"),
    "bad_request": (400, "the HTTP request itself is malformed"),
    "unauthorized": (401, "a valid bearer token is required"),
    "not_found": (404, "no such endpoint"),
    "method_not_allowed": (405, "the endpoint does not accept this method (see Allow)"),
    "body_too_large": (413, "the body is over the size limit"),
    "unsupported_media_type": (415, "the body must be sent as application/json (UTF-8)"),
    "invalid_input": (422, "a field has the wrong type or an invalid value"),
    "unknown_field": (422, "the document has a field this endpoint does not know"),
    "empty_texts": (422, "texts is an empty list"),
    "too_many_texts": (422, "texts has more items than the limit"),
    "text_too_long": (422, "a text has more characters than the limit"),
    "internal_error": (500, "unexpected server error; quote the request id"),
    "model_not_ready": (503, "the model is still loading or failed to load; retry later"),
    "service_unavailable": (503, "nginx cannot reach the application server; retry later"),
}
# Werkzeug status -> our code, for errors raised by routing and request parsing.
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """An error of the web layer with a code from ``CODES``."""

    def __init__(
        self,
        code: str,
        detail: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        if code not in CODES:
            raise ValueError(f"unknown problem code {code!r}")
        self.code = code
        self.status = CODES[code][0]
        self.detail = detail
        self.field = field
        self.headers = headers or {}


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """The problem+json response; the only function that builds one."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "code": code,
        "detail": detail,
    }
    if field is not None:
        body["field"] = field
    request_id = g.get("request_id")
    if request_id:
        body["request_id"] = request_id
    response = Response(json.dumps(body), status=status, mimetype=PROBLEM_MIMETYPE)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _api_error(exc: ApiError) -> Response:
    return problem(exc.status, exc.code, exc.detail, field=exc.field, headers=exc.headers)


def _spo_error(exc: SpoError) -> Response:
    if isinstance(exc, TextTooLong):
        return problem(422, "text_too_long", exc.message, field=exc.field)
    if isinstance(exc, InvalidInput):
        return problem(422, "invalid_input", exc.message, field=exc.field)
    if isinstance(exc, ModelLoadError):
        logger.error("model error while serving: %s", exc.message)
        return problem(503, "model_not_ready", "The model is not available; retry later.")
    return _unexpected(exc)


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    if status >= 500:
        return _unexpected(exc)
    code = _HTTP_CODES.get(status, "bad_request" if status == 400 else f"http_{status}")
    headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
    detail = exc.description or HTTPStatus(status).phrase
    if status == 413:
        detail = "The request body is over the size limit."
    return problem(status, code, detail, headers=headers)


def _unexpected(exc: BaseException) -> Response:
    logger.error("unhandled %s while serving a request", type(exc).__name__, exc_info=exc)
    return problem(
        500,
        "internal_error",
        "An unexpected error occurred. Quote the request id when reporting it.",
    )


def init_app(app: Flask) -> None:
    """Route every error of ``app`` through this module."""
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(SpoError, _spo_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)
