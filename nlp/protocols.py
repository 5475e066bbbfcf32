"""The interfaces between the stages, written down: ``Runtime``, ``ExtractorLike`` and ``Mergeable``.

``Runtime`` is what ``Extractor`` needs of the model call: ``nlp.runtime.SessionRuntime``,
``nlp.onnx_runtime.OnnxRuntime`` and ``nlp.openvino_runtime.OpenVinoRuntime`` implement it (all through
``nlp.engine.WarmedShapes``, the warm-up and shape check they share), and so do the benchmark's naive TF2 runtimes (``bench/runtimes.py``),
which is how they sit under the same tokenization, windowing and decoding. ``ExtractorLike`` is what the service and the batch
command need of an ``nlp.pipeline.Extractor`` (their tests hand in fakes); ``Mergeable`` what the
micro-batcher and the batch workers need of a plan, with ``merge_plans``, the one function here.
No TensorFlow, directly or through bert4keras: the gunicorn master, the batch command and Spark's
driver import this module (``tests/app/test_layers.py`` checks that they never import TensorFlow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, Self, TypeVar

import numpy.typing as npt

from nlp.manifest import Manifest
from nlp.values import Extraction


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


class ExtractorLike(Protocol):
    """What the service (``app.web.model_slot``) and the batch command (``app.batch``) use of an extractor."""

    @property
    def manifest(self) -> Manifest: ...

    # When the model call running now began (``time.monotonic()``), None between calls.
    call_started: float | None

    def plan(
        self,
        texts: Sequence[object],
        *,
        field: str = "texts",
        max_tokens: int | None = None,
        max_text_chars: int | None = None,
    ) -> Any:
        """Validated, tokenized work with a ``tokens`` count (``nlp.pipeline.Plan``), refused over
        ``max_tokens``; no model call, safe from any thread."""
        ...

    def run(self, plan: Any, *, deadline: float | None = None) -> list[Extraction]:
        """The model calls of ``plan``; ``DeadlineExceeded`` past ``deadline`` (``time.monotonic``)."""
        ...

    def extract_batch(
        self, texts: Sequence[str], *, field: str = "texts", deadline: float | None = None
    ) -> list[Extraction]: ...

    def close(self) -> None: ...


class Mergeable(Protocol):
    """A plan as the micro-batcher and the batch workers handle it: ``nlp.pipeline.Plan``, or a
    test's stand-in with the same two members."""

    def __len__(self) -> int: ...

    @classmethod
    def merge(cls, plans: Sequence[Self]) -> Self: ...


P = TypeVar("P", bound=Mergeable)


def merge_plans(plans: Sequence[P]) -> P:
    """``plans`` as one (see ``nlp.pipeline.Plan.merge``); at least one."""
    return type(plans[0]).merge(plans)
