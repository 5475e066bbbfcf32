"""The worker's models: one ``ModelSlot`` per name of ``Settings.model_table``, the first the default.

``SPO_MODELS=ner=models/ner,demo=models/demo`` serves two models; ``SPO_MODEL_DIR`` one (named after its
directory). Each model is its own ``ModelSlot`` (``app.web.model_slot``): its own extractor, TensorFlow Session
and graph, loaded after the fork, finalized and warmed on its bucket shapes, and its own lock, so a call
to one model never waits for another. The worker's memory is the sum of its models (docs/rest.md has
the figures). ``ready`` is true only when every model is; ``/readyz`` answers 200 only then.

The registry lives in ``app.extensions["spo.models"]``; ``app.extensions["spo"]`` stays the default
model's slot, for code that knows one model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.settings import Settings
from app.web.microbatch import MicroBatcher
from app.web.model_slot import Loader, ModelSlot

logger = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """One model of the service: its public name, directory, slot and (when on) micro-batcher."""

    name: str
    directory: Path
    slot: ModelSlot
    batcher: MicroBatcher[Any] | None = None

    def brief(self) -> dict[str, Any]:
        """What ``GET /v1/models`` says of it: name, state, and once loaded version, task, labels."""
        extractor = self.slot.extractor
        manifest = extractor.manifest if extractor is not None else None
        return {
            "name": self.name,
            "state": self.slot.state,
            "version": manifest.version if manifest is not None else None,
            "task": manifest.task if manifest is not None else None,
            "labels": list(manifest.labels) if manifest is not None else None,
        }


class ModelRegistry:
    """The named models of one worker, in ``Settings.model_table`` order (the default first)."""

    def __init__(self, models: list[ServedModel]) -> None:
        if not models:
            raise ValueError("a registry needs at least one model")
        self._models = {m.name: m for m in models}
        if len(self._models) != len(models):
            raise ValueError("model names must be unique")
        self.default = models[0]

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelRegistry:
        models = []
        for name, directory in settings.model_table:
            slot = ModelSlot(retry_max_s=settings.load_retry_max_s)
            batcher = None
            if settings.microbatch_wait_ms > 0:
                batcher = MicroBatcher(
                    slot.run,
                    wait_s=settings.microbatch_wait_ms / 1000,
                    max_texts=settings.microbatch_max_texts,
                )
            models.append(ServedModel(name, directory, slot, batcher))
        return cls(models)

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def get(self, name: str) -> ServedModel | None:
        return self._models.get(name)

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    @property
    def ready(self) -> bool:
        """Every model loaded and warmed."""
        return all(m.slot.ready for m in self)

    def call_started(self) -> float | None:
        """When the oldest model call running now began (``time.monotonic()``), or ``None``."""
        return min((t for m in self if (t := m.slot.call_started) is not None), default=None)

    def load(self, settings: Settings, loader: Loader) -> None:
        """Load every model now, in table order; the first error propagates."""
        for model in self:
            model.slot.load(settings.load_options(model.directory), loader)

    def load_or_retry(self, settings: Settings, loader: Loader) -> bool:
        """Load every model now, in table order; one that fails is logged and retried with backoff
        in the background (``ModelSlot.load_or_retry``) while the others serve. True when all are
        ready."""
        results = [m.slot.load_or_retry(settings.load_options(m.directory), loader) for m in self]
        return all(results)

    def load_in_background(self, settings: Settings, loader: Loader) -> list[threading.Thread]:
        """One loading thread per model; each model turns ready on its own."""
        return [m.slot.load_in_background(settings.load_options(m.directory), loader) for m in self]

    def close_batchers(self, timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        """Drain and stop every model's micro-batcher; their counters by model name."""
        return {m.name: m.batcher.close(timeout=timeout) for m in self if m.batcher is not None}

    def close(self) -> None:
        self.close_batchers()
        for model in self:
            model.slot.close()
