"""Live tests of the service's edges (issue 12), gunicorn alone (no nginx), one worker, the demo model.

- An 18 MB body sent without ``Expect: 100-continue`` by ``urllib`` and ``requests`` reads the 413
  problem (``app.serving.gunicorn_worker``), not a connection reset; no keep-alive over an unread body.
- The worst request the body limit admits gets its 413 (``SPO_MAX_REQUEST_TOKENS``) at once, and one
  under the token limit but slower than ``SPO_REQUEST_TIMEOUT`` its 504 near the deadline, while
  ``/healthz`` and a one-sentence ``/v1/extract`` from other connections to the same worker are answered.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from app.core.settings import DEFAULT_MODEL_DIR
from tests.app.test_live import (
    BOOT_TIMEOUT_S,
    PROBLEM,
    Answer,
    call,
    free_port,
    post_json,
    start_serve,
    stop,
    wait_ready,
    wait_workers,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

TIMEOUT_S = 1.5
MAX_TOKENS = 150_000
SENTENCE = "鲁迅原名周树人，1881年9月25日出生于浙江绍兴，是中国现代文学的奠基人之一。"
LONG_TEXT = (SENTENCE * (10_000 // len(SENTENCE) + 1))[:10_000]


@dataclass
class Server:
    port: int
    log: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("live-edges")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        "SPO_MODEL_DIR": str(DEFAULT_MODEL_DIR),
        "SPO_WORKERS": "1",
        "SPO_THREADS": "4",
        "SPO_TIMEOUT": str(BOOT_TIMEOUT_S),
        "SPO_REQUEST_TIMEOUT": str(TIMEOUT_S),
        "SPO_MAX_REQUEST_TOKENS": str(MAX_TOKENS),
    }
    log = run_dir / "gunicorn.log"
    process = start_serve(port, env, log)
    try:
        wait_ready(port, process, log, BOOT_TIMEOUT_S)
        wait_workers(log, 1, BOOT_TIMEOUT_S)
        yield Server(port, log)
    finally:
        stop(process)


def _big_body(size: int = 18 * 2**20) -> bytes:
    return b'{"text": "' + b"a" * size + b'"}'


def _assert_body_too_large(status: int, content_type: str, body: bytes) -> None:
    assert status == 413
    assert content_type.split(";")[0] == PROBLEM
    assert json.loads(body)["code"] == "body_too_large"


def _raw(port: int, request: bytes) -> bytes:
    """Everything the server answers to ``request`` sent as it is, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


JSON_POST = b"POST /v1/extract HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (JSON_POST + b"Content-Length: abc\r\n\r\n{}", 400),
        (JSON_POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"P@ST /v1/extract HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET /healthz HTTP/9.9\r\nHost: a\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nBad Header: 1\r\n\r\n", 400),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-A: " + b"a" * 20000 + b"\r\n\r\n", 431),
        (JSON_POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400),
    ],
    ids=["length", "two-lengths", "method", "version", "header-name", "uri", "headers", "chunk"],
)
def test_live_edges_malformed_http_is_answered_as_a_problem_never_html(
    server: Server, request_bytes: bytes, status: int
) -> None:
    """What gunicorn refuses itself (it wrote an HTML page) and a chunked body whose framing breaks
    inside the app (it was a 500) are problem+json, one answer each, as behind nginx."""
    answer = _raw(server.port, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), answer[:300]
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["Content-Type"].split(";")[0] == PROBLEM
    problem = json.loads(body[: int(headers["Content-Length"])])
    assert problem["status"] == status and problem["code"] == "bad_request"
    assert problem["request_id"] == headers["X-Request-ID"]
    assert body[int(headers["Content-Length"]) :] == b"", "a second answer followed the first"
    # One access line, with the status and request id the client got (gunicorn wrote none for a
    # request line it could not read, and none with the problem's id).
    rid = f"rid={problem['request_id']}"
    deadline = time.monotonic() + 10
    while rid not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    access = [line for line in server.log.read_text().splitlines() if "gunicorn.access" in line]
    ours = [line for line in access if rid in line]
    assert len(ours) == 1 and f'" {status} ' in ours[0], ours
    assert not any(" rid=-" in line for line in access), access


