"""``extract_windows``: the order, window and chunk protocol shared by ``spo extract`` and Spark."""

from __future__ import annotations

import doctest
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from app.batch import stream
from app.batch.records import Record
from app.batch.stream import extract_records, extract_windows
from app.batch.workers import Chunk, InlineExecutor, WorkSpec
from nlp.config import LoadOptions
from nlp.errors import InvalidInput
from nlp.values import Entity, Extraction, Outcome, Span
from tests.app.test_batch_fakes import TextsPlan


class Whole:
    """A stand-in extractor: one entity, the whole text; records every batch it is given."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def plan(self, texts: Sequence[str], **_: Any) -> TextsPlan:
        return TextsPlan(texts)

    def run(self, plan: TextsPlan, *, deadline: float | None = None) -> list[Extraction]:
        self.batches.append(list(plan))
        return [Extraction((Entity(Span(0, len(t), t), "T"),)) for t in plan]

    def close(self) -> None:
        pass


class Reversed:
    """An executor that completes each group of chunks in reverse order, as worker processes may."""

    def __init__(self, inner: InlineExecutor, group: int = 3) -> None:
        self.inner, self.group = inner, group
        self.pulled = 0

    def map_unordered(self, chunks: Iterable[Chunk]) -> Iterator[tuple[int, list[Outcome]]]:
        pending: list[Chunk] = []
        for chunk in chunks:
            self.pulled += 1
            pending.append(chunk)
            if len(pending) == self.group:
                yield from reversed(list(self.inner.map_unordered(pending)))
                pending = []
        yield from reversed(list(self.inner.map_unordered(pending)))


@pytest.fixture
def extractor() -> Whole:
    return Whole()


@pytest.fixture
def inline(extractor: Whole) -> InlineExecutor:
    executor = InlineExecutor(lambda options: extractor, WorkSpec(LoadOptions("unused")))
    executor.start()
    return executor


def test_batch_stream_doctest() -> None:
    assert doctest.testmod(stream).failed == 0


def test_batch_stream_keeps_input_order_when_chunks_complete_out_of_order(
    inline: InlineExecutor, extractor: Whole
) -> None:
    texts = [("x" * (i * 7 % 13 + 1)) for i in range(50)]
    records = [
        Record(i, t) if i % 9 else Record(i, None, InvalidInput("bad")) for i, t in enumerate(texts)
    ]
    pairs = list(extract_records(records, Reversed(inline), window=16, chunk_size=4))
    assert [r.id for r, _ in pairs] == list(range(50))
    for record, outcome in pairs:
        doc = outcome.to_dict()
        if record.error is not None:
            assert doc == {"error": {"code": "invalid_input", "message": "bad"}}
        else:
            assert doc["entities"][0]["text"] == record.text
    # Each chunk holds texts of one window, sorted by length, at most chunk_size of them.
    assert all(
        len(b) <= 4 and [len(t) for t in b] == sorted(len(t) for t in b) for b in extractor.batches
    )


def test_batch_stream_error_only_windows_are_yielded_one_at_a_time(inline: InlineExecutor) -> None:
    """A run of bad records never piles up: each window comes out before the next is read."""
    read = 0

    def bad_records() -> Iterator[Record]:
        nonlocal read
        for i in range(10_000):
            read += 1
            yield Record(i, None, InvalidInput("bad"))

    windows = extract_windows(bad_records(), inline, window=100, chunk_size=10)
    first = next(windows)
    assert len(first) == 100
    assert read <= 200
    assert sum(len(w) for w in windows) == 9_900


def test_batch_stream_refuses_empty_windows_and_chunks(inline: InlineExecutor) -> None:
    with pytest.raises(ValueError, match="positive"):
        list(extract_windows([], inline, window=0))
    assert list(extract_windows([], inline)) == []


def test_batch_stream_run_chunk_plans_each_text_once_even_when_rerun() -> None:
    """Issue 20: a chunk's texts are planned (checked, tokenized) once; a bad one becomes its
    ``Failure``; when the combined run fails, each plan is rerun alone without being planned again."""
    from app.batch.workers import run_chunk
    from nlp.values import Failure
    from tests.app.test_batch_fakes import FakeExtractor, FakeFactory

    options = LoadOptions(Path("unused"), max_text_chars=20)
    extractor = FakeExtractor(options, FakeFactory(raise_on="虫"))
    texts = ["北京很大", "a\x00b", "有虫的一句", "张三", "长" * 21]
    outcomes = run_chunk(extractor, texts, WorkSpec(options))
    assert extractor.planned == len(texts)
    assert extractor.calls == 1 + 3  # the combined run, then each of the three good plans alone
    assert [o.code if isinstance(o, Failure) else "ok" for o in outcomes] == [
        "ok",
        "invalid_input",
        "internal_error",
        "ok",
        "text_too_long",
    ]
    assert outcomes[0] == Extraction((Entity(Span(0, 2, "北京"), "地点"),))
