"""Opt-in request micro-batching per worker: requests that arrive together run as one model call.

A gthread worker serves ``SPO_THREADS`` requests at once, but its model runs one call at a time
(``ModelSlot.lock``). With ``SPO_MICROBATCH_WAIT_MS`` above 0, a request thread hands its plan (its texts
checked and tokenized once, ``nlp.pipeline.Plan``) to the worker's ``MicroBatcher`` and waits. One
batcher thread takes the oldest pending request, waits until ``wait_s`` after that request arrived (or
until ``max_texts`` texts are pending), merges the plans of every pending request (``Plan.merge``: no
text is checked or tokenized again) and runs them as one model run, which sorts and buckets their
windows; each request gets its own slice of the results, in order. Requests that queued while the model was busy find their
window already over: the wait only delays a request that finds the model idle.

- A request is never split: one with more than ``max_texts`` texts runs alone.
- If a combined call raises, each of its requests is rerun alone, so only the faulty one gets an error.
- Deadlines (``SPO_REQUEST_TIMEOUT``): a request still queued at its deadline is dropped from the queue
  and answered ``DeadlineExceeded`` without a model call. A combined call runs under the earliest
  deadline of its requests; when that stops it, only the requests past their own deadline get
  ``DeadlineExceeded``, and the others are rerun alone under theirs, the earliest deadline first (so
  none waits out a rerun that may run past its own deadline): one slow or late request never fails
  its batch neighbours.
- ``close()`` (gunicorn's ``worker_exit``) refuses new requests with ``BatcherClosed``, serves those
  already pending and stops the thread. Whatever ends the thread, a request still pending then gets
  ``BatcherClosed``: none waits forever.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from nlp.errors import DeadlineExceeded
from nlp.protocols import Mergeable, merge_plans
from nlp.values import Extraction

logger = logging.getLogger(__name__)


P = TypeVar("P", bound=Mergeable)
P_contra = TypeVar("P_contra", bound=Mergeable, contravariant=True)


class RunPlan(Protocol[P_contra]):
    """The locked model call: ``ModelSlot.run``, one ``Extraction`` per text of the plan."""

    def __call__(self, plan: P_contra, deadline: float | None = None) -> list[Extraction]: ...


class BatcherClosed(RuntimeError):
    """The worker's batcher is stopping or stopped: the request was not run; retry it elsewhere."""


@dataclass(eq=False)
class _Pending(Generic[P]):
    plan: P | None  # None: ``_NOTHING``
    texts: int
    arrived: float
    deadline: float | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    results: list[Extraction] | None = None
    error: BaseException | None = None
    # The batcher thread and ``close`` may answer one request at the same moment: the first wins.
    _answering: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def finish(
        self, results: list[Extraction] | None = None, error: BaseException | None = None
    ) -> None:
        with self._answering:
            if not self.done.is_set():
                self.results, self.error = results, error
                self.done.set()


# What ``_take`` returns when every queued request expired: not a stop, nothing to run.
_NOTHING: _Pending[Any] = _Pending(None, 0, 0.0)


@dataclass
class BatchStats:
    """Counters since start: ``requests`` in ``batches`` model calls; ``isolated``: combined calls that
    raised and were rerun request by request."""

    batches: int = 0
    requests: int = 0
    texts: int = 0
    largest: int = 0
    isolated: int = 0
    expired: int = 0

    def to_dict(self) -> dict[str, Any]:
        mean = self.requests / self.batches if self.batches else 0.0
        return {
            "batches": self.batches,
            "requests": self.requests,
            "texts": self.texts,
            "mean_requests_per_batch": round(mean, 3),
            "largest_batch_requests": self.largest,
            "isolated_batches": self.isolated,
            "expired_in_queue": self.expired,
        }


