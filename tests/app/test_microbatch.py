"""Micro-batching (``app.web.microbatch``): combining, routing, isolation, the wait bound, shutdown, off path.

``MicroBatcher`` is driven directly with a recording ``run`` where timing matters, and through the Flask
app (one test client per thread) with the fake extractor and the tiny real model for the wiring.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.core.settings import Settings
from app.web.microbatch import BatcherClosed, MicroBatcher
from nlp.errors import InvalidInput
from nlp.values import Entity, Extraction, Span
from tests.app.conftest import FakePlan


def tagged(text: str) -> Extraction:
    """A result that names its text, so a result routed to the wrong request shows."""
    return Extraction(entities=(Entity(Span(0, len(text), text), "tag"),))


class Recorder:
    """A ``run`` for ``MicroBatcher`` (of ``FakePlan``s): records each call's texts; raises for texts containing ``bad``;
    ``gate``, when set, holds every call until it is opened."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[list[str]] = []
        self.delay = delay
        self.gate: threading.Event | None = None
        self.lock = threading.Lock()
        self.deadlines: list[float | None] = []

    def __call__(self, plan: FakePlan, deadline: float | None = None) -> list[Extraction]:
        texts, field = plan.texts, plan.field
        with self.lock:
            self.calls.append(list(texts))
            self.deadlines.append(deadline)
        if self.gate is not None:
            assert self.gate.wait(10)
        time.sleep(self.delay)
        for i, text in enumerate(texts):
            if "bad" in text:
                raise InvalidInput(f"{field}[{i}] is bad", field=f"{field}[{i}]")
        return [tagged(t) for t in texts]


def together(n: int, work: Callable[[int], Any], timeout: float = 20) -> list[Any]:
    """Run ``work(i)`` for ``i < n`` in ``n`` threads released at once; results (or exceptions) by i."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def target(i: int) -> None:
        barrier.wait()
        try:
            out[i] = work(i)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a request never got its answer"
    return out


@pytest.fixture
def batchers() -> Any:
    made: list[MicroBatcher[FakePlan]] = []

    def make(run: Any, **kwargs: Any) -> MicroBatcher[FakePlan]:
        kwargs.setdefault("wait_s", 0.2)
        kwargs.setdefault("max_texts", 64)
        made.append(MicroBatcher(run, **kwargs))
        return made[-1]

    yield make
    for b in made:
        b.close(timeout=5)


# -- the batcher ---------------------------------------------------------------------------------
def test_microbatch_combines_requests_arriving_together(batchers: Any) -> None:
    run = Recorder()
    batcher = batchers(run, wait_s=0.5)
    requests = [[f"请求{i}的第{j}句" for j in range(1 + i % 3)] for i in range(8)]
    results = together(8, lambda i: batcher.submit(FakePlan.of(requests[i])))
    assert max(len(call) for call in run.calls) > 3, run.calls  # more than one request per call
    assert len(run.calls) < 8
    assert sorted(t for call in run.calls for t in call) == sorted(t for r in requests for t in r)
    for texts, got in zip(requests, results, strict=True):
        assert got == [tagged(t) for t in texts]
    stats = batcher.stats.to_dict()
    assert stats["requests"] == 8 and stats["batches"] == len(run.calls)
    assert stats["mean_requests_per_batch"] > 1


def test_microbatch_routes_results_under_load(batchers: Any) -> None:
    run = Recorder(delay=0.01)
    batcher = batchers(run, wait_s=0.005, max_texts=7)

    def work(i: int) -> bool:
        for k in range(15):
            texts = [f"线程{i}请求{k}文本{j}" for j in range(1 + (i + k) % 4)]
            if batcher.submit(FakePlan.of(texts)) != [tagged(t) for t in texts]:
                return False
        return True

    assert together(16, work) == [True] * 16
    assert batcher.stats.requests == 16 * 15
    assert batcher.stats.batches < batcher.stats.requests
    assert all(len(call) <= 7 for call in run.calls)


def test_microbatch_never_splits_a_request_over_the_cap(batchers: Any) -> None:
    run = Recorder()
    batcher = batchers(run, wait_s=0.3, max_texts=3)
    requests = [["a1", "a2"], ["b1", "b2"], ["c1", "c2", "c3", "c4", "c5"], ["d1"]]
    results = together(4, lambda i: batcher.submit(FakePlan.of(requests[i])))
    assert results == [[tagged(t) for t in r] for r in requests]
    assert ["c1", "c2", "c3", "c4", "c5"] in run.calls
    assert all(len(call) <= 3 for call in run.calls if "c1" not in call)


def test_microbatch_failing_request_is_isolated(batchers: Any) -> None:
    run = Recorder()
    batcher = batchers(run, wait_s=0.5)
    requests = [["好的一句"], ["另一句", "bad 的一句"], ["第三句"], ["第四句", "第五句"]]
    results = together(4, lambda i: batcher.submit(FakePlan.of(requests[i])))
    bad = results[1]
    assert (
        isinstance(bad, InvalidInput) and bad.field == "texts[1]"
    )  # its own index, not the batch's
    for i in (0, 2, 3):
        assert results[i] == [tagged(t) for t in requests[i]]
    assert batcher.stats.isolated >= 1
    # The combined call ran once, then each request alone.
    assert any(len(call) > 2 for call in run.calls)
    assert ["另一句", "bad 的一句"] in run.calls


def test_microbatch_reruns_the_earliest_deadline_first(batchers: Any) -> None:
    """After a combined call failed, its requests were rerun in queue order: a request with a
    deadline waited out a neighbour's whole rerun (with no deadline at all) and got its 504 late."""
    from nlp.errors import DeadlineExceeded

    def run(plan: FakePlan, deadline: float | None = None) -> list[Extraction]:
        if len(plan.texts) > 1:
            raise RuntimeError("the combined call fails")
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("stopped at its deadline")
        if plan.texts == ["slow"]:
            time.sleep(1.0)
        return [tagged(t) for t in plan.texts]

    batcher = batchers(run, wait_s=0.3)
    slow = threading.Thread(target=lambda: batcher.submit(FakePlan.of(["slow"])))
    slow.start()  # first in the queue, no deadline
    time.sleep(0.05)
    started = time.monotonic()
    results = batcher.submit(FakePlan.of(["quick"]), deadline=started + 0.8)
    assert results == [tagged("quick")]
    assert time.monotonic() - started < 0.8
    slow.join(5)


