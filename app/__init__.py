"""spo-service web application: ``create_app`` builds the Flask app; nothing happens at import time.

gunicorn runs ``app:create_app()`` in each worker after the fork (``preload_app = False``), so each worker
loads its own TensorFlow session (see ``app.model_slot``). TensorFlow is imported only when a model
loads.
"""

from __future__ import annotations

import click
from flask import Flask

from app import api, batch, errors, metrics, web
from app import logging as app_logging
from app.microbatch import MicroBatcher
from app.model_slot import Loader, ModelSlot
from app.settings import Settings
from nlp.config import load_extractor

__all__ = ["create_app"]


def create_app(
    settings: Settings | None = None,
    *,
    loader: Loader | None = None,
) -> Flask:
    """The service app for ``settings`` (``Settings.from_env()`` when omitted).

    The model is loaded as ``settings.load_mode`` says: ``boot`` loads and warms it before returning,
    ``background`` starts a thread. A load that fails leaves the app up and unready, retrying with
    backoff (``app.model_slot``); it never raises here. ``loader`` (given ``settings.load_options()``)
    replaces ``nlp.config.load_extractor`` in tests. With ``SPO_MICROBATCH_WAIT_MS`` above 0,
    ``app.extensions["spo.microbatch"]`` holds the worker's ``MicroBatcher`` (``app.microbatch``).
    """
    if settings is None:
        # In a gunicorn worker: a model directory gone since the start is a load failure to survive.
        settings = Settings.from_env(require_model=False)
    app = Flask(__name__)
    # One byte over the limit, so that a chunked body over it can be told from one at it (app.api).
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1
    app.json.ensure_ascii = False  # type: ignore[attr-defined]
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.json.compact = True  # type: ignore[attr-defined]
    app.extensions["spo.settings"] = settings
    slot = ModelSlot(retry_max_s=settings.load_retry_max_s)
    app.extensions["spo"] = slot
    if settings.microbatch_wait_ms > 0:
        app.extensions["spo.microbatch"] = MicroBatcher(
            slot.extract_batch,
            wait_s=settings.microbatch_wait_ms / 1000,
            max_texts=settings.microbatch_max_texts,
        )

    app_logging.init_app(app)
    errors.init_app(app)
    metrics.init_app(app)
    app.register_blueprint(api.bp)
    web.init_app(app)
    batch.init_app(app)

    load = loader or load_extractor
    # Created by a command line (`flask --app app extract`, `flask run`): the batch command loads the
    # model in its own workers, so the app's copy loads in the background rather than blocking it.
    in_cli = click.get_current_context(silent=True) is not None
    if settings.load_mode == "background" or in_cli:
        slot.load_in_background(settings.load_options(), load)
    else:
        slot.load_or_retry(settings.load_options(), load)
    return app