def test_live_edges_18mb_body_via_urllib_reads_the_413(server: Server) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/extract",
        data=_big_body(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert time.monotonic() - started < 20
    error = info.value
    _assert_body_too_large(error.code, error.headers["Content-Type"], error.read())
    assert error.headers["Connection"] == "close"


def test_live_edges_18mb_body_via_requests_reads_the_413(server: Server) -> None:
    with requests.Session() as session:
        response = session.post(
            f"http://127.0.0.1:{server.port}/v1/extract",
            data=_big_body(),
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        _assert_body_too_large(
            response.status_code, response.headers["Content-Type"], response.content
        )
        assert response.headers["Connection"] == "close"
        # The session opens a new connection for the next request, which is served.
        again = session.get(f"http://127.0.0.1:{server.port}/healthz", timeout=10)
        assert again.status_code == 200


def test_live_edges_no_keepalive_over_an_unread_body(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        # Read by the app: the connection stays open and serves the next request.
        conn.request(
            "POST", "/v1/extract", '{"text": "北京"}'.encode(), {"Content-Type": "application/json"}
        )
        first = conn.getresponse()
        first.read()
        assert first.status == 200
        assert first.getheader("Connection") == "keep-alive"
        # Refused before the body is read (415): answered, then closed, never kept alive.
        conn.request("POST", "/v1/extract", b"x" * 300_000, {"Content-Type": "text/plain"})
        refused = conn.getresponse()
        assert refused.status == 415
        assert json.loads(refused.read())["code"] == "unsupported_media_type"
        assert refused.getheader("Connection") == "close"
    finally:
        conn.close()


def _worst_body() -> bytes:
    """As many 10,000-character texts as fit the default 1 MiB body limit."""
    n = (2**20 - 16) // (len(json.dumps(LONG_TEXT, ensure_ascii=False).encode()) + 1)
    body = json.dumps({"texts": [LONG_TEXT] * n}, ensure_ascii=False).encode()
    assert len(body) <= 2**20
    return body


def _alongside(port: int, slow: bytes) -> tuple[Answer, float, list[tuple[str, int, float, float]]]:
    """Send ``slow``; while it runs, ``/healthz`` and a one-sentence extract on other connections.

    Returns ``slow``'s answer, the seconds until it came, and per other request its name, status,
    seconds taken and seconds after ``slow`` was sent that it was sent.
    """

    def timed_slow() -> tuple[Answer, float]:
        answer = call(port, "POST", "/v1/extract", slow, {"Content-Type": "application/json"}, 60)
        return answer, time.monotonic()

    with ThreadPoolExecutor(3) as pool:
        started = time.monotonic()
        big = pool.submit(timed_slow)
        time.sleep(0.4)
        others: list[tuple[str, int, float, float]] = []
        for name, fn in (
            ("healthz", lambda: call(port, "GET", "/healthz", timeout=30)),
            ("extract", lambda: post_json(port, {"text": SENTENCE})),
        ):
            t = time.monotonic()
            answer = fn()
            others.append((name, answer.status, time.monotonic() - t, t - started))
        answer, ended = big.result(60)
        return answer, ended - started, others


def test_live_edges_worst_case_request_gets_413_while_others_are_served(server: Server) -> None:
    answer, seconds, others = _alongside(server.port, _worst_body())
    assert answer.status == 413
    assert answer.mimetype == PROBLEM
    problem = answer.json()
    assert problem["code"] == "request_too_large"
    assert problem["limit"] == MAX_TOKENS and problem["tokens"] > MAX_TOKENS
    assert seconds < 15  # tokenizing and counting only (about 1 s on one busy core)
    assert [(name, status) for name, status, _, _ in others] == [("healthz", 200), ("extract", 200)]


def test_live_edges_slow_request_gets_504_at_its_deadline_while_others_are_served(
    server: Server,
) -> None:
    # Eight 10,000-character texts: under the token limit (16,202 tokens each in the demo model's
    # windows of 96), and seconds of its time.
    body = json.dumps({"texts": [LONG_TEXT] * 8}, ensure_ascii=False).encode()
    answer, seconds, others = _alongside(server.port, body)
    assert answer.status == 504, answer.body[:300]
    assert answer.mimetype == PROBLEM
    assert answer.json()["code"] == "deadline_exceeded"
    assert seconds < TIMEOUT_S + 5
    (_, health, health_s, _), (_, extract, extract_s, extract_at) = others
    assert health == 200 and health_s < 2  # not behind the model
    # The one-sentence extract waits for the model at most until its own deadline. The slow request
    # stops at its deadline plus at most the model call in progress, so the small one is answered 200
    # when the model is free before its deadline, else 504 at that deadline, while the slow one still
    # held the model; never later.
    assert extract_s < TIMEOUT_S + 2
    if extract != 200:
        assert extract == 504 and extract_s >= TIMEOUT_S - 0.1
        assert extract_at + extract_s <= seconds + 0.1, (extract_at, extract_s, seconds)
    # The worker is free at once: the next request is answered without delay.
    started = time.monotonic()
    assert post_json(server.port, {"text": SENTENCE}).status == 200
    assert time.monotonic() - started < TIMEOUT_S
