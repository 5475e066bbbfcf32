"""One logging setup (text or JSON lines) and the request id every log line and answer carries.

``logging_config(settings)`` is a ``logging.config.dictConfig`` document: gunicorn applies it to its own
loggers and the root logger (``logconfig_dict`` in ``deploy/gunicorn.conf.py``). ``create_app`` never
configures logging: the process that runs the app does.

The request id is the client's ``X-Request-ID`` (nginx sets one from ``$request_id`` when the client did
not) when it is a sane token, else a fresh one; it is echoed in the ``X-Request-ID`` response header and
in every problem body, and formatters add it to each line logged while the request is served.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from flask import Flask, Response, g, has_request_context, request

from app.settings import Settings

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")


def current_request_id() -> str | None:
    return g.get("request_id") if has_request_context() else None


def _assign_request_id() -> None:
    given = request.headers.get(REQUEST_ID_HEADER, "")
    g.request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex


def _echo_request_id(response: Response) -> Response:
    request_id = g.get("request_id")
    if request_id:
        response.headers[REQUEST_ID_HEADER] = request_id
    return response


def init_app(app: Flask) -> None:
    """Give every request an id, first thing, and echo it on every answer, errors included."""
    app.before_request_funcs.setdefault(None, []).insert(0, _assign_request_id)
    app.after_request(_echo_request_id)


class TextFormatter(logging.Formatter):
    """``time level logger [request id] message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(rid)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = current_request_id()
        record.rid = f" [{request_id}]" if request_id else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, exception."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        request_id = current_request_id()
        if request_id:
            doc["request_id"] = request_id
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def logging_config(settings: Settings) -> dict[str, Any]:
    """A dictConfig document: root, gunicorn.error and gunicorn.access to stderr/stdout."""
    formatter = "json" if settings.log_format == "json" else "text"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "text": {"()": TextFormatter},
            "json": {"()": JsonFormatter},
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": formatter,
                "stream": "ext://sys.stderr",
            },
            "stdout": {
                "class": "logging.StreamHandler",
                "formatter": formatter,
                "stream": "ext://sys.stdout",
            },
        },
        "root": {"level": settings.log_level, "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {
                "level": settings.log_level,
                "handlers": ["stderr"],
                "propagate": False,
            },
            "gunicorn.access": {"level": "INFO", "handlers": ["stdout"], "propagate": False},
        },
    }
