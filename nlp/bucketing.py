"""Fixed input shapes: sort by length, plan (batch bucket, length bucket) batches, pad, scatter back.

Pure Python/numpy. The runtime only ever sees the shapes ``BucketSpec.shapes()`` lists, so the set of
shapes TensorFlow sees is finite, known, and warmed at start-up.

>>> spec = BucketSpec(length_buckets=(8, 16), batch_buckets=(1, 2, 4))
>>> [(b.shape, b.rows) for b in plan_batches([5, 12, 3, 7, 16], spec)]
[((2, 8), (2, 0)), ((1, 8), (3,)), ((2, 16), (1, 4))]
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_MAX_BATCH_TOKENS = 4096


@dataclass(frozen=True)
class BucketSpec:
    """Length buckets (tokens, ``[CLS]``/``[SEP]`` included) x batch buckets (rows).

    ``max_batch_tokens`` caps rows x length: long inputs run in smaller batches, which bounds the peak
    memory of one run (GPLinker outputs grow with length squared) and the number of warm-up shapes.
    A length bucket always keeps its smallest batch bucket, whatever the cap.
    """

    length_buckets: tuple[int, ...]
    batch_buckets: tuple[int, ...]
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS

    def __post_init__(self) -> None:
        for name in ("length_buckets", "batch_buckets"):
            values = getattr(self, name)
            if not values or list(values) != sorted(set(values)) or values[0] <= 0:
                raise ValueError(f"{name} must be strictly increasing positive integers: {values}")

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

    def shapes(self) -> list[tuple[int, int]]:
        """Every (batch, length) shape the runtime may be fed."""
        return [(b, n) for n in self.length_buckets for b in self.batch_buckets_for(n)]


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
            batches.append(Batch(shape=(size, length), rows=tuple(take)))
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