class MicroBatcher(Generic[P]):
    """Combines concurrent ``submit(plan)`` calls into ``run(merged plan)`` calls (see the module doc).

    ``run`` is the locked model call (``ModelSlot.run``); plans are merged with their type's ``merge``
    (``nlp.protocols.merge_plans``). The thread starts on the first ``submit``, so a batcher created
    before a fork starts in the process that uses it.
    """

    def __init__(
        self,
        run: RunPlan[P],
        *,
        wait_s: float,
        max_texts: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if wait_s <= 0 or max_texts < 1:
            raise ValueError("wait_s must be positive and max_texts at least 1")
        self._run = run
        self.wait_s = wait_s
        self.max_texts = max_texts
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: collections.deque[_Pending[P]] = collections.deque()
        self._queued_texts = 0
        self._running: list[_Pending[P]] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        self.stats = BatchStats()
        # Called with (requests, texts) for each batch taken (metrics); must not raise.
        self.on_batch: Callable[[int, int], None] | None = None

    # -- request threads -------------------------------------------------------------------------
    def submit(self, plan: P, *, deadline: float | None = None) -> list[Extraction]:
        """The results for ``plan`` (one per text, in order), run together with concurrent requests.

        ``deadline``: a value of the batcher's clock (``time.monotonic`` by default) after which the
        request is dropped or stopped with ``DeadlineExceeded``. Raises what the model call raised for
        this plan, or ``BatcherClosed``.
        """
        pending = _Pending(plan, len(plan), self._clock(), deadline)
        with self._cond:
            if self._closed:
                raise BatcherClosed("This worker is shutting down.")
            self._queue.append(pending)
            self._queued_texts += pending.texts
            self._start()
            self._cond.notify_all()
        # The thread answers every request it takes, even when it dies (and a new one takes the
        # queue over); the liveness check is a second guard, so no request thread waits for ever.
        while not pending.done.wait(self._poll_s(pending)):
            with self._cond:
                if self._thread is None or not self._thread.is_alive():
                    pending.finish(error=BatcherClosed("The worker's batcher stopped."))
                elif pending in self._queue:
                    self._drop_expired()  # at its deadline, while the model is busy elsewhere
        if pending.error is not None:
            raise pending.error
        assert pending.results is not None
        return pending.results

    def _poll_s(self, pending: _Pending[P]) -> float:
        """How long a request thread waits before it looks again: 0.5 s, less near its deadline."""
        if pending.deadline is None:
            return 0.5
        return min(0.5, max(0.01, pending.deadline - self._clock()))

    def close(self, timeout: float = 30.0) -> dict[str, Any]:
        """Refuse new requests, serve the pending ones (for at most ``timeout`` seconds), stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._fail_pending("This worker is shutting down.")
        stats = self.stats.to_dict()
        if self.stats.batches:
            logger.info(
                "micro-batching: %d requests (%d texts) in %d model calls, %.2f requests per call "
                "(largest %d), %d combined calls rerun one by one",
                stats["requests"],
                stats["texts"],
                stats["batches"],
                stats["mean_requests_per_batch"],
                stats["largest_batch_requests"],
                stats["isolated_batches"],
            )
        return stats

    # -- the batcher thread ----------------------------------------------------------------------
    def _start(self) -> None:
        """Start the thread unless it runs (call with ``_cond`` held)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="spo-microbatch", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        try:
            while self._serve(self._take()):
                pass
        except BaseException:
            # Not re-raised: nobody would catch it; the requests it held are answered below.
            logger.exception("micro-batcher thread stopped by an unexpected error")
        finally:
            with self._cond:
                for pending in self._running:
                    pending.finish(error=BatcherClosed("The worker's batcher stopped."))
                self._running = []
                if self._thread is threading.current_thread():
                    self._thread = None
                if self._closed:
                    self._fail_pending("This worker is shutting down.")
                elif self._queue:
                    self._start()  # requests queued meanwhile go to a new thread

    def _fail_pending(self, detail: str) -> None:
        """Answer every request not yet answered (call with ``_cond`` held)."""
        for pending in [*self._running, *self._queue]:
            pending.finish(error=BatcherClosed(detail))
        self._queue.clear()
        self._queued_texts = 0

    def _take(self) -> list[_Pending[P]]:
        """The next batch: whole requests, oldest first, at most ``max_texts`` texts unless the first
        alone has more. Empty once closed and drained."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            self._running = []
            self._drop_expired()
            if not self._queue:
                return [] if self._closed else [_NOTHING]
            deadline = self._queue[0].arrived + self.wait_s
            while not self._closed and self._queued_texts < self.max_texts:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._drop_expired()
            if not self._queue:
                return [] if self._closed else [_NOTHING]
            batch = [self._queue.popleft()]
            size = batch[0].texts
            while self._queue and size + self._queue[0].texts <= self.max_texts:
                batch.append(self._queue.popleft())
                size += batch[-1].texts
            self._queued_texts -= size
            self._running = batch
            return batch

    def _drop_expired(self) -> None:
        """Answer and drop queued requests past their deadline (call with ``_cond`` held)."""
        now = self._clock()
        expired = [p for p in self._queue if p.deadline is not None and now >= p.deadline]
        for pending in expired:
            self._queue.remove(pending)
            self._queued_texts -= pending.texts
            self.stats.expired += 1
            pending.finish(
                error=DeadlineExceeded(
                    "its deadline passed while it waited in the micro-batch queue"
                )
            )

    def _serve_each(self, batch: list[_Pending[P]]) -> None:
        """Rerun ``batch``'s requests alone, the earliest deadline first (none: last). Each run stops
        at its own deadline, so a request waits only for reruns that end by its own deadline (plus
        one model call); in queue order it waited out a rerun with no deadline at all."""
        for pending in sorted(batch, key=lambda p: (p.deadline is None, p.deadline or 0.0)):
            self._serve_alone(pending)

    def _serve(self, batch: list[_Pending[P]]) -> bool:
        """Run ``batch`` and answer each of its requests; False when there was none (stop)."""
        if not batch:
            return False
        if batch[0] is _NOTHING:
            return True  # every queued request expired: wait for more
        texts = sum(p.texts for p in batch)
        started = self._clock()
        stats = self.stats
        stats.batches += 1
        stats.requests += len(batch)
        stats.texts += texts
        stats.largest = max(stats.largest, len(batch))
        if self.on_batch is not None:
            self.on_batch(len(batch), texts)
        if len(batch) == 1:
            self._serve_alone(batch[0])
        else:
            deadlines = [p.deadline for p in batch if p.deadline is not None]
            try:
                plans = [p.plan for p in batch if p.plan is not None]
                results = self._run(merge_plans(plans), deadline=min(deadlines, default=None))
                if len(results) != texts:
                    raise RuntimeError(f"{len(results)} results for {texts} texts")
            except DeadlineExceeded as exc:
                # The earliest deadline stopped the call: it answers the requests past theirs; the
                # others get their own run, under their own deadline.
                # Each its own exception: one instance raised in several request threads at once
                # would gather all their frames in one traceback (and keep them alive).
                now = self._clock()
                for pending in batch:
                    if pending.deadline is not None and now >= pending.deadline:
                        pending.finish(error=DeadlineExceeded(exc.message))
                self._serve_each([p for p in batch if not p.done.is_set()])
            except Exception as exc:
                stats.isolated += 1
                logger.warning(
                    "a combined call of %d requests raised %s; rerunning each alone",
                    len(batch),
                    type(exc).__name__,
                )
                self._serve_each(batch)
            else:
                start = 0
                for pending in batch:
                    stop = start + pending.texts
                    pending.finish(results=results[start:stop])
                    start = stop
        logger.debug(
            "micro-batch: %d requests, %d texts, waited %.1f ms, ran %.1f ms",
            len(batch),
            texts,
            1000 * (started - batch[0].arrived),
            1000 * (self._clock() - started),
        )
        return True

    def _serve_alone(self, pending: _Pending[P]) -> None:
        assert pending.plan is not None
        try:
            pending.finish(results=self._run(pending.plan, deadline=pending.deadline))
        except Exception as exc:
            pending.finish(error=exc)
