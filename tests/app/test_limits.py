"""Bounded work per request (issue 12): ``SPO_MAX_REQUEST_TOKENS`` -> 413, ``SPO_REQUEST_TIMEOUT`` -> 504.

Driven through the Flask app with the fake extractor (one token per character plus two per text;
``delay`` seconds per call) and, for the batcher's queue, ``MicroBatcher`` directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app.core.settings import Settings, SettingsError
from app.web.microbatch import MicroBatcher
from nlp.errors import DeadlineExceeded
from nlp.values import Extraction
from tests.app.conftest import FakeExtractor, FakePlan

PROBLEM = "application/problem+json"


def test_limits_request_over_max_tokens_is_413_before_any_model_call(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor
) -> None:
    client = make_fake_app(max_request_tokens=40).test_client()
    response = client.post("/v1/extract", json={"texts": ["北京" * 10, "上海" * 10]})
    assert response.status_code == 413
    assert response.mimetype == PROBLEM
    body = response.get_json()
    assert body["code"] == "request_too_large"
    assert (body["limit"], body["tokens"]) == (40, 44)
    assert "44" in body["detail"] and "40" in body["detail"]
    assert fake_extractor.calls == []
    one = client.post("/v1/extract", json={"text": "北京" * 10})
    assert one.status_code == 200  # the limit is per request: each text alone passes
    ok = client.post("/v1/extract", json={"text": "北京" * 19})
    assert ok.status_code == 200  # 40 tokens: at the limit is allowed


def test_limits_zero_max_tokens_means_no_limit(make_fake_app: Callable[..., Flask]) -> None:
    client = make_fake_app(max_request_tokens=0).test_client()
    assert client.post("/v1/extract", json={"text": "北京" * 150}).status_code == 200


def test_limits_request_past_its_deadline_is_504(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor
) -> None:
    fake_extractor.delay = 0.3
    client = make_fake_app(request_timeout=0.1).test_client()
    started = time.monotonic()
    response = client.post("/v1/extract", json={"text": "北京"})
    assert time.monotonic() - started < 2
    assert response.status_code == 504
    assert response.mimetype == PROBLEM
    assert response.get_json()["code"] == "deadline_exceeded"
    detail = response.get_json()["detail"]
    assert "SPO_REQUEST_TIMEOUT" in detail and "--record-timeout" not in detail  # the batch's flag
    deadline = fake_extractor.deadlines[-1]
    assert deadline is not None and deadline == pytest.approx(started + 0.1, abs=0.5)


def test_limits_the_deadline_counts_from_the_request_not_from_its_first_model_call(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor
) -> None:
    """Tokenizing is the request's time too: a request whose texts took past its deadline to plan
    stopped only after its model calls (a request of long letter-words tokenized for 19 s under a
    5 s deadline, then ran)."""
    fake_extractor.plan_delay = 0.3
    client = make_fake_app(request_timeout=0.1).test_client()
    started = time.monotonic()
    response = client.post("/v1/extract", json={"text": "北京"})
    assert response.status_code == 504
    assert response.get_json()["code"] == "deadline_exceeded"
    deadline = fake_extractor.deadlines[-1] if fake_extractor.deadlines else None
    assert deadline is None or deadline < started + 0.3  # never counted from after the plan
    fake_extractor.plan_delay = 0.0
    assert client.post("/v1/extract", json={"text": "北京"}).status_code == 200


def test_limits_the_deadline_counts_the_wait_in_gunicorns_queue(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor
) -> None:
    """Behind nginx, a request that waited for a worker thread past its deadline (an overloaded
    worker's queue) ran in full when its turn came, so the queue never drained and /healthz behind
    it timed out: nginx's X-Request-Start dates the deadline. A time in the future (a client's own
    header, without nginx) is ignored: it can never buy a longer deadline."""
    client = make_fake_app(request_timeout=5).test_client()
    queued = {"X-Request-Start": f"t={time.time() - 6:.3f}"}
    sent = time.monotonic()
    response = client.post("/v1/extract", json={"text": "北京"}, headers=queued)
    assert response.status_code == 504 and response.get_json()["code"] == "deadline_exceeded"
    expired = fake_extractor.deadlines[-1]  # already past when the app started on it
    assert expired is not None and expired == pytest.approx(sent - 1, abs=0.5)
    started = time.monotonic()
    for header in (f"t={time.time() - 1:.3f}", f"t={time.time() + 3600:.3f}", "garbage"):
        answer = client.post(
            "/v1/extract", json={"text": "北京"}, headers={"X-Request-Start": header}
        )
        assert answer.status_code == 200, header
        deadline = fake_extractor.deadlines[-1]
        assert deadline is not None and deadline <= started + 5.5, header


def test_limits_a_request_waiting_for_the_model_gives_up_at_its_deadline(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor
) -> None:
    app = make_fake_app(request_timeout=0.2)
    slot = app.extensions["spo"]
    with slot.lock:  # another request holds the model
        started = time.monotonic()
        response = app.test_client().post("/v1/extract", json={"text": "北京"})
        waited = time.monotonic() - started
    assert response.status_code == 504
    assert response.get_json()["code"] == "deadline_exceeded"
    assert 0.15 < waited < 2
    assert fake_extractor.calls == []  # never reached the model
    assert app.test_client().post("/v1/extract", json={"text": "北京"}).status_code == 200


def test_limits_health_is_answered_while_a_request_holds_the_model(
    make_fake_app: Callable[..., Flask], fake_extractor: FakeExtractor
) -> None:
    fake_extractor.delay = 1.0
    app = make_fake_app(request_timeout=5)
    slow = threading.Thread(
        target=lambda: app.test_client().post("/v1/extract", json={"text": "北京"})
    )
    slow.start()
    time.sleep(0.1)
    started = time.monotonic()
    assert app.test_client().get("/healthz").status_code == 200
    assert time.monotonic() - started < 0.5
    slow.join(5)


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("SPO_REQUEST_TIMEOUT", "soon", "expected a number of seconds"),
        ("SPO_REQUEST_TIMEOUT", "-1", "between 0 and 86400"),
        ("SPO_REQUEST_TIMEOUT", "200", "must be below SPO_TIMEOUT"),
        ("SPO_MAX_REQUEST_TOKENS", "-5", "between 0 and"),
        ("SPO_RATE_LIMIT", "fast", "expected N r/s"),
        ("SPO_RATE_LIMIT", "0r/s", "expected N r/s"),
    ],
)
def test_limits_settings_are_validated(
    triples_model_dir: Path, variable: str, value: str, problem: str
) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SPO_MODEL_DIR": str(triples_model_dir), variable: value})
    assert any(p.startswith(variable) and problem in p for p in info.value.problems)


def test_limits_settings_parse(triples_model_dir: Path) -> None:
    s = Settings.from_env(
        {
            "SPO_MODEL_DIR": str(triples_model_dir),
            "SPO_REQUEST_TIMEOUT": "2.5",
            "SPO_MAX_REQUEST_TOKENS": "4_096",
            "SPO_RATE_LIMIT": "10R/S",
        }
    )
    assert (s.request_timeout, s.max_request_tokens, s.rate_limit) == (2.5, 4096, "10r/s")


# -- micro-batching ----------------------------------------------------------------------------------
class Clocked:
    """A ``run`` for ``MicroBatcher`` that takes ``delay`` seconds and honours its deadline."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: list[tuple[list[str], float | None]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, plan: FakePlan, deadline: float | None = None) -> list[Extraction]:
        texts = plan.texts
        self.calls.append((list(texts), deadline))
        assert self.gate.wait(10)
        time.sleep(self.delay)
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("stopped at its deadline")
        return [Extraction() for _ in texts]


