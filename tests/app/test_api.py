"""In-process tests of every endpoint and every problem answer (Flask test client)."""

from __future__ import annotations

import gzip
import io
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.core.settings import Settings
from app.web.model_slot import ModelSlot
from nlp.errors import ManifestError

PROBLEM = "application/problem+json"
TEXTS = [
    "李白出生于碎叶城，他的妻子是许氏。",
    "《红楼梦》的作者是曹雪芹。",
    "",
    "ＡＢＣ，全角标点！？emoji😀和组合字符é在一起。",
    "北京" * 100,
]


def assert_problem(
    response: Any, status: int, code: str, field: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.mimetype == PROBLEM
    body: dict[str, Any] = response.get_json(force=True)
    assert body["status"] == status
    assert body["code"] == code
    assert body["title"] and body["detail"] and body["type"] == "about:blank"
    assert body["request_id"] == response.headers["X-Request-ID"]
    if field is not None:
        assert body["field"] == field
    return body


def assert_offsets(text: str, result: dict[str, Any]) -> None:
    spans = list(result["entities"])
    for triple in result["triples"]:
        spans += [triple["subject"], triple["object"]]
        assert triple["subject"] in result["entities"] and triple["object"] in result["entities"]
    for span in spans:
        assert 0 <= span["start"] < span["end"] <= len(text)
        assert text[span["start"] : span["end"]] == span["text"]
        assert isinstance(span["type"], str)


# -- happy paths (real tiny model) ---------------------------------------------------------------
def test_api_healthz_is_ok(client: FlaskClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok"}


def test_api_readyz_names_the_loaded_model(client: FlaskClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    brief = {"name": "tiny-triples", "version": "7", "task": "triples"}
    # One model (SPO_MODEL_DIR): served under its directory's name, the default.
    (served,) = client.application.extensions["spo.models"].names
    assert response.get_json() == {"status": "ready", "model": brief, "models": {served: brief}}


def test_api_model_is_the_manifest_summary(client: FlaskClient, triples_extractor: Any) -> None:
    response = client.get("/v1/model")
    assert response.status_code == 200
    body = response.get_json()
    assert body == triples_extractor.manifest.summary()
    assert [p["predicate"] for p in body["predicates"]] == ["出生地", "妻子", "作者"]
    assert "directory" not in body and "vocab" not in body


def test_api_extract_one_text(client: FlaskClient, triples_extractor: Any) -> None:
    response = client.post("/v1/extract", json={"text": TEXTS[0]})
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    body = response.get_json()
    assert body["model"] == {"name": "tiny-triples", "version": "7", "task": "triples"}
    assert body["results"] == [triples_extractor.extract(TEXTS[0]).to_dict()]
    assert_offsets(TEXTS[0], body["results"][0])


def test_api_extract_texts_in_input_order(client: FlaskClient, triples_extractor: Any) -> None:
    texts = [*TEXTS, TEXTS[0]]
    response = client.post("/v1/extract", json={"texts": texts})
    assert response.status_code == 200
    results = response.get_json()["results"]
    assert len(results) == len(texts)
    for text, result in zip(texts, results, strict=True):
        assert result == triples_extractor.extract(text).to_dict()
        assert_offsets(text, result)
    assert results[0] == results[-1]
    assert results[2] == {"entities": [], "triples": []}


def test_api_extract_keeps_input_order_and_offsets(fake_client: FlaskClient) -> None:
    # The fake finds every 北京, so each result differs and order mistakes show.
    texts = ["在北京", "北京", "无", "北京和北京", "😀北京", "e\u0301北京", "在北京"]
    response = fake_client.post("/v1/extract", json={"texts": texts})
    assert response.status_code == 200
    results = response.get_json()["results"]
    assert [len(r["entities"]) for r in results] == [1, 1, 0, 2, 1, 1, 1]
    assert [r["entities"][0]["start"] for r in results if r["entities"]] == [1, 0, 0, 1, 2, 1]
    for text, result in zip(texts, results, strict=True):
        assert_offsets(text, result)


def test_api_extract_answers_utf8_not_escapes(client: FlaskClient) -> None:
    response = client.post("/v1/extract", json={"text": "北京" * 10})
    assert response.status_code == 200
    assert "\\u" not in response.get_data(as_text=True)


def test_api_extract_accepts_charset_parameter(client: FlaskClient) -> None:
    response = client.post(
        "/v1/extract",
        data='{"text": "北京"}'.encode(),
        content_type="application/json; charset=UTF-8",
    )
    assert response.status_code == 200


def test_api_extract_text_at_the_limit_is_accepted(client: FlaskClient) -> None:
    response = client.post("/v1/extract", json={"text": "中" * 300})
    assert response.status_code == 200


# -- problems ------------------------------------------------------------------------------------
LONG = "中" * 301
BAD_DOCUMENTS = [
    pytest.param(b"{", "invalid_json", 400, None, id="truncated"),
    pytest.param(b"", "invalid_json", 400, None, id="empty-body"),
    pytest.param(b'{"text": "a"} x', "invalid_json", 400, None, id="trailing-garbage"),
    pytest.param(b'{"text": NaN}', "invalid_json", 400, None, id="nan"),
    pytest.param(b'{"text": "a", "text": "b"}', "invalid_json", 400, None, id="duplicate-key"),
    pytest.param(b'{"text": "\xff\xfe"}', "invalid_json", 400, None, id="not-utf8"),
    pytest.param(b"\xef\xbb\xbf" + b'{"text": "a"}', "invalid_json", 400, None, id="bom"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "invalid_json", 400, None, id="deep-nesting"),
    pytest.param(b'{"text": ' + b"1" * 5000 + b"}", "invalid_json", 400, None, id="huge-int"),
    pytest.param(b'"just a string"', "invalid_input", 422, None, id="not-an-object"),
    pytest.param(b"null", "invalid_input", 422, None, id="null"),
    pytest.param(b"{}", "invalid_input", 422, None, id="neither"),
    pytest.param(b'{"text": "a", "texts": ["b"]}', "invalid_input", 422, None, id="both"),
    pytest.param(b'{"text": "a", "lang": "zh"}', "unknown_field", 422, "lang", id="unknown-field"),
    pytest.param(b'{"txt": "a"}', "unknown_field", 422, "txt", id="typo"),
    pytest.param(b'{"\\ud800": "a"}', "unknown_field", 422, "\\ud800", id="surrogate-key"),
    pytest.param(b'{"text": "a", "\\udfff": 1}', "unknown_field", 422, "\\udfff",
                 id="surrogate-key-beside-text"),
    pytest.param(b'{"\\ud800": 1, "\\ud800": 2}', "invalid_json", 400, None,
                 id="surrogate-duplicate-key"),
    pytest.param(b'{"text": 1}', "invalid_input", 422, "text", id="text-int"),
    pytest.param(b'{"text": null}', "invalid_input", 422, "text", id="text-null"),
    pytest.param(b'{"text": ["a"]}', "invalid_input", 422, "text", id="text-list"),
    pytest.param(b'{"texts": "a"}', "invalid_input", 422, "texts", id="texts-string"),
    pytest.param(b'{"texts": {"0": "a"}}', "invalid_input", 422, "texts", id="texts-object"),
    pytest.param(b'{"texts": ["a", 2]}', "invalid_input", 422, "texts[1]", id="texts-item-int"),
    pytest.param(b'{"texts": ["a", null]}', "invalid_input", 422, "texts[1]", id="texts-item-null"),
    pytest.param(b'{"texts": []}', "empty_texts", 422, "texts", id="empty-texts"),
    pytest.param(b'{"texts": ' + b'["a"' + b',"a"' * 8 + b"]}", "too_many_texts", 422, "texts",
                 id="too-many-texts"),
    pytest.param(f'{{"text": "{LONG}"}}'.encode(), "text_too_long", 422, "text", id="text-too-long"),
    pytest.param(f'{{"texts": ["a", "{LONG}"]}}'.encode(), "text_too_long", 422, "texts[1]",
                 id="texts-item-too-long"),
    pytest.param(b'{"text": "a\\ud800b"}', "invalid_input", 422, "text", id="lone-surrogate"),
    pytest.param(b'{"text": "\\udc00"}', "invalid_input", 422, "text", id="lone-low-surrogate"),
    pytest.param(b'{"texts": ["ok", "x\\ud83d"]}', "invalid_input", 422, "texts[1]",
                 id="texts-item-surrogate"),
    pytest.param(b'{"text": "a\\u0000b"}', "invalid_input", 422, "text", id="nul"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "code", "status", "field"), BAD_DOCUMENTS)
def test_api_extract_rejects_bad_documents(
    client: FlaskClient, body: bytes, code: str, status: int, field: str | None
) -> None:
    response = client.post("/v1/extract", data=body, content_type="application/json")
    assert_problem(response, status, code, field)


def test_api_extract_names_a_byte_order_mark(client: FlaskClient) -> None:
    """A BOM (a file saved by an editor that adds one) is named as such, not with the JSON parser's
    own words (which told the client to decode with Python's utf-8-sig)."""
    response = client.post(
        "/v1/extract", data=b"\xef\xbb\xbf" + b'{"text": "a"}', content_type="application/json"
    )
    assert_problem(response, 400, "invalid_json")
    detail = response.get_json()["detail"]
    assert "byte order mark (U+FEFF)" in detail and "utf-8-sig" not in detail


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        (b'{"text": ' + b"1" * 5000 + b"}", "an integer has more than 4300 digits"),
    ],
)
def test_api_extract_names_unacceptable_json_in_its_own_words(
    client: FlaskClient, body: bytes, said: str
) -> None:
    """Python's own words (``sys.set_int_max_str_digits()``, "maximum recursion depth") mean
    nothing to a client."""
    response = client.post("/v1/extract", data=body, content_type="application/json")
    detail = assert_problem(response, 400, "invalid_json")["detail"]
    assert said in detail and "sys." not in detail and "recursion" not in detail


def test_api_extract_surrogate_pair_escape_is_fine(client: FlaskClient) -> None:
    response = client.post(
        "/v1/extract", data=b'{"text": "\\ud83d\\ude00"}', content_type="application/json"
    )
    assert response.status_code == 200


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_api_extract_wrong_content_type_is_415(
    client: FlaskClient, content_type: str | None
) -> None:
    response = client.post("/v1/extract", data=b'{"text": "a"}', content_type=content_type)
    assert_problem(response, 415, "unsupported_media_type")


@pytest.mark.parametrize("encoding", ["gzip", "br, gzip"])
def test_api_extract_compressed_body_is_415(client: FlaskClient, encoding: str) -> None:
    """A compressed body is refused with what to send, not read as it is: gzip of JSON is not UTF-8,
    and a body that only claims compression would be served as something the client did not send."""
    response = client.post(
        "/v1/extract",
        data=gzip.compress(b'{"text": "a"}') if encoding == "gzip" else b'{"text": "a"}',
        content_type="application/json",
        headers={"Content-Encoding": encoding},
    )
    assert_problem(response, 415, "unsupported_media_type")
    assert response.headers["Accept-Encoding"] == "identity"
    assert "compressed" in response.get_json()["detail"]
    plain = {"Content-Encoding": "identity"}
    assert client.post("/v1/extract", json={"text": "a"}, headers=plain).status_code == 200


def test_api_extract_unreadable_body_is_400_not_500(client: FlaskClient) -> None:
    """gunicorn's reader raises its own errors on broken chunked framing (``InvalidChunkSize``) or a
    body cut short: the client's fault, answered 400 ``bad_request`` (was a 500)."""

    class InvalidChunkSize(Exception):  # gunicorn's: an Exception, not the OSError werkzeug catches
        pass

    class BrokenChunks:
        def read(self, *size: int) -> bytes:
            raise InvalidChunkSize("Invalid chunk size: b'zz'")

        readline = read

    response = client.post(
        "/v1/extract",
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input": BrokenChunks(), "wsgi.input_terminated": True},
    )
    assert_problem(response, 400, "bad_request")
    assert "chunked framing is broken" in response.get_json()["detail"]
    assert "zz" not in response.get_json()["detail"]


@pytest.mark.parametrize("body", [b'{"text": "abc"}', b'{"texts": ["a", "b"]}', b'{"text": "a'])
def test_api_extract_body_shorter_than_its_content_length_is_400(
    client: FlaskClient, body: bytes
) -> None:
    """gunicorn ends the body where the connection ends, without an error: 15 bytes of a declared
    1000 were answered 200 as if whole (or, cut inside the JSON, as ``invalid_json``)."""
    response = client.post(
        "/v1/extract",
        input_stream=io.BytesIO(body),
        content_type="application/json",
        # As gunicorn passes it: the length the client announced, the stream ending with the connection.
        environ_overrides={"CONTENT_LENGTH": "1000", "wsgi.input_terminated": True},
    )
    assert_problem(response, 400, "bad_request")
    assert response.get_json()["detail"] == (
        f"The request body ended after {len(body)} of the 1000 bytes its Content-Length announced."
    )


@pytest.mark.parametrize("coding", ["gzip, chunked", "deflate,chunked", "chunked, chunked"])
def test_api_extract_a_transfer_coding_other_than_chunked_is_501(
    client: FlaskClient, coding: str
) -> None:
    """gunicorn alone read a ``gzip, chunked`` body as plain chunked: an uncompressed body so
    labelled was answered 200, a compressed one as invalid UTF-8. nginx answers 501; so does the app."""
    response = client.post(
        "/v1/extract",
        input_stream=io.BytesIO(b'{"text": "abc"}'),
        content_type="application/json",
        headers={"Transfer-Encoding": coding},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert_problem(response, 501, "bad_request")
    assert "transfer coding this server does not implement" in response.get_json()["detail"]
    chunked = client.post(
        "/v1/extract",
        input_stream=io.BytesIO(b'{"text": "abc"}'),
        content_type="application/json",
        headers={"Transfer-Encoding": "Chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert chunked.status_code == 200


def test_api_extract_body_over_limit_is_413(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(max_body_bytes=2048, max_text_chars=4000).test_client()
    at_limit = b'{"text": "' + b"a" * (2048 - 12) + b'"}'
    assert len(at_limit) == 2048
    over = at_limit[:-2] + b'a"}'

    def post(body: bytes, chunked: bool) -> Any:
        """``body`` streamed, with its Content-Length or chunked (no length known up front)."""
        length = {"Content-Length": str(len(body))}
        return client.post(
            "/v1/extract",
            input_stream=io.BytesIO(body),
            content_type="application/json",
            headers={"Transfer-Encoding": "chunked"} if chunked else length,
            environ_overrides={"wsgi.input_terminated": chunked},
        )

    for chunked in (False, True):
        assert post(at_limit, chunked).status_code == 200
        assert_problem(post(over, chunked), 413, "body_too_large")
    body = b'{"text": "' + b"a" * 2100 + b'"}'
    assert_problem(
        client.post("/v1/extract", data=body, content_type="application/json"),
        413,
        "body_too_large",
    )
    # Chunked (no Content-Length, as gunicorn passes it): cut off while reading, same answer.
    response = client.post(
        "/v1/extract",
        input_stream=io.BytesIO(body),
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert_problem(response, 413, "body_too_large")


def test_api_unknown_path_is_404_problem(client: FlaskClient) -> None:
    assert_problem(client.get("/nope"), 404, "not_found")
    assert_problem(client.post("/v1/extract/x", json={}), 404, "not_found")


@pytest.mark.parametrize(
    "path", ["/v1//extract", "/v1/models//extract", "/v1/models/demo//extract"]
)
def test_api_doubled_slash_is_404_problem_not_a_redirect(client: FlaskClient, path: str) -> None:
    """Werkzeug merges slashes with a 308 redirect (an HTML body, and a Location built from the
    client's Host header); the API has one spelling of each path."""
    response = client.post(path, json={"text": "a"}, headers={"Host": "elsewhere.example"})
    assert_problem(response, 404, "not_found")
    assert "Location" not in response.headers


def test_api_quotes_a_clients_long_name_shortened(client: FlaskClient) -> None:
    """A name the client sent comes back shortened, not whole (a 5,000-character field or model
    name would otherwise be echoed in full)."""
    long = "k" * 5000
    body = assert_problem(
        client.post("/v1/extract", json={"text": "a", long: 1}), 422, "unknown_field"
    )
    assert body["field"] == "k" * 64 + "..." and len(body["detail"]) < 200
    body = assert_problem(
        client.post(f"/v1/models/{long}/extract", json={"text": "a"}), 404, "unknown_model"
    )
    assert len(body["detail"]) < 200


def test_api_wrong_method_is_405_problem_with_allow(client: FlaskClient) -> None:
    response = client.get("/v1/extract")
    assert_problem(response, 405, "method_not_allowed")
    assert "POST" in response.headers["Allow"]
    assert_problem(client.delete("/healthz"), 405, "method_not_allowed")


def test_api_unexpected_error_is_logged_and_leaks_nothing(
    fake_client: FlaskClient, fake_extractor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fake_extractor.fail = RuntimeError("secret at /srv/models/x.pb")
    with caplog.at_level(logging.ERROR, logger="app.web.errors"):
        response = fake_client.post("/v1/extract", json={"text": "北京"})
    body = assert_problem(response, 500, "internal_error")
    assert "secret" not in response.get_data(as_text=True)
    assert "RuntimeError" not in response.get_data(as_text=True)
    [record] = [r for r in caplog.records if r.name == "app.web.errors"]
    assert record.exc_info is not None and "secret" in caplog.text
    assert body["request_id"]


# -- request id ------------------------------------------------------------------------------
def test_api_request_id_is_echoed(client: FlaskClient) -> None:
    response = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert response.headers["X-Request-ID"] == "abc-123"
    response = client.post("/v1/extract", json={}, headers={"X-Request-ID": "req.42"})
    assert response.headers["X-Request-ID"] == "req.42"
    assert response.get_json()["request_id"] == "req.42"


@pytest.mark.parametrize("given", [None, "", "x" * 129, "a b", "<script>", "é"])
def test_api_request_id_generated_when_absent_or_insane(
    client: FlaskClient, given: str | None
) -> None:
    headers = {} if given is None else {"X-Request-ID": given}
    first = client.get("/healthz", headers=headers).headers["X-Request-ID"]
    second = client.get("/healthz", headers=headers).headers["X-Request-ID"]
    assert first != second and len(first) == 32 and first.isalnum()


# -- readiness -------------------------------------------------------------------------------
def test_api_not_ready_until_loaded(settings: Settings, fake_extractor: Any) -> None:
    release = threading.Event()

    def slow_loader(s: Settings) -> Any:
        release.wait(10)
        return fake_extractor

    app = create_app(settings.replace(load_mode="background"), loader=slow_loader)
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    for path in ("/readyz", "/v1/model"):
        response = client.get(path)
        assert_problem(response, 503, "model_not_ready")
        assert response.headers["Retry-After"] == "5"
    assert_problem(client.post("/v1/extract", json={"text": "北京"}), 503, "model_not_ready")
    # Bad input is still answered as bad input while loading (the texts too: issue 20).
    assert_problem(client.post("/v1/extract", json={"texts": []}), 422, "empty_texts")
    assert_problem(client.post("/v1/extract", json={"texts": ["a", 5]}), 422, "invalid_input")
    assert_problem(client.post("/v1/extract", json={"text": "长" * 301}), 422, "text_too_long")
    release.set()
    thread = [t for t in threading.enumerate() if t.name == "spo-model-load"]
    for t in thread:
        t.join(10)
    assert client.get("/readyz").status_code == 200
    assert client.post("/v1/extract", json={"text": "在北京"}).get_json()["results"] == [
        {"entities": [{"text": "北京", "start": 1, "end": 3, "type": "地点"}], "triples": []}
    ]


def wait_for(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("load_mode", ["boot", "background"])
def test_api_failed_load_answers_503_with_its_code_then_recovers(
    settings: Settings,
    fake_extractor: Any,
    load_mode: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load that fails never raises out of create_app (a worker that cannot boot halts gunicorn):
    /healthz stays 200, /readyz and /v1/* answer 503 with the load error's code, and the slot retries
    with backoff until the loader succeeds."""
    monkeypatch.setattr("app.web.model_slot.FIRST_RETRY_S", 0.01)
    caplog.set_level(logging.INFO, logger="app.web.model_slot")
    errors: list[BaseException] = [
        RuntimeError("no such tensor /srv/secret"),
        ManifestError("/srv/x/model.json: not valid JSON", field="model.json"),
    ]
    release = threading.Event()

    def flaky(options: Any) -> Any:
        if errors:
            raise errors.pop(0)
        release.wait(10)
        return fake_extractor

    app = create_app(settings.replace(load_mode=load_mode), loader=flaky)
    slot = app.extensions["spo"]
    client = app.test_client()
    try:
        wait_for(lambda: slot.error_code == "invalid_manifest")
        assert client.get("/healthz").status_code == 200
        for response in (
            client.get("/readyz"),
            client.get("/v1/model"),
            client.post("/v1/extract", json={"text": "北京"}),
        ):
            body = assert_problem(response, 503, "invalid_manifest")
            assert response.headers["Retry-After"] == "5"
            assert "retries" in body["detail"] and "/srv" not in body["detail"]
        assert "model load failed (attempt 1): model_load_error" in caplog.text
        assert "no such tensor" in caplog.text
        release.set()
        wait_for(lambda: slot.ready)
        assert client.get("/readyz").status_code == 200
        assert client.post("/v1/extract", json={"text": "北京"}).status_code == 200
        assert "model loaded at attempt 3" in caplog.text
    finally:
        release.set()
        slot.close()


def test_api_model_slot_says_when_the_running_model_call_began() -> None:
    """A slot gives its extractor's ``call_started`` (None before it is loaded), and the registry
    the oldest of its models' (the worker's heartbeat reads it: deploy/gunicorn.conf.py)."""
    from types import SimpleNamespace

    from app.web.registry import ModelRegistry, ServedModel

    demo, ner = ModelSlot(), ModelSlot()
    registry = ModelRegistry(
        [ServedModel("demo", Path("m"), demo), ServedModel("ner", Path("n"), ner)]
    )
    assert demo.call_started is None and registry.call_started() is None
    demo_extractor = SimpleNamespace(call_started=None)
    ner_extractor = SimpleNamespace(call_started=7.5)
    demo.set(demo_extractor)  # type: ignore[arg-type]
    ner.set(ner_extractor)  # type: ignore[arg-type]
    assert demo.call_started is None and ner.call_started == 7.5
    assert registry.call_started() == 7.5
    demo_extractor.call_started = 3.0
    assert registry.call_started() == 3.0
    ner_extractor.call_started = demo_extractor.call_started = None
    assert registry.call_started() is None


def test_api_model_slot_reports_changes_and_stops_retrying_on_close(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.web.model_slot.FIRST_RETRY_S", 0.01)
    calls: list[int] = []

    def broken(options: Any) -> Any:
        calls.append(1)
        raise RuntimeError("no")

    slot = ModelSlot(retry_max_s=0.02)
    seen: list[str] = []
    slot.on_change(lambda changed: seen.append(changed.state))
    assert slot.load_or_retry(settings.load_options(), broken) is False
    assert slot.state == "failed" and slot.error_code == "model_load_error"
    wait_for(lambda: len(calls) >= 3)
    slot.close()
    time.sleep(0.1)
    stopped = len(calls)
    time.sleep(0.1)
    assert len(calls) == stopped
    assert set(seen) == {"failed"} and len(seen) >= 3


def test_api_model_slot_closed_during_a_background_load_closes_what_it_loads(
    settings: Settings,
) -> None:
    """A worker stopped while its model loaded: the load that ended after the close put a live
    session into the closed slot (never closed) and told the listeners ``ready``."""
    from types import SimpleNamespace

    release = threading.Event()
    loaded = SimpleNamespace(closed=False, call_started=None)
    loaded.close = lambda: setattr(loaded, "closed", True)

    def slow(options: Any) -> Any:
        release.wait(5)
        return loaded

    slot = ModelSlot()
    seen: list[str] = []
    slot.on_change(lambda changed: seen.append(changed.state))
    thread = slot.load_in_background(settings.load_options(), slow)
    slot.close()
    release.set()
    thread.join(5)
    assert loaded.closed and not slot.ready and seen == []


# -- authentication --------------------------------------------------------------------------
TOKEN = "s3cret-token-0123456789"


def test_api_bearer_token_guards_v1_only(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(auth_tokens=("another-token-abcdefgh", TOKEN)).test_client()
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}):  # fmt: skip
        response = client.post("/v1/extract", json={"text": "北京"}, headers=headers)
        assert_problem(response, 401, "unauthorized")
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/v1/extract", json={"text": "北京"}, headers=good).status_code == 200
    assert client.get("/v1/model", headers=good).status_code == 200


# -- openapi ---------------------------------------------------------------------------------
def _codes(response: dict[str, Any]) -> list[str]:
    schema = response["content"]["application/problem+json"]["schema"]["allOf"][1]
    return list(schema["properties"]["code"]["enum"])


def test_api_openapi_reflects_limits_and_codes(client: FlaskClient) -> None:
    spec = client.get("/openapi.json").get_json()
    assert spec["openapi"].startswith("3.")
    schemas = spec["components"]["schemas"]
    assert schemas["Text"]["maxLength"] == 300
    assert schemas["ExtractMany"]["properties"]["texts"]["maxItems"] == 8
    responses = spec["paths"]["/v1/extract"]["post"]["responses"]
    # bad_request comes with what nginx and gunicorn answer malformed HTTP with, too.
    assert set(responses) == {"200", "400", "413", "415", "422", "500", "503", "504"} | {
        "408", "411", "414", "417", "431", "501", "505"
    }  # fmt: skip
    assert _codes(responses["501"]) == ["bad_request"]
    assert "securitySchemes" not in spec["components"]


def test_api_entities_model(entities_model_dir: Any) -> None:
    """The NER task: /v1/model lists entity types, results have entities and no triples."""
    settings = Settings(model_dir=entities_model_dir, workers=1, intra_op_threads=1)
    app = create_app(settings)
    try:
        client = app.test_client()
        summary = client.get("/v1/model").get_json()
        assert summary["task"] == "entities" and summary["entity_types"] == ["人物", "地点", "机构"]
        assert "predicates" not in summary
        texts = ["李白出生于碎叶城。", "北京" * 30]
        body = client.post("/v1/extract", json={"texts": texts}).get_json()
        assert body["model"]["task"] == "entities"
        for text, result in zip(texts, body["results"], strict=True):
            assert result["triples"] == []
            assert_offsets(text, result)
            assert {e["type"] for e in result["entities"]} <= set(summary["entity_types"])
    finally:
        app.extensions["spo"].close()
