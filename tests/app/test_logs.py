"""One logging setup: text or JSON lines, the access line's fields, no input text unless asked."""

from __future__ import annotations

import doctest
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from flask import Flask, request
from flask.testing import FlaskClient

from app.cli import main
from app.core.logs import AccessLogger, JsonFormatter, TextFormatter, access_fields, access_message
from app.core.settings import LogSettings, SettingsError

SECRET = "李白出生于碎叶城。"


class FakeResponse:
    status = "200 OK"
    sent = 321
    headers: ClassVar = [("Content-Type", "application/json"), ("X-Request-ID", "rid-1")]


def summary_of(client: FlaskClient, body: dict[str, Any]) -> dict[str, Any]:
    """What the app left in the WSGI environ for gunicorn's access line."""
    with client:  # keeps the request context after the answer
        assert client.post("/v1/extract", json=body).status_code == 200
        summary: dict[str, Any] = request.environ["spo.request"]
    return summary


def test_logging_request_summary_has_texts_tokens_and_buckets(client: FlaskClient) -> None:
    summary = summary_of(client, {"texts": [SECRET, "北京"]})
    assert summary["texts"] == 2
    assert summary["tokens"] == len(SECRET) + 2
    assert summary["buckets"] and all(b.count("x") == 1 for b in summary["buckets"])
    assert "input" not in summary


def test_logging_input_text_only_when_the_setting_says_so(
    make_fake_app: Callable[..., Flask],
) -> None:
    assert "input" not in summary_of(make_fake_app().test_client(), {"text": SECRET})
    on = summary_of(make_fake_app(log_input_text=True).test_client(), {"text": SECRET})
    assert on["input"] == [SECRET]


def test_logging_access_line_in_json_and_text() -> None:
    environ = {
        "REMOTE_ADDR": "10.0.0.1",
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/extract",
        "spo.request": {"texts": 2, "tokens": 11, "buckets": ["2x16"]},
    }
    fields = access_fields(FakeResponse(), environ, 0.0123)
    assert fields == {
        "request_id": "rid-1",
        "remote": "10.0.0.1",
        "method": "POST",
        "path": "/v1/extract",
        "status": 200,
        "latency_ms": 12.3,
        "bytes": 321,
        "texts": 2,
        "tokens": 11,
        "buckets": ["2x16"],
    }
    message = access_message(fields)
    assert (
        message == '10.0.0.1 "POST /v1/extract" 200 12.3ms texts=2 tokens=11 buckets=2x16 rid=rid-1'
    )
    record = logging.LogRecord("gunicorn.access", logging.INFO, __file__, 1, message, None, None)
    record.access = fields
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == message
    assert {k: doc[k] for k in fields} == fields
    assert TextFormatter().format(record).endswith(message)


def test_logging_access_line_behind_a_proxy_on_a_unix_socket_and_with_quotes_in_the_path() -> None:
    """Behind nginx (gunicorn on a unix socket) the remote was empty; a path with a quote closed
    the quoted request and wrote fields of its own (a status, a latency, a request id)."""
    environ = {
        "REMOTE_ADDR": "",
        "HTTP_X_FORWARDED_FOR": "203.0.113.9, 198.51.100.4",
        "REQUEST_METHOD": "GET",
        "PATH_INFO": '/v1/extract" 200 1.0ms rid=x "\\',
    }
    fields = access_fields(FakeResponse(), environ, 0.001)
    assert fields["remote"] == "198.51.100.4"  # the entry nginx added: its own peer
    message = access_message(fields)
    assert message.startswith('198.51.100.4 "GET /v1/extract\\" 200 1.0ms rid=x \\"\\\\" 200 ')


