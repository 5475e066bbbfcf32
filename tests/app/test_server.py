"""``spo serve``, the gunicorn configuration and its hooks, the nginx template (no processes started)."""

from __future__ import annotations

import doctest
import logging
import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from app.cli import main
from app.core.settings import JEMALLOC_PATH, Settings
from app.serving import launch, master
from app.serving.launch import (
    GUNICORN_CONF,
    default_pid_file,
    gunicorn_args_problems,
    gunicorn_command,
    pid_file_problem,
)
from app.serving.master import SETTINGS_VAR
from app.serving.nginx import render_nginx_conf

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "model.json").write_text("{}")
    return path


def test_server_gunicorn_command_passes_flags_and_env(model_dir: Path) -> None:
    settings = Settings(model_dir=model_dir, bind="127.0.0.1:9001", workers=3, jemalloc=False)
    argv, env = gunicorn_command(settings, ["--check-config"], {"PATH": "/bin"})
    assert argv[1:6] == ["-P", "-m", "app.serving.master", "--config", str(GUNICORN_CONF)]
    assert argv[6:] == ["--bind", "127.0.0.1:9001", "--workers", "3", "--check-config"]
    argv, _ = gunicorn_command(settings, pid_file=Path("/run/x.pid"))
    assert argv[-2:] == ["--pid", "/run/x.pid"]
    # The resolved settings travel as one value, the model pinned (its directory's links resolved,
    # named as given); no SPO_* variable is written to be parsed again.
    assert Settings.from_json(env[SETTINGS_VAR]) == settings.pinned()
    assert settings.pinned().model_table == (("model", model_dir.resolve()),)
    assert env.keys() == {"PATH", SETTINGS_VAR}


def test_server_jemalloc_preload_is_switchable(model_dir: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(Path, "is_file", lambda self: True)
    _, env = gunicorn_command(Settings(model_dir=model_dir), environ={"LD_PRELOAD": "/x.so"})
    assert env["LD_PRELOAD"] == f"{JEMALLOC_PATH}:/x.so"
    _, env = gunicorn_command(
        Settings(model_dir=model_dir, jemalloc=False), environ={"LD_PRELOAD": str(JEMALLOC_PATH)}
    )
    assert env["LD_PRELOAD"] == ""


def test_server_no_jemalloc_when_missing(model_dir: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("app.core.settings.JEMALLOC_PATH", Path("/nonexistent/libjemalloc.so.2"))
    _, env = gunicorn_command(Settings(model_dir=model_dir), environ={})
    assert "LD_PRELOAD" not in env


def test_server_serve_reports_bad_settings(model_dir: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["serve", "--workers", "300"],
        env={"SPO_MODEL_DIR": str(model_dir), "SPO_LOG_FORMAT": "xml"},
    )
    assert result.exit_code == 2
    assert "SPO_WORKERS" in result.output and "SPO_LOG_FORMAT" in result.output


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bind="], {}, "Invalid value for --bind: expected a value, got nothing"),
        (["--workers="], {}, "Invalid value for --workers: expected a value, got nothing"),
        (
            [],
            {"SPO_WORKERS": "\u0661\u0662"},
            "SPO_WORKERS: expected an integer",
        ),  # Arabic-Indic 12
        (
            [],
            {"SPO_REQUEST_TIMEOUT": "\uff13"},
            "SPO_REQUEST_TIMEOUT: expected a number of seconds",
        ),
    ],
)
def test_server_serve_refuses_blank_flags_and_digits_of_other_scripts(
    triples_model_dir: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    """A blank flag fell back to the default (and over SPO_BIND); int() and float() took the
    digits of any script, and underscores anywhere."""
    result = CliRunner().invoke(
        main, ["serve", *args], env={"SPO_MODEL_DIR": str(triples_model_dir), **env}
    )
    assert result.exit_code == 2 and message in result.output, result.output


def test_server_serve_refuses_a_bad_model_before_starting(model_dir: Path) -> None:
    """model.json is checked (without TensorFlow) before gunicorn starts: exit 1 with the reason."""
    result = CliRunner().invoke(main, ["serve"], env={"SPO_MODEL_DIR": str(model_dir)})
    assert result.exit_code == 1
    assert f"cannot serve {model_dir}: model.json: field" in result.output


def test_server_serve_nginx_missing_says_how_to_install(
    triples_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.serving.supervisor.find_nginx", lambda: None)
    result = CliRunner().invoke(
        main, ["serve", "--nginx", "127.0.0.1:8080"], env={"SPO_MODEL_DIR": str(triples_model_dir)}
    )
    assert result.exit_code == 1
    assert "nginx is not installed" in result.output
    assert "apt-get install nginx-light" in result.output


@pytest.mark.parametrize(
    "listen", ["", "nowhere", "127.0.0.1:", "a b:80", "1.2.3.4:123456", "127.0.0.1:99999", "0"]
)
def test_server_serve_nginx_address_is_checked(triples_model_dir: Path, listen: str) -> None:
    result = CliRunner().invoke(
        main, ["serve", "--nginx", listen], env={"SPO_MODEL_DIR": str(triples_model_dir)}
    )
    assert result.exit_code == 2 and "--nginx" in result.output


@pytest.mark.parametrize("bind", ["localhost:99999", "127.0.0.1:0", "[::1]:65536"])
def test_server_serve_bind_port_is_checked(triples_model_dir: Path, bind: str) -> None:
    """A port gunicorn could not bind is refused with the settings, before anything starts."""
    result = CliRunner().invoke(
        main,
        ["serve", "--check-config", "--bind", bind],
        env={"SPO_MODEL_DIR": str(triples_model_dir)},
    )
    assert result.exit_code == 2
    assert f"SPO_BIND: port {bind.rsplit(':', 1)[1]} is not between 1 and 65535" in result.output


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["--workers", "5"], "workers"),
        (["-w5"], "workers"),
        (["--threa", "8"], "threads"),  # gunicorn takes abbreviations: so does the check
        (["-t", "3"], "timeout"),
        (["--preload"], "preload_app"),
        (["-c", "other.conf.py"], "config"),
        (["myapp:app"], "args"),
    ],
)
def test_server_gunicorn_args_that_spo_decides_are_refused(
    triples_model_dir: Path, args: list[str], setting: str
) -> None:
    """After --, a gunicorn flag would win over the config file: the sizing, the threads per worker
    or the load after the fork would no longer be what runs. Refused, saying what to use."""
    result = CliRunner().invoke(
        main,
        ["serve", "--check-config", "--", *args],
        env={"SPO_MODEL_DIR": str(triples_model_dir)},
    )
    assert result.exit_code == 2
    assert f"gunicorn's {setting} setting: " in result.output


