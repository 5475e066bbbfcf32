"""``/openapi.json`` cannot drift: every route is in it, and every answer the service gives (status,
problem code) is one the document declares for that operation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.problems import CATALOGUE
from tests.app.test_api import BAD_DOCUMENTS

IGNORED_METHODS = {"HEAD", "OPTIONS"}


def _spec(client: FlaskClient) -> dict[str, Any]:
    spec: dict[str, Any] = client.get("/openapi.json").get_json()
    return spec


def test_openapi_documents_every_route_and_only_those(app: Flask, client: FlaskClient) -> None:
    routes = {
        (re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        # The demo page and Swagger UI are pages for browsers, not API operations.
        if rule.endpoint != "static" and not rule.endpoint.startswith(("web.", "swagger_ui."))
        for method in rule.methods or ()
        if method not in IGNORED_METHODS
    }
    documented = {(path, method) for path, ops in _spec(client)["paths"].items() for method in ops}
    assert routes == documented


def test_openapi_problem_responses_come_from_the_catalogue(client: FlaskClient) -> None:
    spec = _spec(client)
    assert spec["components"]["schemas"]["Problem"]["properties"]["code"]["enum"] == sorted(
        CATALOGUE
    )
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith("2"):
                    continue
                codes = response["content"]["application/problem+json"]["schema"]["allOf"][1]
                for code in codes["properties"]["code"]["enum"]:
                    entry = CATALOGUE[code]
                    assert str(entry.status) == status, f"{method} {path}: {code}"
                    assert f"`{code}`: {entry.meaning}" in response["description"]
                    assert ("Retry-After" in response["headers"]) >= entry.retry_after


def _declared(spec: dict[str, Any], path: str, method: str, status: int) -> list[str] | None:
    """The codes the document allows for this answer (``None``: the status is not declared)."""
    response = spec["paths"][path][method]["responses"].get(str(status))
    if response is None:
        return None
    if status < 300:
        return []
    return list(
        response["content"]["application/problem+json"]["schema"]["allOf"][1]["properties"]["code"][
            "enum"
        ]
    )


@pytest.mark.parametrize(("body", "code", "status", "field"), BAD_DOCUMENTS)
def test_openapi_declares_every_extract_problem_answered(
    fake_client: FlaskClient, body: bytes, code: str, status: int, field: str | None
) -> None:
    response = fake_client.post("/v1/extract", data=body, content_type="application/json")
    assert response.status_code == status
    assert code in (_declared(_spec(fake_client), "/v1/extract", "post", status) or [])


def test_openapi_declares_the_other_answers(make_fake_app: Any, fake_extractor: Any) -> None:
    client = make_fake_app().test_client()
    spec = _spec(client)
    for path, method, kwargs in [
        ("/v1/extract", "post", {"data": b"{}", "content_type": "text/plain"}),
        ("/v1/extract", "post", {"data": b"{nope", "content_type": "application/json"}),
        ("/v1/extract", "post", {"json": {"text": "北京"}}),
        ("/v1/model", "get", {}),
        ("/healthz", "get", {}),
        ("/readyz", "get", {}),
        ("/openapi.json", "get", {}),
    ]:
        response = getattr(client, method)(path, **kwargs)
        declared = _declared(spec, path, method, response.status_code)
        assert declared is not None, f"{method} {path} answered {response.status_code}"
        if response.status_code >= 400:
            assert response.get_json()["code"] in declared
    fake_extractor.fail = RuntimeError("boom")
    response = client.post("/v1/extract", json={"text": "北京"})
    assert response.get_json()["code"] in (_declared(spec, "/v1/extract", "post", 500) or [])
    authed = make_fake_app(auth_tokens=("a-token-of-16-chars-or-more",)).test_client()
    response = authed.get("/v1/model")
    assert response.get_json()["code"] in (_declared(_spec(authed), "/v1/model", "get", 401) or [])