def test_logging_text_lines_are_one_line_whatever_the_input() -> None:
    """A path with %0A in it reached the text access log as a line break: a client could end its
    line and write one that looks like the service's own. Line breaks and control characters in a
    message are escaped; an exception's traceback still follows on lines of its own."""
    import app.core.logs as logs_module

    environ = {"REMOTE_ADDR": "10.0.0.1", "REQUEST_METHOD": "GET"}
    forged = "/x\n2026-12-06 04:40:33,001 INFO app.web.api model replaced\r\x1b[2J\u2028"
    fields = access_fields(FakeResponse(), {**environ, "PATH_INFO": forged}, 0.001)
    message = access_message(fields)
    record = logging.LogRecord("gunicorn.access", logging.INFO, __file__, 1, message, None, None)
    record.access = fields
    line = TextFormatter().format(record)
    assert len(line.splitlines()) == 1 and "\x1b" not in line
    assert (
        '"GET /x\\n2026-12-06 04:40:33,001 INFO app.web.api model replaced\\r\\x1b[2J\\u2028"'
        in line
    )
    as_json = JsonFormatter().format(record)
    assert len(as_json.splitlines()) == 1  # U+2028 too: a line break to str.splitlines()
    assert json.loads(as_json)["path"] == forged
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        failed = logging.LogRecord(
            "app", logging.ERROR, __file__, 1, "failed on %s", ("a\nb",), sys.exc_info()
        )
    text = TextFormatter().format(failed)
    assert text.splitlines()[0].endswith("failed on a\\nb")
    assert "Traceback (most recent call last)" in text.splitlines()[1]
    assert doctest.testmod(logs_module).failed == 0


def test_logging_access_logger_writes_one_line_per_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Cfg:
        accesslog = "-"

    logger = AccessLogger.__new__(AccessLogger)
    logger.cfg = Cfg()
    logger.access_log = logging.getLogger("test.access")
    logger.error_log = logging.getLogger("test.error")
    environ = {"REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "GET", "PATH_INFO": "/healthz"}
    with caplog.at_level(logging.INFO, logger="test.access"):
        logger.access(FakeResponse(), None, environ, timedelta(milliseconds=5))
        Cfg.accesslog = None  # SPO_ACCESS_LOG=off
        logger.access(FakeResponse(), None, environ, timedelta(milliseconds=5))
    [record] = caplog.records
    assert record.access["path"] == "/healthz"  # type: ignore[attr-defined]


def test_logging_settings_alone_are_checked() -> None:
    assert LogSettings.from_env({}) == LogSettings("text", "INFO")
    assert LogSettings.from_env(
        {"SPO_LOG_FORMAT": "JSON", "SPO_LOG_LEVEL": "debug"}
    ) == LogSettings("json", "DEBUG")
    with pytest.raises(SettingsError) as error:
        LogSettings.from_env({"SPO_LOG_FORMAT": "xml", "SPO_LOG_LEVEL": "loud"})
    assert len(error.value.problems) == 2


def test_logging_cli_refuses_a_bad_log_format() -> None:
    result = CliRunner().invoke(main, ["extract", "--help"], env={"SPO_LOG_FORMAT": "xml"})
    assert result.exit_code == 2
    assert "SPO_LOG_FORMAT" in result.output


@pytest.mark.slow
def test_logging_batch_command_logs_json_lines_without_input_text(
    triples_model_dir: Path, tmp_path: Path
) -> None:
    spo = Path(sys.executable).with_name("spo")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        "SPO_LOG_FORMAT": "json",
    }
    result = subprocess.run(
        [str(spo), "extract", "-", "--workers", "0", "--model-dir", str(triples_model_dir),
         "--metrics-file", str(tmp_path / "spo.prom")],
        input=(SECRET + "\n").encode(), capture_output=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    ours = [line for line in result.stderr.decode().splitlines() if line.startswith("{")]
    docs = [json.loads(line) for line in ours]
    assert any(d["logger"] == "nlp.runtime" and "warm-up" in d["message"] for d in docs), ours
    assert SECRET not in result.stderr.decode()
    assert "spo_batch_records 1.0" in (tmp_path / "spo.prom").read_text()


def test_logging_serve_warns_of_an_unknown_variable_in_the_log_format(tmp_path: Path) -> None:
    """``spo serve`` parsed its settings before it set up logging: the warning about an unknown
    SPO_ variable went out as a bare text line, the one non-JSON line of a SPO_LOG_FORMAT=json run."""
    spo = Path(sys.executable).with_name("spo")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
        "SPO_LOG_FORMAT": "json",
        "SPO_TYPO": "1",
        "TMPDIR": str(tmp_path),
    }
    run = subprocess.run(
        [str(spo), "serve", "--bind", "127.0.0.1:1", "--check-config"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stderr.splitlines()]  # every one a JSON object
    assert any("ignoring unknown variables: SPO_TYPO" in doc["message"] for doc in lines)
