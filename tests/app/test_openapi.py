"""``/openapi.json`` cannot drift: every route is in it, and every answer the service gives (status,
problem code) is one the document declares for that operation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.core.problems import CATALOGUE, LOAD_ERROR_CODES
from app.core.settings import Settings
from nlp.errors import ManifestError, ModelLoadError, UnsupportedPrecision
from tests import PROJECT_ROOT
from tests.app.test_api import BAD_DOCUMENTS, wait_for

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
                    assert int(status) in entry.statuses, f"{method} {path}: {code}"
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


def test_openapi_under_pages_auth_declares_the_token_on_every_guarded_operation(
    make_fake_app: Any,
) -> None:
    """SPO_PAGES=auth puts /openapi.json behind the tokens; its own operation said no security and
    no 401, while /healthz and /readyz stay open."""
    token = "a-token-of-16-chars-or-more"
    client = make_fake_app(auth_tokens=(token,), pages="auth").test_client()
    assert client.get("/openapi.json").status_code == 401
    spec = client.get("/openapi.json", headers={"Authorization": f"Bearer {token}"}).get_json()
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            answer = getattr(client, method)(path.replace("{name}", "nope"))
            if answer.status_code == 401:
                assert operation.get("security") == [{"bearer": []}], (method, path)
                assert "401" in operation["responses"], (method, path)
            elif path in ("/healthz", "/readyz"):
                assert "security" not in operation and "401" not in operation["responses"]


@pytest.mark.parametrize("code", LOAD_ERROR_CODES)
def test_openapi_declares_the_load_errors_of_every_model_route(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """Issue 20: a worker whose model failed to load answers 503 with the load error's own code on
    every route that needs the model; the document declared only ``model_not_ready``."""
    monkeypatch.setattr("app.web.model_slot.FIRST_RETRY_S", 60.0)
    error = {c.code: c for c in (ModelLoadError, ManifestError, UnsupportedPrecision)}[code]

    def broken(options: Any) -> Any:
        raise error("/srv/x: cannot load")

    app = create_app(settings.replace(load_mode="background"), loader=broken)
    slot = app.extensions["spo"]
    client = app.test_client()
    try:
        wait_for(lambda: slot.error_code == code)
        spec = _spec(client)
        name = settings.default_model
        for path, method, request_path, kwargs in [
            ("/readyz", "get", "/readyz", {}),
            ("/v1/model", "get", "/v1/model", {}),
            ("/v1/models/{name}", "get", f"/v1/models/{name}", {}),
            ("/v1/extract", "post", "/v1/extract", {"json": {"text": "北京"}}),
            (
                "/v1/models/{name}/extract",
                "post",
                f"/v1/models/{name}/extract",
                {"json": {"text": "北京"}},
            ),
        ]:
            response = getattr(client, method)(request_path, **kwargs)
            assert response.status_code == 503 and response.get_json()["code"] == code, path
            assert code in (_declared(spec, path, method, 503) or []), f"{method} {path}"
            assert "Retry-After" in spec["paths"][path][method]["responses"]["503"]["headers"]
    finally:
        slot.close()


def test_openapi_declares_nginx_rate_limit_on_the_paths_it_limits(make_fake_app: Any) -> None:
    """With SPO_RATE_LIMIT, nginx answers 429 ``rate_limited`` on the paths its ``$spo_rate_key`` map
    keys (deploy/nginx.conf); the document declares it there and nowhere else, and not without it."""
    conf = (PROJECT_ROOT / "deploy" / "nginx.conf").read_text(encoding="utf-8")
    block = re.search(r"map \$uri \$spo_rate_key \{(.*?)\}", conf, re.DOTALL)
    assert block is not None
    limited = re.findall(r'^\s*"~([^"]+)"\s+\$binary_remote_addr;', block.group(1), re.M)
    assert limited
    spec = _spec(make_fake_app(rate_limit="10r/s").test_client())
    for path, operations in spec["paths"].items():
        example = path.replace("{name}", "ner")
        for method in operations:
            declared = _declared(spec, path, method, 429) or []
            assert ("rate_limited" in declared) == any(re.match(r, example) for r in limited), path
    plain = _spec(make_fake_app().test_client())
    assert not any(
        _declared(plain, path, method, 429)
        for path, ops in plain["paths"].items()
        for method in ops
    )


def test_openapi_every_rest_code_is_declared_somewhere(make_fake_app: Any) -> None:
    """With every guard on (tokens, nginx rate limit, metrics token), each REST code of the catalogue
    is declared by some operation; only the answers to a path or method no operation has are not."""
    spec = _spec(
        make_fake_app(
            auth_tokens=("a-token-of-16-chars-or-more",),
            rate_limit="10r/s",
            metrics_token="a-metrics-token-16-chars",
        ).test_client()
    )
    declared = {
        code
        for path, operations in spec["paths"].items()
        for method in operations
        for status in operations[method]["responses"]
        for code in _declared(spec, path, method, int(status)) or []
    }
    off_route = {"not_found", "method_not_allowed"}
    rest = {code for code, entry in CATALOGUE.items() if entry.rest}
    assert rest - declared == off_route
