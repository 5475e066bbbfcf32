"""``app.serving.master``: model reloads and load failures under a real gunicorn, with clients sending all along.

Each test starts ``spo serve`` on a copy of the tiny model behind a symlink (``SPO_MODEL_DIR``), like a
deployment that switches models by moving the link. Load comes from 4 client threads (``Load``) that
record every answer; the tests assert what those answers were, and print the timeline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.core.settings import Settings, SettingsError
from app.serving import master
from app.serving.master import REPORT_FD, SpoArbiter, report, resolve_models
from nlp.errors import SpoError
from tests.app.test_live import call, free_port, post_json, start_serve, stop, wait_ready

BOOT_TIMEOUT_S = 120
TEXT = "李白出生于碎叶城，他的妻子是许氏。"


def model_copy(source: Path, target: Path, version: str) -> Path:
    """A copy of ``source`` whose model.json says ``version``."""
    shutil.copytree(source, target)
    manifest = target / "model.json"
    doc = json.loads(manifest.read_text(encoding="utf-8"))
    doc["version"] = version
    manifest.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return target


def corrupt_graph(model_dir: Path, *, recorded: bool = False) -> Path:
    """Garbage for ``model_dir``'s ``saved_model.pb``. ``recorded=False`` also drops model.json's
    ``saved_model.sha256`` (a model.json written by hand), so only TensorFlow can tell, in the
    worker; with the record the master refuses the directory before any worker starts."""
    (model_dir / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 10)
    if not recorded:
        manifest = model_dir / "model.json"
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        doc.pop("saved_model", None)
        manifest.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return model_dir


def point(link: Path, target: Path) -> None:
    """Switch ``link`` to ``target`` atomically (a new link renamed over the old one)."""
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(link)


@dataclass
class Load:
    """``clients`` threads posting ``TEXT`` until stopped; each answer as (time, status, version|code)."""

    port: int
    clients: int = 4
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _client(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                answer = post_json(self.port, {"text": TEXT})
                doc = answer.json()
                what = doc["model"]["version"] if answer.status == 200 else doc.get("code", "?")
                self.answers.append((started, answer.status, str(what)))
            except Exception as exc:
                self.answers.append((started, 0, type(exc).__name__))

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._client) for _ in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def since(self, t: float) -> list[tuple[float, int, str]]:
        return [a for a in self.answers if a[0] >= t]

    def failures(self) -> list[tuple[float, int, str]]:
        return [a for a in self.answers if a[1] != 200]

    def wait_answers(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        start = len(self.answers)
        while len(self.answers) < start + n and time.monotonic() < deadline:
            time.sleep(0.05)


def log_lines(log: Path, needle: str) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if needle in line]


def wait_log(log: Path, needle: str, timeout: float, count: int = 1, poll: float = 0.1) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log_lines(log, needle)
        if len(lines) >= count:
            return lines[count - 1]
        time.sleep(poll)
    pytest.fail(f"no {needle!r} in the log after {timeout}s:\n{log.read_text()[-4000:]}")


def serve_env(link: Path, **settings: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        "SPO_MODEL_DIR": str(link),
        "SPO_TIMEOUT": str(BOOT_TIMEOUT_S),
        "SPO_ACCESS_LOG": "0",
        **settings,
    }


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log: Path
    pid_file: Path


@pytest.fixture
def models(triples_model_dir: Path, tmp_path: Path) -> dict[str, Path]:
    """Version 1 (A), version 2 (B), and a link pointing at A."""
    a = model_copy(triples_model_dir, tmp_path / "A", "1")
    b = model_copy(triples_model_dir, tmp_path / "B", "2")
    link = tmp_path / "current"
    point(link, a)
    return {"A": a, "B": b, "link": link}


@contextmanager
def run_server(env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    pid_file = tmp_path / "spo.pid"
    env = {**env, "SPO_PID_FILE": str(pid_file)}
    log = tmp_path / "serve.log"
    process = start_serve(port, env, log)
    try:
        wait_ready(port, process, log, BOOT_TIMEOUT_S)
        yield Server(port, process, log, pid_file)
    finally:
        stop(process)
    assert not pid_file.exists(), "the master left its pid file behind"


def spo_reload(server: Server) -> None:
    spo = Path(sys.executable).with_name("spo")
    result = subprocess.run(
        [str(spo), "reload", "--pid-file", str(server.pid_file)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_reloads_under_load_without_a_failed_request(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Concurrency 4 throughout: A -> B (spo reload), then a broken model.json (refused), a graph
    that no longer matches model.json's sha256 (refused), then a corrupt SavedModel only TensorFlow
    can tell (its workers fail; the reload is undone): zero failed requests, and after "reload
    done" every answer comes from B."""
    env = serve_env(models["link"], SPO_WORKERS="2", SPO_THREADS="4")
    broken = model_copy(models["A"], tmp_path / "broken", "3")
    (broken / "model.json").write_text('{"name": "broken",', encoding="utf-8")
    changed = corrupt_graph(model_copy(models["A"], tmp_path / "changed", "5"), recorded=True)
    corrupt = corrupt_graph(model_copy(models["A"], tmp_path / "corrupt", "4"))
    with run_server(env, tmp_path) as server, Load(server.port) as load:
        load.wait_answers(20)
        # 1. A -> B: the old workers serve until every new one is warm.
        point(models["link"], models["B"])
        hup = time.monotonic()
        spo_reload(server)
        done_line = wait_log(server.log, "reload done", BOOT_TIMEOUT_S)
        done = time.monotonic()
        load.wait_answers(40)
        # 2. model.json broken: the master refuses the reload, nothing changes.
        point(models["link"], broken)
        spo_reload(server)
        refused = wait_log(server.log, "reload refused", 30)
        load.wait_answers(20)
        # 2b. the graph changed since model.json was written: refused the same way.
        point(models["link"], changed)
        spo_reload(server)
        mismatch = wait_log(server.log, "saved_model.sha256", 30)
        load.wait_answers(20)
        # 3. SavedModel corrupt (only TensorFlow can tell): the new workers fail, the old serve on.
        point(models["link"], corrupt)
        spo_reload(server)
        failed = wait_log(server.log, "reload failed", BOOT_TIMEOUT_S)
        load.wait_answers(40)
    # The old generation of step 1 only retires when step 1 is done: allow 1 s of answers that had
    # started before the master saw the last worker ready.
    after = load.since(done + 1.0)
    during = [a for a in load.answers if hup <= a[0] < done]
    assert not load.failures(), f"{len(load.failures())} failed: {load.failures()[:5]}"
    assert after and {a[2] for a in after} == {"2"}, Counter(a[2] for a in after)
    assert "broken" in refused or "model.json" in refused
    assert "reload refused" in mismatch and "mismatch" in mismatch
    assert "model_load_error" in failed
    assert server.process.returncode == 0
    with capsys.disabled():
        print(
            f"\nreload A->B: {done - hup:.1f}s from HUP to 'reload done' "
            f"({done_line.split('reload done in ')[1].split(':')[0]} by the master), "
            f"{len(during)} requests answered meanwhile, {len(load.answers)} in all, "
            f"{len(load.failures())} failed; versions {dict(Counter(a[2] for a in load.answers))}"
        )


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_reload_during_a_reload_is_kept_and_the_last_one_wins(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """The link moves A -> B, reload, then B -> C and reload again while B's workers warm up: the
    second HUP is not dropped; C serves in the end, with no failed request on the way."""
    env = serve_env(models["link"], SPO_WORKERS="2", SPO_THREADS="4")
    c = model_copy(models["A"], tmp_path / "C", "3")
    with run_server(env, tmp_path) as server, Load(server.port, clients=2) as load:
        load.wait_answers(10)
        master_pid = int(server.pid_file.read_text())
        point(models["link"], models["B"])
        os.kill(master_pid, signal.SIGHUP)  # what spo reload sends, without its start-up time
        wait_log(server.log, "reload: starting", 30, poll=0.01)
        point(models["link"], c)  # B's two workers take a second or more to load and warm up
        os.kill(master_pid, signal.SIGHUP)
        kept = wait_log(server.log, "reload already in progress", 30)
        wait_log(server.log, "reload done", BOOT_TIMEOUT_S, count=2)
        done = time.monotonic()
        time.sleep(1.5)  # the old generation finishes the requests it had started
        load.wait_answers(20)
        # Two reloads later the master still has no TensorFlow in it: only workers load the model.
        master_maps = Path(f"/proc/{master_pid}/maps").read_text()
    assert "tensorflow" not in master_maps
    assert "another follows once it ends" in kept
    assert not load.failures(), f"{len(load.failures())} failed: {load.failures()[:5]}"
    after = load.since(done + 1.0)
    assert after and {a[2] for a in after} == {"3"}, Counter(a[2] for a in after)
    assert "C" in log_lines(server.log, "reload done")[-1]


# Test only, put on the workers' path as sitecustomize: the model call of any batch holding the
# character HANG never returns (a wedged runtime, which no deadline can stop).
HANGING_LOADER = """\
import threading

import nlp.loader

HANG = "鬯"
_load = nlp.loader.load_extractor


class _Wedged:
    def __init__(self, inner, hang_id):
        self._inner, self._hang_id = inner, hang_id

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def run(self, token_ids, segment_ids):
        if (token_ids == self._hang_id).any():
            threading.Event().wait()
        return self._inner.run(token_ids, segment_ids)


def load_extractor(options):
    extractor = _load(options)
    hang_id = extractor.tokenizer.encode(HANG).token_ids[0]
    extractor.runtime = _Wedged(extractor.runtime, hang_id)
    return extractor


nlp.loader.load_extractor = load_extractor
"""


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_a_model_call_that_never_returns_gets_its_worker_replaced(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """gthread's main loop heartbeats whatever its request threads do, so gunicorn's timeout never
    caught a model call that does not return: the worker kept its lock forever and every later
    request to it waited out its deadline. Each beat is now dated at most a second into the oldest
    model call still running."""
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "sitecustomize.py").write_text(HANGING_LOADER, encoding="utf-8")
    env = serve_env(
        models["A"],
        SPO_WORKERS="1",
        SPO_TIMEOUT="20",  # covers the tiny model's load and warm-up (a few seconds)
        SPO_REQUEST_TIMEOUT="5",
        PYTHONPATH=str(plugin),
    )
    with run_server(env, tmp_path) as server:
        first = wait_log(server.log, "ready: model loaded", 30)

        def send_hang() -> None:
            with contextlib.suppress(OSError):  # its worker is killed under it
                post_json(server.port, {"text": "张三出生于鬯。"})

        threading.Thread(target=send_hang, daemon=True).start()
        time.sleep(1)
        # The worker's one model lock is held: a request waits out its deadline.
        assert post_json(server.port, {"text": "张三出生于北京。"}).status == 504
        timed_out = wait_log(server.log, "WORKER TIMEOUT", 60)
        second = wait_log(server.log, "ready: model loaded", 90, count=2)
        answer = post_json(server.port, {"text": "张三出生于北京。"})
    assert answer.status == 200, answer.body[:300]
    assert first.split("worker ")[1].split()[0] != second.split("worker ")[1].split()[0]
    assert "WORKER TIMEOUT" in timed_out


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_starts_over_a_stale_pid_file_and_never_beside_a_live_master(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """A master killed outright leaves its pid file, and its pid may by now be another program's
    (a restarted container keeps /tmp): gunicorn refused to start ("Already running on PID"). The
    stale file is removed, named; a file naming a live master still stops a second server."""
    env = serve_env(models["link"], SPO_WORKERS="1")
    other = subprocess.Popen(["sleep", "300"])
    try:
        (tmp_path / "spo.pid").write_text(f"{other.pid}\n")
        with run_server(env, tmp_path) as server:
            removed = log_lines(server.log, "removed the stale pid file")
            assert (
                removed
                and f"process {other.pid} is not a gunicorn master (sleep 300)" in removed[0]
            )
            master_pid = int(server.pid_file.read_text())
            assert master_pid != other.pid and master.not_a_master(master_pid) is None
            second_log = tmp_path / "second.log"
            second = start_serve(
                free_port(), {**env, "SPO_PID_FILE": str(server.pid_file)}, second_log
            )
            assert second.wait(60) != 0
            assert f"Already running on PID {master_pid}" in second_log.read_text()
            assert int(server.pid_file.read_text()) == master_pid
            assert call(server.port, "GET", "/readyz").status == 200
    finally:
        other.kill()
        other.wait()


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_worker_recycled_while_model_dir_is_gone_stays_up_and_recovers(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """One worker recycled every ~12 requests while its model directory has been moved away (root
    reads any file, so "unreadable" is simulated by its absence): the replacement stays up with
    /healthz 200, /readyz and /v1/extract 503 invalid_manifest, never a refused connection or a 500;
    once the directory is back it loads the model by itself."""
    env = serve_env(
        models["link"],
        SPO_WORKERS="1",
        SPO_MAX_REQUESTS="12",
        SPO_MAX_REQUESTS_JITTER="1",
        SPO_LOAD_RETRY_MAX_S="1",
    )
    away = tmp_path / "A.away"
    with run_server(env, tmp_path) as server:
        try:
            models["A"].rename(away)
            statuses: Counter[tuple[int, str]] = Counter()
            deadline = time.monotonic() + BOOT_TIMEOUT_S
            while time.monotonic() < deadline:
                answer = post_json(server.port, {"text": TEXT})
                doc = answer.json()
                statuses[(answer.status, doc.get("code") or doc["model"]["version"])] += 1
                if answer.status == 503:
                    break
            assert call(server.port, "GET", "/healthz").status == 200
            ready = call(server.port, "GET", "/readyz")
            assert ready.status == 503 and ready.mimetype == "application/problem+json"
            assert ready.json()["code"] == "invalid_manifest"
            assert ready.headers["retry-after"]
            assert wait_log(server.log, "cannot load the model", 30)
            assert log_lines(server.log, "model directory not found")
            away.rename(models["A"])
            wait_ready(server.port, server.process, server.log, BOOT_TIMEOUT_S)
            assert post_json(server.port, {"text": TEXT}).json()["model"]["version"] == "1"
            assert server.process.poll() is None
        finally:
            if away.exists():
                away.rename(models["A"])
    assert set(statuses) <= {(200, "1"), (503, "invalid_manifest")}, statuses
    assert statuses[(503, "invalid_manifest")] == 1


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_recycled_workers_keep_their_generations_tokens_until_a_reload(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """The master reads SPO_AUTH_TOKENS_FILE (at start, on each reload); a worker recycled after the
    file was edited serves the same tokens as its siblings, not the edited file (docs/security.md)."""
    old, new = "token-old-0123456789", "token-new-0123456789"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{old}\n")
    env = serve_env(
        models["link"],
        SPO_WORKERS="1",
        SPO_MAX_REQUESTS="4",
        SPO_MAX_REQUESTS_JITTER="0",
        SPO_AUTH_TOKENS_FILE=str(tokens),
    )

    def status(token: str) -> int:
        return post_json(server.port, {"text": TEXT}, Authorization=f"Bearer {token}").status

    with run_server(env, tmp_path) as server:
        assert status(old) == 200
        tokens.write_text(f"{new}\n")
        booted = len(log_lines(server.log, "Booting worker"))
        for _ in range(9):  # two recycles at 4 requests a worker
            assert call(server.port, "GET", "/healthz").status == 200
        wait_log(server.log, "Booting worker", 60, count=booted + 2)
        wait_ready(server.port, server.process, server.log, BOOT_TIMEOUT_S)
        assert status(old) == 200 and status(new) == 401
        spo_reload(server)
        wait_log(server.log, "reload done", BOOT_TIMEOUT_S)
        time.sleep(1)  # the old generation finishes and exits
        assert [status(new) for _ in range(3)] == [200] * 3
        assert status(old) == 401


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_master_first_start_with_a_corrupt_model_exits_nonzero(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """What only TensorFlow finds (a corrupt SavedModel) fails the first worker; with no worker ever
    ready, the master halts with the reason and a non-zero exit instead of serving 503s forever."""
    corrupt_graph(models["A"])
    log = tmp_path / "serve.log"
    env = serve_env(models["link"], SPO_WORKERS="1", SPO_PID_FILE=str(tmp_path / "spo.pid"))
    process = start_serve(free_port(), env, log)
    try:
        code = process.wait(BOOT_TIMEOUT_S)
    finally:
        stop(process)
    output = log.read_text()
    assert code == 3, output[-3000:]
    assert "the model failed to load: model_load_error" in output
    assert not (tmp_path / "spo.pid").exists()


def test_master_report_without_a_master_is_a_no_op() -> None:
    """Under plain gunicorn (no SpoArbiter) workers have no pipe: reporting does nothing."""
    assert REPORT_FD is None
    report("ready", model="x", version="1")


def test_master_spo_reload_errors(tmp_path: Path) -> None:
    spo = Path(sys.executable).with_name("spo")

    def reload(pid_file: Path) -> subprocess.CompletedProcess[str]:
        command = [str(spo), "reload", "--pid-file", str(pid_file)]
        return subprocess.run(command, capture_output=True, text=True, timeout=30)

    missing = reload(tmp_path / "nope.pid")
    assert missing.returncode == 1 and "is `spo serve` running?" in missing.stderr
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "stale.pid").write_text(f"{dead.pid}\n")
    stale = reload(tmp_path / "stale.pid")
    assert stale.returncode == 1 and "stale pid file" in stale.stderr
    # A pid file whose pid is now another program's: that program is not signalled (SIGHUP ends it).
    other = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "reused.pid").write_text(f"{other.pid}\n")
        reused = reload(tmp_path / "reused.pid")
        assert reused.returncode == 1
        assert f"process {other.pid} is not a gunicorn master (sleep 30)" in reused.stderr
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_master_spo_reload_reads_only_what_finds_the_pid_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reloading shell's other SPO_* values are not the server's: a bad one (or a missing
    model) refused the reload; a bad pid-file or bind value is still named."""
    from click.testing import CliRunner

    from app.cli import main

    monkeypatch.setenv("SPO_WORKERS", "many")
    monkeypatch.setenv("SPO_MODEL_DIR", str(tmp_path / "no-such-model"))
    monkeypatch.setenv("SPO_PID_FILE", str(tmp_path / "spo.pid"))
    result = CliRunner().invoke(main, ["reload"])
    assert result.exit_code == 1, result.output
    assert f"no pid file {tmp_path / 'spo.pid'}: is `spo serve` running?" in result.output
    monkeypatch.delenv("SPO_PID_FILE")
    result = CliRunner().invoke(main, ["reload", "--bind", "nowhere:port"])
    assert result.exit_code == 2 and "SPO_BIND" in result.output, result.output
    assert "SPO_WORKERS" not in result.output


def test_master_not_a_master_doctests_hold() -> None:
    import doctest

    import app.serving.master as master_module

    assert doctest.testmod(master_module).failed == 0


def test_master_spo_reload_sends_hup(tmp_path: Path) -> None:
    spo = Path(sys.executable).with_name("spo")
    flag = tmp_path / "hup"
    child = subprocess.Popen(
        [
            "gunicorn: master [stand-in]",  # argv[0] as gunicorn's title shows it (not_a_master)
            "-c",
            "import signal, sys, time, pathlib\n"
            f"signal.signal(signal.SIGHUP, lambda *a: (pathlib.Path({str(flag)!r}).touch(), sys.exit(0)))\n"
            "print('up', flush=True)\n"
            "time.sleep(30)\n",
        ],
        executable=sys.executable,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        (tmp_path / "spo.pid").write_text(str(child.pid))
        result = subprocess.run(
            [str(spo), "reload", "--pid-file", str(tmp_path / "spo.pid")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        assert child.wait(10) == 0 and flag.exists()
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert child.stdout is not None
        child.stdout.close()


# -- settings handed down, not re-read (issue 20) ------------------------------------------------
def test_master_reload_reads_the_model_variables_once_and_keeps_the_rest(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    started = Settings.from_env(
        {"SPO_MODEL_DIR": str(models["link"]), "SPO_WORKERS": "3", "SPO_MAX_TEXTS": "9"}
    )
    assert started.pinned().model_table == ((models["link"].name, models["A"].resolve()),)
    point(models["link"], models["B"])
    for name in list(os.environ):
        if name.startswith("SPO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SPO_MODEL_DIR", str(models["link"]))
    monkeypatch.setenv("SPO_MAX_TEXTS", "1")  # not a model variable: the running value stays
    parses = []
    real = Settings.from_env.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        Settings,
        "from_env",
        classmethod(lambda cls, *a, **k: parses.append(k) or real(cls, *a, **k)),
    )
    pinned, manifests = resolve_models(started)
    assert len(parses) == 1  # the environment, read once
    # The link's target now, under the link's name (the name a client uses stays).
    assert pinned.model_table == ((models["link"].name, models["B"].resolve()),)
    assert manifests[0].version == "2"
    assert (pinned.workers, pinned.max_texts) == (3, 9)
    models["link"].unlink()
    with pytest.raises((SettingsError, SpoError)):
        resolve_models(started)


def test_master_workers_get_their_generations_settings_by_the_fork(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No SPO_* variable is swapped around a fork: the child finds its generation's value in
    app.serving.master.SETTINGS (the one worker_app builds the app with)."""
    seen: list[tuple[Settings | None, dict[str, str]]] = []

    def fork(self: object) -> int:
        seen.append((master.SETTINGS, dict(os.environ)))
        return 4242

    monkeypatch.setattr(master.Arbiter, "spawn_worker", fork)
    monkeypatch.setattr(master, "SETTINGS", None)
    environ = dict(os.environ)
    arbiter = object.__new__(SpoArbiter)
    for version in ("A", "B"):
        arbiter.settings = Settings(model_dir=models[version], workers=1)
        assert arbiter.spawn_worker() == 4242
        assert seen[-1] == (arbiter.settings, environ)
        assert master.handed_settings() is arbiter.settings


def test_master_ready_report_of_a_worker_already_reaped_still_counts() -> None:
    """A worker recycled right after it became ready may be reaped before the master reads its
    report: the server has been ready all the same, so its successor's failed load is logged (503s
    and retries), not a halt. Without the ready report the same failure halts the first start."""
    from gunicorn.errors import HaltServer

    def arbiter_reading(*docs: dict[str, object]) -> tuple[SpoArbiter, list[str]]:
        arbiter = object.__new__(SpoArbiter)
        arbiter._reports_r, write = os.pipe()
        os.set_blocking(arbiter._reports_r, False)
        arbiter._partial, arbiter.ever_ready, arbiter.states = b"", False, {}
        arbiter.pending, arbiter.retiring, arbiter.WORKERS = None, set(), {4243: object()}
        errors: list[str] = []
        arbiter.log = SimpleNamespace(  # type: ignore[assignment]
            error=lambda msg, *args: errors.append(msg % args), warning=print
        )
        os.write(write, b"".join(json.dumps(doc).encode() + b"\n" for doc in docs))
        os.close(write)
        return arbiter, errors

    failed = {"pid": 4243, "state": "failed", "code": "invalid_manifest", "detail": "gone"}
    arbiter, errors = arbiter_reading({"pid": 4242, "state": "ready"}, failed)  # 4242 reaped
    try:
        arbiter._read_reports()
    finally:
        os.close(arbiter._reports_r)
    assert arbiter.ever_ready
    assert len(errors) == 1 and "worker 4243 cannot load the model (invalid_manifest" in errors[0]
    arbiter, _ = arbiter_reading(failed)
    try:
        with pytest.raises(HaltServer, match="the model failed to load: invalid_manifest"):
            arbiter._read_reports()
    finally:
        os.close(arbiter._reports_r)


def test_master_refuses_a_reload_onto_openvino_under_preloaded_jemalloc() -> None:
    """A master started with jemalloc preloaded cannot serve an openvino model (OpenVINO 2026.4.1
    aborts compiling under it): the reload is refused with the reason, not left to crash workers."""
    from app.core.settings import JEMALLOC_PATH
    from app.serving.master import preload_blocks_reload

    tf, ov = (
        SimpleNamespace(name="demo", engine="tf"),
        SimpleNamespace(name="ov", engine="openvino"),
    )
    preload = f"/lib/other.so:{JEMALLOC_PATH}"
    reason = preload_blocks_reload([tf, ov], preload)  # type: ignore[list-item]
    assert reason is not None and "ov runs on the openvino engine" in reason
    assert "restart" in reason
    assert preload_blocks_reload([tf], preload) is None  # type: ignore[list-item]
    assert preload_blocks_reload([tf, ov], "/lib/other.so") is None  # type: ignore[list-item]
    assert preload_blocks_reload([tf, ov], "") is None  # type: ignore[list-item]


def test_master_a_reload_whose_check_fails_unexpectedly_is_refused_not_fatal(
    monkeypatch: pytest.MonkeyPatch, triples_model_dir: Path
) -> None:
    """The check raised what it did not expect (an OSError for a vocab path over the file
    system's limit, before the manifest learned to name it): gunicorn's main loop died of it, and
    the whole server with it."""
    arbiter = object.__new__(SpoArbiter)
    arbiter.pending, arbiter.WORKERS = None, {}
    arbiter.settings = Settings(model_dir=triples_model_dir)
    logged: list[str] = []
    arbiter.log = SimpleNamespace(  # type: ignore[assignment]
        error=lambda msg, *args: logged.append(msg % args),
        exception=lambda msg, *args: logged.append(msg % args),
    )

    def unforeseen(settings: Settings) -> None:
        raise OSError(36, "File name too long")

    monkeypatch.setattr(master, "resolve_models", unforeseen)
    arbiter.reload()  # returns: the master serves on
    assert logged[-1].startswith("reload refused: OSError: [Errno 36] File name too long; the 0")
    assert arbiter.pending is None


@pytest.mark.parametrize(("limit_in_workers", "refused"), [(3.5, True), (4.2, False)])
def test_master_refuses_a_reload_whose_two_generations_pass_the_memory_limit(
    monkeypatch: pytest.MonkeyPatch, triples_model_dir: Path, limit_in_workers: float, refused: bool
) -> None:
    """The new workers start beside the old: in the shipped Kubernetes pod (3Gi, 2 workers of
    ~970 MiB) a reload needed ~3.9 GiB, and the OOM killer, not the reload, ended it."""
    from app.core.sizing import Limit, Machine

    rss = Settings(model_dir=triples_model_dir).sizing().worker_rss_mib
    assert rss
    box = Machine(
        affinity=2,
        quota=Limit(2.0, "test"),
        memory=Limit(limit_in_workers * rss * 2**20, "test"),
    )
    monkeypatch.setattr(Machine, "probe", classmethod(lambda cls: box))
    settings = Settings(model_dir=triples_model_dir)  # sized on ``box``
    arbiter = object.__new__(SpoArbiter)
    arbiter.pending, arbiter.WORKERS, arbiter._num_workers = None, {1: None, 2: None}, 2
    arbiter.settings = settings
    logged: list[str] = []
    arbiter.log = SimpleNamespace(  # type: ignore[assignment]
        error=lambda msg, *args: logged.append(msg % args),
        info=lambda msg, *args: logged.append(msg % args),
        reopen_files=lambda: None,
    )
    spawned: list[int] = []
    monkeypatch.setattr(arbiter, "spawn_worker", lambda: spawned.append(1) or 100 + len(spawned))
    monkeypatch.setattr(master, "resolve_models", lambda s: (s, []))
    arbiter.reload()
    if refused:
        assert logged[-1].startswith("reload refused: 2 old and 2 new workers together need ~")
        assert (
            "raise the limit to" in logged[-1]
            and "the 2 running workers keep serving" in logged[-1]
        )
        assert spawned == [] and arbiter.pending is None
    else:
        assert spawned == [1, 1] and arbiter.pending is not None


def test_master_a_model_dir_that_is_a_symlink_loop_is_a_settings_error(tmp_path: Path) -> None:
    """Python 3.11's Path.resolve raised RuntimeError on the loop, uncaught (in a reload, gunicorn's
    main loop died of it); 3.13's resolves it to the path, found to be no directory."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(SettingsError, match=r"SPO_MODEL_DIR: (cannot resolve|not a directory)"):
        Settings.from_env({"SPO_MODEL_DIR": str(loop)})


def test_master_a_new_worker_that_fails_to_boot_is_cleaned_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """gunicorn raises HaltServer for a worker that failed to boot before closing its heartbeat
    file and calling child_exit; the reload's catch skipped both: a descriptor leaked and the dead
    worker's metrics files stayed, on every such reload."""
    from gunicorn.workers.workertmp import WorkerTmp

    arbiter = object.__new__(SpoArbiter)
    exited: list[int] = []
    arbiter.cfg = SimpleNamespace(  # type: ignore[assignment]
        umask=0o22, worker_tmp_dir=str(tmp_path), uid=os.geteuid(), gid=os.getegid(),
        child_exit=lambda arbiter, worker: exited.append(worker.pid),
    )  # fmt: skip
    worker = SimpleNamespace(pid=4243, tmp=WorkerTmp(arbiter.cfg))
    arbiter.WORKERS, arbiter.reexec_pid, arbiter.dirty_arbiter_pid = {4243: worker}, 0, 0
    arbiter.pending, arbiter.ever_ready, arbiter.states = SimpleNamespace(), True, {}
    arbiter.log = SimpleNamespace(  # type: ignore[assignment]
        error=lambda *a: None, debug=lambda *a: None, info=lambda *a: None
    )
    failed: list[str] = []
    monkeypatch.setattr(arbiter, "_fail_reload", lambda pending, why: failed.append(why))
    reaped = iter([(4243, 3 << 8)])  # exit status 3: gunicorn's WORKER_BOOT_ERROR
    monkeypatch.setattr(os, "waitpid", lambda pid, flags: next(reaped, (0, 0)))
    arbiter.reap_workers()
    assert failed == ["a new worker failed to boot"]
    assert exited == [4243] and worker.tmp._tmp.closed
    assert arbiter.WORKERS == {}


def test_master_a_new_worker_gone_after_it_was_ready_is_replaced_not_a_failed_reload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new worker that serves once ready may exit before its siblings are (recycled, or a crash
    under a request): the reload took that for a worker "exited before its model was ready" and
    threw the whole new generation away. Only a worker gone before it was ready fails it."""

    def arbiter_with(new: set[int], ready: set[int]) -> tuple[SpoArbiter, list[str]]:
        arbiter = object.__new__(SpoArbiter)
        arbiter.WORKERS = {pid: object() for pid in (1, 2, *new)}
        arbiter.states = {pid: {"state": "ready"} for pid in ready & set(arbiter.WORKERS)}
        arbiter.retiring, arbiter.timeout = set(), 30
        arbiter.pending = master.PendingReload({1, 2}, new | {11}, Settings(), "B", ready=ready)
        logged: list[str] = []
        arbiter.log = SimpleNamespace(  # type: ignore[assignment]
            warning=lambda msg, *a: logged.append(msg % a),
            error=lambda msg, *a: logged.append(msg % a),
            info=lambda msg, *a: logged.append(msg % a),
        )
        return arbiter, logged

    # 11 reported ready, served, and was reaped; 12 is ready: one more worker (13) loads for 11.
    arbiter, logged = arbiter_with({12}, ready={11, 12})
    spawned = iter([13])
    monkeypatch.setattr(arbiter, "spawn_worker", lambda: next(spawned))
    killed: list[int] = []
    monkeypatch.setattr(arbiter, "kill_worker", lambda pid, sig: killed.append(pid))
    pending = arbiter.pending
    assert pending is not None
    arbiter._advance_reload(pending)
    assert arbiter.pending is pending and pending.new == {12, 13} and killed == []
    assert "1 new worker(s) exited after their model was ready" in logged[-1]
    arbiter.WORKERS[13] = object()
    arbiter._advance_reload(pending)  # 13 loading: the old generation serves on
    assert arbiter.pending is pending and killed == []
    arbiter.states[13] = {"state": "ready"}
    arbiter._advance_reload(pending)
    assert arbiter.pending is None and sorted(killed) == [1, 2]  # the old ones retire
    assert logged[-1].startswith("reload done in")

    # 11 exited without a ready report: its model may not load; the reload fails, the old serve on.
    arbiter, logged = arbiter_with({12}, ready={12})
    monkeypatch.setattr(arbiter, "kill_worker", lambda pid, sig: None)
    pending = arbiter.pending
    assert pending is not None
    arbiter._advance_reload(pending)
    assert arbiter.pending is None
    assert "a new worker exited before its model was ready" in logged[-1]


def test_master_a_new_workers_ready_report_counts_after_it_was_reaped() -> None:
    arbiter = object.__new__(SpoArbiter)
    arbiter._reports_r, write = os.pipe()
    os.set_blocking(arbiter._reports_r, False)
    arbiter._partial, arbiter.ever_ready, arbiter.states = b"", True, {}
    arbiter.pending = master.PendingReload({1}, {11, 12}, Settings(), "B")
    arbiter.retiring, arbiter.WORKERS = set(), {1: object(), 12: object()}  # 11 reaped already
    os.write(write, b'{"pid": 11, "state": "ready"}\n{"pid": 1, "state": "ready"}\n')
    os.close(write)
    try:
        arbiter._read_reports()
    finally:
        os.close(arbiter._reports_r)
    assert arbiter.pending.ready == {11}


def test_master_an_old_worker_gone_during_a_reload_is_replaced_by_its_generation(
    monkeypatch: pytest.MonkeyPatch, models: dict[str, Path]
) -> None:
    """While the new workers loaded, nothing replaced an old one that exited (recycled at
    max_requests, killed): with both gone, every request waited seconds for the reload."""
    old, new = (
        Settings(model_dir=models["A"], workers=2),
        Settings(model_dir=models["B"], workers=2),
    )
    spawned: list[Settings | None] = []

    def fork(self: object) -> int:
        spawned.append(master.SETTINGS)
        return 20 + len(spawned)

    monkeypatch.setattr(master.Arbiter, "spawn_worker", fork)
    arbiter = object.__new__(SpoArbiter)
    arbiter.settings, arbiter._num_workers, arbiter.timeout = new, 2, 30
    arbiter.WORKERS = {2: object(), 11: object(), 12: object()}  # old worker 1 exited
    arbiter.states, arbiter.retiring, arbiter.reload_again = {}, set(), False
    arbiter._reports_r, write = os.pipe()
    os.set_blocking(arbiter._reports_r, False)
    arbiter._partial = b""
    arbiter.pending = master.PendingReload({1, 2}, {11, 12}, old, "B")
    logged: list[str] = []
    arbiter.log = SimpleNamespace(  # type: ignore[assignment]
        warning=lambda msg, *a: logged.append(msg % a), error=lambda msg, *a: logged.append(msg % a)
    )
    try:
        arbiter.manage_workers()
    finally:
        os.close(write)
        os.close(arbiter._reports_r)
    assert spawned == [old]  # one worker, of the old generation, with the old settings
    assert arbiter.pending is not None and arbiter.pending.old == {1, 2, 21}
    assert arbiter.settings is new  # the reload goes on
    assert "1 old worker(s) exited while the new ones load" in logged[-1]