def test_microbatch_requests_stopped_by_one_deadline_each_get_their_own_exception(
    batchers: Any,
) -> None:
    """One instance raised in several request threads gathered all their frames in one traceback."""
    from nlp.errors import DeadlineExceeded

    def run(plan: FakePlan, deadline: float | None = None) -> list[Extraction]:
        time.sleep(0.3)
        raise DeadlineExceeded("stopped at its deadline")

    batcher = batchers(run, wait_s=0.2)
    deadline = time.monotonic() + 0.25
    raised: list[BaseException] = []

    def submit(text: str) -> None:
        try:
            batcher.submit(FakePlan.of([text]), deadline=deadline)
        except DeadlineExceeded as exc:
            raised.append(exc)

    threads = [threading.Thread(target=submit, args=(t,)) for t in ("一", "二", "三")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert len(raised) == 3 and len({id(e) for e in raised}) == 3, raised
    assert batcher.stats.batches == 1  # one combined call stopped them all


def test_microbatch_wait_window_is_bounded(batchers: Any) -> None:
    run = Recorder()
    batcher = batchers(run, wait_s=0.15)
    started = time.monotonic()
    assert batcher.submit(FakePlan.of(["独自一句"])) == [tagged("独自一句")]
    elapsed = time.monotonic() - started
    assert 0.14 <= elapsed < 1.0
    # Requests queued behind a busy model do not wait a window of their own once it frees.
    run.gate = threading.Event()
    first = threading.Thread(target=batcher.submit, args=(FakePlan.of(["先到"]),))
    first.start()
    time.sleep(0.4)  # the first call is running (held at the gate)
    later: list[float] = []

    def queued() -> None:
        batcher.submit(FakePlan.of(["后到"]))
        later.append(time.monotonic())

    second = threading.Thread(target=queued)
    second.start()
    time.sleep(0.3)  # longer than the window: it is over by the time the model frees
    opened = time.monotonic()
    run.gate.set()
    first.join(5)
    second.join(5)
    assert later and later[0] - opened < 0.1


def test_microbatch_close_serves_pending_and_refuses_new(batchers: Any) -> None:
    run = Recorder()
    run.gate = threading.Event()
    batcher = batchers(run, wait_s=0.01, max_texts=1)
    answers: list[Any] = []

    def submit(text: str) -> None:
        try:
            answers.append(batcher.submit(FakePlan.of([text])))
        except BatcherClosed as exc:
            answers.append(exc)

    threads = [threading.Thread(target=submit, args=(f"排队{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    time.sleep(0.1)
    with pytest.raises(BatcherClosed):
        batcher.submit(FakePlan.of(["关闭之后"]))
    run.gate.set()
    closer.join(5)
    for t in threads:
        t.join(5)
    assert sorted(a[0].entities[0].span.text for a in answers) == ["排队0", "排队1", "排队2"]
    assert len(run.calls) == 3


def test_microbatch_close_answers_what_it_cannot_serve(batchers: Any) -> None:
    run = Recorder()
    run.gate = threading.Event()
    batcher = batchers(run, wait_s=0.01, max_texts=1)
    results = []
    thread = threading.Thread(
        target=lambda: results.append(
            together(2, lambda i: batcher.submit(FakePlan.of([f"句{i}"])))
        )
    )
    thread.start()
    time.sleep(0.3)
    batcher.close(timeout=0.2)  # the model call is stuck: give up on it
    thread.join(5)
    assert not thread.is_alive()
    assert all(isinstance(r, BatcherClosed) for r in results[0])
    run.gate.set()


def test_microbatch_a_dying_thread_answers_its_requests(batchers: Any) -> None:
    class Fatal(BaseException):
        pass

    calls = []

    def run(plan: FakePlan, deadline: float | None = None) -> list[Extraction]:
        calls.append(plan.texts)
        if len(calls) == 1:
            raise Fatal()
        return [tagged(t) for t in plan.texts]

    batcher = batchers(run, wait_s=0.01)
    with pytest.raises(BatcherClosed):
        batcher.submit(FakePlan.of(["第一句"]))
    assert batcher.submit(FakePlan.of(["第二句"])) == [tagged("第二句")]  # a new thread took over


def test_microbatch_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        MicroBatcher(Recorder(), wait_s=0, max_texts=8)
    with pytest.raises(ValueError):
        MicroBatcher(Recorder(), wait_s=0.01, max_texts=0)


# -- through the app -----------------------------------------------------------------------------
def post_together(app: Flask, bodies: list[dict[str, Any]]) -> list[Any]:
    return together(len(bodies), lambda i: app.test_client().post("/v1/extract", json=bodies[i]))


def test_microbatch_off_by_default(
    make_fake_app: Callable[..., Flask], fake_extractor: Any, triples_model_dir: Path
) -> None:
    assert Settings(model_dir=triples_model_dir).microbatch_wait_ms == 0
    app = make_fake_app()
    assert "spo.microbatch" not in app.extensions
    bodies = [{"text": f"北京{i}"} for i in range(4)]
    responses = post_together(app, bodies)
    assert [r.status_code for r in responses] == [200] * 4
    assert sorted(fake_extractor.calls) == [[f"北京{i}"] for i in range(4)]  # one call per request


def test_microbatch_app_combines_and_routes(
    make_fake_app: Callable[..., Flask], fake_extractor: Any
) -> None:
    app = make_fake_app(microbatch_wait_ms=500, threads=8)
    assert isinstance(app.extensions["spo.microbatch"], MicroBatcher)
    bodies = [{"texts": ["北京" * (i + 1), f"上海{i}"]} for i in range(6)]
    responses = post_together(app, bodies)
    for i, response in enumerate(responses):
        assert response.status_code == 200
        results = response.get_json()["results"]
        assert [len(r["entities"]) for r in results] == [i + 1, 0]
    assert max(len(call) for call in fake_extractor.calls) > 2
    assert app.extensions["spo.microbatch"].close()["requests"] == 6


def test_microbatch_app_isolates_a_failing_request(
    settings: Settings, triples_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.app.conftest import FakeExtractor

    class Picky(FakeExtractor):
        def extract_batch(
            self, texts: Sequence[str], *, field: str = "texts", deadline: float | None = None
        ) -> list[Extraction]:
            if "炸" in "".join(texts):
                raise RuntimeError("boom")
            return super().extract_batch(texts, field=field, deadline=deadline)

    picky = Picky(triples_model_dir)
    app = create_app(settings.replace(microbatch_wait_ms=500), loader=lambda s: picky)
    bodies = [{"text": "北京"}, {"text": "炸"}, {"texts": ["北京北京", "天津"]}, {"text": "南京"}]
    responses = post_together(app, bodies)
    assert [r.status_code for r in responses] == [200, 500, 200, 200]
    assert responses[1].get_json()["code"] == "internal_error"
    assert [len(r["entities"]) for r in responses[2].get_json()["results"]] == [2, 0]
    assert "rerunning each alone" in caplog.text


def test_microbatch_app_validates_each_request_before_batching(
    make_fake_app: Callable[..., Flask], fake_extractor: Any
) -> None:
    app = make_fake_app(microbatch_wait_ms=300)
    bodies: list[dict[str, Any]] = [{"text": "北京"}, {"text": 5}, {"texts": []}, {"text": "北京!"}]
    responses = post_together(app, bodies)
    assert [r.status_code for r in responses] == [200, 422, 422, 200]
    assert sorted(t for call in fake_extractor.calls for t in call) == ["北京", "北京!"]


def test_microbatch_app_closed_worker_answers_503(
    make_fake_app: Callable[..., Flask],
) -> None:
    app = make_fake_app(microbatch_wait_ms=10)
    app.extensions["spo.microbatch"].close()
    response = app.test_client().post("/v1/extract", json={"text": "北京"})
    assert response.status_code == 503
    assert response.get_json()["code"] == "model_not_ready"
    assert response.headers["Retry-After"]


def test_microbatch_real_model_results_match_unbatched(
    settings: Settings, triples_extractor: Any
) -> None:
    texts = [
        "李白出生于碎叶城，他的妻子是许氏。",
        "《红楼梦》的作者是曹雪芹。",
        "鲁迅出生于浙江绍兴。",
        "张三的妻子是李四，李四出生于北京。",
        "王五写了《平凡的世界》。",
        "赵六出生于上海",
        "ＡＢＣ，全角标点！？",
        "北京" * 40,
    ]
    expected = [triples_extractor.extract_batch([t], field="text")[0].to_dict() for t in texts]
    app = create_app(settings.replace(microbatch_wait_ms=300), loader=lambda s: triples_extractor)
    responses = post_together(app, [{"text": t} for t in texts])
    assert [r.get_json()["results"][0] for r in responses] == expected
    stats = app.extensions["spo.microbatch"].close()
    assert stats["requests"] == len(texts) and stats["batches"] < len(texts)


def test_microbatch_real_model_checks_and_tokenizes_each_text_once(
    settings: Settings, triples_extractor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: on the micro-batched REST path each text is checked and tokenized once (by the
    request's plan), not again by the batcher's combined call or a rerun."""
    from nlp.validation import check_text as real_check

    encoded: list[str] = []
    checked: list[object] = []
    real_encode = triples_extractor.tokenizer.encode

    def encode(text: str) -> Any:
        encoded.append(text)
        return real_encode(text)

    def check(text: object, *args: Any) -> str:
        checked.append(text)
        return real_check(text, *args)

    monkeypatch.setattr(triples_extractor.tokenizer, "encode", encode)
    monkeypatch.setattr("nlp.pipeline.check_text", check)
    texts = [f"李白出生于碎叶城，第{i}句。" for i in range(6)]
    app = create_app(settings.replace(microbatch_wait_ms=300), loader=lambda s: triples_extractor)
    bodies: list[dict[str, Any]] = [{"texts": texts[:2]}, *[{"text": t} for t in texts[2:]]]
    responses = post_together(app, bodies)
    assert [r.status_code for r in responses] == [200] * len(bodies)
    stats = app.extensions["spo.microbatch"].close()
    assert stats["batches"] < len(bodies)  # some requests were combined
    assert sorted(encoded) == sorted(texts)
    assert sorted(map(str, checked)) == sorted(texts)
