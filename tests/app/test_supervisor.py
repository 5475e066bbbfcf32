"""``spo serve --nginx``: nginx in front of gunicorn on a private socket, supervised, stopped cleanly.

The live tests need Debian's nginx (``.ci/run`` installs nginx-light) and skip, saying why, without it.
The signal handling itself is tested with two stand-in processes, without nginx or TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from app.core.rundirs import OWNER_FILE, owner_line
from app.serving.launch import default_pid_file
from app.serving.supervisor import find_nginx
from tests.app.test_live import PROBLEM, call, free_port, post_json, wait_ready
from tests.app.test_master import corrupt_graph

BOOT_TIMEOUT_S = 120
needs_nginx = pytest.mark.skipif(
    find_nginx() is None, reason="nginx is not installed (.ci/run installs nginx-light)"
)
SPO = Path(sys.executable).with_name("spo")


def spo_reload(port: int, log: Path) -> None:
    """``spo reload`` the service behind nginx on ``port``; wait until its log says it is done."""
    reload = subprocess.run(
        [str(SPO), "reload", "--nginx", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert reload.returncode == 0, reload.stderr
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while "reload done" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "reload done" in log.read_text(), log.read_text()[-3000:]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPO), "serve", "--nginx", f"127.0.0.1:{port}"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_cleanly(process: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, as a container stop sends it: the server must be gone with status 0 within 60 s."""
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, log.read_text()[-3000:]


def kill_if_running(process: subprocess.Popen[Any]) -> None:
    """On the way out of a test that failed before stopping its server: kill it."""
    if process.poll() is None:
        process.kill()
        process.wait()


def run_dir_of(log: Path) -> Path:
    match = re.search(r"gunicorn on unix:(\S+)/gunicorn\.sock", log.read_text())
    assert match, log.read_text()[-2000:]
    return Path(match.group(1))


def serve_env(model_dir: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        "SPO_MODEL_DIR": str(model_dir),
        "SPO_WORKERS": "1",
        "SPO_TIMEOUT": str(BOOT_TIMEOUT_S),
        "SPO_MAX_BODY_BYTES": "4096",
    }


@needs_nginx
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_supervisor_serves_through_nginx_reloads_and_stops_cleanly(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    process = start(port, serve_env(triples_model_dir), log)
    pid_file = default_pid_file(f"127.0.0.1:{port}")
    try:
        wait_ready(port, process, log, BOOT_TIMEOUT_S)
        # Polls that found no worker yet (503: gunicorn not listening) reached no app: nginx's.
        booting = [line for line in log.read_text().splitlines() if "nginx.access" in line]
        assert all(" GET /readyz " in line for line in booting), booting
        run_dir = run_dir_of(log)
        assert (run_dir / "gunicorn.sock").is_socket()
        assert run_dir.stat().st_mode & 0o777 == 0o711
        assert (run_dir / OWNER_FILE).read_text() == owner_line(process.pid)
        nginx_pid = int((run_dir / "nginx" / "nginx.pid").read_text())
        gunicorn_pid = int(pid_file.read_text())
        answer = post_json(port, {"text": "李白出生于碎叶城。"})
        assert answer.status == 200 and answer.json()["model"]["name"] == "tiny-triples"
        assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["x-request-id"])  # nginx's $request_id
        # nginx refuses a body over SPO_MAX_BODY_BYTES itself, as problem+json.
        big = call(port, "POST", "/v1/extract", b"x" * 8192, {"Content-Type": "application/json"})
        assert big.status == 413 and big.mimetype == PROBLEM
        assert big.json()["code"] == "body_too_large"
        # What nginx answers itself is logged on stdout (gunicorn's access log has the rest), as
        # the client sent it, without its query string; nothing is logged into the run directory,
        # which in a container is a small tmpfs that a log there filled request by request.
        assert call(port, "TRACE", "/v1/extract?token=secret").status == 405
        for _ in range(50):
            assert call(port, "GET", "/healthz").status == 200
        # A control byte in a header value: nginx passes it, gunicorn refuses it before the app
        # sees it, and its worker logs it with the id the client got (not nginx: one line each).
        odd = call(port, "GET", "/readyz", headers={"X-Odd": "a\x01b"})
        assert odd.status == 400 and odd.mimetype == PROBLEM
        deadline = time.monotonic() + 10  # the last line comes through the relay's pipe
        while True:
            lines = [line for line in log.read_text().splitlines() if "nginx.access" in line]
            rid = f"rid={odd.headers['x-request-id']}"
            refused = [line for line in log.read_text().splitlines() if rid in line]
            if (len(lines) >= len(booting) + 2 and refused) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [line.split("] ", 1)[1] for line in lines[len(booting) :]] == [
            "127.0.0.1 POST /v1/extract 413",
            "127.0.0.1 TRACE /v1/extract 405",
        ], lines
        assert len(refused) == 1 and "gunicorn.access" in refused[0], refused
        assert '" 400 ' in refused[0], refused  # gunicorn read no request line: "- -"
        written = [p.name for p in (run_dir / "nginx").rglob("*") if p.is_file()]
        assert sorted(written) == ["nginx.conf", "nginx.pid"], written
        # spo reload finds gunicorn's master through the pid file of this address.
        spo_reload(port, log)
        assert post_json(port, {"text": "北京"}).status == 200
        stop_cleanly(process, log)
    finally:
        kill_if_running(process)
    assert not alive(nginx_pid) and not alive(gunicorn_pid)
    assert not run_dir.exists(), "socket, nginx pid file or temp files left behind"
    assert not pid_file.exists()
    with pytest.raises(OSError):
        call(port, "GET", "/healthz", timeout=2)


