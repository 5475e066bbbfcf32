"""One logging setup (text or JSON lines) and the request id every log line and answer carries.

``logging_config(settings)`` is a ``logging.config.dictConfig`` document: gunicorn applies it to its own
loggers and the root logger (``logconfig_dict`` in ``deploy/gunicorn.conf.py``), ``configure_logging``
applies it in every ``spo`` command (``app.cli``) and in the batch command's worker processes.
``create_app`` never configures logging: the process that runs the app does.

gunicorn's access log goes through ``AccessLogger`` (``logger_class``): one line per request, in the
same format as every other line. Besides method, path, status, latency, bytes and request id it carries
what the request did (``texts``, ``tokens``, ``buckets``: the model-call shapes), which the app leaves
in the WSGI environ (``app.web.metrics.request_summary``). Input texts are never logged unless
``SPO_LOG_INPUT_TEXT`` is on (then the access line has ``input``).

The request id is the client's ``X-Request-ID`` (nginx sets one from ``$request_id`` when the client did
not) when it is a sane token, else a fresh one; it is echoed in the ``X-Request-ID`` response header and
in every problem body, and formatters add it to each line logged while the request is served.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import time
import uuid
from typing import Any

from flask import Flask, Response, g, has_request_context, request
from gunicorn.glogging import Logger as GunicornLogger

from app.core.jsonlines import LINE_BREAKS
from app.core.settings import LogSettings, Settings

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


# Line breaks and other control characters, escaped in a text line's message (a path with %0A in
# it, a value quoted by an error): one record is one line, and no input can forge another.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, 0x85)} | {
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\t",  # a tab stays a tab
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


def one_line(message: str) -> str:
    r"""``message`` with its line breaks and control characters escaped.

    >>> print(one_line('GET "/a\nb" 404\r\x1b[31m'))
    GET "/a\nb" 404\r\x1b[31m
    """
    return message.translate(_CONTROL)


class TextFormatter(logging.Formatter):
    """``time level logger [request id] message``: one line; an exception's traceback follows it."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(rid)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = current_request_id()
        record.rid = f" [{request_id}]" if request_id else ""
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = one_line(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, exception; an access-log
    line adds its fields (``AccessLogger``)."""

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
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            doc.update(access)
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False).translate(LINE_BREAKS)


class AccessLogger(GunicornLogger):  # type: ignore[misc]
    """gunicorn's logger with one access line per request carrying the app's request summary."""

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        # Only when asked (SPO_ACCESS_LOG): gunicorn would also log whenever a logconfig is given.
        if not self.cfg.accesslog:
            return
        try:
            fields = access_fields(resp, environ, request_time.total_seconds())
            self.access_log.info(access_message(fields), extra={"access": fields})
        except Exception:
            self.error_log.exception("could not write the access log line")


def access_fields(resp: Any, environ: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The access-log fields of one request (``resp`` is gunicorn's response)."""
    status = resp.status
    code = int(str(status).split(None, 1)[0]) if status else 0
    headers = {k.lower(): v for k, v in (resp.headers or [])}
    fields: dict[str, Any] = {
        "request_id": headers.get(REQUEST_ID_HEADER.lower(), "-"),
        "remote": _remote(environ),
        "method": environ.get("REQUEST_METHOD", "-"),
        "path": environ.get("PATH_INFO", "-"),
        "status": code,
        "latency_ms": round(seconds * 1000, 1),
        "bytes": getattr(resp, "sent", None) or 0,
    }
    fields.update(environ.get("spo.request") or {})
    return fields


def _remote(environ: dict[str, Any]) -> str:
    """The client's address. On a unix socket gunicorn has none (``REMOTE_ADDR`` is empty): the
    proxy in front, which alone reaches the socket (nginx under ``spo serve --nginx``), names it as
    the last ``X-Forwarded-For`` entry, the one it added.

    >>> _remote({"REMOTE_ADDR": "", "HTTP_X_FORWARDED_FOR": "203.0.113.9, 10.0.0.7"})
    '10.0.0.7'
    >>> _remote({"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}), _remote({})
    ('127.0.0.1', '-')
    """
    address = str(environ.get("REMOTE_ADDR") or "")
    if not address:
        address = str(environ.get("HTTP_X_FORWARDED_FOR") or "").rsplit(",", 1)[-1].strip()
    return address or "-"


def _quoted(value: Any) -> str:
    """A value put between double quotes in the text line: its quotes and backslashes escaped,
    so a path cannot close the quotes and write fields of its own."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def access_message(fields: dict[str, Any]) -> str:
    """``REMOTE "METHOD PATH" STATUS LATENCYms texts=.. tokens=.. buckets=.. rid=ID``."""
    parts = [
        f'{fields["remote"]} "{fields["method"]} {_quoted(fields["path"])}" {fields["status"]}',
        f"{fields['latency_ms']}ms",
    ]
    for key in ("texts", "tokens"):
        if key in fields:
            parts.append(f"{key}={fields[key]}")
    if fields.get("buckets"):
        parts.append("buckets=" + ",".join(fields["buckets"]))
    parts.append(f"rid={fields['request_id']}")
    if "input" in fields:
        parts.append("input=" + json.dumps(fields["input"], ensure_ascii=False))
    return " ".join(parts)


def logging_config(settings: Settings | LogSettings) -> dict[str, Any]:
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


def configure_logging(settings: Settings | LogSettings | None = None) -> None:
    """Apply ``logging_config`` (from ``SPO_LOG_FORMAT`` / ``SPO_LOG_LEVEL`` when not given)."""
    logging.config.dictConfig(logging_config(settings or LogSettings.from_env()))
