"""``extract_windows``: records in, outcomes out, in input order: the library entry point of batch extraction.

Both ``spo extract`` (``app.batch.pipeline``) and the Spark integration (``app.spark.job``) run records
through this one generator, so they cut the same windows, sort and chunk them the same way, and turn
the same bad records into the same error outcomes.

The protocol, per window of ``window`` records (the last one may be shorter):

1. records that carry an ``error`` (parsing failed) get their error outcome at once;
2. the others are sorted by text length and cut into chunks of ``chunk_size`` texts, so each model call
   fills its buckets with texts of similar length; a window with no valid record still sends one empty
   chunk, so the consumer regains control once per window whatever the input holds;
3. the executor runs chunks (in this process or in worker processes, completing in any order);
4. once every chunk of the oldest window is back, that window is yielded, records in input order.

Memory is bounded by the window size and the executor's look-ahead, never by the input.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from app.batch.records import Record
from app.batch.workers import Chunk, error_outcome
from nlp.values import Outcome


class Executor(Protocol):
    """What ``extract_windows`` needs of ``InlineExecutor`` / ``ProcessExecutor`` (started already)."""

    def map_unordered(self, chunks: Iterable[Chunk]) -> Iterator[tuple[int, list[Outcome]]]: ...


@dataclass
class _Window:
    records: list[Record]
    outcomes: list[Outcome | None] = field(default_factory=list)
    pending: int = 0


def extract_windows(
    records: Iterable[Record],
    executor: Executor,
    *,
    window: int = 2048,
    chunk_size: int = 64,
    on_chunk: Callable[[int], None] | None = None,
) -> Iterator[list[tuple[Record, Outcome]]]:
    """Each window of ``records`` with its outcomes, in input order (see the module docstring).

    ``on_chunk(n)`` is called as the outcomes of ``n`` records come back (progress bars).

    >>> from app.batch.workers import InlineExecutor, WorkSpec
    >>> from nlp.config import LoadOptions
    >>> class Texts(tuple):  # a stand-in plan: its texts
    ...     @classmethod
    ...     def merge(cls, plans): return cls(t for p in plans for t in p)
    >>> class Upper:  # a stand-in extractor: one "entity", the whole text
    ...     def plan(self, texts, field="texts", max_text_chars=None): return Texts(texts)
    ...     def run(self, plan, deadline=None):
    ...         from nlp.values import Entity, Extraction, Span
    ...         return [Extraction((Entity(Span(0, len(t), t), "T"),)) for t in plan]
    ...     def close(self): pass
    >>> ex = InlineExecutor(lambda options: Upper(), WorkSpec(LoadOptions("unused")))
    >>> ex.start()
    >>> from nlp.errors import InvalidInput
    >>> recs = [Record(1, "ab"), Record(2, None, InvalidInput("bad")), Record(3, "c")]
    >>> [(r.id, type(o).__name__) for w in extract_windows(recs, ex, window=2) for r, o in w]
    [(1, 'Extraction'), (2, 'Failure'), (3, 'Extraction')]
    """
    if window < 1 or chunk_size < 1:
        raise ValueError("window and chunk_size must be positive")
    windows: deque[_Window] = deque()
    chunk_map: dict[int, tuple[_Window, list[int]]] = {}
    chunk_ids = itertools.count()
    it = iter(records)

    def chunks() -> Iterator[Chunk]:
        while batch := list(itertools.islice(it, window)):
            current = _Window(batch)
            current.outcomes = [
                error_outcome(r.error) if r.error is not None else None for r in batch
            ]
            valid = [i for i, r in enumerate(batch) if r.error is None]
            valid.sort(key=lambda i: len(batch[i].text or ""))
            cuts = [valid[i : i + chunk_size] for i in range(0, len(valid), chunk_size)] or [[]]
            current.pending = len(cuts)
            windows.append(current)
            for positions in cuts:
                chunk_id = next(chunk_ids)
                chunk_map[chunk_id] = (current, positions)
                yield chunk_id, [batch[i].text or "" for i in positions]

    for chunk_id, outcomes in executor.map_unordered(chunks()):
        done, positions = chunk_map.pop(chunk_id)
        for i, outcome in zip(positions, outcomes, strict=True):
            done.outcomes[i] = outcome
        done.pending -= 1
        if on_chunk is not None:
            on_chunk(len(positions))
        while windows and windows[0].pending == 0:
            ready = windows.popleft()
            pairs = list(zip(ready.records, ready.outcomes, strict=True))
            assert all(o is not None for _, o in pairs)
            yield [(r, o) for r, o in pairs if o is not None]
    assert not windows and not chunk_map


def extract_records(
    records: Iterable[Record], executor: Executor, *, window: int = 2048, chunk_size: int = 64
) -> Iterator[tuple[Record, Outcome]]:
    """``extract_windows`` flattened: each record with its outcome, in input order."""
    for pairs in extract_windows(records, executor, window=window, chunk_size=chunk_size):
        yield from pairs