@needs_nginx
@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_supervisor_stops_nginx_when_gunicorn_cannot_start(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """A model only TensorFlow finds corrupt: gunicorn halts (status 3), and the supervisor stops
    nginx, removes its run directory and exits with that status."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(triples_model_dir, model)
    corrupt_graph(model)
    log = tmp_path / "serve.log"
    process = start(free_port(), serve_env(model), log)
    try:
        assert process.wait(BOOT_TIMEOUT_S) == 3, log.read_text()[-3000:]
    finally:
        kill_if_running(process)
    output = log.read_text()
    assert "the model failed to load" in output
    assert "gunicorn exited (status 3): stopping the other" in output
    assert not run_dir_of(log).exists()


STAND_IN = """
import signal, sys, time, pathlib
log = pathlib.Path(sys.argv[1])
def bye(sig, frame):
    log.write_text(signal.Signals(sig).name)
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
    signal.signal(s, bye if s != signal.SIGHUP else lambda *a: log.write_text("HUP"))
print(flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM, signal.SIGQUIT])
def test_supervisor_signals_stop_both_in_order(tmp_path: Path, stop_with: int) -> None:
    """SIGHUP goes to gunicorn only; SIGINT/SIGTERM/SIGQUIT stop nginx (SIGQUIT: graceful) and
    gunicorn (SIGTERM: graceful), and the supervisor exits 0 once both are gone (SIGQUIT killed it
    outright: nginx was stopped fast, the requests in flight failed, its run directory stayed)."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    nginx_log, gunicorn_log = tmp_path / "nginx", tmp_path / "gunicorn"
    driver = textwrap.dedent(
        f"""
        import sys
        from app.serving.supervisor import Supervisor
        py, s = sys.executable, {str(stand_in)!r}
        sup = Supervisor([py, s, {str(nginx_log)!r}], [py, s, {str(gunicorn_log)!r}], {{}},
                         graceful_timeout=5, on_exit=lambda: print("cleaned", flush=True))
        sys.exit(sup.run())
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "\n" and process.stdout.readline() == "\n"
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not gunicorn_log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gunicorn_log.read_text() == "HUP" and not nginx_log.exists()
        process.send_signal(stop_with)
        assert process.wait(20) == 0
        assert process.stdout.read() == "cleaned\n"
    finally:
        kill_if_running(process)
        if process.stdout is not None:
            process.stdout.close()
    assert nginx_log.read_text() == "SIGQUIT"
    assert gunicorn_log.read_text() == "SIGTERM"


LATE_HUP = """
import signal, sys, time, pathlib
log, ready = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
print(flush=True)
time.sleep(1.5)  # a gunicorn master still importing: SIGHUP's default would end it
signal.signal(signal.SIGHUP, lambda *a: log.write_text("HUP"))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
ready.touch()  # gunicorn's socket: its handlers are in place
while True:
    time.sleep(0.05)
"""


