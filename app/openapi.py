"""The OpenAPI 3.0 document served at ``/openapi.json``, built from the live settings.

Limits in the schemas (``maxItems``, ``maxLength``) are the configured ones, and every problem response
the code can give is listed, so schemathesis can check the service against this document (the live tests
do). Codes and their meanings come from ``app.problems``. Keep it in step with ``app.api``.
"""

from __future__ import annotations

from typing import Any

from app.problems import CATALOGUE
from app.settings import Settings

# Valid texts hold no NUL (JSON strings with lone surrogates are refused too; a pattern cannot say so
# in a way generators understand, so the description does).
TEXT_PATTERN = r"^[^\u0000]*$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem(
    description: str, codes: list[str], headers: dict[str, Any] | None = None
) -> dict[str, Any]:
    listed = "; ".join(f"`{c}`: {CATALOGUE[c].meaning}" for c in codes)
    response: dict[str, Any] = {
        "description": f"{description} ({listed})",
        "headers": {
            "X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"},
            **(headers or {}),
        },
        "content": {"application/problem+json": {"schema": _ref("Problem")}},
    }
    return response


def _ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}},
        "content": {"application/json": {"schema": schema}},
    }


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}


def build_spec(settings: Settings) -> dict[str, Any]:
    text = {
        "type": "string",
        "maxLength": settings.max_text_chars,
        "pattern": TEXT_PATTERN,
        "description": (
            f"Chinese text, at most {settings.max_text_chars} characters (code points); "
            "no NUL and no lone surrogate escapes such as \\ud800."
        ),
    }
    span = {
        "type": "object",
        "required": ["text", "start", "end", "type"],
        "additionalProperties": False,
        "properties": {
            "text": {"type": "string", "description": "equals the input's [start:end]"},
            "start": {"type": "integer", "minimum": 0, "description": "character offset"},
            "end": {"type": "integer", "minimum": 1, "description": "exclusive character offset"},
            "type": {"type": "string"},
        },
    }
    brief = {
        "type": "object",
        "required": ["name", "version", "task"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "task": {"type": "string", "enum": ["triples", "entities"]},
        },
    }
    schemas: dict[str, Any] = {
        "Text": text,
        "ExtractOne": {
            "type": "object",
            "required": ["text"],
            "additionalProperties": False,
            "properties": {"text": _ref("Text")},
        },
        "ExtractMany": {
            "type": "object",
            "required": ["texts"],
            "additionalProperties": False,
            "properties": {
                "texts": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": settings.max_texts,
                    "items": _ref("Text"),
                }
            },
        },
        "Span": span,
        "Triple": {
            "type": "object",
            "required": ["subject", "predicate", "object"],
            "additionalProperties": False,
            "properties": {
                "subject": _ref("Span"),
                "predicate": {"type": "string"},
                "object": _ref("Span"),
            },
        },
        "ModelBrief": brief,
        "ExtractResponse": {
            "type": "object",
            "required": ["model", "results"],
            "additionalProperties": False,
            "properties": {
                "model": _ref("ModelBrief"),
                "results": {
                    "type": "array",
                    "description": "one per input text, in input order",
                    "items": {
                        "type": "object",
                        "required": ["entities", "triples"],
                        "additionalProperties": False,
                        "properties": {
                            "entities": {"type": "array", "items": _ref("Span")},
                            "triples": {"type": "array", "items": _ref("Triple")},
                        },
                    },
                },
            },
        },
        "ModelSummary": {
            "type": "object",
            "required": [
                "name",
                "version",
                "task",
                "max_length",
                "length_buckets",
                "batch_buckets",
            ],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "task": {"type": "string", "enum": ["triples", "entities"]},
                "max_length": {"type": "integer", "description": "tokens per window"},
                "threshold": {"type": "number"},
                "length_buckets": {"type": "array", "items": {"type": "integer"}},
                "batch_buckets": {"type": "array", "items": {"type": "integer"}},
                "single_row_length_step": {
                    "type": "integer",
                    "nullable": True,
                    "description": "one-row batches pad to a multiple of this (null: to a length bucket)",
                },
                "predicates": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["predicate", "subject_type", "object_type"],
                        "properties": {
                            "predicate": {"type": "string"},
                            "subject_type": {"type": "string"},
                            "object_type": {"type": "string"},
                        },
                    },
                },
                "entity_types": {"type": "array", "items": {"type": "string"}},
            },
        },
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details; `code` is stable, `detail` is for humans.",
            "required": ["type", "title", "status", "code", "detail"],
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "code": {"type": "string", "description": ", ".join(sorted(CATALOGUE))},
                "detail": {"type": "string"},
                "field": {"type": "string", "description": "the offending field, e.g. texts[3]"},
                "request_id": {"type": "string"},
            },
        },
    }
    auth = (
        {"401": _problem("Missing or wrong bearer token", ["unauthorized"])}
        if settings.auth_enabled
        else {}
    )
    not_ready = _problem(
        "The model is not loaded yet", ["model_not_ready", "service_unavailable"], _RETRY_AFTER
    )
    server_error = _problem("Unexpected error; nothing internal is disclosed", ["internal_error"])
    paths: dict[str, Any] = {
        "/v1/extract": {
            "post": {
                "operationId": "extract",
                "summary": "Entities and (subject, predicate, object) triples of one text or many",
                "requestBody": {
                    "required": True,
                    "description": f"At most {settings.max_body_bytes} bytes of UTF-8 JSON.",
                    "content": {
                        "application/json": {
                            "schema": {"oneOf": [_ref("ExtractOne"), _ref("ExtractMany")]}
                        }
                    },
                },
                "responses": {
                    "200": _ok("One result per text, in input order", _ref("ExtractResponse")),
                    "400": _problem("The body is not JSON", ["invalid_json"]),
                    **auth,
                    "413": _problem("The body is too large", ["body_too_large"]),
                    "415": _problem("Wrong content type", ["unsupported_media_type"]),
                    "422": _problem(
                        "The document is not a valid request",
                        [
                            "invalid_input",
                            "unknown_field",
                            "empty_texts",
                            "too_many_texts",
                            "text_too_long",
                        ],
                    ),
                    "500": server_error,
                    "503": not_ready,
                },
            }
        },
        "/v1/model": {
            "get": {
                "operationId": "model",
                "summary": "The served model: task, predicates and their types, buckets, limits",
                "responses": {
                    "200": _ok("The model summary", _ref("ModelSummary")),
                    **auth,
                    "500": server_error,
                    "503": not_ready,
                },
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: the process answers",
                "responses": {
                    "200": _ok(
                        "Alive",
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {"status": {"type": "string", "enum": ["ok"]}},
                        },
                    ),
                    "500": server_error,
                },
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: the model is loaded and every bucket shape warmed",
                "responses": {
                    "200": _ok(
                        "Ready",
                        {
                            "type": "object",
                            "required": ["status", "model"],
                            "properties": {
                                "status": {"type": "string", "enum": ["ready"]},
                                "model": _ref("ModelBrief"),
                            },
                        },
                    ),
                    "500": server_error,
                    "503": not_ready,
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {"200": _ok("OpenAPI 3.0 document", {"type": "object"})},
            }
        },
    }
    spec: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "spo-service",
            "version": "1",
            "description": (
                "Entities and (subject, predicate, object) triples from Chinese text. Errors are "
                "application/problem+json with a stable `code`. Every answer carries X-Request-ID "
                "(the client's, when it sends a sane one)."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "headers": {
                "X-Request-ID": {
                    "description": "the request id (also in problem bodies and logs)",
                    "schema": {"type": "string"},
                }
            },
        },
    }
    if settings.auth_enabled:
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path in ("/v1/extract", "/v1/model"):
            for operation in paths[path].values():
                operation["security"] = [{"bearer": []}]
    return spec
