"""The demo page, the API docs and CORS, in-process (the browser test drives them in Chromium)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.core.settings import Settings, SettingsError
from app.web.pages import PAGE_CSP

ORIGIN = "https://tools.example.org"


def test_web_page_is_served_with_its_own_assets_only(client: FlaskClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert page.mimetype == "text/html"
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    html = page.get_data(as_text=True)
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert "/static/demo.js" in assets and "/static/demo.css" in assets
    for asset in assets:
        assert asset.startswith("/"), asset  # nothing from another host
        with client.get(asset) as answer:
            assert answer.status_code == 200, asset
    for name in ("demo.js", "demo.css"):
        with client.get(f"/static/{name}") as answer:
            text = answer.get_data(as_text=True)
        assert "http://" not in text and "https://" not in text
        assert "@import" not in text and "@font-face" not in text


def test_web_page_has_the_controls_the_demo_needs(client: FlaskClient) -> None:
    html = client.get("/").get_data(as_text=True)
    for element in ('id="text"', 'id="extract"', 'id="token"', 'id="triples"', 'id="error"',
                    'role="alert"', 'name="viewport"', '<label for="text">'):  # fmt: skip
        assert element in html


def test_web_docs_serve_swagger_ui_locally(client: FlaskClient) -> None:
    redirect = client.get("/docs", headers={"Host": "evil.example"})
    assert redirect.status_code == 308
    assert redirect.headers["Location"] == "docs/"  # relative: never the client's Host
    assert redirect.get_data() == b""
    docs = client.get("/docs/")
    assert docs.status_code == 200
    html = docs.get_data(as_text=True)
    assert '"url": "/openapi.json"' in html
    assert '"validatorUrl": null' in html  # Swagger UI calls no outside validator
    for asset in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert asset.startswith("/docs/"), asset
        with client.get(asset) as answer:
            assert answer.status_code == 200, asset


def test_web_cors_is_off_by_default(client: FlaskClient) -> None:
    answer = client.post("/v1/extract", json={"text": "北京"}, headers={"Origin": ORIGIN})
    assert answer.status_code == 200
    assert not [k for k, _ in answer.headers.items() if k.lower().startswith("access-control-")]
    preflight = client.options(
        "/v1/extract", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    )
    assert "Access-Control-Allow-Origin" not in preflight.headers


def _preflight(client: FlaskClient) -> Any:
    """A browser's CORS preflight for a POST to /v1/extract from ``ORIGIN`` with a token."""
    return client.options(
        "/v1/extract",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "Content-Type, Authorization",
        },
    )