def test_supervisor_holds_a_sighup_until_gunicorn_can_take_it(tmp_path: Path) -> None:
    """A reload asked in the first second after a start killed gunicorn's master (SIGHUP's default
    before its handlers), and with it the service (exit 255)."""
    stand_in, late = tmp_path / "stand_in.py", tmp_path / "late.py"
    stand_in.write_text(STAND_IN)
    late.write_text(LATE_HUP)
    nginx_log, gunicorn_log, socket = tmp_path / "nginx", tmp_path / "gunicorn", tmp_path / "sock"
    driver = textwrap.dedent(
        f"""
        import pathlib, sys
        from app.serving.supervisor import Supervisor
        py = sys.executable
        sup = Supervisor([py, {str(stand_in)!r}, {str(nginx_log)!r}],
                         [py, {str(late)!r}, {str(gunicorn_log)!r}, {str(socket)!r}], {{}},
                         graceful_timeout=5, gunicorn_socket=pathlib.Path({str(socket)!r}))
        sys.exit(sup.run())
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "\n" and process.stdout.readline() == "\n"
        assert not socket.exists()
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not gunicorn_log.exists() and time.monotonic() < deadline:
            assert process.poll() is None, "the supervisor stopped"
            time.sleep(0.05)
        assert gunicorn_log.read_text() == "HUP"
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        kill_if_running(process)
        if process.stdout is not None:
            process.stdout.close()


STUBBORN = """
import signal, sys, time
for s in (signal.SIGTERM, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
print(flush=True)
while True:
    time.sleep(0.05)
"""


def test_supervisor_stop_kills_what_is_left_within_one_budget(tmp_path: Path) -> None:
    """nginx and gunicorn share SPO_GRACEFUL_TIMEOUT + 5 s (here 1 + 5): neither stopping, both
    are killed once it has passed, not after 6 s each (12 s, past a container's grace period)."""
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(STUBBORN)
    driver = textwrap.dedent(
        f"""
        import sys
        from app.serving.supervisor import Supervisor
        py, s = sys.executable, {str(stubborn)!r}
        sys.exit(Supervisor([py, s], [py, s], {{}}, graceful_timeout=1).run())
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "\n" and process.stdout.readline() == "\n"
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        took = time.monotonic() - started
    finally:
        kill_if_running(process)
        if process.stdout is not None:
            process.stdout.close()
    assert 5.5 < took < 10, took


def test_supervisor_relays_nginx_lines_with_control_bytes_escaped() -> None:
    """nginx's error lines quote what a client sent (a Referer, a raw path) as it came: written to
    stderr as they were, ESC and BEL could clear a terminal or forge a line."""
    import io
    from types import SimpleNamespace

    from app.serving.supervisor import _relay

    out = SimpleNamespace(buffer=io.BytesIO())
    lines = io.BytesIO(b'referrer: "\x1b[2J\x1b[31mFAKE\x07" \tok\nnext\x0bline\n')
    _relay(lines, out)  # type: ignore[arg-type]
    assert out.buffer.getvalue() == b'referrer: "\\x1b[2J\\x1b[31mFAKE\\x07" \tok\nnext\\x0bline\n'

    class Closed:
        @property
        def buffer(self) -> Any:
            raise ValueError("I/O operation on closed file")

    rest = io.BytesIO(b"a\nb\nc\n")
    _relay(rest, Closed())  # type: ignore[arg-type]
    assert rest.read() == b""  # read to the end: a pipe left full would block nginx


NGINX_FAILS = r"""
import sys
sys.stderr.buffer.write(b'2026/12/06 17:50:01 [warn] 7#7: *1 client sent "\x1b[2J\xff" ok\n')
sys.stderr.buffer.write(b'2026/12/06 17:50:02 [emerg] 7#7: bind() failed\n')
sys.exit(1)
"""


def test_supervisor_lines_are_json_objects_under_json_logs(tmp_path: Path) -> None:
    """SPO_LOG_FORMAT=json: the supervisor's own lines and nginx's error lines are each one JSON
    object on stderr (a log shipper parses every line), nginx's level kept, its bytes escaped."""
    stand_in, nginx = tmp_path / "stand_in.py", tmp_path / "nginx.py"
    stand_in.write_text(STAND_IN)
    nginx.write_text(NGINX_FAILS)
    driver = textwrap.dedent(
        f"""
        import sys
        from app.core.logs import configure_logging
        from app.core.settings import LogSettings
        from app.serving.supervisor import Supervisor
        configure_logging(LogSettings(log_format="json", log_level="INFO"))
        py = sys.executable
        sup = Supervisor([py, {str(nginx)!r}], [py, {str(stand_in)!r}, {str(tmp_path / "g")!r}],
                         {{}}, graceful_timeout=5, errors_as_log=True)
        sys.exit(sup.run())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, timeout=60, cwd=Path.cwd()
    )
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in done.stderr.decode().splitlines()]
    by_logger = {(r["logger"], r["level"]): r["message"] for r in records}
    assert by_logger[("nginx", "WARNING")] == (
        '2026/12/06 17:50:01 [warn] 7#7: *1 client sent "\x1b[2J\\xff" ok'
    )
    assert by_logger[("nginx", "CRITICAL")].endswith("[emerg] 7#7: bind() failed")
    assert by_logger[("spo.serve", "ERROR")] == "nginx exited (status 1): stopping the other"
