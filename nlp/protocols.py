"""The two interfaces between the stages, written down: ``Runtime`` and ``ExtractorLike``.

``Runtime`` is what ``Extractor`` needs of the model call: ``nlp.runtime.SessionRuntime`` and
``nlp.onnx_runtime.OnnxRuntime`` implement it (both through ``WarmedShapes``, the warm-up and shape check
they share), and so do the benchmark's naive TF2 runtimes (``bench/runtimes.py``), which is how they sit
under the same tokenization, windowing and decoding. ``ExtractorLike`` is what the service and the batch
command need of an ``nlp.pipeline.Extractor`` (their tests hand in fakes). No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from nlp.errors import InvalidInput
from nlp.manifest import Manifest
from nlp.types import Extraction


class Runtime(Protocol):
    """A loaded model, fed padded ``(batch, length)`` token and segment ids, returning numpy outputs."""

    # The shapes warmed at load (``run`` accepts only these); empty for a runtime that takes any shape.
    shapes: frozenset[tuple[int, int]]
    # Every shape ``run`` has been fed since load.
    shapes_fed: set[tuple[int, int]]
    # Seconds spent loading and warming (0.0 for a runtime that does not warm).
    load_seconds: float
    warm_seconds: float

    def run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        """The model's outputs in role order, each ``(batch, heads, length, length)``."""
        ...

    def close(self) -> None: ...


class WarmedShapes:
    """The bucketed-shape half of ``Runtime``, shared by both engines (``SessionRuntime``,
    ``OnnxRuntime``): every shape is run once at load, and ``run`` refuses any other.

    A subclass sets ``shapes`` (and empty ``shapes_fed``, ``runs = 0``), implements ``_run`` (one
    unchecked model call), and calls ``_warm`` once loaded.
    """

    shapes: frozenset[tuple[int, int]]
    shapes_fed: set[tuple[int, int]]
    runs: int

    def _run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        raise NotImplementedError

    def _warm(self, vocab_size: int, seed: int) -> None:
        """Run every shape once with full-size inputs (no padding), so the first real requests of
        each shape allocate nothing new."""
        rng = np.random.default_rng(seed)
        low = min(5, vocab_size - 1)
        for batch, length in sorted(self.shapes):
            ids = rng.integers(low, vocab_size, size=(batch, length), dtype=np.int64)
            self._run(ids, np.zeros_like(ids))
        self.runs = 0

    def check_shape(self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]) -> None:
        """``InvalidInput`` unless both arrays have one and the same warmed shape."""
        shape = tuple(token_ids.shape)
        if shape not in self.shapes or segment_ids.shape != token_ids.shape:
            raise InvalidInput(f"input shape {shape} is not one of the warmed bucket shapes")

    def run(
        self, token_ids: npt.NDArray[Any], segment_ids: npt.NDArray[Any]
    ) -> list[npt.NDArray[Any]]:
        """Model outputs (numpy, ``(batch, heads, length, length)`` each) for one bucketed batch."""
        self.check_shape(token_ids, segment_ids)
        self.shapes_fed.add((token_ids.shape[0], token_ids.shape[1]))
        self.runs += 1
        return self._run(token_ids, segment_ids)


class ExtractorLike(Protocol):
    """What the service (``app.model_slot``) and the batch command (``app.batch``) use of an extractor."""

    @property
    def manifest(self) -> Manifest: ...

    def plan(self, texts: Sequence[str], *, field: str = "texts") -> Any:
        """Validated, tokenized work with a ``tokens`` count (``nlp.pipeline.Plan``); no model call,
        safe from any thread."""
        ...

    def run(self, plan: Any, *, deadline: float | None = None) -> list[Extraction]:
        """The model calls of ``plan``; ``DeadlineExceeded`` past ``deadline`` (``time.monotonic``)."""
        ...

    def extract_batch(
        self, texts: Sequence[str], *, field: str = "texts", deadline: float | None = None
    ) -> list[Extraction]: ...

    def close(self) -> None: ...
