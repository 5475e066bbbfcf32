"""The one catalogue of error codes: every code the service, the batch command or nginx answers with.

Each ``Problem`` is a code, its HTTP status, what it means, and where it can appear: ``rest`` (a
problem+json answer, listed in ``/openapi.json`` and ``docs/rest.md``) and ``batch`` (an error record or
the message a failed ``spo extract`` run exits with, listed in ``docs/batch.md``), and whether the answer
carries ``Retry-After``. The REST translator
(``app.web.errors``), the batch error records (``app.batch``), the OpenAPI document (``app.web.openapi``) and the
tests all read this table; adding a code is adding one line to it. Library errors (``nlp.errors``)
carry their own ``code``, which must be catalogued here (a test checks every ``SpoError`` subclass).

Codes are part of the public API: never rename one. No Flask here (the batch workers import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus


@dataclass(frozen=True)
class Problem:
    code: str
    status: int
    meaning: str
    rest: bool = True
    batch: bool = False
    retry_after: bool = False  # answered with a Retry-After header
    # Other statuses it is answered with (``bad_request``: what nginx and gunicorn call malformed).
    also: tuple[int, ...] = ()

    @property
    def statuses(self) -> tuple[int, ...]:
        return (self.status, *self.also)

    @property
    def title(self) -> str:
        """The RFC 9457 ``title``: the status's reason phrase."""
        return HTTPStatus(self.status).phrase


CATALOGUE: dict[str, Problem] = {
    p.code: p
    for p in (
        Problem("invalid_json", 400, "the body (a batch line) is not a UTF-8 JSON document (object)", batch=True),
        Problem("bad_request", 400, "the HTTP request itself is malformed", also=(408, 411, 414, 417, 431, 501, 505)),
        Problem("unauthorized", 401, "a valid bearer token is required"),
        Problem("not_found", 404, "no such endpoint"),
        Problem("unknown_model", 404, "no model of this service has that name (the detail lists them)"),
        Problem("method_not_allowed", 405, "the endpoint does not accept this method (see Allow)"),
        Problem("body_too_large", 413, "the body is over the size limit"),
        Problem("request_too_large", 413, "the texts need more model tokens than SPO_MAX_REQUEST_TOKENS (limit and tokens members)"),
        Problem("unsupported_media_type", 415, "the body must be sent as application/json (UTF-8), not compressed"),
        Problem("invalid_input", 422, "a field has the wrong type or an invalid value (NUL, lone surrogate)", batch=True),
        Problem("unknown_field", 422, "the document has a field this endpoint does not know"),
        Problem("empty_texts", 422, "texts is an empty list"),
        Problem("too_many_texts", 422, "texts has more items than the limit"),
        Problem("text_too_long", 422, "a text has more characters than the limit", batch=True),
        Problem("rate_limited", 429, "too many requests from this client (nginx, SPO_RATE_LIMIT); retry later", retry_after=True),
        Problem("internal_error", 500, "unexpected error; logged with its traceback, nothing internal disclosed", batch=True),
        Problem("model_not_ready", 503, "the model is still loading; retry later", retry_after=True),
        Problem("model_load_error", 503, "the model directory cannot be loaded (REST: this worker retries; the log has the reason)", batch=True, retry_after=True),
        Problem("invalid_manifest", 503, "model.json, or a file it names, is missing or invalid (REST: this worker retries)", batch=True, retry_after=True),
        Problem("unsupported_precision", 503, "the precision cannot run on this CPU or build (REST: this worker retries)", batch=True, retry_after=True),
        Problem("service_unavailable", 503, "nginx cannot reach the application server; retry later", retry_after=True),
        Problem("deadline_exceeded", 504, "the request ran past SPO_REQUEST_TIMEOUT (a record past --record-timeout) and was stopped", batch=True),
    )
}  # fmt: skip

INTERNAL_ERROR = CATALOGUE["internal_error"]
# What a worker whose model failed to load answers with (the codes of ``nlp.errors.ModelLoadError``).
LOAD_ERROR_CODES = ("model_load_error", "invalid_manifest", "unsupported_precision")


def problem_for(code: str) -> Problem:
    """The catalogued problem of ``code``; ``KeyError`` names an uncatalogued one."""
    try:
        return CATALOGUE[code]
    except KeyError:
        raise KeyError(f"error code {code!r} is not in app.core.problems.CATALOGUE") from None


def codes(*, status: int | None = None, batch: bool | None = None) -> list[str]:
    """Catalogued codes, optionally only those of ``status`` or of the batch command."""
    return [
        p.code
        for p in CATALOGUE.values()
        if (status is None or p.status == status) and (batch is None or p.batch == batch)
    ]
