"""HTTP endpoints: ``/v1/extract``, ``/v1/model``, ``/healthz``, ``/readyz``, ``/openapi.json``.

The request document is validated here, strictly and completely, before the model sees it: wrong content
type, undecodable or invalid JSON, unknown fields, wrong types, empty or too many texts each get their own
problem code (see ``app.problems``); each text goes through ``nlp.validation.check_text``, the same
check the batch command and the library make (type, length, NUL, lone surrogates).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from app.errors import ApiError
from app.microbatch import BatcherClosed, MicroBatcher
from app.model_slot import ModelNotReady, ModelSlot
from app.openapi import build_spec
from app.problems import LOAD_ERROR_CODES
from app.settings import Settings
from nlp.types import Extraction
from nlp.validation import check_text

bp = Blueprint("api", __name__)

RETRY_AFTER_S = "5"
_JSON_MIMETYPE = "application/json"
_FIELDS = ("text", "texts")


def settings() -> Settings:
    value: Settings = current_app.extensions["spo.settings"]
    return value


def slot() -> ModelSlot:
    value: ModelSlot = current_app.extensions["spo"]
    return value


def _not_ready() -> ApiError:
    """503 while loading (``model_not_ready``) or after a failed load (the load error's own code)."""
    model = slot()
    code = model.error_code
    if code is None:
        return ApiError(
            "model_not_ready", "The model is still loading.", headers={"Retry-After": RETRY_AFTER_S}
        )
    return ApiError(
        code if code in LOAD_ERROR_CODES else "model_load_error",
        f"The model failed to load ({code}); this worker retries in the background. "
        "The server log has the reason.",
        headers={"Retry-After": RETRY_AFTER_S},
    )


def _model_brief() -> dict[str, str]:
    extractor = slot().extractor
    if extractor is None:
        raise _not_ready()
    summary = extractor.manifest.summary()
    return {"name": summary["name"], "version": summary["version"], "task": summary["task"]}


@bp.before_request
def _authenticate() -> None:
    tokens = settings().auth_tokens
    if not tokens or not request.path.startswith("/v1/"):
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    given = given.strip()
    ok = scheme.lower() == "bearer" and any(
        hmac.compare_digest(given.encode(), t.encode()) for t in tokens
    )
    if not ok:
        raise ApiError(
            "unauthorized",
            "A valid bearer token is required (Authorization: Bearer <token>).",
            headers={"WWW-Authenticate": 'Bearer realm="spo"'},
        )


# -- request document ----------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"duplicate key {key!r}")
        doc[key] = value
    return doc


def read_json_body() -> Any:
    """The request body as JSON: ``application/json``, UTF-8, no NaN/Infinity, no duplicate keys."""
    if request.mimetype != _JSON_MIMETYPE:
        got = request.mimetype or "no Content-Type"
        raise ApiError("unsupported_media_type", f"Send the body as application/json, not {got}.")
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise ApiError("unsupported_media_type", f"The body must be UTF-8, not {charset}.")
    # Werkzeug answers 413 itself when Content-Length is over MAX_CONTENT_LENGTH (the limit + 1), but
    # silently truncates a chunked body at it: reading one byte more than allowed tells them apart.
    raw = request.get_data(cache=False)
    if len(raw) > settings().max_body_bytes:
        raise RequestEntityTooLarge()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError("invalid_json", f"The body is not valid UTF-8 (byte {exc.start}).") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ApiError("invalid_json", f"The body is not valid JSON: {exc}.") from None
    except (ValueError, RecursionError) as exc:
        # NaN/Infinity, duplicate keys, integers over Python's digit limit, absurd nesting.
        raise ApiError("invalid_json", f"The body is not acceptable JSON: {exc}.") from None


def parse_extract_request(doc: Any, limits: Settings) -> tuple[list[str], str]:
    """The texts of an extract request and the field they came from (``text`` or ``texts``)."""
    if not isinstance(doc, dict):
        raise ApiError(
            "invalid_input", 'The body must be a JSON object: {"text": ...} or {"texts": [...]}.'
        )
    unknown = sorted(set(doc) - set(_FIELDS))
    if unknown:
        raise ApiError(
            "unknown_field",
            f"Unknown field {unknown[0]!r}; expected exactly one of 'text', 'texts'.",
            field=unknown[0],
        )
    if ("text" in doc) == ("texts" in doc):
        raise ApiError(
            "invalid_input", "Send exactly one of 'text' (a string) or 'texts' (a list of strings)."
        )
    if "text" in doc:
        return [check_text(doc["text"], limits.max_text_chars, "text")], "text"
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
    return [
        check_text(t, limits.max_text_chars, f"texts[{i}]") for i, t in enumerate(texts)
    ], "texts"


def batcher() -> MicroBatcher | None:
    """The worker's micro-batcher; ``None`` when micro-batching is off (the default)."""
    value: MicroBatcher | None = current_app.extensions.get("spo.microbatch")
    return value


def _extract(texts: Sequence[str], field: str) -> list[Extraction]:
    model = slot()
    extractor = model.extractor
    if extractor is None:
        raise _not_ready()
    combiner = batcher()
    if combiner is None:
        with model.lock:
            return extractor.extract_batch(texts, field=field)
    try:
        return combiner.submit(texts, field)
    except ModelNotReady:
        raise _not_ready() from None
    except BatcherClosed:
        raise ApiError(
            "model_not_ready",
            "This worker is shutting down; retry.",
            headers={"Retry-After": RETRY_AFTER_S},
        ) from None


# -- endpoints -----------------------------------------------------------------------------------
@bp.post("/v1/extract")
def extract() -> Response:
    texts, field = parse_extract_request(read_json_body(), settings())
    g.spo_texts = len(texts)  # for the metrics and the access log (app.metrics)
    if settings().log_input_text:
        g.spo_input = texts
    brief = _model_brief()
    results = _extract(texts, field)
    return jsonify({"model": brief, "results": [r.to_dict() for r in results]})


@bp.get("/v1/model")
def model() -> Response:
    extractor = slot().extractor
    if extractor is None:
        raise _not_ready()
    return jsonify(extractor.manifest.summary())


@bp.get("/healthz")
def healthz() -> Response:
    """Liveness: the process answers. Says nothing about the model (that is ``/readyz``)."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    """Readiness: 200 once the model is loaded and every bucket shape warmed, 503 before."""
    brief = _model_brief()
    return jsonify({"status": "ready", "model": brief})


@bp.get("/openapi.json")
def openapi() -> Response:
    return jsonify(build_spec(settings()))
