"""Fixed input shapes: sort by length, plan (batch bucket, length bucket) batches, pad, scatter back.

Pure Python/numpy. The runtime only ever sees the shapes ``BucketSpec.shapes()`` lists, so the set of
shapes TensorFlow sees is finite, known, and warmed at start-up.

>>> spec = BucketSpec(length_buckets=(8, 16), batch_buckets=(1, 2, 4))
>>> [(b.shape, b.rows) for b in plan_batches([5, 12, 3, 7, 16], spec)]
[((2, 8), (2, 0)), ((1, 8), (3,)), ((2, 16), (1, 4))]

A batch of one row pads only to the next multiple of ``single_row_step`` (when set): single-text
requests are the common case, and one-row shapes are cheap to warm.

>>> spec = BucketSpec(length_buckets=(8, 32), batch_buckets=(1, 2), single_row_step=4)
>>> [b.shape for b in plan_batches([5, 18, 30], spec)]
[(1, 8), (2, 32)]
>>> [b.shape for b in plan_batches([18], spec)]
[(1, 20)]
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from nlp.config import DEFAULT_MAX_BATCH_TOKENS


@dataclass(frozen=True)
class BucketSpec:
    """Length buckets (tokens, ``[CLS]``/``[SEP]`` included) x batch buckets (rows).

    ``max_batch_tokens`` caps rows x length: long inputs run in smaller batches, which bounds the peak
    memory of one run (GPLinker outputs grow with length squared) and the number of warm-up shapes.
    A length bucket always keeps its smallest batch bucket, whatever the cap.

    ``single_row_step``: batches of one row (when batch bucket 1 exists) use the finer lengths
    ``single_row_lengths`` (the length buckets plus every multiple of the step below the largest),
    so a single text is padded by less than one step.
    """

    length_buckets: tuple[int, ...]
    batch_buckets: tuple[int, ...]
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS
    single_row_step: int | None = None

    def __post_init__(self) -> None:
        for name in ("length_buckets", "batch_buckets"):
            values = getattr(self, name)
            if not values or list(values) != sorted(set(values)) or values[0] <= 0:
                raise ValueError(f"{name} must be strictly increasing positive integers: {values}")
        if self.single_row_step is not None and self.single_row_step <= 0:
            raise ValueError(f"single_row_step must be positive: {self.single_row_step}")

    @functools.cached_property
    def single_row_lengths(self) -> tuple[int, ...]:
        """Lengths a one-row batch may take: the length buckets, plus the step's multiples."""
        if self.single_row_step is None or self.batch_buckets[0] != 1:
            return self.length_buckets
        step = self.single_row_step
        fine = range(step, self.max_length, step)
        return tuple(
            sorted(set(self.length_buckets) | {n for n in fine if n >= self.length_buckets[0]})
        )

    @property
    def max_length(self) -> int:
        return self.length_buckets[-1]

    def length_bucket(self, n_tokens: int) -> int:
        """The smallest length bucket that holds ``n_tokens``."""
        i = bisect.bisect_left(self.length_buckets, n_tokens)
        if i == len(self.length_buckets):
            raise ValueError(
                f"{n_tokens} tokens exceed the largest length bucket {self.max_length}"
            )
        return self.length_buckets[i]

    def batch_buckets_for(self, length: int) -> tuple[int, ...]:
        if self.max_batch_tokens is None:
            return self.batch_buckets
        allowed = tuple(b for b in self.batch_buckets if b * length <= self.max_batch_tokens)
        return allowed or self.batch_buckets[:1]

    def single_row_length(self, n_tokens: int) -> int:
        """The length a one-row batch of ``n_tokens`` runs at (never above its length bucket)."""
        bucket = self.length_bucket(n_tokens)  # raises when no bucket holds it
        lengths = self.single_row_lengths
        return min(bucket, lengths[bisect.bisect_left(lengths, n_tokens)])

    def shapes(self) -> list[tuple[int, int]]:
        """Every (batch, length) shape the runtime may be fed."""
        shapes = [(b, n) for n in self.length_buckets for b in self.batch_buckets_for(n)]
        shapes += [(1, n) for n in self.single_row_lengths if n not in self.length_buckets]
        return sorted(shapes, key=lambda s: (s[1], s[0]))


@dataclass(frozen=True)
class Batch:
    """One run: ``rows[i]`` is the input index padded into row ``i``; rows past ``len(rows)`` are padding."""

    shape: tuple[int, int]
    rows: tuple[int, ...]


def _split_rows(count: int, buckets: tuple[int, ...]) -> list[int]:
    """Row counts for ``count`` items: the largest bucket that fits, repeatedly (no padded rows when a
    bucket of 1 exists); a remainder smaller than every bucket takes the smallest bucket."""
    sizes: list[int] = []
    while count > 0:
        fitting = [b for b in buckets if b <= count]
        size = fitting[-1] if fitting else buckets[0]
        sizes.append(size)
        count -= min(size, count)
    return sizes


def plan_batches(lengths: Sequence[int], spec: BucketSpec) -> list[Batch]:
    """Group inputs of the given token lengths into fixed-shape batches, shortest first."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[Batch] = []
    start = 0
    while start < len(order):
        length = spec.length_bucket(lengths[order[start]])
        stop = start
        while stop < len(order) and spec.length_bucket(lengths[order[stop]]) == length:
            stop += 1
        buckets = spec.batch_buckets_for(length)
        for size in _split_rows(stop - start, buckets):
            take = order[start : min(start + size, stop)]
            run_length = spec.single_row_length(lengths[take[0]]) if size == 1 else length
            batches.append(Batch(shape=(size, run_length), rows=tuple(take)))
            start += len(take)
    return batches


def pad_batch(
    sequences: Sequence[Sequence[int]], shape: tuple[int, int], *, pad_id: int = 0
) -> npt.NDArray[np.int32]:
    """A ``shape`` array of ids, each sequence left-aligned, the rest ``pad_id``."""
    rows, length = shape
    if len(sequences) > rows:
        raise ValueError(f"{len(sequences)} sequences do not fit in {rows} rows")
    out = np.full(shape, pad_id, dtype=np.int32)
    for r, seq in enumerate(sequences):
        if len(seq) > length:
            raise ValueError(f"a sequence of {len(seq)} tokens does not fit length {length}")
        out[r, : len(seq)] = seq
    return out
