"""The worker's model: loaded once per process, after gunicorn forks, and used under one lock.

``ModelSlot`` lives in ``app.extensions["spo"]``. Loading happens when the app is created, which under
gunicorn (``preload_app = False``) is in each worker after the fork, before it accepts a connection:

- ``boot`` (default): ``create_app`` loads and warms synchronously. A worker only accepts once it can
  answer, so recycling a worker (``max_requests``, the RSS watchdog) never sends a request to a cold one;
  meanwhile its siblings serve, and with one worker requests wait in the listen backlog instead of failing.
  The gunicorn ``timeout`` must cover load plus warm-up (the worker does not heartbeat meanwhile).
- ``background``: a thread loads while the worker already answers ``/healthz`` and ``503 model_not_ready``
  (with ``Retry-After``), for orchestrators that gate traffic on ``/readyz`` instead.

The Extractor is not thread-safe; gthread workers serve several requests at once, so model calls take
``lock`` while health checks and request validation do not. With micro-batching on (``app.microbatch``)
one batcher thread per worker makes the model calls, through ``extract_batch`` and the same lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from nlp.config import LoadOptions
from nlp.protocols import ExtractorLike
from nlp.types import Extraction

logger = logging.getLogger(__name__)


class ModelNotReady(RuntimeError):
    """No extractor to run: ``state`` is ``loading`` or ``failed``."""

    def __init__(self, state: str) -> None:
        super().__init__(f"the model is {state}")
        self.state = state


# Loads the model of some options: ``nlp.config.load_extractor``, or a fake in tests.
Loader = Callable[[LoadOptions], ExtractorLike]


class ModelSlot:
    """Holds the worker's extractor: ``loading`` -> ``ready`` (or ``failed``)."""

    def __init__(self) -> None:
        self._extractor: ExtractorLike | None = None
        self._failed = False
        self.lock = threading.Lock()

    @property
    def ready(self) -> bool:
        return self._extractor is not None

    @property
    def state(self) -> str:
        return "ready" if self.ready else "failed" if self._failed else "loading"

    @property
    def extractor(self) -> ExtractorLike | None:
        return self._extractor

    def set(self, extractor: ExtractorLike) -> None:
        self._extractor = extractor

    def load(self, options: LoadOptions, loader: Loader) -> None:
        """Load synchronously; errors propagate (a worker that cannot load must not boot)."""
        started = time.perf_counter()
        try:
            extractor = loader(options)
        except BaseException:
            self._failed = True
            raise
        self.set(extractor)
        summary = extractor.manifest.summary()
        logger.info(
            "model %s v%s (%s) loaded and warmed in %.1fs from %s",
            summary.get("name"),
            summary.get("version"),
            summary.get("task"),
            time.perf_counter() - started,
            options.model_dir,
        )

    def load_in_background(self, options: LoadOptions, loader: Loader) -> threading.Thread:
        def run() -> None:
            try:
                self.load(options, loader)
            except Exception:
                logger.exception("model load failed: %s stays unready", options.model_dir)

        thread = threading.Thread(target=run, name="spo-model-load", daemon=True)
        thread.start()
        return thread

    def extract_batch(self, texts: Sequence[str], field: str = "texts") -> list[Extraction]:
        """The extractor's ``extract_batch`` under ``lock``; ``ModelNotReady`` before it is loaded."""
        extractor = self._extractor
        if extractor is None:
            raise ModelNotReady(self.state)
        with self.lock:
            return extractor.extract_batch(texts, field=field)

    def close(self) -> None:
        extractor, self._extractor = self._extractor, None
        if extractor is not None:
            with self.lock:
                extractor.close()
