"""Live tests: ``spo serve`` (gunicorn, 2 workers, small ``max_requests``) behind nginx on loopback.

One stack per module (worker boot is ~10 s on 2 busy cores). Tests through nginx skip, saying why, when
nginx is not installed (``.ci/run`` installs it, so CI always runs them).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from app.serving.nginx import render_nginx_conf

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

PROBLEM = "application/problem+json"
NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
)
MAX_REQUESTS = 60
JITTER = 10
BOOT_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def mimetype(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
    tls: ssl.SSLContext | None = None,
) -> Answer:
    """One request to 127.0.0.1:``port``, over TLS with ``tls``."""
    conn = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
        if tls is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    )
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Answer(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


def post_json(port: int, doc: Any, **headers: str) -> Answer:
    return call(
        port,
        "POST",
        "/v1/extract",
        json.dumps(doc).encode(),
        {"Content-Type": "application/json", **headers},
    )


def raw_exchange(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Send bytes as they are; return everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def wait_ready(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if call(port, "GET", "/readyz", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"server not ready after {timeout}s:\n{log.read_text()[-3000:]}")


def start_serve(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``spo serve`` on ``port`` with ``env``, stdout and stderr into ``log``."""
    spo = Path(sys.executable).with_name("spo")
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(spo), "serve", "--bind", f"127.0.0.1:{port}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_workers(log: Path, n: int, timeout: float) -> None:
    """Until ``n`` workers have logged that their model is warm (readyz answers after the first)."""
    deadline = time.monotonic() + timeout
    while log.read_text().count("ready: model loaded") < n:
        if time.monotonic() > deadline:
            pytest.fail(
                f"fewer than {n} workers ready after {timeout}s:\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.3)


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class Stack:
    gunicorn_port: int
    nginx_port: int | None
    settings: Settings
    gunicorn_log: Path

    @property
    def port(self) -> int:
        """nginx's port (tests through nginx skip when it is missing)."""
        if self.nginx_port is None:
            pytest.skip(
                "nginx is not installed (.ci/run installs nginx-light): live nginx test skipped"
            )
        return self.nginx_port


@pytest.fixture(scope="module")
def stack(
    triples_model_dir: Path, entities_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("live")
    gunicorn_port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        # Two models, so every live test (schemathesis too) runs the multi-model service.
        "SPO_MODELS": f"tiny={triples_model_dir},ner={entities_model_dir}",
        "SPO_WORKERS": "2",
        "SPO_THREADS": "4",
        "SPO_MAX_REQUESTS": str(MAX_REQUESTS),
        "SPO_MAX_REQUESTS_JITTER": str(JITTER),
        "SPO_TIMEOUT": str(BOOT_TIMEOUT_S),
        "SPO_LOG_FORMAT": "json",
    }
    settings = Settings.from_env(env)
    log = run_dir / "gunicorn.log"
    gunicorn = start_serve(gunicorn_port, env, log)
    nginx: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(gunicorn_port, gunicorn, log, BOOT_TIMEOUT_S)
        wait_workers(log, 2, BOOT_TIMEOUT_S)
        nginx_port = None
        if NGINX is not None:
            nginx_port = free_port()
            nginx = start_nginx(settings, nginx_port, gunicorn_port)
        yield Stack(gunicorn_port, nginx_port, settings, log)
    finally:
        if nginx is not None:
            stop_nginx(nginx)
        stop(gunicorn)


def stop_nginx(nginx: subprocess.Popen[bytes]) -> None:
    stop(nginx, signal.SIGQUIT)
    prefix = Path(str(nginx.args[2]))  # [nginx, -p, PREFIX, ...]
    shutil.rmtree(prefix, ignore_errors=True)


def start_nginx(settings: Settings, port: int, upstream_port: int) -> subprocess.Popen[bytes]:
    """nginx on ``port`` in front of gunicorn, with ``render_nginx_conf(settings)``.

    Its prefix is a fresh directory under /tmp that its workers can reach: started as root, they
    run as ``nobody`` (never root), and pytest's own temporary directories are private to root.
    """
    assert NGINX is not None
    prefix = Path(tempfile.mkdtemp(prefix="spo-nginx-"))
    prefix.chmod(0o755)
    conf = prefix / "nginx.conf"
    conf.write_text(
        render_nginx_conf(
            settings,
            listen=f"127.0.0.1:{port}",
            upstream=f"127.0.0.1:{upstream_port}",
            prefix=prefix,
        )
    )
    with (prefix / "stderr.log").open("wb") as err:
        nginx = subprocess.Popen(
            [NGINX, "-p", str(prefix), "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    wait_ready(port, nginx, prefix / "error.log", 20)
    return nginx


# -- gunicorn itself -----------------------------------------------------------------------------
def test_live_gunicorn_serves_and_logs_json(stack: Stack) -> None:
    answer = post_json(stack.gunicorn_port, {"texts": ["北京", "李白出生于碎叶城。"]})
    assert answer.status == 200
    assert len(answer.json()["results"]) == 2
    assert answer.headers["x-request-id"]
    lines = [
        json.loads(line) for line in stack.gunicorn_log.read_text().splitlines() if line[:1] == "{"
    ]
    messages = [line["message"] for line in lines]
    assert any("loaded and warmed" in m for m in messages)
    assert sum("ready: model loaded" in m for m in messages) >= 2  # one per worker
    assert any(m.startswith("127.0.0.1") and "rid=" in m for m in messages)  # access log


def test_live_two_models_each_loaded_once_per_worker_and_addressed_by_name(stack: Stack) -> None:
    listed = call(stack.gunicorn_port, "GET", "/v1/models")
    assert listed.status == 200
    body = listed.json()
    assert body["default"] == "tiny"
    assert [(m["name"], m["task"], m["state"]) for m in body["models"]] == [
        ("tiny", "triples", "ready"),
        ("ner", "entities", "ready"),
    ]
    ready = call(stack.gunicorn_port, "GET", "/readyz").json()
    assert set(ready["models"]) == {"tiny", "ner"}
    ner = call(
        stack.gunicorn_port,
        "POST",
        "/v1/models/ner/extract",
        json.dumps({"texts": ["李白出生于碎叶城。", "北京"]}).encode(),
        {"Content-Type": "application/json"},
    )
    assert ner.status == 200 and ner.json()["model"]["task"] == "entities"
    assert all(r["triples"] == [] for r in ner.json()["results"])
    unknown = call(stack.gunicorn_port, "GET", "/v1/models/nope")
    assert unknown.status == 404 and unknown.json()["code"] == "unknown_model"
    # Each worker loaded each model once (2 workers x 2 models), not again per request.
    messages = stack.gunicorn_log.read_text().splitlines()
    for name in ("tiny-triples", "tiny-entities"):
        assert sum(f"model {name} " in m and "loaded and warmed" in m for m in messages) >= 2


# -- through nginx -------------------------------------------------------------------------------
def test_live_nginx_extract_and_request_ids(stack: Stack) -> None:
    port = stack.port
    answer = post_json(port, {"text": "李白出生于碎叶城。"})
    assert answer.status == 200
    assert answer.json()["model"]["name"] == "tiny-triples"
    generated = answer.headers["x-request-id"]
    assert len(generated) == 32 and int(generated, 16) >= 0  # nginx's $request_id
    assert (
        post_json(port, {"text": "a"}, **{"X-Request-ID": "client-42"}).headers["x-request-id"]
        == "client-42"
    )
    insane = post_json(port, {}, **{"X-Request-ID": 'a"b'})
    assert insane.status == 422
    assert insane.headers["x-request-id"] != 'a"b'
    assert insane.json()["request_id"] == insane.headers["x-request-id"]
    assert call(port, "GET", "/readyz").status == 200
    assert call(port, "GET", "/v1/model").json()["task"] == "triples"


def test_live_nginx_rate_limit_answers_429_problems(stack: Stack) -> None:
    assert stack.port  # skips without nginx
    port = free_port()
    limited = start_nginx(
        stack.settings.replace(rate_limit="1r/s", rate_burst=2), port, stack.gunicorn_port
    )
    try:
        answers = [call(port, "GET", "/v1/model") for _ in range(8)]
        statuses = [a.status for a in answers]
        assert statuses[:3] == [200, 200, 200]  # the rate, plus a burst of 2
        refused = [a for a in answers if a.status == 429]
        assert len(refused) >= 4, statuses
        assert refused[0].mimetype == PROBLEM
        assert refused[0].json()["code"] == "rate_limited"
        assert refused[0].headers["retry-after"] == "1"
        assert all(call(port, "GET", "/healthz").status == 200 for _ in range(5))  # never limited
        # The path as the app routes it is limited, however it is spelled.
        time.sleep(3)  # the budget refills
        for spelling in ("/%761/model", "//v1/model", "/v1/./model"):
            statuses = [call(port, "GET", spelling).status for _ in range(8)]
            assert statuses.count(429) >= 4, (spelling, statuses)
            time.sleep(3)
    finally:
        stop_nginx(limited)


MALFORMED = [
    pytest.param("POST", "/v1/extract", b"{", "application/json", 400, "invalid_json", id="json"),
    pytest.param("POST", "/v1/extract", b'{"text":"a"}', "text/plain", 415,
                 "unsupported_media_type", id="content-type"),
    pytest.param("POST", "/v1/extract", b'{"text":"\\ud800"}', "application/json", 422,
                 "invalid_input", id="surrogate"),
    pytest.param("POST", "/v1/extract", b'{"text":"a\\u0000"}', "application/json", 422,
                 "invalid_input", id="nul"),
    pytest.param("POST", "/v1/extract", b'{"texts":[]}', "application/json", 422, "empty_texts",
                 id="empty-texts"),
    pytest.param("POST", "/v1/extract", b'{"texts":' + json.dumps(["a"] * 65).encode() + b"}",
                 "application/json", 422, "too_many_texts", id="too-many"),
    pytest.param("POST", "/v1/extract", b'{"text":"' + b"a" * 10_001 + b'"}',
                 "application/json", 422, "text_too_long", id="too-long"),
    pytest.param("POST", "/v1/extract", b'{"text":"' + b"a" * (1 << 20) + b'"}',
                 "application/json", 413, "body_too_large", id="body-too-large"),
    pytest.param("GET", "/nowhere", None, None, 404, "not_found", id="404"),
    pytest.param("PUT", "/v1/extract", b"{}", "application/json", 405, "method_not_allowed",
                 id="405"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "content_type", "status", "code"), MALFORMED)
def test_live_nginx_malformed_requests_get_problems(
    stack: Stack,
    method: str,
    path: str,
    body: bytes | None,
    content_type: str | None,
    status: int,
    code: str,
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    answer = call(stack.port, method, path, body, headers)
    assert answer.status == status, answer.body[:300]
    assert answer.mimetype == PROBLEM
    assert answer.json()["code"] == code
    assert answer.json()["request_id"] == answer.headers["x-request-id"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"POST /v1/extract HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + b"100000\r\n" + b"a" * 0x100000
                     + b"\r\n10\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n", id="chunked-over-limit"),
        pytest.param(b"POST /v1/extract HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n{}", id="two-lengths"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 70_000
                     + b"\r\n\r\n", id="huge-header"),
        pytest.param(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", id="long-uri"),
        pytest.param(b"BLAH\r\n\r\n", id="garbage"),
        pytest.param(b"GET /healthz HTTP/1.1\r\n\r\n", id="no-host"),
    ],
)  # fmt: skip
def test_live_nginx_broken_http_never_5xx(stack: Stack, request_bytes: bytes) -> None:
    answer = raw_exchange(stack.port, request_bytes)
    assert answer, "connection dropped without an answer"
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    assert 400 <= int(status_line.split()[1]) < 500, status_line
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert headers["content-type"] == PROBLEM, answer[:500]
    assert json.loads(body)["request_id"] == headers["x-request-id"]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        pytest.param(b"POST /v1/extract HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 501,
                     id="gzip-chunked"),
        pytest.param(b"POST /v1/extract HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: identity\r\nContent-Length: 2\r\n\r\n{}", 501,
                     id="identity"),
        pytest.param(b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505, id="http-2.0"),
    ],
)  # fmt: skip
def test_live_nginx_unimplemented_http_is_a_problem_never_html(
    stack: Stack, request_bytes: bytes, status: int
) -> None:
    """What nginx refuses with a 5xx of its own (501, 505) is problem+json too, not its HTML page."""
    answer = raw_exchange(stack.port, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    assert int(status_line.split()[1]) == status, answer[:500]
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert headers["content-type"] == PROBLEM, answer[:500]
    problem = json.loads(body)
    assert problem["status"] == status and problem["code"] == "bad_request"
    assert problem["request_id"] == headers["x-request-id"]


# -- schemathesis ----------------------------------------------------------------------------
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "unsupported_method",
        "allow_header_conformance",
    ]
)


