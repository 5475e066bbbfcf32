"""What a browser sees: the demo page at ``/``, interactive API docs at ``/docs``, and CORS.

Every asset is served by the app itself: the page's HTML, CSS and JavaScript from ``app/static``, Swagger
UI's files from the ``flask-swagger-ui`` package (no CDN, no web font, no call to a validator service).
The page calls the API like any client (``POST /v1/extract``, ``GET /readyz``), so what it shows is what
the API answers, problems included.

CORS is off by default: no ``Access-Control-*`` header is ever sent. ``SPO_CORS_ORIGINS`` lists the
origins whose pages may call the API (``flask-cors`` answers the preflight and echoes an allowed
origin); ``*`` allows any origin, which only makes sense for an open, token-less service.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask, Response, current_app

from app.settings import Settings

DOCS_URL = "/docs"
bp = Blueprint("web", __name__)

# The page loads nothing from elsewhere; the policy makes that a rule the browser enforces.
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@bp.get("/")
def page() -> Response:
    assert current_app.static_folder is not None
    html = (Path(current_app.static_folder) / "demo.html").read_bytes()
    response = Response(html, mimetype="text/html")
    response.headers["Content-Security-Policy"] = PAGE_CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-cache"
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
    app.register_blueprint(bp)
    _init_docs(app)
    _init_cors(app, settings)
