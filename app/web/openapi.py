"""The OpenAPI 3.0 document served at ``/openapi.json``, built from the live settings.

The document is declared as data: the static schemas (``SCHEMAS``), the operations (``OPERATIONS``: path,
method, summary, 200 schema, the problem codes each answers) and small builders that fill in what
depends on the settings (limits, model names, tokens). The schemas of an entity (``Span``), a triple and
a result are derived from their one wire shape in ``nlp.values`` (``shape_schema``), as ``to_dict``
and the Spark columns are. Limits in the schemas (``maxItems``, ``maxLength``) are the configured ones. Problem responses are
generated from the error catalogue (``app.core.problems``): an operation names the codes it can answer and
gets one response per status, listing those codes (the schema allows exactly them) with their
meanings and ``Retry-After`` where the catalogue says so. ``tests/app/test_openapi.py`` checks that
every route is documented, and that the answers the service really gives (status and code) are the
ones this document declares; schemathesis checks the whole document against the running service
(``tests/app/test_live.py``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from app.core.problems import CATALOGUE, LOAD_ERROR_CODES, Problem, problem_for
from app.core.settings import Settings
from app.web.auth import guarded
from nlp.decoding import CARDINALITIES, LINK_RULES
from nlp.tasks import TASK_NAMES
from nlp.values import ENTITY, EXTRACTION, TRIPLE, Member, Shape

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
        for status in entry.statuses:
            by_status.setdefault(status, []).append(entry)
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


# -- schemas derived from the wire shapes (nlp.values) ---------------------------------------------
def member_schema(member: Member) -> dict[str, Any]:
    """The schema of one member of a wire shape: a named shape is referenced, a scalar inlined."""
    kind = member.kind
    schema: dict[str, Any]
    if isinstance(kind, Shape):
        schema = _ref(kind.name)
    else:
        schema = {"type": kind}
        if member.minimum is not None:
            schema["minimum"] = member.minimum
        if member.description:
            schema["description"] = member.description
    return {"type": "array", "items": schema} if member.many else schema


def shape_schema(shape: Shape, description: str | None = None) -> dict[str, Any]:
    """A wire shape as a closed object schema: every member required, no other member allowed."""
    schema: dict[str, Any] = {
        "type": "object",
        "required": [m.name for m in shape.members],
        "additionalProperties": False,
        "properties": {m.name: member_schema(m) for m in shape.members},
    }
    if description:
        schema["description"] = description
    return schema


# -- static schemas ------------------------------------------------------------------------------
_STRING = {"type": "string"}
_TASK = {"type": "string", "enum": list(TASK_NAMES)}

SCHEMAS: dict[str, Any] = {
    "ModelBrief": {
        "type": "object",
        "required": ["name", "version", "task"],
        "properties": {"name": _STRING, "version": _STRING, "task": _TASK},
    },
    "ModelSummary": {
        "type": "object",
        "required": ["name", "version", "task", "max_length", "length_buckets", "batch_buckets"],
        "properties": {
            "name": _STRING,
            "version": _STRING,
            "task": _TASK,
            "max_length": {"type": "integer", "description": "tokens per window"},
            "threshold": {"type": "number"},
            "link_rule": {
                "type": "string",
                "enum": list(LINK_RULES),
                "description": "triples models: how a predicate links a subject and an object",
            },
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
                        "predicate": _STRING,
                        "subject_type": _STRING,
                        "object_type": _STRING,
                        "cardinality": {
                            "type": "string",
                            "enum": list(CARDINALITIES),
                            "description": "links per text: many_to_one (a subject has at most one "
                            "object), one_to_many (an object at most one subject), one_to_one "
                            "(both); absent: many_to_many (no limit)",
                        },
                    },
                },
            },
            "entity_types": {"type": "array", "items": _STRING},
        },
    },
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details; `code` is stable, `detail` is for humans.",
        "required": ["type", "title", "status", "code", "detail"],
        "properties": {
            "type": _STRING,
            "title": _STRING,
            "status": {"type": "integer"},
            "code": {"type": "string", "enum": sorted(CATALOGUE)},
            "detail": _STRING,
            "field": {"type": "string", "description": "the offending field, e.g. texts[3]"},
            "limit": {
                "type": "integer",
                "description": "request_too_large: SPO_MAX_REQUEST_TOKENS",
            },
            "tokens": {
                "type": "integer",
                "description": "request_too_large: the model tokens the request needs",
            },
            "request_id": _STRING,
        },
    },
    "ModelListing": {
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
                        "task": {**_TASK, "nullable": True},
                        "labels": {
                            "type": "array",
                            "items": _STRING,
                            "nullable": True,
                            "description": "predicates (triples) or entity types (entities); "
                            "null until loaded",
                        },
                    },
                },
            },
        },
    },
}


def _schemas(settings: Settings) -> dict[str, Any]:
    """Every component schema: the limits from ``settings``, the values from their wire shapes."""
    text = {
        "type": "string",
        "maxLength": settings.max_text_chars,
        "pattern": TEXT_PATTERN,
        "description": (
            f"Chinese text, at most {settings.max_text_chars} characters (code points); "
            "no NUL and no lone surrogate escapes such as \\ud800."
        ),
    }
    many = {"type": "array", "minItems": 1, "maxItems": settings.max_texts, "items": _ref("Text")}
    response = {
        "type": "object",
        "required": ["model", "results"],
        "additionalProperties": False,
        "properties": {
            "model": _ref("ModelBrief"),
            "results": {
                "type": "array",
                "description": "one per input text, in input order",
                "items": shape_schema(EXTRACTION),
            },
        },
    }
    return {
        "Text": text,
        "ExtractOne": _closed({"text": _ref("Text")}),
        "ExtractMany": _closed({"texts": many}),
        ENTITY.name: shape_schema(ENTITY),
        TRIPLE.name: shape_schema(TRIPLE),
        "ExtractResponse": response,
        **copy.deepcopy(SCHEMAS),
    }


def _closed(properties: dict[str, Any]) -> dict[str, Any]:
    """An object with exactly ``properties``, all required."""
    return {
        "type": "object",
        "required": list(properties),
        "additionalProperties": False,
        "properties": properties,
    }


# -- operations ----------------------------------------------------------------------------------
# Stands, in an operation's codes, for what the edge may answer on every /v1/ operation before the
# app sees it: a missing token (the app, with SPO_AUTH_TOKENS), and nginx's per-client rate limit
# (SPO_RATE_LIMIT applies to /v1/ only, deploy/nginx.conf).
EDGE = "<edge>"
# Every operation may meet malformed HTTP or fail unexpectedly.
_ALWAYS = ("bad_request", "internal_error")
# A model still loading, or whose load failed (this worker retries; each load error has its code).
_NOT_READY = ("model_not_ready", *LOAD_ERROR_CODES, "service_unavailable")
_EXTRACT_CODES = (
    "invalid_json",
    EDGE,
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
)


@dataclass(frozen=True)
class Operation:
    """One operation of the document: ``codes`` are the problem codes it answers (``EDGE`` expands
    to the /v1/ edge's); ``named``: it takes the ``{name}`` of a model."""

    path: str
    method: str
    operation_id: str
    summary: str
    ok: str
    ok_schema: dict[str, Any]
    codes: tuple[str, ...]
    description: str | None = None
    extract: bool = False  # takes the extract request body
    named: bool = False
    ok_media: str = "application/json"


_EXTRACT_SUMMARY = "Entities and (subject, predicate, object) triples of one text or many"
OPERATIONS = (
    Operation(
        "/v1/extract",
        "post",
        "extract",
        f"{_EXTRACT_SUMMARY}, by the default model",
        "One result per text, in input order",
        _ref("ExtractResponse"),
        _EXTRACT_CODES,
        extract=True,
    ),
    Operation(
        "/v1/model",
        "get",
        "model",
        "The served model: task, predicates and their types, buckets, limits",
        "The model summary",
        _ref("ModelSummary"),
        (EDGE, *_ALWAYS, *_NOT_READY),
    ),
    Operation(
        "/v1/models",
        "get",
        "models",
        "Every model of the service: name, state, version, task, labels",
        "The models, the default first",
        _ref("ModelListing"),
        (EDGE, *_ALWAYS),
    ),
    Operation(
        "/v1/models/{name}",
        "get",
        "model_named",
        "One model: task, predicates or entity types, buckets, limits",
        "The model summary",
        _ref("ModelSummary"),
        (EDGE, "unknown_model", *_ALWAYS, *_NOT_READY),
        named=True,
    ),
    Operation(
        "/healthz",
        "get",
        "healthz",
        "Liveness: the process answers",
        "Alive",
        {
            "type": "object",
            "required": ["status"],
            "properties": {"status": {"type": "string", "enum": ["ok"]}},
        },
        _ALWAYS,
    ),
    Operation(
        "/readyz",
        "get",
        "readyz",
        "Readiness: the model is loaded and every bucket shape warmed",
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
        (*_ALWAYS, *_NOT_READY),
    ),
    Operation(
        "/metrics",
        "get",
        "metrics",
        "Prometheus metrics of every worker (docs/rest.md lists them)",
        "Prometheus text exposition format 0.0.4",
        _STRING,
        ("<metrics>", *_ALWAYS),
        description="Guarded by its own token (SPO_METRICS_TOKEN) when one is set; "
        "the API tokens never apply.",
        ok_media="text/plain",
    ),
    Operation(
        "/openapi.json",
        "get",
        "openapi",
        "This document",
        "OpenAPI 3.0 document",
        {"type": "object"},
        _ALWAYS,
    ),
    # The named extract is the default one's operation with a model name and its 404.
    Operation(
        "/v1/models/{name}/extract",
        "post",
        "extract_with",
        "Entities and triples of one text or many, by the named model",
        "One result per text, in input order",
        _ref("ExtractResponse"),
        (*_EXTRACT_CODES, "unknown_model"),
        extract=True,
        named=True,
    ),
)


def _codes(operation: Operation, settings: Settings) -> tuple[str, ...]:
    """``operation``'s problem codes with its placeholders filled in from ``settings``."""
    locked = guarded(operation.path, settings)  # the API's tokens (SPO_PAGES=auth: the docs too)
    expanded = {
        EDGE: (
            *(("unauthorized",) if locked else ()),
            *(("rate_limited",) if settings.rate_limit else ()),
        ),
        "<metrics>": ("unauthorized",) if settings.metrics_token else (),
    }
    codes = tuple(c for code in operation.codes for c in expanded.get(code, (code,)))
    return codes if not locked or "unauthorized" in codes else (*codes, "unauthorized")


def _build_operation(operation: Operation, settings: Settings) -> dict[str, Any]:
    if operation.ok_media == "application/json":
        ok = _ok(operation.ok, copy.deepcopy(operation.ok_schema))
    else:
        ok = {
            "description": operation.ok,
            "headers": {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}},
            "content": {operation.ok_media: {"schema": dict(operation.ok_schema)}},
        }
    built: dict[str, Any] = {"operationId": operation.operation_id, "summary": operation.summary}
    if operation.description:
        built["description"] = operation.description
    if operation.named:
        names = [name for name, _ in settings.model_table]
        built["parameters"] = [
            {
                "name": "name",
                "in": "path",
                "required": True,
                "description": f"a model of this service (GET /v1/models); the default is {names[0]}",
                "schema": {"type": "string", "enum": names},
            }
        ]
    if operation.extract:
        built["requestBody"] = {
            "required": True,
            "description": f"At most {settings.max_body_bytes} bytes of UTF-8 JSON.",
            "content": {
                "application/json": {"schema": {"oneOf": [_ref("ExtractOne"), _ref("ExtractMany")]}}
            },
        }
    built["responses"] = {"200": ok, **_problems(*_codes(operation, settings))}
    if guarded(operation.path, settings):
        built["security"] = [{"bearer": []}]
    if settings.metrics_token and operation.operation_id == "metrics":
        built["security"] = [{"metrics": []}]
    return built


