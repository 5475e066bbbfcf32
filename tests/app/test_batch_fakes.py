"""Fakes for the batch tests: a picklable extractor factory (it crosses the spawn boundary) and a
crash driver that kills a real process at chosen points of ``run_batch``. No tests here."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nlp.config import LoadOptions
from nlp.errors import DeadlineExceeded
from nlp.validation import check_text
from nlp.values import Entity, Extraction, Span

BOOM = "💥"
SLOW = "🐢"  # a runaway record: each model call on it takes ``slow_s`` (see FakeFactory)
HANG = "🧊"  # with ``hang``: the call never returns


@dataclass(frozen=True)
class FakeFactory:
    """Makes ``FakeExtractor``s. ``kill_on_call``: SIGKILL this process on that ``extract_batch``
    call (``kill_on_load``: while it loads the model); ``die_once``: a path; the first process to see a
    text with BOOM creates it and dies."""

    delay: float = 0.0
    kill_on_call: int = 0
    kill_on_load: bool = False
    die_once: str | None = None
    die_always: bool = False
    raise_on: str | None = None
    slow_s: float = 0.0
    hang: bool = False

    def __call__(self, options: LoadOptions) -> FakeExtractor:
        if self.kill_on_load:
            os.kill(os.getpid(), signal.SIGKILL)
        return FakeExtractor(options, self)


class TextsPlan(tuple[str, ...]):
    """A stand-in ``nlp.pipeline.Plan``: its texts, already checked; merges as ``Plan`` does."""

    @classmethod
    def merge(cls, plans: Sequence[TextsPlan]) -> TextsPlan:
        return cls(t for p in plans for t in p)


class FakeExtractor:
    """Finds every '北京' (地点) and every '张三' (人物); checks texts as ``Extractor`` does (in
    ``plan``; ``plans`` counts the texts it checked)."""

    manifest = None  # the batch command never reads it

    def __init__(self, options: LoadOptions, factory: FakeFactory) -> None:
        self.options, self.factory = options, factory
        self.calls = 0
        self.planned = 0

    def plan(
        self,
        texts: Sequence[object],
        *,
        field: str = "texts",
        max_tokens: int | None = None,
        max_text_chars: int | None = None,
    ) -> TextsPlan:
        limit = self.options.max_text_chars if max_text_chars is None else max_text_chars
        self.planned += len(texts)
        return TextsPlan(
            check_text(t, limit, f"{field}[{i}]" if field == "texts" else field)
            for i, t in enumerate(texts)
        )

    def run(self, plan: TextsPlan, *, deadline: float | None = None) -> list[Extraction]:
        return self._extract(list(plan), deadline)

    def extract_batch(
        self, texts: Sequence[str], *, field: str = "texts", deadline: float | None = None
    ) -> list[Extraction]:
        return self.run(self.plan(texts, field=field), deadline=deadline)

    def _extract(self, texts: list[str], deadline: float | None) -> list[Extraction]:
        self.calls += 1
        f = self.factory
        if f.hang and any(HANG in t for t in texts):
            time.sleep(3600)
        for t in texts:  # ten model calls per SLOW text; the deadline is checked between calls
            for _ in range(10 if SLOW in t else 1):
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineExceeded("stopped at its deadline (fake)")
                if SLOW in t:
                    time.sleep(f.slow_s / 10)
        if f.kill_on_call and self.calls == f.kill_on_call:
            os.kill(os.getpid(), signal.SIGKILL)
        if f.delay:
            time.sleep(f.delay)
        if any(BOOM in t for t in texts):
            if f.die_always:
                os._exit(3)
            if f.die_once and not os.path.exists(f.die_once):
                Path(f.die_once).touch()
                os._exit(3)
        if f.raise_on and any(f.raise_on in t for t in texts):
            raise RuntimeError("a bug")
        return [self._one(t) for t in texts]

    @staticmethod
    def _one(text: str) -> Extraction:
        found = []
        for word, kind in (("北京", "地点"), ("张三", "人物")):
            start = text.find(word)
            while start >= 0:
                found.append(Entity(Span(start, start + len(word), word), kind))
                start = text.find(word, start + 1)
        return Extraction(entities=tuple(sorted(found)))

    def close(self) -> None:
        pass


def crash_run() -> None:
    """``python -c 'from tests.app.test_batch_fakes import crash_run; crash_run()' CONFIG``.

    CONFIG (JSON): ``options`` (BatchOptions fields), ``factory`` (FakeFactory fields), and ``point``:
    ``["checkpoint", n]`` kills after the n-th checkpoint write's output fsync (before the checkpoint),
    ``["write", n]`` writes half of the n-th window and dies.
    """
    from app.batch import BatchOptions, output, run_batch

    config: dict[str, Any] = json.loads(sys.argv[1])
    options = BatchOptions(**{**config["options"], "inputs": tuple(config["options"]["inputs"])})
    kind, n = config.get("point") or (None, 0)
    calls = {"save": 0, "write": 0}
    if kind == "checkpoint":
        real_save = output.Checkpoint.save

        def save(self: Any, path: Path) -> None:
            calls["save"] += 1
            if calls["save"] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            real_save(self, path)

        output.Checkpoint.save = save  # type: ignore[method-assign]
    elif kind == "write":
        real_write = os.write

        def write(fd: int, data: Any) -> int:
            calls["write"] += 1
            if calls["write"] == n:
                real_write(fd, bytes(data[: len(data) // 2]))
                os.kill(os.getpid(), signal.SIGKILL)
            return real_write(fd, data)

        os.write = write  # the output writes with os.write
    run_batch(options, factory=FakeFactory(**config.get("factory", {})))
