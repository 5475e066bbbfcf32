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

A client that keeps sending past those bounds gets the reset it would get from nginx.

What gunicorn answers itself, a request it cannot parse (a bad request line, method, version or
header; a request line or headers over its limits; 400, 414, 431...), is problem+json too, as nginx's
answers and the app's are (``problem_answer``): gunicorn writes its HTML page to a stand-in for the
client, the status is read from it, and the client gets the problem instead. Each such refusal has
one access line, with the status and request id the client got (gunicorn writes none when it could
not read the request line, and would name no request id): the worker holds gunicorn's back and
writes its own. The worker class is
chosen in ``deploy/gunicorn.conf.py``; it relies on gunicorn's request objects (``Request.body``,
``Request.force_close``, ``Parser.finish_body``) and ``Worker.handle_error`` of the pinned gunicorn
version.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any

from gunicorn import util
from gunicorn.http.body import ChunkedReader, LengthReader
from gunicorn.workers.gthread import ThreadWorker as _GThreadWorker

from app.core.problems import problem_for

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


# What gunicorn's own refusals say (nginx's words where nginx answers the same).
_DETAILS = {
    400: "The HTTP request is malformed.",
    403: "The request is forbidden.",
    414: "The request line is too long.",
    417: "The expectation cannot be met.",
    431: "The request headers are too large.",
    500: "An unexpected error occurred. Quote the request id when reporting it.",
    501: "The transfer coding is not supported.",
}


def problem_answer(status: int, request_id: str | None = None) -> bytes:
    """The whole HTTP answer, problem+json, for a request gunicorn refused with ``status`` before
    the app saw it: ``internal_error`` for a 500, else ``bad_request`` (the status kept, as nginx
    keeps its 414 and 431).

    >>> head, body = problem_answer(431).split(b"\\r\\n\\r\\n")
    >>> head.splitlines()[0], json.loads(body)["code"], json.loads(body)["status"]
    (b'HTTP/1.1 431 Request Header Fields Too Large', 'bad_request', 431)
    """
    code = problem_for("internal_error" if status == 500 else "bad_request").code
    request_id = request_id or uuid.uuid4().hex
    phrase = HTTPStatus(status).phrase
    detail = _DETAILS.get(status, _DETAILS[400])
    body = json.dumps(
        {
            "type": "about:blank",
            "title": phrase,
            "status": status,
            "code": code,
            "detail": detail,
            "request_id": request_id,
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nConnection: close\r\n"
        f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n"
        f"X-Request-ID: {request_id}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _Kept:
    """A client socket whose writes are kept (gunicorn's HTML error page); all else goes through."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.sent = bytearray()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def send(self, data: bytes) -> int:
        self.sent += data
        return len(data)

    def sendall(self, data: bytes) -> None:
        self.sent += data


class _RefusalLog:
    """The worker's logger, but for the access line gunicorn writes for a request it refused: held
    back (its environ kept) while ``ThreadWorker.handle_error`` runs in this thread, which writes
    the line itself with the answer's request id."""

    def __init__(self, log: Any) -> None:
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        held = getattr(_current, "refused", None)
        if held is not None:
            held.append(environ)
            return
        self._log.access(resp, req, environ, request_time)


class ThreadWorker(_GThreadWorker):  # type: ignore[misc]
    """gthread, plus a clean close after answering over an unread request body, and problem+json
    for what gunicorn refuses itself (module doc)."""

    wsgi: Any
    log: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = _RefusalLog(self.log)

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

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """gunicorn's own answer (its logging and access-log line), as problem+json (module doc)."""
        kept = _Kept(client)
        started = time.monotonic()
        held: list[dict[str, Any]] = []
        _current.refused = held
        try:
            super().handle_error(req, kept, addr, exc)
        finally:
            _current.refused = None
        status_line = bytes(kept.sent).split(b"\r\n", 1)[0].split(b" ")
        if len(status_line) < 2 or not status_line[1].isdigit():
            return  # nothing was written (the client had gone)
        status, request_id = int(status_line[1]), uuid.uuid4().hex
        answer = problem_answer(status, request_id)
        try:
            util.write_nonblock(client, answer)
        except Exception:
            self.log.debug("Failed to send error message.")
        # gunicorn's environ when it read the request line (method, path, X-Forwarded-For), else
        # only the peer; the access line names what the client got.
        environ = held[0] if held else {"REMOTE_ADDR": (addr or ("",))[0] or ""}
        resp = SimpleNamespace(
            status=str(status), headers=[("X-Request-ID", request_id)], sent=len(answer)
        )
        elapsed = timedelta(seconds=time.monotonic() - started)
        self.log.access(resp, None, environ, elapsed)