@pytest.mark.slow
def test_live_schemathesis_finds_no_5xx_and_no_schema_violation(
    stack: Stack, tmp_path: Path
) -> None:
    st = Path(sys.executable).with_name("st")
    config = tmp_path / "schemathesis.toml"
    # 413 is a fine answer to an over-long text too: nginx refuses the body before the app sees it.
    config.write_text(
        "[checks.negative_data_rejection]\n"
        "expected-statuses = [400, 401, 404, 405, 406, 409, 413, 415, 422, 428, 429]\n"
    )
    result = subprocess.run(
        [
            str(st),
            "--config-file",
            str(config),
            "run",
            f"http://127.0.0.1:{stack.port}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            "25",
            "--seed",
            "4",
            "--workers",
            "2",
            "--request-timeout",
            "60",
            "--max-time",
            "45",
            "--suppress-health-check",
            "too_slow",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# -- load with worker recycling ------------------------------------------------------------
@pytest.mark.slow
def test_live_load_with_worker_recycling_drops_nothing(stack: Stack) -> None:
    """Concurrency 8 through nginx until 3 x (max_requests + jitter) requests are answered (a
    2-minute cap, for a loaded machine): zero failures while workers recycle every 60-70 requests."""
    port = stack.port
    restarts_before = stack.gunicorn_log.read_text().count("Autorestarting worker")
    deadline = time.monotonic() + 120
    target = 3 * (MAX_REQUESTS + JITTER)
    budget = threading.Semaphore(target)
    failures: list[str] = []
    counts = [0]
    lock = threading.Lock()
    texts = ["李白出生于碎叶城，他的妻子是许氏。", "《红楼梦》的作者是曹雪芹。", "北京" * 20]

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < deadline and budget.acquire(blocking=False):
            i += 1
            doc = {"texts": texts[: 1 + (i + k) % 3]} if i % 2 else {"text": texts[i % 3]}
            try:
                answer = post_json(port, doc)
                ok = answer.status == 200 and len(answer.json()["results"]) == len(
                    doc.get("texts", [0])
                )
                if not ok:
                    failures.append(f"{answer.status} {answer.body[:200]!r}")
            except Exception as exc:
                failures.append(repr(exc))
            with lock:
                counts[0] += 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    restarts = stack.gunicorn_log.read_text().count("Autorestarting worker") - restarts_before
    assert not failures, f"{len(failures)} of {counts[0]} failed: {failures[:5]}"
    # Past 2 x (max_requests + jitter) requests, some worker must have been recycled.
    assert counts[0] > 2 * (MAX_REQUESTS + JITTER), f"only {counts[0]} requests in 120 s"
    assert restarts >= 1, "no worker was recycled: the test proved nothing"


# -- micro-batching under real gunicorn ----------------------------------------------------------
@pytest.mark.slow
def test_live_microbatch_with_worker_recycling_drops_nothing(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """Micro-batching on, 1 worker recycled every 40-45 requests, concurrency 8 straight to gunicorn
    for up to 20 s: every answer is right, and each retiring worker drains its batcher and logs its
    counters (``worker_exit``), which show requests combined."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        "SPO_MODEL_DIR": str(triples_model_dir),
        "SPO_WORKERS": "1",
        "SPO_THREADS": "8",
        "SPO_MICROBATCH_WAIT_MS": "20",
        "SPO_MAX_REQUESTS": "40",
        "SPO_MAX_REQUESTS_JITTER": "5",
        "SPO_TIMEOUT": str(BOOT_TIMEOUT_S),
        "SPO_ACCESS_LOG": "0",
    }
    log = tmp_path / "gunicorn.log"
    server = start_serve(port, env, log)
    texts = [f"张{i}出生于北京，他的妻子是李{i}。" for i in range(8)]
    failures: list[str] = []
    counts = [0]
    lock = threading.Lock()
    try:
        wait_ready(port, server, log, BOOT_TIMEOUT_S)
        deadline = time.monotonic() + 20
        budget = threading.Semaphore(400)

        def client(k: int) -> None:
            while time.monotonic() < deadline and budget.acquire(blocking=False):
                doc = {"texts": [texts[k], texts[(k + 1) % 8]]}
                try:
                    answer = post_json(port, doc)
                    results = answer.json().get("results") if answer.status == 200 else None
                    if not results or len(results) != 2:
                        failures.append(f"{answer.status} {answer.body[:200]!r}")
                    else:
                        for text, result in zip(doc["texts"], results, strict=True):
                            for entity in result["entities"]:
                                if text[entity["start"] : entity["end"]] != entity["text"]:
                                    failures.append(f"result of another text: {entity}")
                except Exception as exc:
                    failures.append(repr(exc))
                with lock:
                    counts[0] += 1

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(client, range(8)))
    finally:
        stop(server)
    output = log.read_text()
    assert not failures, f"{len(failures)} of {counts[0]} failed: {failures[:5]}"
    assert output.count("Autorestarting worker") >= 1, "no worker was recycled: proved nothing"
    per_call = [
        float(m) for m in re.findall(r"micro-batching: .*?([\d.]+) requests per call", output)
    ]
    assert per_call, output[-3000:]
    assert max(per_call) > 1, per_call
