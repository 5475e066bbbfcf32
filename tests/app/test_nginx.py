"""``spo serve --nginx`` for an exposed service (issue 21): TLS, retrying a request whose worker died,
nginx's own 405s, and settings that only nginx can apply refused without it.

The live tests need Debian's nginx (``.ci/run`` installs nginx-light) and skip, saying why, without it.
"""

from __future__ import annotations

import http.client
import http.server
import re
import shutil
import signal
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest
from click.testing import CliRunner
from flask import Flask

from app.cli import main
from app.core.settings import DEFAULT_MODEL_DIR, Settings
from app.serving.launch import default_pid_file
from app.serving.nginx import nginx_http2, render_nginx_conf
from app.serving.server import secret_warnings
from app.serving.supervisor import find_nginx, has_ipv6
from tests.app.test_live import (
    PROBLEM,
    Answer,
    call,
    free_port,
    post_json,
    wait_ready,
    wait_workers,
)
from tests.app.test_supervisor import (
    BOOT_TIMEOUT_S,
    SPO,
    kill_if_running,
    needs_nginx,
    serve_env,
    spo_reload,
    start,
    stop_cleanly,
)

CLIENTS = 4
MAX_KILLS = 6
# A dozen sentences a request, so the workers' model work outweighs the clients' own (the tiny test
# model answers a short text faster than four client threads can ask): requests queue up at the
# workers, and a kill finds one in flight.
BUSY_TEXT = "李白出生于碎叶城，字太白。" * 12
TOKEN_A = "token-a-0123456789abcdef"
TOKEN_B = "token-b-0123456789abcdef"
OPENSSL = shutil.which("openssl")


def _render(settings: Settings, tmp_path: Path, http2: str | None = None) -> str:
    return render_nginx_conf(
        settings, listen="127.0.0.1:1", upstream="unix:/run/g.sock", prefix=tmp_path, http2=http2
    )


