"""HTTP endpoints: ``/v1/extract``, ``/v1/model``, ``/v1/models``, ``/v1/models/<name>``,
``/v1/models/<name>/extract``, ``/healthz``, ``/readyz``, ``/openapi.json``.

``/v1/extract`` and ``/v1/model`` are the default model's (the first of ``SPO_MODELS``); the
``/v1/models/<name>`` routes address one model by name (``app.web.registry``), and an unknown name is a
404 ``unknown_model`` that lists the known ones.

The request document is validated here, strictly and completely, before the model sees it: wrong content
type, undecodable or invalid JSON, unknown fields, wrong types, empty or too many texts each get their own
problem code (see ``app.core.problems``). Then the request becomes one plan (``ModelSlot.plan``, the model's
``Extractor.plan``): each text is checked once by ``nlp.validation.check_text``, the same check the batch
command and the library make (type, length, NUL, lone surrogates), tokenized once, and counted against
``SPO_MAX_REQUEST_TOKENS``; that plan is what the micro-batcher merges and the model runs. The results
stay ``Extraction`` values until the response is written.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.exceptions import HTTPException, NotFound, RequestEntityTooLarge

from app.core.problems import LOAD_ERROR_CODES
from app.core.settings import Settings
from app.web.errors import ApiError
from app.web.microbatch import BatcherClosed, MicroBatcher
from app.web.model_slot import ModelNotReady, ModelSlot
from app.web.openapi import build_spec
from app.web.registry import ModelRegistry, ServedModel
from nlp.validation import check_text
from nlp.values import Extraction

bp = Blueprint("api", __name__)

RETRY_AFTER_S = "5"
_JSON_MIMETYPE = "application/json"
_FIELDS = ("text", "texts")
_SHOWN_CHARS = 64  # of a client's name (a field, a model, a duplicate key) quoted in an answer


def _shown(name: str) -> str:
    """A name the client sent, as an answer quotes it: at most ``_SHOWN_CHARS`` characters (then
    ``...``), a lone surrogate (from a JSON escape such as ``\\ud800``) as that escape, since it
    cannot be encoded (tests/app/test_api.py)."""
    cut = name[:_SHOWN_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
    return cut + "..." if len(name) > _SHOWN_CHARS else cut


def settings() -> Settings:
    value: Settings = current_app.extensions["spo.settings"]
    return value


def slot() -> ModelSlot:
    value: ModelSlot = current_app.extensions["spo"]
    return value


def registry() -> ModelRegistry:
    value: ModelRegistry = current_app.extensions["spo.models"]
    return value


def served(name: str | None = None) -> ServedModel:
    """The model called ``name`` (the default one for ``None``); 404 ``unknown_model`` otherwise."""
    models = registry()
    if name is None:
        return models.default
    model = models.get(name)
    if model is None:
        raise ApiError(
            "unknown_model",
            f"No model is called '{_shown(name)}'; this service has: {', '.join(models.names)}.",
        )
    return model


def _not_ready(model: ServedModel) -> ApiError:
    """503 while loading (``model_not_ready``) or after a failed load (the load error's own code)."""
    what = "The model" if len(registry()) == 1 else f"Model {model.name!r}"
    code = model.slot.error_code
    if code is None:
        return ApiError(
            "model_not_ready", f"{what} is still loading.", headers={"Retry-After": RETRY_AFTER_S}
        )
    return ApiError(
        code if code in LOAD_ERROR_CODES else "model_load_error",
        f"{what} failed to load ({code}); this worker retries in the background. "
        "The server log has the reason.",
        headers={"Retry-After": RETRY_AFTER_S},
    )


def _model_brief(model: ServedModel) -> dict[str, str]:
    extractor = model.slot.extractor
    if extractor is None:
        raise _not_ready(model)
    summary = extractor.manifest.summary()
    return {"name": summary["name"], "version": summary["version"], "task": summary["task"]}


# -- request document ----------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"duplicate key '{_shown(key)}'")
        doc[key] = value
    return doc


def read_json_body() -> Any:
    """The request body as JSON: ``application/json``, UTF-8, uncompressed, no NaN/Infinity, no
    duplicate keys."""
    if request.mimetype != _JSON_MIMETYPE:
        got = request.mimetype or "no Content-Type"
        raise ApiError("unsupported_media_type", f"Send the body as application/json, not {got}.")
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError("unsupported_media_type", f"The body must be UTF-8, not {charset}.")
    # A compressed body would otherwise be read as it is, and fail as invalid UTF-8 (or, worse, not).
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(
            "unsupported_media_type",
            f"The body must not be compressed (Content-Encoding: {encoding}).",
            headers={"Accept-Encoding": "identity"},  # RFC 9110 section 12.5.3
        )
    # gunicorn alone reads a body of any transfer coding as chunked; nginx answers 501 for one it does
    # not implement (deploy/nginx.conf): the same here, rather than a body read as it is not.
    coding = request.headers.get("Transfer-Encoding")
    if coding is not None and [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
        raise ApiError(
            "bad_request",
            "The request uses a transfer coding this server does not implement: send "
            "Content-Length or Transfer-Encoding: chunked.",
            status=501,
        )
    # Werkzeug answers 413 itself when Content-Length is over MAX_CONTENT_LENGTH (the limit + 1), but
    # silently truncates a chunked body at it: reading one byte more than allowed tells them apart.
    try:
        raw = request.get_data(cache=False)
    except HTTPException:
        raise  # werkzeug's own answers (413 over MAX_CONTENT_LENGTH, a client gone: 400)
    except Exception:  # the server's reader: broken chunked framing, a body that ended early
        raise ApiError(
            "bad_request",
            "The request body cannot be read: its chunked framing is broken or it ended early.",
        ) from None
    if len(raw) > settings().max_body_bytes:
        raise RequestEntityTooLarge()
    # gunicorn ends the stream where the connection does (wsgi.input_terminated), not with an error:
    # a client that sent less than its Content-Length said would have the prefix taken for the body.
    announced = request.content_length
    if announced is not None and coding is None and len(raw) < announced:
        raise ApiError(
            "bad_request",
            f"The request body ended after {len(raw)} of the {announced} bytes its Content-Length "
            "announced.",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError("invalid_json", f"The body is not valid UTF-8 (byte {exc.start}).") from None
    if text.startswith("\ufeff"):  # RFC 8259 section 8.1: a sender must not add one
        raise ApiError(
            "invalid_json",
            "The body starts with a byte order mark (U+FEFF): send JSON without one.",
        )
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ApiError("invalid_json", f"The body is not valid JSON: {exc}.") from None
    except RecursionError:
        raise ApiError(
            "invalid_json", "The body is not acceptable JSON: it nests too deeply."
        ) from None
    except ValueError as exc:  # NaN/Infinity, duplicate keys, an integer over Python's digit limit
        reason = str(exc)
        if "integer string conversion" in reason:
            reason = f"an integer has more than {sys.get_int_max_str_digits()} digits"
        raise ApiError("invalid_json", f"The body is not acceptable JSON: {reason}.") from None


def parse_extract_request(doc: Any, limits: Settings) -> tuple[list[object], str]:
    """The texts of an extract request and the field they came from (``text`` or ``texts``); the
    texts themselves are checked once, by the plan (``_extract``)."""
    if not isinstance(doc, dict):
        raise ApiError(
            "invalid_input", 'The body must be a JSON object: {"text": ...} or {"texts": [...]}.'
        )
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise ApiError(
            "unknown_field",
            f"Unknown field '{_shown(unknown[0])}'; expected exactly one of 'text', 'texts'.",
            field=_shown(unknown[0]),
        )
    if ("text" in doc) == ("texts" in doc):
        raise ApiError(
            "invalid_input", "Send exactly one of 'text' (a string) or 'texts' (a list of strings)."
        )
    if "text" in doc:
        return [doc["text"]], "text"
    texts = doc["texts"]
    if not isinstance(texts, list):
        raise ApiError("invalid_input", "texts must be a list of strings.", field="texts")
    if not texts:
        raise ApiError("empty_texts", "texts must hold at least one text.", field="texts")
    if len(texts) > limits.max_texts:
        raise ApiError(
            "too_many_texts",
            f"texts has {len(texts)} items; the limit is {limits.max_texts}.",
            field="texts",
        )
    return list(texts), "texts"


def _plan(model: ServedModel, texts: Sequence[object], field: str) -> Any:
    """The request's one plan (``nlp.pipeline.Plan``): each text checked and tokenized once, 413
    over ``SPO_MAX_REQUEST_TOKENS``, all before any model call. While the model is not ready there
    is no tokenizer to plan with: the texts are only checked, so bad input is still answered as such."""
    limits = settings()
    try:
        return model.slot.plan(
            texts,
            field,
            max_tokens=limits.max_request_tokens or None,
            max_text_chars=limits.max_text_chars,
        )
    except ModelNotReady:
        for i, text in enumerate(texts):
            check_text(text, limits.max_text_chars, f"texts[{i}]" if field == "texts" else field)
        raise _not_ready(model) from None


def _run(model: ServedModel, plan: Any, deadline: float | None) -> list[Extraction]:
    """``plan`` run on ``model``, through its micro-batcher when it has one, by ``deadline``
    (``time.monotonic``; 504 ``deadline_exceeded`` past it)."""
    combiner: MicroBatcher[Any] | None = model.batcher
    try:
        if combiner is None:
            return model.slot.run(plan, deadline)
        return combiner.submit(plan, deadline=deadline)
    except ModelNotReady:
        raise _not_ready(model) from None
    except BatcherClosed:
        raise ApiError(
            "model_not_ready",
            "This worker is shutting down; retry.",
            headers={"Retry-After": RETRY_AFTER_S},
        ) from None


REQUEST_START_HEADER = "X-Request-Start"  # set by deploy/nginx.conf: t=<nginx's $msec>


def queued_seconds(header: str | None, now: float) -> float:
    """How long a request waited before the app started on it, from nginx's ``X-Request-Start``
    (``t=SECONDS.MILLIS``, the wall clock when nginx passed it on) and ``now`` (``time.time()``);
    0 without one, for a malformed one, or for one in the future: the header can only shorten a
    request's deadline, never lengthen it, so a client that sends its own cannot gain time.

    >>> queued_seconds("t=1000.250", 1012.5), queued_seconds("t=2000.0", 1012.5)
    (12.25, 0.0)
    >>> [queued_seconds(h, 5.0) for h in (None, "soon", "t=nan", "t=-9", "t=²", "t=" + "9" * 400)]
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    try:
        started = float((header or "").strip().removeprefix("t="))
    except ValueError:
        return 0.0
    return max(0.0, now - started) if math.isfinite(started) and started > 0 else 0.0


# -- endpoints -----------------------------------------------------------------------------------
def _extract_response(model: ServedModel) -> Response:
    # SPO_REQUEST_TIMEOUT counts from here, or from when nginx passed the request on (its time in
    # gunicorn's queue, waiting for a thread, counts too: one that waited past its deadline is
    # answered 504 at once, so a queue behind an overloaded worker drains instead of running stale
    # work). Reading, checking and tokenizing the texts are part of the request's time (past the
    # deadline, the run stops before its first model call).
    limits = settings()
    deadline = None
    if limits.request_timeout:
        waited = queued_seconds(request.headers.get(REQUEST_START_HEADER), time.time())
        deadline = time.monotonic() + limits.request_timeout - waited
    texts, field = parse_extract_request(read_json_body(), limits)
    g.spo_texts = len(texts)  # for the metrics and the access log (app.web.metrics)
    plan = _plan(model, texts, field)
    brief = _model_brief(model)
    if settings().log_input_text:
        g.spo_input = texts  # checked by the plan
    results = _run(model, plan, deadline)
    return jsonify({"model": brief, "results": [r.to_dict() for r in results]})


def _summary(model: ServedModel) -> Response:
    extractor = model.slot.extractor
    if extractor is None:
        raise _not_ready(model)
    return jsonify(extractor.manifest.summary())


@bp.post("/v1/extract")
def extract() -> Response:
    """The default model's extraction."""
    return _extract_response(served())


@bp.post("/v1/models/<name>/extract")
def extract_with(name: str) -> Response:
    model = served(name)
    return _extract_response(model)


@bp.get("/v1/model")
def model() -> Response:
    return _summary(served())


@bp.get("/v1/models")
def models() -> Response:
    """Every model with its state; version, task and labels once it is loaded."""
    listed = registry()
    return jsonify({"default": listed.default.name, "models": [m.brief() for m in listed]})


@bp.get("/v1/models/<name>")
def model_named(name: str) -> Response:
    return _summary(served(name))


@bp.get("/healthz")
def healthz() -> Response:
    """Liveness: the process answers. Says nothing about the model (that is ``/readyz``)."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """Readiness: 200 once every model is loaded and every bucket shape warmed, 503 before."""
    listed = registry()
    for model in listed:
        if not model.slot.ready:
            raise _not_ready(model)
    return jsonify(
        {
            "status": "ready",
            "model": _model_brief(listed.default),
            "models": {m.name: _model_brief(m) for m in listed},
        }
    )


@bp.get("/openapi.json")
def openapi() -> Response:
    if settings().pages == "off":
        raise NotFound()  # as any unknown path (SPO_PAGES=off)
    return jsonify(build_spec(settings()))
