"""The worker's model: loaded once per process, after gunicorn forks, and used under one lock.

``ModelSlot`` lives in ``app.extensions["spo"]``. Loading happens when the app is created, which under
gunicorn (``preload_app = False``) is in each worker after the fork, before it accepts a connection:

- ``boot`` (default): ``create_app`` loads and warms synchronously. A worker only accepts once it can
  answer, so recycling a worker (``max_requests``, the RSS watchdog) never sends a request to a cold one;
  meanwhile its siblings serve, and with one worker requests wait in the listen backlog instead of failing.
  The gunicorn ``timeout`` must cover load plus warm-up (the worker does not heartbeat meanwhile).
- ``background``: a thread loads while the worker already answers ``/healthz`` and ``503 model_not_ready``
  (with ``Retry-After``), for orchestrators that gate traffic on ``/readyz`` instead.

A load that fails never ends the worker (a worker that exits while booting makes gunicorn halt the whole
server): the slot turns ``failed``, keeps the error (``/readyz`` and ``/v1/*`` answer 503 with its code),
and a thread retries after 1, 2, 4... seconds, at most ``SPO_LOAD_RETRY_MAX_S`` apart, until the model
loads. ``on_change`` listeners hear each ``ready``/``failed`` transition (``app.serving.master`` reports them to
gunicorn's master, which decides whether a failure ends a first start or a reload).

The Extractor is not thread-safe; gthread workers serve several requests at once, so model calls take
``lock`` while health checks and request validation do not. With micro-batching on (``app.web.microbatch``)
one batcher thread per worker makes the model calls, through ``extract_batch`` and the same lock.

A model call that never returns (a wedged runtime) is the one thing a deadline cannot stop: gthread's
main loop heartbeats to gunicorn's master whatever its request threads do, so ``call_started`` is
what ``deploy/gunicorn.conf.py`` dates the heartbeat by, and gunicorn replaces the worker once a
call has run past ``SPO_TIMEOUT``.

Deadlines (``SPO_REQUEST_TIMEOUT``): a request waits for ``lock`` at most until its deadline, and the
extractor checks it again before each model call, so a request past it gets ``DeadlineExceeded`` and
frees the lock (and its thread) at once. ``plan`` (tokenizing, windowing, counting the request's model
tokens) takes no lock: it is pure, and a request refused for its size never waits for the model.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from nlp.config import LoadOptions
from nlp.errors import DeadlineExceeded, SpoError
from nlp.protocols import ExtractorLike
from nlp.values import Extraction

logger = logging.getLogger(__name__)


class ModelNotReady(RuntimeError):
    """No extractor to run: ``state`` is ``loading`` or ``failed``."""

    def __init__(self, state: str) -> None:
        super().__init__(f"the model is {state}")
        self.state = state


LOAD_ERROR_CODE = "model_load_error"
FIRST_RETRY_S = 1.0


def error_code(exc: BaseException) -> str:
    """A load error's stable code: the library's own (``invalid_manifest``...), else the generic one."""
    return exc.code if isinstance(exc, SpoError) else LOAD_ERROR_CODE


def retry_delays(max_s: float, first_s: float = FIRST_RETRY_S) -> Iterator[float]:
    """Seconds to wait before each retry: doubling from ``first_s``, capped at ``max_s``.

    >>> from itertools import islice
    >>> list(islice(retry_delays(10), 6))
    [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    """
    delay = min(float(first_s), max_s)
    while True:
        yield delay
        delay = min(delay * 2, float(max_s))


# Loads the model of some options: ``nlp.loader.load_extractor``, or a fake in tests.
Loader = Callable[[LoadOptions], ExtractorLike]


class ModelSlot:
    """Holds the worker's extractor: ``loading`` -> ``ready``, or ``failed`` (retrying) -> ``ready``."""

    def __init__(self, retry_max_s: float = 30.0) -> None:
        self._extractor: ExtractorLike | None = None
        self.error: BaseException | None = None
        self.retry_max_s = retry_max_s
        self.lock = threading.Lock()
        self._listeners: list[Callable[[ModelSlot], None]] = []
        self._closed = threading.Event()  # ends the retries
        self._swap = threading.Lock()  # set and close: a load that ends after the close is closed

    @property
    def ready(self) -> bool:
        return self._extractor is not None

    @property
    def call_started(self) -> float | None:
        """When the extractor's model call running now began (``time.monotonic()``; one bucket-shaped
        batch), or ``None`` between calls. The worker's heartbeat to gunicorn counts from one second
        into the oldest call still running (``deploy/gunicorn.conf.py``), so a call that never
        returns gets its worker replaced after ``SPO_TIMEOUT``."""
        extractor = self._extractor
        return extractor.call_started if extractor is not None else None

    @property
    def state(self) -> str:
        return "ready" if self.ready else "failed" if self.error is not None else "loading"

    @property
    def error_code(self) -> str | None:
        """The last load error's stable code while ``failed``."""
        return None if self.error is None or self.ready else error_code(self.error)

    @property
    def extractor(self) -> ExtractorLike | None:
        return self._extractor

    def on_change(self, listener: Callable[[ModelSlot], None]) -> None:
        """Call ``listener(slot)`` after each transition to ``ready`` or ``failed``."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener(self)
            except Exception:
                logger.exception("model state listener failed")

    def set(self, extractor: ExtractorLike) -> bool:
        """Serve ``extractor`` from now on (True). A slot already closed (the worker stopped while
        a background load ran) closes it instead (False): no session outlives the slot, and no
        listener hears ``ready`` after the close."""
        with self._swap:
            closed = self._closed.is_set()
            if not closed:
                self._extractor = extractor
                self.error = None
        if closed:
            with self.lock:
                extractor.close()
            return False
        self._changed()
        return True

    def load(self, options: LoadOptions, loader: Loader) -> None:
        """Load synchronously; errors propagate (and leave the slot ``failed``)."""
        started = time.perf_counter()
        try:
            extractor = loader(options)
        except BaseException as exc:
            self.error = exc
            self._changed()
            raise
        if not self.set(extractor):
            logger.info("model loaded after the worker stopped serving: closed unused")
            return
        summary = extractor.manifest.summary()
        logger.info(
            "model %s v%s (%s) loaded and warmed in %.1fs from %s",
            summary.get("name"),
            summary.get("version"),
            summary.get("task"),
            time.perf_counter() - started,
            options.model_dir,
        )

    def load_or_retry(self, options: LoadOptions, loader: Loader) -> bool:
        """Load now; on failure log the reason and retry in a thread with backoff. True when ready."""
        try:
            self.load(options, loader)
        except Exception as exc:
            self._log_failure(options, exc, 1)
            self._retry(options, loader, first_now=False)
            return False
        return True

    def load_in_background(self, options: LoadOptions, loader: Loader) -> threading.Thread:
        """Load in a thread, retrying with backoff until it succeeds."""
        return self._retry(options, loader, first_now=True)

    def _retry(self, options: LoadOptions, loader: Loader, *, first_now: bool) -> threading.Thread:
        def run() -> None:
            attempt = 1 if first_now else 2
            delays = retry_delays(self.retry_max_s, FIRST_RETRY_S)
            if not first_now and self._closed.wait(next(delays)):
                return
            while not self._closed.is_set():
                try:
                    self.load(options, loader)
                except Exception as exc:
                    self._log_failure(options, exc, attempt)
                    attempt += 1
                    self._closed.wait(next(delays))
                    continue
                if attempt > 1:
                    logger.info("model loaded at attempt %d from %s", attempt, options.model_dir)
                return

        thread = threading.Thread(target=run, name="spo-model-load", daemon=True)
        thread.start()
        return thread

    def _log_failure(self, options: LoadOptions, exc: BaseException, attempt: int) -> None:
        reason = exc.message if isinstance(exc, SpoError) else f"{type(exc).__name__}: {exc}"
        logger.error(
            "model load failed (attempt %d): %s: %s; unready (503 %s) and retrying: %s",
            attempt,
            error_code(exc),
            reason,
            error_code(exc),
            options.model_dir,
            exc_info=exc if attempt == 1 and not isinstance(exc, SpoError) else None,
        )

    def _ready(self) -> ExtractorLike:
        extractor = self._extractor
        if extractor is None:
            raise ModelNotReady(self.state)
        return extractor

    def _acquire(self, deadline: float | None) -> None:
        """Take ``lock``, waiting at most until ``deadline``; ``DeadlineExceeded`` if it passes."""
        if deadline is None:
            self.lock.acquire()
            return
        if not self.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise DeadlineExceeded("its deadline passed while it waited for the model")

    def plan(self, texts: Sequence[object], field: str = "texts", **limits: int | None) -> Any:
        """The extractor's ``plan`` with ``limits`` (``max_tokens``, ``max_text_chars``; no lock:
        pure); ``ModelNotReady`` before it is loaded."""
        return self._ready().plan(texts, field=field, **limits)

    def run(self, plan: Any, deadline: float | None = None) -> list[Extraction]:
        """The extractor's ``run`` of ``plan`` under ``lock``, within ``deadline`` (monotonic)."""
        extractor = self._ready()
        self._acquire(deadline)
        try:
            return extractor.run(plan, deadline=deadline)
        finally:
            self.lock.release()

    def extract_batch(
        self, texts: Sequence[str], field: str = "texts", deadline: float | None = None
    ) -> list[Extraction]:
        """The extractor's ``extract_batch`` under ``lock``; ``ModelNotReady`` before it is loaded."""
        extractor = self._ready()
        self._acquire(deadline)
        try:
            return extractor.extract_batch(texts, field=field, deadline=deadline)
        finally:
            self.lock.release()

    def close(self) -> None:
        with self._swap:
            self._closed.set()
            extractor, self._extractor = self._extractor, None
        if extractor is not None:
            with self.lock:
                extractor.close()
