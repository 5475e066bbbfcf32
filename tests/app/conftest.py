"""Web-layer fixtures, Flask style: ``settings -> app -> client -> runner``.

The tiny triples model (``tests/conftest.py``) is loaded once per session; each test gets a fresh app
around it. ``fake_app`` wraps a scriptable fake extractor for what the real model cannot be made to do
(raise, block); it needs no TensorFlow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient, FlaskCliRunner

from app import create_app
from app.core.settings import Settings
from nlp.config import DEFAULT_MAX_TEXT_CHARS
from nlp.errors import DeadlineExceeded, RequestTooLarge
from nlp.manifest import load_manifest
from nlp.validation import check_text
from nlp.values import Entity, Extraction, Span


@pytest.fixture(scope="session")
def triples_extractor(triples_model_dir: Path) -> Iterator[Any]:
    from nlp.pipeline import Extractor

    extractor = Extractor.load(triples_model_dir, intra_op_threads=1, inter_op_threads=1)
    yield extractor
    extractor.close()


@pytest.fixture
def settings(triples_model_dir: Path) -> Settings:
    return Settings(model_dir=triples_model_dir, workers=1, max_texts=8, max_text_chars=300)


@pytest.fixture
def app(settings: Settings, triples_extractor: Any) -> Flask:
    return create_app(settings, loader=lambda s: triples_extractor)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def runner(app: Flask) -> FlaskCliRunner:
    return app.test_cli_runner()


@dataclass(frozen=True)
class FakePlan:
    """``FakeExtractor.plan``: one model token per character, plus two per text; merges as
    ``nlp.pipeline.Plan`` does."""

    texts: list[str]
    field: str
    tokens: int

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def of(cls, texts: Sequence[str], field: str = "texts") -> FakePlan:
        return cls(list(texts), field, sum(len(t) + 2 for t in texts))

    @classmethod
    def merge(cls, plans: Sequence[FakePlan]) -> FakePlan:
        return cls([t for p in plans for t in p.texts], "texts", sum(p.tokens for p in plans))


class FakeExtractor:
    """Finds every '北京' as a 地点; ``fail`` makes the next call raise it; ``delay``: seconds each
    call takes, after which a call past its deadline raises ``DeadlineExceeded``; ``plan_delay``:
    seconds each plan takes (tokenizing)."""

    def __init__(self, model_dir: Path) -> None:
        self.manifest = load_manifest(model_dir, check_files=False)
        self.fail: BaseException | None = None
        self.delay = 0.0
        self.plan_delay = 0.0
        self.calls: list[list[str]] = []
        self.plans = 0
        self.deadlines: list[float | None] = []

    def plan(
        self,
        texts: Sequence[object],
        *,
        field: str = "texts",
        max_tokens: int | None = None,
        max_text_chars: int | None = None,
    ) -> FakePlan:
        """Checks texts as ``Extractor.plan`` does; ``plans`` counts the calls."""
        self.plans += 1
        time.sleep(self.plan_delay)
        limit = DEFAULT_MAX_TEXT_CHARS if max_text_chars is None else max_text_chars
        checked = [
            check_text(t, limit, f"{field}[{i}]" if field == "texts" else field)
            for i, t in enumerate(texts)
        ]
        plan = FakePlan(checked, field, sum(len(t) + 2 for t in checked))
        if max_tokens is not None and plan.tokens > max_tokens:
            raise RequestTooLarge(plan.tokens, max_tokens, field=field)
        return plan

    def run(self, plan: FakePlan, *, deadline: float | None = None) -> list[Extraction]:
        return self.extract_batch(plan.texts, field=plan.field, deadline=deadline)

    def extract_batch(
        self, texts: Sequence[str], *, field: str = "texts", deadline: float | None = None
    ) -> list[Extraction]:
        self.calls.append(list(texts))
        self.deadlines.append(deadline)
        if self.delay:
            time.sleep(self.delay)
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("stopped at its deadline (fake)")
        if self.fail is not None:
            raise self.fail
        out = []
        for text in texts:
            spans = []
            start = text.find("北京")
            while start >= 0:
                spans.append(Entity(Span(start, start + 2, "北京"), "地点"))
                start = text.find("北京", start + 1)
            out.append(Extraction(entities=tuple(spans)))
        return out

    def close(self) -> None:
        pass


@pytest.fixture
def fake_extractor(triples_model_dir: Path) -> FakeExtractor:
    return FakeExtractor(triples_model_dir)


@pytest.fixture
def make_fake_app(settings: Settings, fake_extractor: FakeExtractor) -> Callable[..., Flask]:
    def make(**changes: Any) -> Flask:
        return create_app(settings.replace(**changes), loader=lambda s: fake_extractor)

    return make


@pytest.fixture
def fake_client(make_fake_app: Callable[..., Flask]) -> FlaskClient:
    return make_fake_app().test_client()
