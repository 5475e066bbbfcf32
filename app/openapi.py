"""The OpenAPI 3.0 document served at ``/openapi.json``, built from the live settings.

Limits in the schemas (``maxItems``, ``maxLength``) are the configured ones. Problem responses are
generated from the error catalogue (``app.problems``): an operation names the codes it can answer and
gets one response per status, listing those codes (the schema allows exactly them) with their
meanings and ``Retry-After`` where the catalogue says so. ``tests/app/test_openapi.py`` checks that
every route is documented, and that the answers the service really gives (status and code) are the
ones this document declares; schemathesis checks the whole document against the running service
(``tests/app/test_live.py``).
"""

from __future__ import annotations

from typing import Any

from app.problems import CATALOGUE, LOAD_ERROR_CODES, Problem, problem_for
from app.settings import Settings
from nlp.tasks import TASK_NAMES

# Valid texts hold no NUL (JSON strings with lone surrogates are refused too; a pattern cannot say so
# in a way generators understand, so the description does).
TEXT_PATTERN = r"^[^\u0000]*$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problems(*codes: str) -> dict[str, Any]:
    """The problem responses of an operation that answers ``codes``, one per status, generated from
    the catalogue: each lists its codes and their meanings, its schema allows exactly those codes,
    and it declares ``Retry-After`` when a code is answered with one."""
    by_status: dict[int, list[Problem]] = {}
    for code in codes:
        entry = problem_for(code)
        by_status.setdefault(entry.status, []).append(entry)
    responses: dict[str, Any] = {}
    for status, entries in sorted(by_status.items()):
        headers: dict[str, Any] = {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}}
        if any(e.retry_after for e in entries):
            headers["Retry-After"] = {"schema": {"type": "string"}, "description": "seconds"}
        schema = {
            "allOf": [
                _ref("Problem"),
                {"properties": {"code": {"type": "string", "enum": [e.code for e in entries]}}},
            ]
        }
        responses[str(status)] = {
            "description": "; ".join(f"`{e.code}`: {e.meaning}" for e in entries),
            "headers": headers,
            "content": {"application/problem+json": {"schema": schema}},
        }
    return responses


def _ok(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}},
        "content": {"application/json": {"schema": schema}},
    }