def _nginx_t(text: str, prefix: Path) -> subprocess.CompletedProcess[str]:
    (prefix / "nginx.conf").write_text(text)
    return subprocess.run(
        [str(find_nginx()), "-t", "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=30,
    )


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (a day long) and its key."""
    if OPENSSL is None:
        pytest.skip("openssl is not installed")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


# -- settings only nginx applies -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"SPO_RATE_LIMIT": "10r/s"}, "SPO_RATE_LIMIT=10r/s is applied by nginx"),
        ({"SPO_TLS_CERT": "cert.pem", "SPO_TLS_KEY": "key.pem"}, "SPO_TLS_CERT / SPO_TLS_KEY"),
    ],
)
@pytest.mark.parametrize("check_config", [False, True])
def test_nginx_only_settings_are_refused_without_nginx(
    tmp_path: Path, variables: dict[str, str], named: str, check_config: bool
) -> None:
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("-")
    env = {"SPO_MODEL_DIR": str(DEFAULT_MODEL_DIR)}
    env.update(
        {k: str(tmp_path / v) if k.startswith("SPO_TLS") else v for k, v in variables.items()}
    )
    args = ["serve", *(["--check-config"] if check_config else [])]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    assert "settings that cannot take effect" in result.output
    assert named in result.output and "--nginx" in result.output


# -- the rendered configuration ---------------------------------------------------------------------
def test_nginx_allow_list_agrees_with_the_app(fake_client: Any, tmp_path: Path) -> None:
    """nginx's own 405 (TRACE, say) names the methods the app allows on that path, for every route."""
    app: Flask = fake_client.application
    text = _render(Settings(model_dir=DEFAULT_MODEL_DIR), tmp_path)
    block = re.search(r"map \$request_uri \$spo_allow \{(.*?)\}", text, re.DOTALL)
    assert block is not None
    entries = re.findall(r'^\s*"~([^"]+)"\s+"([^"]+)";', block.group(1), re.M)
    default = re.search(r'^\s*default\s+"([^"]+)";', block.group(1), re.M)
    assert entries and default is not None
    checked = 0
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or "<path" in rule.rule or rule.rule.startswith("/_"):
            continue
        path = re.sub(r"<[^>]+>", "ner", rule.rule)
        allowed = next((a for r, a in entries if re.match(r, path)), default.group(1))
        for uri in (path, path + "?x=1"):
            assert next((a for r, a in entries if re.match(r, uri)), default.group(1)) == allowed
        assert set(allowed.split(", ")) == set(rule.methods or ()), rule.rule
        checked += 1
    assert checked >= 8


def test_nginx_retries_on_a_second_entry_within_the_deadline(tmp_path: Path) -> None:
    text = _render(Settings(model_dir=DEFAULT_MODEL_DIR, request_timeout=2.5), tmp_path)
    assert text.count("server unix:/run/g.sock max_fails=0;") == 2
    assert "proxy_next_upstream error non_idempotent;" in text
    assert "proxy_next_upstream_tries 2;" in text
    assert "proxy_next_upstream_timeout 2500ms;" in text
    no_deadline = Settings(model_dir=DEFAULT_MODEL_DIR, request_timeout=0, timeout=100)
    assert "proxy_next_upstream_timeout 50000ms;" in _render(no_deadline, tmp_path)


@pytest.mark.parametrize("http2", [None, "listen", "directive"])
def test_nginx_tls_lines(tmp_path: Path, http2: str | None) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-")
    key.write_text("-")
    plain = _render(Settings(model_dir=DEFAULT_MODEL_DIR), tmp_path, http2=http2)
    assert "ssl" not in re.findall(r"^\s*listen ([^;]*);", plain, re.M)[0] and "ssl_" not in plain
    text = _render(
        Settings(model_dir=DEFAULT_MODEL_DIR, tls_cert=cert, tls_key=key), tmp_path, http2=http2
    )
    (listen,) = re.findall(r"^\s*listen ([^;]*);", text, re.M)
    assert listen == "127.0.0.1:1 ssl" + (" http2" if http2 == "listen" else "")
    assert f"ssl_certificate {cert};" in text and f"ssl_certificate_key {key};" in text
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in text
    assert ("http2 on;" in text) == (http2 == "directive")


@pytest.mark.parametrize(
    ("listen", "ipv6", "lines"),
    [
        ("8080", True, ["8080 ssl", "[::]:8080 ssl"]),  # every address, both families
        ("8080", False, ["8080 ssl"]),  # a kernel without IPv6: nginx could not bind [::]
        ("127.0.0.1:8080", True, ["127.0.0.1:8080 ssl"]),
        ("[::1]:8080", True, ["[::1]:8080 ssl"]),
    ],
)
def test_nginx_a_bare_port_listens_on_ipv6_too_where_there_is_one(
    tmp_path: Path, listen: str, ipv6: bool, lines: list[str]
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("-")
    key.write_text("-")
    settings = Settings(model_dir=DEFAULT_MODEL_DIR, tls_cert=cert, tls_key=key)
    text = render_nginx_conf(
        settings, listen=listen, upstream="unix:/run/g.sock", prefix=tmp_path, ipv6=ipv6
    )
    assert re.findall(r"^\s*listen ([^;]*);", text, re.M) == lines


@needs_nginx
@pytest.mark.skipif(not has_ipv6(), reason="this machine has no IPv6")
def test_nginx_a_bare_port_answers_on_ipv4_and_ipv6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Upstream, "starts", [])  # its own: another test counts the class's
    run_dir = Path(tempfile.mkdtemp(prefix="spo-nginx-v6-"))
    try:
        run_dir.chmod(0o711)
        prefix, sock = run_dir / "nginx", run_dir / "g.sock"
        prefix.mkdir()
        port = free_port()
        text = render_nginx_conf(
            Settings(model_dir=DEFAULT_MODEL_DIR),
            listen=str(port),
            upstream=f"unix:{sock}",
            prefix=prefix,
            ipv6=True,
        )
        (prefix / "nginx.conf").write_text(text)
        server = _UnixHTTPServer(str(sock), _Upstream)
        sock.chmod(0o777)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        nginx = subprocess.Popen(
            [str(find_nginx()), "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            statuses = {}
            for host in ("127.0.0.1", "::1"):
                deadline = time.monotonic() + 30
                while host not in statuses:
                    conn = http.client.HTTPConnection(host, port, timeout=10)
                    try:
                        conn.request("GET", "/readyz")
                        statuses[host] = conn.getresponse().status
                    except OSError:
                        assert time.monotonic() < deadline and nginx.poll() is None
                        time.sleep(0.1)
                    finally:
                        conn.close()
        finally:
            nginx.terminate()
            nginx.wait(30)
            server.shutdown()
            server.server_close()
        assert statuses == {"127.0.0.1": 200, "::1": 200}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_nginx_tls_path_nginx_cannot_take(tmp_path: Path) -> None:
    odd = tmp_path / "my cert;.pem"
    odd.write_text("-")
    settings = Settings(model_dir=DEFAULT_MODEL_DIR, tls_cert=odd, tls_key=odd)
    with pytest.raises(ValueError, match="SPO_TLS_CERT: nginx cannot be given"):
        _render(settings, tmp_path)


@needs_nginx
def test_nginx_tls_conf_is_valid(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    version = subprocess.run([str(find_nginx()), "-V"], capture_output=True, text=True).stderr
    settings = Settings(model_dir=DEFAULT_MODEL_DIR, tls_cert=cert, tls_key=key)
    result = _nginx_t(_render(settings, tmp_path, http2=nginx_http2(version)), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warn" not in result.stderr, result.stderr  # no deprecated http2 syntax, say


@needs_nginx
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_nginx_access_lines_follow_the_log_settings(tmp_path: Path, log_format: str) -> None:
    """nginx's own access lines are in SPO_LOG_FORMAT, on stdout, off with SPO_ACCESS_LOG; nginx
    writes no log file (its run directory is a small tmpfs in a container)."""
    for access in (True, False):
        settings = Settings(model_dir=DEFAULT_MODEL_DIR, log_format=log_format, access_log=access)
        text = _render(settings, tmp_path)
        result = _nginx_t(text, tmp_path)
        assert result.returncode == 0, result.stderr
        logs = re.findall(r"^\s*((?:access|error)_log [^;]*);", text, re.M)
        assert logs == [
            "error_log stderr warn",
            "access_log /dev/stdout spo_nginx if=$spo_nginx_answered"
            if access
            else "access_log off",
        ]
        assert ("escape=json" in text) == (log_format == "json")


# -- live -----------------------------------------------------------------------------------------
def https_call(
    port: int, context: ssl.SSLContext, method: str, path: str, body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:  # fmt: skip
    return call(port, method, path, body, headers, tls=context)


def wait_https_ready(port: int, context: ssl.SSLContext, process: Any, log: Path) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"spo serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if https_call(port, context, "GET", "/readyz").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"not ready after {BOOT_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


@needs_nginx
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nginx_exposed_service_https_tokens_file_and_reload(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """TLS (HTTP/2 where nginx has it) with a certificate made here, tokens from a file, the pages
    behind them; a reload (spo reload) reads the edited file: the new token in, the old one out."""
    cert, key = make_certificate(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the API's tokens\n{TOKEN_A}\n")
    port = free_port()
    log = tmp_path / "serve.log"
    env = {
        **serve_env(triples_model_dir),
        "SPO_TLS_CERT": str(cert),
        "SPO_TLS_KEY": str(key),
        "SPO_AUTH_TOKENS_FILE": str(tokens),
        "SPO_PAGES": "auth",
    }
    context = ssl.create_default_context(cafile=str(cert))
    body = b'{"text": "\xe6\x9d\x8e\xe7\x99\xbd"}'
    json_type = {"Content-Type": "application/json"}

    def extract(token: str) -> int:
        headers = {**json_type, "Authorization": f"Bearer {token}"}
        return https_call(port, context, "POST", "/v1/extract", body, headers).status

    process = start(port, env, log)
    try:
        wait_https_ready(port, context, process, log)
        assert extract(TOKEN_A) == 200
        assert extract(TOKEN_B) == 401
        for path in ("/", "/docs/", "/openapi.json"):
            assert https_call(port, context, "GET", path).status == 401, path
        page = https_call(port, context, "GET", "/", headers={"Authorization": f"Bearer {TOKEN_A}"})
        assert page.status == 200 and page.headers["x-content-type-options"] == "nosniff"
        # nginx's own 405 names POST for both extract routes (it named GET for the model's route).
        named_path = f"/v1/models/{triples_model_dir.name}/extract"
        for path in ("/v1/extract", named_path):
            answer = https_call(port, context, "TRACE", path)
            assert answer.status == 405 and answer.headers["allow"] == "OPTIONS, POST", path
        named = https_call(
            port, context, "POST", named_path, body,
            {**json_type, "Authorization": f"Bearer {TOKEN_A}"},
        )  # fmt: skip
        assert named.status == 200, named.body
        # Plain HTTP on the TLS port: a problem, not nginx's HTML page.
        plain = call(port, "GET", "/healthz")
        assert plain.status == 400 and plain.mimetype == PROBLEM
        # HTTP/2 offered by ALPN where this nginx has it.
        version = subprocess.run([str(find_nginx()), "-V"], capture_output=True, text=True).stderr
        alpn = ssl.create_default_context(cafile=str(cert))
        alpn.set_alpn_protocols(["h2", "http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            alpn.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            negotiated = tls.selected_alpn_protocol()
        assert negotiated == ("h2" if nginx_http2(version) else "http/1.1")
        # Rotate: B in, A out; spo reload; the new workers read the file.
        tokens.write_text(f"{TOKEN_B}\n")
        assert extract(TOKEN_A) == 200  # the running workers keep what they read
        spo_reload(port, log)
        time.sleep(1)  # the old worker finishes and exits; connections go to the new one
        assert [extract(TOKEN_B) for _ in range(5)] == [200] * 5
        assert [extract(TOKEN_A) for _ in range(5)] == [401] * 5
        # An emptied file refuses the reload; the workers keep serving B.
        tokens.write_text("# nothing\n")
        subprocess.run([str(SPO), "reload", "--nginx", f"127.0.0.1:{port}"], check=True, timeout=30)
        deadline = time.monotonic() + 30
        while "reload refused" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "reload refused: invalid settings" in log.read_text()
        assert "SPO_AUTH_TOKENS_FILE: no token in" in log.read_text()
        assert extract(TOKEN_B) == 200
        stop_cleanly(process, log)
    finally:
        kill_if_running(process)
    assert TOKEN_A not in log.read_text() and TOKEN_B not in log.read_text()


def _served_certificate(port: int, context: ssl.SSLContext) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


@needs_nginx
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nginx_takes_a_renewed_certificate_without_a_restart(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """The certificate and key files are replaced (as a renewal, or a Kubernetes Secret, does): within
    seconds nginx serves the new pair, with no failed request and no restart; a broken pair is
    refused by nginx, which keeps serving the last good one."""
    cert, key = make_certificate(tmp_path)
    (tmp_path / "new").mkdir()
    new_cert, new_key = make_certificate(tmp_path / "new")
    both = tmp_path / "both.pem"
    both.write_text(cert.read_text() + new_cert.read_text())
    context = ssl.create_default_context(cafile=str(both))
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**serve_env(triples_model_dir), "SPO_TLS_CERT": str(cert), "SPO_TLS_KEY": str(key)}
    statuses: list[int | str] = []
    stop_clients = threading.Event()

    def client() -> None:
        while not stop_clients.is_set():
            try:
                statuses.append(https_call(port, context, "GET", "/readyz").status)
            except OSError as exc:
                statuses.append(type(exc).__name__)
            time.sleep(0.02)

    def served_after(timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        der = _served_certificate(port, context)
        while der != new_der and time.monotonic() < deadline:
            time.sleep(0.2)
            der = _served_certificate(port, context)
        return der

    new_der = ssl.PEM_cert_to_DER_cert(new_cert.read_text())
    old_der = ssl.PEM_cert_to_DER_cert(cert.read_text())
    process = start(port, env, log)
    try:
        wait_https_ready(port, context, process, log)
        assert _served_certificate(port, context) == old_der
        thread = threading.Thread(target=client)
        thread.start()
        try:
            # A broken pair first (a key that is not the certificate's): nginx keeps the old one.
            key.rename(tmp_path / "old-key.pem")
            new_key.rename(key)
            deadline = time.monotonic() + 15
            while "reloading nginx" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)
            assert _served_certificate(port, context) == old_der
            # The matching certificate: served within seconds.
            new_cert.rename(cert)
            assert served_after(15) == new_der
        finally:
            stop_clients.set()
            thread.join(30)
        assert process.poll() is None
        assert log.read_text().count("the TLS certificate or key changed") == 2
        assert statuses and set(statuses) == {200}, Counter(statuses)
        stop_cleanly(process, log)
    finally:
        kill_if_running(process)


def _retried(log_text: str) -> int:
    """How many requests nginx saw die with their worker (it logs each, then sends it to another)."""
    return len(re.findall(r"\[error\].* from upstream, .*\"POST /v1/extract ", log_text))


@needs_nginx
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nginx_retries_the_requests_of_a_killed_worker(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """2 workers, 4 clients sending without pause; SIGKILL a worker, and once its replacement serves
    the other one: every request is answered 200 (nginx retries what a dead worker held on the other
    upstream entry). A kill can still fall between two requests; the test kills on (up to
    ``MAX_KILLS``) until nginx has logged at least one retried request, so the retry is exercised.

    One exception, which no proxy can hide: a kill that lands after the worker wrote its answer's
    header and before it wrote the body (gunicorn sends them in two writes). nginx has already passed
    the header on, so it cannot retry; the client sees a body shorter than its Content-Length
    (``IncompleteRead``), never a wrong answer. At most one such request per kill is allowed."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**serve_env(triples_model_dir), "SPO_WORKERS": "2", "SPO_MAX_REQUESTS": "0"}
    process = start(port, env, log)
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    truncated: list[float] = []  # when each truncated answer was seen
    kills: list[float] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                answer = post_json(port, {"text": f"{BUSY_TEXT}{n}-{i}"})
                outcome = str(answer.status)
                if answer.status != 200:
                    failures.append(f"{answer.status} {answer.body[:200]!r}")
            except http.client.IncompleteRead:
                outcome = "truncated"
                truncated.append(time.monotonic())
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
                failures.append(repr(exc))
            with lock:
                outcomes[outcome] += 1

    try:
        wait_ready(port, process, log, BOOT_TIMEOUT_S)
        wait_workers(log, 2, BOOT_TIMEOUT_S)
        master = int(default_pid_file(f"127.0.0.1:{port}").read_text())
        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(2)
        before_kills = sum(outcomes.values())
        while len(kills) < 2 or (not _retried(log.read_text()) and len(kills) < MAX_KILLS):
            oldest = min(psutil.Process(master).children(), key=lambda p: p.create_time())
            kills.append(time.monotonic())
            oldest.send_signal(signal.SIGKILL)
            # Until the replacement serves (it loads the model), then a little longer.
            wait_workers(log, 2 + len(kills), BOOT_TIMEOUT_S)
            time.sleep(1)
        after_kills = sum(outcomes.values())
        time.sleep(2)
        stop.set()
        for thread in threads:
            thread.join(60)
        stop_cleanly(process, log)
    finally:
        stop.set()
        kill_if_running(process)
    output = log.read_text()
    retried = _retried(output)
    print(
        f"answered {dict(outcomes)}, {before_kills} before the first kill, {after_kills} by the time "
        f"the last replacement was ready; {len(kills)} kills; nginx saw {retried} request(s) die "
        "with their worker"
    )
    assert not failures, f"{len(failures)} failed: {failures[:5]}\n{output[-3000:]}"
    # A truncated answer only right after a kill (the one a killed worker was writing), one per kill.
    assert len(truncated) <= len(kills)
    assert all(any(0 <= t - k < 5 for k in kills) for t in truncated), (truncated, kills)
    assert retried >= 1, (
        f"none of {len(kills)} kills landed on a request: the retry was not exercised"
    )
    assert outcomes["200"] > after_kills > before_kills > 0


def test_nginx_secret_files_readable_by_all_are_warned_about(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A}\n")
    env = {"SPO_MODEL_DIR": str(DEFAULT_MODEL_DIR), "SPO_AUTH_TOKENS_FILE": str(tokens)}
    tokens.chmod(0o644)
    warned = secret_warnings(Settings.from_env(env))
    assert len(warned) == 1 and "SPO_AUTH_TOKENS_FILE" in warned[0] and "0644" in warned[0]
    assert TOKEN_A not in warned[0]
    tokens.chmod(0o440)
    assert secret_warnings(Settings.from_env(env)) == []


@needs_nginx
def test_nginx_check_config_tests_what_a_start_would_give_nginx(tmp_path: Path) -> None:
    """--check-config with --nginx checked gunicorn's side only (and named 127.0.0.1:8000): a
    rate limit with SPO_RATE_BURST=0 passed it, and the start then failed (nginx refuses
    "burst=0"; no burst is now no burst parameter)."""
    import sys

    port = free_port()
    env = {
        "SPO_MODEL_DIR": str(DEFAULT_MODEL_DIR),
        "SPO_LOAD_MODE": "background",
        "SPO_RATE_LIMIT": "10r/s",
        "SPO_RATE_BURST": "0",
        "PATH": "/usr/sbin:/usr/bin:/bin",
        "TMPDIR": str(tmp_path),
    }
    spo = str(Path(sys.executable).with_name("spo"))
    args = [spo, "serve", "--nginx", f"127.0.0.1:{port}", "--check-config"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"nginx accepts its configuration for 127.0.0.1:{port}" in result.stdout
    assert f"127.0.0.1:{port} (nginx)" in result.stderr
    assert list(tmp_path.iterdir()) == []  # the throw-away prefix is gone
    spaced = tmp_path / "tls dir"
    spaced.mkdir()
    for name in ("cert.pem", "key.pem"):
        (spaced / name).write_text("-")
    tls = {"SPO_TLS_CERT": str(spaced / "cert.pem"), "SPO_TLS_KEY": str(spaced / "key.pem")}
    refused = CliRunner().invoke(
        main, ["serve", "--nginx", str(port), "--check-config"], env={**env, **tls}
    )
    assert refused.exit_code == 2 and "SPO_TLS_CERT: nginx cannot be given" in refused.output
    no_host = CliRunner().invoke(main, ["serve", "--nginx", f":{port}"], env=env)
    assert no_host.exit_code == 2 and "HOST:PORT or PORT" in no_host.output
    # nginx's pid, temp and socket paths live under TMPDIR: one with a space broke its "pid" line.
    import tempfile

    monkey = pytest.MonkeyPatch()
    monkey.setattr(tempfile, "tempdir", str(spaced))
    try:
        spaced_tmp = CliRunner().invoke(
            main, ["serve", "--nginx", str(port), "--check-config"], env=env
        )
    finally:
        monkey.undo()
    assert spaced_tmp.exit_code == 2 and "(TMPDIR): use a TMPDIR of" in spaced_tmp.output


class _Upstream(http.server.BaseHTTPRequestHandler):
    """gunicorn's stand-in: every answer carries X-Request-ID, as the app's and the worker's do."""

    starts: ClassVar[list[str | None]] = []  # the X-Request-Start nginx passed on, a request each

    def do_GET(self) -> None:
        self.starts.append(self.headers.get("X-Request-Start"))
        self.send_response(200)
        self.send_header("X-Request-ID", "from-upstream")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        conn, _ = self.socket.accept()
        return conn, ("", 0)  # BaseHTTPRequestHandler wants an address pair


@needs_nginx
def test_nginx_logs_every_request_gunicorn_has_no_line_for(tmp_path: Path) -> None:
    """nginx's access log has what gunicorn's cannot: what nginx answered itself, and what got no
    answer from gunicorn (its socket not there yet: a 503 that neither log had); an answer of
    gunicorn's (its X-Request-ID) is left to gunicorn's log, so no request is logged twice."""
    run_dir = Path(tempfile.mkdtemp(prefix="spo-nginx-log-"))
    try:
        run_dir.chmod(0o711)  # nginx's workers (not root) reach the socket, as in a run
        prefix, sock = run_dir / "nginx", run_dir / "g.sock"
        prefix.mkdir()
        port = free_port()
        text = render_nginx_conf(
            Settings(model_dir=DEFAULT_MODEL_DIR),
            listen=f"127.0.0.1:{port}",
            upstream=f"unix:{sock}",
            prefix=prefix,
        )
        (prefix / "nginx.conf").write_text(text)
        out = (tmp_path / "stdout").open("wb")
        nginx = subprocess.Popen(
            [str(find_nginx()), "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
        server = None
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    down = call(port, "GET", "/healthz")
                    break
                except OSError:
                    assert time.monotonic() < deadline and nginx.poll() is None
                    time.sleep(0.1)
            assert down.status == 503 and down.mimetype == PROBLEM
            server = _UnixHTTPServer(str(sock), _Upstream)
            sock.chmod(0o777)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            before = time.time()
            answered = call(port, "GET", "/readyz", headers={"X-Request-Start": "t=1"})
            assert answered.status == 200 and answered.headers["x-request-id"] == "from-upstream"
            # nginx dates the request itself (the deadline counts gunicorn's queue), over a
            # client's own header.
            (start,) = _Upstream.starts
            assert start is not None and re.fullmatch(r"t=\d+\.\d{3}", start), start
            assert before - 1 <= float(start[2:]) <= time.time() + 1
            assert call(port, "TRACE", "/v1/extract").status == 405
            lines: list[str] = []
            while len(lines) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
                lines = (tmp_path / "stdout").read_text().splitlines()
        finally:
            nginx.terminate()
            nginx.wait(30)
            out.close()
            if server is not None:
                server.shutdown()
                server.server_close()
        assert [line.split("] ", 1)[1] for line in lines] == [
            "127.0.0.1 GET /healthz 503",
            "127.0.0.1 TRACE /v1/extract 405",
        ], lines
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
