"""The demo page, the API docs and CORS, in-process (the browser test drives them in Chromium)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app.settings import Settings, SettingsError

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
    redirect = client.get("/docs")
    assert redirect.status_code == 308
    assert redirect.headers["Location"].endswith("/docs/")
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


def test_web_cors_allow_list(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(cors_origins=(ORIGIN,)).test_client()
    preflight = client.options(
        "/v1/extract",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "Content-Type, Authorization",
        },
    )
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


def test_web_cors_origins_setting_is_checked(triples_model_dir: Path) -> None:
    env = {"SPO_MODEL_DIR": str(triples_model_dir), "SPO_CORS_ORIGINS": f"{ORIGIN}, *"}
    assert Settings.from_env(env).cors_origins == (ORIGIN, "*")
    with pytest.raises(SettingsError) as error:
        Settings.from_env({**env, "SPO_CORS_ORIGINS": "tools.example.org,https://a.b/path"})
    assert [p.split(":")[0] for p in error.value.problems] == ["SPO_CORS_ORIGINS"] * 2
