"""What a browser sees: the demo page at ``/``, interactive API docs at ``/docs``, and CORS.

``SPO_PAGES`` decides whether they are served: ``open`` (the default), ``auth`` (behind the API tokens,
``app.web.auth``) or ``off`` (not at all: the page, its assets, ``/docs`` and ``/openapi.json`` are 404s).
Every response under them carries ``X-Content-Type-Options: nosniff`` and a Content-Security-Policy
that allows nothing from elsewhere: the page's is fixed; Swagger UI's allows its one inline script by
its hash, computed for each answer (the script embeds the request's URL).

Every asset is served by the app itself: the page's HTML, CSS and JavaScript from ``app/web/static``, Swagger
UI's files from the ``flask-swagger-ui`` package (no CDN, no web font, no call to a validator service).
The page calls the API like any client (``POST /v1/extract``, ``GET /readyz``), so what it shows is what
the API answers, problems included.

CORS is off by default: no ``Access-Control-*`` header is ever sent. ``SPO_CORS_ORIGINS`` lists the
origins whose pages may call the API (``flask-cors`` answers the preflight and echoes an allowed
origin); ``*`` allows any origin, which only makes sense for an open, token-less service.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from flask import Blueprint, Flask, Response, current_app, request

from app.core.settings import Settings

DOCS_URL = "/docs"
bp = Blueprint("web", __name__)

# The page loads nothing from elsewhere; the policy makes that a rule the browser enforces.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

# Swagger UI: its scripts and styles are served from /docs/; it sets styles inline and its stylesheet
# has data: images. Its one inline <script> is allowed by its hash (``docs_csp``).
DOCS_CSP = (
    "default-src 'none'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)
_BROWSER_PATHS = ("/docs", "/static/")


def docs_csp(html: bytes) -> str:
    """Swagger UI's policy for the page ``html``: its inline scripts allowed by their SHA-256 only.

    >>> docs_csp(b"<script>var a = 1;</script>").split("; ")[1]
    "script-src 'self' 'sha256-+dZ6udsWxNVoGfScAq7t5IIF5UJb4F6RhjbN6oe1p4w='"
    """
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(html)
    )
    return DOCS_CSP.format(hashes=hashes)


@bp.get("/")
def page() -> Response:
    assert current_app.static_folder is not None
    html = (Path(current_app.static_folder) / "demo.html").read_bytes()
    response = Response(html, mimetype="text/html")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    response.headers["Cache-Control"] = "no-cache"
    return response


def _browser_headers(response: Response) -> Response:
    """nosniff on the page, its assets and everything under /docs; every HTML answer there gets a
    policy: Swagger UI's page its own (its inline script by hash), a file of Swagger UI's served as
    it is (``oauth2-redirect.html``: no inline script; hashing its streamed body failed, a 500) the
    same without hashes, and any other (``/static/demo.html``, the page by its file name: it was
    framable and its form sent the token in a URL) the page's."""
    if request.path != "/" and not request.path.startswith(_BROWSER_PATHS):
        return response
    response.headers["X-Content-Type-Options"] = "nosniff"
    if response.mimetype == "text/html" and "Content-Security-Policy" not in response.headers:
        if not request.path.startswith("/docs"):
            policy = PAGE_CSP
        elif response.direct_passthrough:
            policy = DOCS_CSP.format(hashes="")
        else:
            policy = docs_csp(response.get_data())
        response.headers["Content-Security-Policy"] = policy
    return response


@bp.get(DOCS_URL)
def docs_redirect() -> Response:
    """``/docs`` to ``/docs/`` by a relative ``Location`` and no body. Werkzeug's own slash redirect
    built an absolute one from the client's ``Host`` (``http://evil.example/docs/``), with an HTML
    body; ``docs/`` also keeps a path prefix a proxy in front may add."""
    response = Response(status=308)
    response.headers["Location"] = "docs/"
    return response


def _init_docs(app: Flask) -> None:
    """Swagger UI at ``/docs/`` (``/docs`` redirects there) over ``/openapi.json``."""
    from flask_swagger_ui import get_swaggerui_blueprint

    app.register_blueprint(
        get_swaggerui_blueprint(
            DOCS_URL,
            "/openapi.json",
            # validatorUrl None: Swagger UI would otherwise send the spec to an outside validator.
            config={"app_name": "spo-service API", "validatorUrl": None, "tryItOutEnabled": True},
        )
    )


def _init_cors(app: Flask, settings: Settings) -> None:
    if not settings.cors_origins:
        return
    from flask_cors import CORS

    origins = "*" if "*" in settings.cors_origins else list(settings.cors_origins)
    CORS(
        app,
        origins=origins,
        methods=["GET", "POST", "OPTIONS"],
        allow_headers=["Content-Type", "Authorization", "X-Request-ID"],
        expose_headers=["X-Request-ID", "Retry-After"],
        max_age=600,
    )


def init_app(app: Flask) -> None:
    settings: Settings = app.extensions["spo.settings"]
    if settings.pages != "off":
        app.register_blueprint(bp)
        _init_docs(app)
        app.after_request(_browser_headers)
    _init_cors(app, settings)
