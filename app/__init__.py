"""spo-service: ``create_app`` builds the Flask app; nothing happens at import time.

``app`` is a stack of subpackages, each importing only those below it and ``nlp`` (tests/app/test_layers.py
holds the rules): ``core`` (settings and their option table, sizing, logging, the problem catalogue),
``web`` (the Flask layer: routes, errors, OpenAPI, pages, metrics, the model registry and
micro-batching), ``batch`` (``spo extract``), ``spark`` (``spo spark-extract``, over batch),
``serving`` (the processes: ``spo serve``, the gunicorn master, the nginx supervisor) and ``cli`` (the
``spo`` command over all of them). This module, the factory, assembles ``web`` and registers the batch
command on Flask's CLI.

gunicorn runs ``create_app(settings)`` in each worker after the fork (``preload_app = False``;
``app.serving.master.worker_app``, with the settings ``spo serve`` resolved), so each worker loads its own
TensorFlow session (see ``app.web.model_slot``). TensorFlow is imported only when a model loads.
"""

from __future__ import annotations

from typing import Any

import click
from flask import Flask
from werkzeug.routing import Map

from app import batch
from app.core import logs as app_logging
from app.core.settings import Settings
from app.web import api, auth, errors, metrics, pages
from app.web.model_slot import Loader
from app.web.registry import ModelRegistry
from nlp.loader import load_extractor

__all__ = ["create_app"]


class _OneSpelling(Map):
    """Werkzeug's URL map without its slash merging: ``/v1//extract`` would be answered with a 308
    redirect (an HTML body, its ``Location`` built from the client's ``Host``); every path has one
    spelling, and another is a 404 problem like any unknown path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["merge_slashes"] = False
        super().__init__(*args, **kwargs)


class _App(Flask):
    url_map_class = _OneSpelling


def create_app(
    settings: Settings | None = None,
    *,
    loader: Loader | None = None,
    load_models: bool = True,
) -> Flask:
    """The service app for ``settings`` (``Settings.from_env()`` when omitted).

    Every model of ``settings.model_table`` (``app.web.registry``) is loaded as ``settings.load_mode``
    says: ``boot`` loads and warms them before returning, ``background`` starts threads. A load that
    fails leaves the app up, that model unready and retrying with backoff (``app.web.model_slot``); it never
    raises here. ``loader``
    (given ``settings.load_options(directory)`` for each) replaces ``nlp.loader.load_extractor`` in
    tests. ``load_models=False`` loads none (every model stays unready): ``spo serve --check-config``
    builds the app only to validate it, and exits at once. ``app.extensions["spo.models"]`` holds the ``ModelRegistry``, ``app.extensions["spo"]``
    the default model's slot. With ``SPO_MICROBATCH_WAIT_MS`` above 0 each model has a
    ``MicroBatcher`` (``app.web.microbatch``); ``app.extensions["spo.microbatch"]`` is the default's.
    """
    if settings is None:
        # `flask --app app`, tests: a model directory that is gone is a load failure to survive.
        settings = Settings.from_env(require_model=False)
    # SPO_PAGES=off: no demo page, so none of its assets either (app.web.pages).
    app = _App(__name__, static_folder=None if settings.pages == "off" else "web/static")
    # One byte over the limit, so that a chunked body over it can be told from one at it (app.web.api).
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.compact = True  # type: ignore[attr-defined]
    app.extensions["spo.settings"] = settings
    models = ModelRegistry.from_settings(settings)
    app.extensions["spo.models"] = models
    app.extensions["spo"] = models.default.slot
    if models.default.batcher is not None:
        app.extensions["spo.microbatch"] = models.default.batcher

    app_logging.init_app(app)
    errors.init_app(app)
    metrics.init_app(app)
    auth.init_app(app)
    app.register_blueprint(api.bp)
    pages.init_app(app)
    batch.init_app(app)

    if not load_models:
        return app
    load = loader or load_extractor
    # Created by a command line (`flask --app app extract`, `flask run`): the batch command loads the
    # model in its own workers, so the app's copy loads in the background rather than blocking it.
    in_cli = click.get_current_context(silent=True) is not None
    if settings.load_mode == "background" or in_cli:
        models.load_in_background(settings, load)
    else:
        models.load_or_retry(settings, load)
    return app