def _security_schemes(settings: Settings) -> dict[str, Any]:
    schemes: dict[str, Any] = {}
    if settings.auth_enabled:
        schemes["bearer"] = {"type": "http", "scheme": "bearer"}
    if settings.metrics_token:
        schemes["metrics"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "SPO_METRICS_TOKEN",
        }
    return schemes


INFO = {
    "title": "spo-service",
    "version": "1",
    "description": (
        "Entities and (subject, predicate, object) triples from Chinese text. Errors are "
        "application/problem+json with a stable `code`. Every answer carries X-Request-ID "
        "(the client's, when it sends a sane one)."
    ),
}


def build_spec(settings: Settings) -> dict[str, Any]:
    """The document for ``settings``: ``OPERATIONS`` and the schemas, built."""
    paths: dict[str, Any] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method] = _build_operation(
            operation, settings
        )
    components: dict[str, Any] = {
        "schemas": _schemas(settings),
        "headers": {
            "X-Request-ID": {
                "description": "the request id (also in problem bodies and logs)",
                "schema": {"type": "string"},
            }
        },
    }
    schemes = _security_schemes(settings)
    if schemes:
        components["securitySchemes"] = schemes
    return {"openapi": "3.0.3", "info": dict(INFO), "paths": paths, "components": components}