# Every operation may meet malformed HTTP or fail unexpectedly; /v1/ ones may want a token.
_ALWAYS = ("bad_request", "internal_error")
# A model still loading, or whose load failed (this worker retries; each load error has its code).
_NOT_READY = ("model_not_ready", *LOAD_ERROR_CODES, "service_unavailable")


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
            "task": {"type": "string", "enum": list(TASK_NAMES)},
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
                "task": {"type": "string", "enum": list(TASK_NAMES)},
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
                "code": {"type": "string", "enum": sorted(CATALOGUE)},
                "detail": {"type": "string"},
                "field": {"type": "string", "description": "the offending field, e.g. texts[3]"},
                "limit": {
                    "type": "integer",
                    "description": "request_too_large: SPO_MAX_REQUEST_TOKENS",
                },
                "tokens": {
                    "type": "integer",
                    "description": "request_too_large: the model tokens the request needs",
                },
                "request_id": {"type": "string"},
            },
        },
    }
    schemas["ModelListing"] = {
        "type": "object",
        "required": ["default", "models"],
        "additionalProperties": False,
        "properties": {
            "default": {"type": "string", "description": "the model /v1/extract runs"},
            "models": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "state", "version", "task", "labels"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "description": "its name in URLs"},
                        "state": {"type": "string", "enum": ["loading", "ready", "failed"]},
                        "version": {"type": "string", "nullable": True},
                        "task": {
                            "type": "string",
                            "enum": list(TASK_NAMES),
                            "nullable": True,
                        },
                        "labels": {
                            "type": "array",
                            "items": {"type": "string"},
                            "nullable": True,
                            "description": "predicates (triples) or entity types (entities); "
                            "null until loaded",
                        },
                    },
                },
            },
        },
    }
    names = [name for name, _ in settings.model_table]
    model_name = {
        "name": "name",
        "in": "path",
        "required": True,
        "description": f"a model of this service (GET /v1/models); the default is {names[0]}",
        "schema": {"type": "string", "enum": names},
    }
    # What the edge may answer on every /v1/ operation before the app sees it: a missing token (the
    # app), and nginx's per-client rate limit (SPO_RATE_LIMIT applies to /v1/ only, deploy/nginx.conf).
    auth = (
        *(("unauthorized",) if settings.auth_enabled else ()),
        *(("rate_limited",) if settings.rate_limit else ()),
    )
    paths: dict[str, Any] = {
        "/v1/extract": {
            "post": {
                "operationId": "extract",
                "summary": "Entities and (subject, predicate, object) triples of one text or many, "
                "by the default model",
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
                    **_problems(
                        "invalid_json",
                        *auth,
                        "body_too_large",
                        "request_too_large",
                        "unsupported_media_type",
                        "invalid_input",
                        "unknown_field",
                        "empty_texts",
                        "too_many_texts",
                        "text_too_long",
                        "deadline_exceeded",
                        *_ALWAYS,
                        *_NOT_READY,
                    ),
                },
            }
        },
        "/v1/model": {
            "get": {
                "operationId": "model",
                "summary": "The served model: task, predicates and their types, buckets, limits",
                "responses": {
                    "200": _ok("The model summary", _ref("ModelSummary")),
                    **_problems(*auth, *_ALWAYS, *_NOT_READY),
                },
            }
        },
        "/v1/models": {
            "get": {
                "operationId": "models",
                "summary": "Every model of the service: name, state, version, task, labels",
                "responses": {
                    "200": _ok("The models, the default first", _ref("ModelListing")),
                    **_problems(*auth, *_ALWAYS),
                },
            }
        },
        "/v1/models/{name}": {
            "get": {
                "operationId": "model_named",
                "summary": "One model: task, predicates or entity types, buckets, limits",
                "parameters": [model_name],
                "responses": {
                    "200": _ok("The model summary", _ref("ModelSummary")),
                    **_problems(*auth, "unknown_model", *_ALWAYS, *_NOT_READY),
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
                    **_problems(*_ALWAYS),
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
                                "models": {
                                    "type": "object",
                                    "description": "every model by name",
                                    "additionalProperties": _ref("ModelBrief"),
                                },
                            },
                        },
                    ),
                    **_problems(*_ALWAYS, *_NOT_READY),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics of every worker (docs/rest.md lists them)",
                "description": "Guarded by its own token (SPO_METRICS_TOKEN) when one is set; "
                "the API tokens never apply.",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format 0.0.4",
                        "headers": {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}},
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_problems(*(("unauthorized",) if settings.metrics_token else ()), *_ALWAYS),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {
                    "200": _ok("OpenAPI 3.0 document", {"type": "object"}),
                    **_problems(*_ALWAYS),
                },
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
    # The named extract is the default one's operation with a model name and its 404.
    named_extract = dict(paths["/v1/extract"]["post"])
    named_responses = dict(named_extract["responses"])
    named_responses.update(_problems("unknown_model"))
    named_extract.update(
        operationId="extract_with",
        summary="Entities and triples of one text or many, by the named model",
        parameters=[model_name],
        responses=named_responses,
    )
    paths["/v1/models/{name}/extract"] = {"post": named_extract}
    if settings.auth_enabled:
        spec["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path in [p for p in paths if p.startswith("/v1/")]:
            for operation in paths[path].values():
                operation["security"] = [{"bearer": []}]
    if settings.metrics_token:
        spec["components"].setdefault("securitySchemes", {})["metrics"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "SPO_METRICS_TOKEN",
        }
        paths["/metrics"]["get"]["security"] = [{"metrics": []}]
    return spec