def test_web_cors_allow_list(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(cors_origins=(ORIGIN,)).test_client()
    preflight = _preflight(client)
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "authorization" in preflight.headers["Access-Control-Allow-Headers"].lower()
    answer = client.post("/v1/extract", json={"text": "北京"}, headers={"Origin": ORIGIN})
    assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "X-Request-ID" in answer.headers["Access-Control-Expose-Headers"]
    # Errors carry the header too, so a browser client can read the problem.
    problem = client.post("/v1/extract", json={}, headers={"Origin": ORIGIN})
    assert problem.status_code == 422
    assert problem.headers["Access-Control-Allow-Origin"] == ORIGIN
    other = client.post(
        "/v1/extract", json={"text": "北京"}, headers={"Origin": "https://evil.test"}
    )
    assert "Access-Control-Allow-Origin" not in other.headers


def test_web_cors_preflight_needs_no_token_when_the_api_has_tokens(
    make_fake_app: Callable[..., Flask],
) -> None:
    """Browsers send a preflight without credentials: guarded, no allowed origin could call the API."""
    token = "a-token-of-16-chars"
    client = make_fake_app(cors_origins=(ORIGIN,), auth_tokens=(token,)).test_client()
    preflight = _preflight(client)
    assert preflight.status_code == 200
    assert preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "authorization" in preflight.headers["Access-Control-Allow-Headers"].lower()
    # The request itself still needs its token.
    headers = {"Origin": ORIGIN}
    refused = client.post("/v1/extract", json={"text": "北京"}, headers=headers)
    assert refused.status_code == 401
    assert refused.headers["Access-Control-Allow-Origin"] == ORIGIN
    headers["Authorization"] = f"Bearer {token}"
    assert client.post("/v1/extract", json={"text": "北京"}, headers=headers).status_code == 200
    # An OPTIONS that is no preflight is guarded like any other method.
    assert client.options("/v1/extract").status_code == 401


def test_web_cors_origins_setting_is_checked(triples_model_dir: Path) -> None:
    env = {"SPO_MODEL_DIR": str(triples_model_dir), "SPO_CORS_ORIGINS": f"{ORIGIN}, *"}
    assert Settings.from_env(env).cors_origins == (ORIGIN, "*")
    with pytest.raises(SettingsError) as error:
        Settings.from_env({**env, "SPO_CORS_ORIGINS": "tools.example.org,https://a.b/path"})
    assert [p.split(":")[0] for p in error.value.problems] == ["SPO_CORS_ORIGINS"] * 2


# -- SPO_PAGES and the browser-facing headers (issue 21) --------------------------------------------
TOKEN = "pages-token-0123456789"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
PAGES = ("/", "/static/demo.js", "/docs/", "/docs/swagger-ui.css", "/openapi.json")


def test_web_docs_have_the_pages_headers(client: FlaskClient) -> None:
    docs = client.get("/docs/")
    html = docs.get_data()
    assert docs.headers["X-Content-Type-Options"] == "nosniff"
    csp = docs.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    # Its one inline script, by the hash of exactly what was sent; nothing else inline.
    (script,) = re.findall(rb"<script>(.*?)</script>", html, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
    assert f"script-src 'self' 'sha256-{digest}'" in csp
    assert "unsafe-inline" not in csp.split("script-src", 1)[1].split(";", 1)[0]
    for path in ("/docs", "/docs/swagger-ui-bundle.js", "/", "/static/demo.css"):
        with client.get(path) as answer:
            assert answer.headers["X-Content-Type-Options"] == "nosniff", path
    assert "default-src 'none'" in client.get("/").headers["Content-Security-Policy"]


def test_web_every_html_answer_has_a_policy(client: FlaskClient) -> None:
    """Swagger UI's oauth2-redirect.html (a file, streamed) answered 500: hashing its inline
    scripts read a body in passthrough mode. The page by its file name, /static/demo.html, had
    no policy at all: another site could frame it, and its form sent the token in a URL."""
    with client.get("/docs/oauth2-redirect.html") as redirect:
        assert redirect.status_code == 200 and redirect.mimetype == "text/html"
        csp = redirect.headers["Content-Security-Policy"]
        assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
    with client.get("/static/demo.html") as page:
        assert page.status_code == 200
        assert page.headers["Content-Security-Policy"] == PAGE_CSP
        assert "form-action 'none'" in PAGE_CSP and "frame-ancestors 'none'" in PAGE_CSP


def test_web_pages_open_by_default_even_with_tokens(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(auth_tokens=(TOKEN,)).test_client()
    for path in PAGES:
        with client.get(path) as answer:
            assert answer.status_code == 200, path
    assert client.get("/v1/model").status_code == 401


def test_web_pages_auth_puts_every_path_behind_the_tokens(
    make_fake_app: Callable[..., Flask],
) -> None:
    client = make_fake_app(auth_tokens=(TOKEN,), pages="auth").test_client()
    for path in (*PAGES, "/docs", "/no-such-path"):
        with client.get(path) as answer:
            assert answer.status_code == 401, path
            assert answer.mimetype == "application/problem+json"
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        with client.get(path, headers=GOOD) as answer:
            assert answer.status_code in (200, 308, 404), path
    for path in PAGES:
        with client.get(path, headers=GOOD) as answer:
            assert answer.status_code == 200, path
    for path in ("/healthz", "/readyz", "/metrics"):  # probes, and /metrics has its own token
        assert client.get(path).status_code == 200, path


def test_web_pages_off_serves_none_of_them(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(pages="off").test_client()
    for path in (*PAGES, "/docs", "/static/favicon.svg"):
        with client.get(path) as answer:
            assert answer.status_code == 404, path
            assert answer.get_json()["code"] == "not_found"
    assert client.post("/v1/extract", json={"text": "北京"}).status_code == 200
    assert client.get("/healthz").status_code == 200


def test_web_pages_auth_file_tokens(make_fake_app: Callable[..., Flask], tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the API's tokens\n{TOKEN}\n")
    client = make_fake_app(auth_tokens_file=tokens, pages="auth").test_client()
    assert client.get("/").status_code == 401
    assert client.get("/", headers=GOOD).status_code == 200
    answer = client.post("/v1/extract", json={"text": "北京"}, headers=GOOD)
    assert answer.status_code == 200


def test_web_worker_without_its_tokens_file_fails_closed(
    settings: Settings, fake_extractor: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that finds the tokens file gone (after ``spo serve`` checked it) stays up, and refuses
    what needs a token with 503: never open, never a crashed worker (which would halt gunicorn)."""
    missing = tmp_path / "tokens"
    with pytest.raises(SettingsError, match="SPO_AUTH_TOKENS_FILE: cannot read"):
        Settings(model_dir=settings.model_dir, auth_tokens_file=missing)  # spo serve refuses it
    worker = Settings(model_dir=settings.model_dir, auth_tokens_file=missing, require_model=False)
    assert worker.auth_enabled and worker.api_tokens == ()
    client = create_app(worker, loader=lambda s: fake_extractor).test_client()
    assert "every request that needs a token is refused" in caplog.text
    for headers in ({}, GOOD):
        answer = client.post("/v1/extract", json={"text": "北京"}, headers=headers)
        assert answer.status_code == 503 and answer.get_json()["code"] == "service_unavailable"
        assert answer.headers["Retry-After"] == "5"
    assert client.get("/healthz").status_code == 200