def _submit(batcher: MicroBatcher[FakePlan], texts: list[str], timeout: float | None) -> Any:
    deadline = time.monotonic() + timeout if timeout is not None else None
    try:
        return batcher.submit(FakePlan.of(texts), deadline=deadline)
    except Exception as exc:
        return exc


def test_limits_microbatch_drops_a_request_past_its_deadline_from_the_queue() -> None:
    run = Clocked(0.0)
    batcher = MicroBatcher(run, wait_s=0.005, max_texts=8)
    try:
        run.gate.clear()  # the model is busy with the first request
        first = threading.Thread(target=_submit, args=(batcher, ["a"], None))
        first.start()
        time.sleep(0.1)
        started = time.monotonic()
        late = _submit(batcher, ["late"], 0.2)
        waited = time.monotonic() - started
        run.gate.set()
        first.join(5)
        assert isinstance(late, DeadlineExceeded)
        assert waited < 1.0  # answered at its deadline, not when the model came free
        assert all(texts != ["late"] for texts, _ in run.calls)  # never ran
        assert batcher.stats.expired == 1
    finally:
        batcher.close(timeout=5)


def test_limits_microbatch_a_slow_request_never_fails_its_neighbours() -> None:
    run = Clocked(0.4)
    batcher = MicroBatcher(run, wait_s=0.05, max_texts=8)
    out: dict[str, Any] = {}
    try:
        threads = [
            threading.Thread(target=lambda k=k, t=t: out.__setitem__(k, _submit(batcher, [k], t)))
            for k, t in (("tight", 0.2), ("easy", 5.0), ("none", None))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        batcher.close(timeout=5)
    assert isinstance(out["tight"], DeadlineExceeded)
    assert isinstance(out["easy"], list) and len(out["easy"]) == 1
    assert isinstance(out["none"], list) and len(out["none"]) == 1
    combined = [c for c in run.calls if len(c[0]) > 1]
    assert combined, "the three requests were never combined"
    assert combined[0][1] is not None and combined[0][1] < time.monotonic()  # earliest deadline
