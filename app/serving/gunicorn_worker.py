"""gunicorn's gthread worker with clean HTTP edges: an answer before the body is read closes cleanly.

The service refuses some requests without reading their body: over ``SPO_MAX_BODY_BYTES`` (413), bad
token (401), wrong content type (415), unknown path (404). Ordinary clients (Python ``urllib`` and
``requests``, most others) send the whole body before they read any answer, and they do not send
``Expect: 100-continue``. Stock gthread answers such a request with ``Connection: keep-alive``, drains
at most 64 KiB of the rest, and closes the socket with the body still arriving: the kernel then resets
the connection, and the client sees ``ConnectionResetError`` / ``BrokenPipeError`` instead of the 413.

``ThreadWorker`` does what nginx does (``lingering_close``):

1. when the application starts its response while the request body is still unread, the response
   carries ``Connection: close`` (never keep-alive over an unread body);
2. after the response is sent, the rest of the body is read and discarded, for at most ``LINGER_S``
   seconds (nginx's ``lingering_time``, there 30 s) and at most ``LINGER_MAX_BYTES``;
3. then the connection closes (gthread's graceful close): the client has sent everything, finds the
   answer waiting, and reads it.

A client that keeps sending past those bounds gets the reset it would get from nginx. The worker class
is chosen in ``deploy/gunicorn.conf.py``; it relies on gunicorn's request objects (``Request.body``,
``Request.force_close``, ``Parser.finish_body``) of the pinned gunicorn version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.http.body import ChunkedReader, LengthReader
from gunicorn.workers.gthread import ThreadWorker as _GThreadWorker

LINGER_S = 10.0
LINGER_MAX_BYTES = 1 << 30

_current = threading.local()


def body_unread(req: Any) -> bool:
    """Whether ``req`` (a gunicorn ``Request``) still has body bytes the application did not read."""
    body = getattr(req, "body", None)
    if body is None:
        return False
    if body.buf.tell():
        return True
    reader = body.reader
    if isinstance(reader, LengthReader):
        return bool(reader.length > 0)
    if isinstance(reader, ChunkedReader):
        return reader.parser is not None or bool(reader.buf.tell())
    return False


class _EdgeApp:
    """Wraps the WSGI app: a response started over an unread body closes the connection.

    Attribute access goes through to the app (``worker.wsgi.extensions`` in ``worker_exit``).
    """

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        req = getattr(_current, "req", None)

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            if req is not None and body_unread(req):
                req.force_close()  # gunicorn then answers "Connection: close"
            return start_response(status, headers, exc_info)

        return self.app(environ, start)


def linger(conn: Any, seconds: float = LINGER_S) -> bool:
    """Read and discard the rest of the current request body, for at most ``seconds`` and
    ``LINGER_MAX_BYTES``; True if all of it came."""
    deadline = time.monotonic() + seconds
    return bool(conn.parser.finish_body(deadline=deadline, max_bytes=LINGER_MAX_BYTES))


class ThreadWorker(_GThreadWorker):  # type: ignore[misc]
    """gthread, plus a clean close after answering over an unread request body (module doc)."""

    wsgi: Any

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = _EdgeApp(self.wsgi)

    def handle_request(self, req: Any, conn: Any) -> bool:
        _current.req = req
        try:
            keepalive = bool(super().handle_request(req, conn))
        finally:
            _current.req = None
        if body_unread(req):
            drained = linger(conn)
            self.log.debug("answered over an unread body; drained it: %s", drained)
            return False
        return keepalive