def test_server_other_gunicorn_args_pass(triples_model_dir: Path) -> None:
    argv, _ = gunicorn_command(
        Settings(model_dir=triples_model_dir), ["--log-level", "debug"], environ={}
    )
    assert argv[-2:] == ["--log-level", "debug"]
    assert gunicorn_args_problems(["--log-level", "debug", "--keep-alive", "10"]) == []
    assert doctest.testmod(launch).failed == 0


def test_server_pid_file_the_master_cannot_write_is_refused_before_it_starts(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    """gunicorn makes no directory for its pid file: it ended in a traceback after starting."""
    (tmp_path / "notes.md").write_text("keep\n")
    (tmp_path / "link.pid").symlink_to(tmp_path / "notes.md")
    for pid_file, problem in (
        (tmp_path / "run" / "spo.pid", f"{tmp_path / 'run'} is not a directory"),
        (tmp_path / "notes.md" / "spo.pid", f"{tmp_path / 'notes.md'} is not a directory"),
        (tmp_path, f"the pid file {tmp_path} is a directory"),
        # gunicorn replaced whatever the path named and deleted it at exit: a file named by
        # mistake, or /dev/null when run as root.
        (tmp_path / "notes.md", "holds something other than a pid"),
        (Path("/dev/null"), "exists and is not a regular file"),
        (tmp_path / "link.pid", "holds something other than a pid"),  # a link to notes.md
        (tmp_path / ("x" * 300), "File name too long"),
    ):
        result = CliRunner().invoke(
            main,
            ["serve", "--check-config"],
            env={"SPO_MODEL_DIR": str(triples_model_dir), "SPO_PID_FILE": str(pid_file)},
        )
        assert (
            result.exit_code == 2 and problem in result.output and "(SPO_PID_FILE)" in result.output
        )
    assert (tmp_path / "notes.md").read_text() == "keep\n"
    assert pid_file_problem(tmp_path / "spo.pid") is None
    # What a master left (a pid, or an empty file) is a pid file: remove_stale_pid_file's to judge.
    for left in ("4242\n", ""):
        (tmp_path / "spo.pid").write_text(left)
        assert pid_file_problem(tmp_path / "spo.pid") is None


def test_server_default_pid_file_is_per_address() -> None:
    assert default_pid_file("127.0.0.1:8000") != default_pid_file("127.0.0.1:8001")
    assert default_pid_file("[::1]:80").name == "spo-service-1-80.pid"


def test_server_serve_check_config(triples_model_dir: Path, tmp_path: Path) -> None:
    """The real gunicorn validates the real config file (the app is loaded, not with a model), and
    leaves nothing behind (the metrics directory the config file makes is removed)."""
    result = subprocess.run(
        [str(Path(__import__("sys").executable).with_name("spo")), "serve", "--check-config"],
        env={
            "SPO_MODEL_DIR": str(triples_model_dir),
            "SPO_LOAD_MODE": "background",
            "PATH": "/usr/bin:/bin",
            "TMPDIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # The resolved sizing and why (app.core.sizing), before gunicorn's own check.
    assert "resolved sizing" in result.stdout
    assert re.search(r"^  workers: \d+$", result.stdout, re.M)
    assert "because usable CPUs:" in result.stdout
    assert "TensorFlow intra-op threads per worker" in result.stdout
    assert not list(tmp_path.iterdir())


def test_server_auto_workers_reach_gunicorn_as_sized(model_dir: Path) -> None:
    auto = Settings(model_dir=model_dir)
    assert auto.workers_auto and auto.workers >= 1
    argv, env = gunicorn_command(auto, environ={"SPO_WORKERS": "auto"})
    handed = Settings.from_json(env[SETTINGS_VAR])
    assert handed.workers_auto  # so gunicorn.conf.py logs the reasons, not "set explicitly"
    assert argv[argv.index("--workers") + 1] == str(auto.workers) == str(handed.workers)
    assert not Settings(model_dir=model_dir, workers=2).workers_auto


# -- deploy/gunicorn.conf.py -----------------------------------------------------------------
@pytest.fixture(autouse=True)
def fresh_master(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's gunicorn.conf.py reads its own settings (app.serving.master keeps the first it read)."""
    monkeypatch.setattr(master, "SETTINGS", None)
    for name in list(os.environ):
        if name.startswith("SPO_"):
            monkeypatch.delenv(name)
    # gunicorn.conf.py sets it for the master's workers: taken back after each test, or every
    # later app of this process would serve the metrics of that directory.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)


@pytest.fixture
def conf(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("SPO_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SPO_WORKERS", "2")
    monkeypatch.setenv("SPO_MAX_REQUESTS", "500")
    monkeypatch.setenv("SPO_MAX_REQUESTS_JITTER", "50")
    monkeypatch.setenv("SPO_MAX_WORKER_RSS_MB", "1")
    return runpy.run_path(str(GUNICORN_CONF))


def test_server_gunicorn_conf_from_settings(conf: dict[str, Any]) -> None:
    assert conf["preload_app"] is False
    assert conf["wsgi_app"] == "app.serving.master:worker_app()"
    assert (
        conf["workers"] == 2 and conf["worker_class"] == "app.serving.gunicorn_worker.ThreadWorker"
    )
    assert (conf["max_requests"], conf["max_requests_jitter"]) == (500, 50)
    assert conf["timeout"] >= 60


def test_server_rss_watchdog_retires_worker(conf: dict[str, Any], caplog: Any) -> None:
    worker = SimpleNamespace(alive=True, pid=42, log=logging.getLogger("gunicorn.error"))
    with caplog.at_level(logging.WARNING, logger="gunicorn.error"):
        conf["post_request"](worker, None, {}, None)  # any process is over 1 MiB
    assert worker.alive is False
    assert "retiring it gracefully" in caplog.text


def test_server_heartbeat_counts_from_the_oldest_model_call_still_running(
    conf: dict[str, Any], tmp_path: Path
) -> None:
    """gthread's main loop beats about once a second whatever its threads do. Each beat is dated no
    later than a second into the oldest model call still running, so gunicorn's timeout replaces a
    worker whose call never returns, while calls that end (back to back, or two models' calls
    overlapping) keep it alive."""
    heartbeat = tmp_path / "heartbeat"
    heartbeat.write_bytes(b"")
    fd = os.open(heartbeat, os.O_RDONLY)
    now = [1000.0]
    started: list[float | None] = [None]

    def beat() -> None:  # gunicorn's WorkerTmp.notify, on a clock of the test's
        os.utime(fd, (now[0], now[0]))

    tmp = SimpleNamespace(fileno=lambda: fd, last_update=lambda: os.fstat(fd).st_mtime)
    worker = SimpleNamespace(notify=beat, tmp=tmp)
    models = SimpleNamespace(call_started=lambda: started[0])
    conf["hold_heartbeat_during_model_calls"](worker, models, clock=lambda: now[0])
    try:
        worker.notify()
        assert tmp.last_update() == 1000.0
        # Two models' calls overlapping, each 3 s, half a call apart: the oldest is always younger
        # than 3 s, so the beat is never more than 2 s behind.
        for k in range(200):
            now[0] += 1
            started[0] = now[0] - (k % 3) * 0.5 - 1.5
            worker.notify()
            assert now[0] - tmp.last_update() <= 2.0
        # One call wedged: the beat stays one second into it, however long it runs.
        started[0] = now[0] - 0.5
        for _ in range(300):
            now[0] += 1
            worker.notify()
        assert tmp.last_update() == started[0] + 1.0
        started[0] = None
        worker.notify()
        assert tmp.last_update() == now[0]
    finally:
        os.close(fd)


def test_server_gunicorn_conf_takes_the_handed_settings_and_parses_nothing(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: spo serve's resolved value reaches the master once; SPO_* is not parsed again."""
    handed = Settings(model_dir=model_dir, workers=3, max_requests=700, max_requests_jitter=7)
    _, env = gunicorn_command(handed, environ={})
    monkeypatch.setenv(SETTINGS_VAR, env[SETTINGS_VAR])
    monkeypatch.setenv("SPO_WORKERS", "not-a-number")  # would fail a parse
    monkeypatch.setattr(Settings, "from_env", None)  # and there is none
    conf = runpy.run_path(str(GUNICORN_CONF))
    assert (conf["workers"], conf["max_requests"], conf["max_requests_jitter"]) == (3, 700, 7)
    assert SETTINGS_VAR not in os.environ  # read once, not inherited by the workers
    assert master.handed_settings() is conf["settings"] == handed.pinned()


def test_server_rss_watchdog_off_when_zero(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPO_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("SPO_MAX_WORKER_RSS_MB", "0")
    conf = runpy.run_path(str(GUNICORN_CONF))
    worker = SimpleNamespace(alive=True, pid=42, log=logging.getLogger("gunicorn.error"))
    conf["post_request"](worker, None, {}, None)
    assert worker.alive is True


# -- deploy/nginx.conf -----------------------------------------------------------------------
def test_server_nginx_conf_carries_the_limits(model_dir: Path, tmp_path: Path) -> None:
    settings = Settings(model_dir=model_dir, max_body_bytes=12345, timeout=100)
    text = render_nginx_conf(
        settings, listen="127.0.0.1:81", upstream="127.0.0.1:82", prefix=tmp_path
    )
    assert "client_max_body_size 12345;" in text
    assert "proxy_read_timeout 110s;" in text
    assert text.count("server 127.0.0.1:82 max_fails=0;") == 2  # a retry needs a second entry
    assert "listen 127.0.0.1:81;" in text
    assert "{{" not in text


@pytest.mark.parametrize("euid", [0, 1000])
def test_server_nginx_conf_never_runs_workers_as_root(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, euid: int
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    text = render_nginx_conf(
        Settings(model_dir=model_dir), listen="127.0.0.1:1", upstream="127.0.0.1:2", prefix=tmp_path
    )
    users = re.findall(r"^\s*user\s+([^;]+);", text, re.M)
    assert "root" not in " ".join(users)
    assert users == (["nobody nogroup"] if euid == 0 else [])


def test_server_nginx_rate_limit_only_when_set(model_dir: Path, tmp_path: Path) -> None:
    off = render_nginx_conf(
        Settings(model_dir=model_dir), listen="127.0.0.1:1", upstream="127.0.0.1:2", prefix=tmp_path
    )
    assert "limit_req " not in off and "limit_req_zone" not in off
    on = render_nginx_conf(
        Settings(model_dir=model_dir, rate_limit="5r/s", rate_burst=7),
        listen="127.0.0.1:1",
        upstream="127.0.0.1:2",
        prefix=tmp_path,
    )
    assert "limit_req_zone $spo_rate_key zone=spo_clients:10m rate=5r/s;" in on
    assert "limit_req zone=spo_clients burst=7 nodelay;" in on
    assert "limit_req_status 429;" in on
    assert '"code":"rate_limited"' in on


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs nginx-light)")
@pytest.mark.parametrize("rate_limit", ["", "10r/s"])
def test_server_nginx_conf_is_valid(model_dir: Path, tmp_path: Path, rate_limit: str) -> None:
    text = render_nginx_conf(
        Settings(model_dir=model_dir, rate_limit=rate_limit),
        listen="127.0.0.1:1",
        upstream="127.0.0.1:2",
        prefix=tmp_path,
    )
    (tmp_path / "nginx.conf").write_text(text)
    result = subprocess.run(
        [str(NGINX), "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
