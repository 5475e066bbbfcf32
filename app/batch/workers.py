"""Where texts meet the model: in this process, or in spawned worker processes.

Both executors take chunks ``(chunk_id, texts)`` lazily and yield ``(chunk_id, outcomes)`` as chunks
complete (any order; the caller restores input order). An outcome stays a typed value
(``nlp.values.Outcome``: an ``Extraction`` or a ``Failure``) until the output writes it
(``app.batch.output.dumps_line``) or Spark turns it into columns.

Each text of a chunk is planned once (``Extractor.plan``: checked against ``--max-text-chars`` and
tokenized); a bad text becomes its ``Failure`` and never fails its neighbours; the good plans are
merged (``nlp.protocols.merge_plans``) and run as one. A rerun one text at a time (below) runs the same
plans: no text is checked or tokenized twice.

Worker processes are started with the ``spawn`` context (TensorFlow is not fork-safe), each loads its
own extractor with the run's ``nlp.config.LoadOptions`` (``intra_op = cores / workers``: see
``app.core.settings.threads_per_worker``), and is replaced after ``recycle_after`` texts or
when its RSS is over ``max_rss_mb``, between chunks, so no chunk is lost or reordered. A worker that
dies mid-chunk is replaced and the chunk is run again once. A second death splits the chunk into its
texts, each run alone (in the same order, under its parent's id once all are back); a text that kills
its worker twice running alone becomes an error record (``internal_error``, or ``deadline_exceeded``
for a worker killed as hung), so one poison record never stops the run, nor every ``--resume`` of it.

``WorkSpec.record_timeout`` (``--record-timeout``, seconds; 0: none) bounds each record's model time. A
chunk runs under a deadline of ``record_timeout`` x its texts; when the pipeline stops it there (it
checks between model calls), its texts run one at a time under ``record_timeout`` each, and a record
that passes it becomes a ``deadline_exceeded`` error record: a runaway record never holds a worker. A
worker that does not answer at all within twice its chunk's budget plus ``HANG_GRACE_S`` (a model call
that never returns) is killed and handled as a dead worker.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from app.core.problems import CATALOGUE, INTERNAL_ERROR
from nlp.config import LoadOptions
from nlp.errors import (
    DeadlineExceeded,
    ManifestError,
    ModelLoadError,
    SpoError,
    UnsupportedPrecision,
)
from nlp.protocols import ExtractorLike, merge_plans
from nlp.values import Failure, Outcome

# A worker's load error, raised again in the parent as what it was (its code is the run's message).
_LOAD_ERRORS = {cls.code: cls for cls in (ModelLoadError, ManifestError, UnsupportedPrecision)}

logger = logging.getLogger(__name__)

Chunk = tuple[int, list[str]]
DEADLINE_EXCEEDED = CATALOGUE["deadline_exceeded"]
INTERNAL_ERROR_OUTCOME = Failure(INTERNAL_ERROR.code, "unexpected error on this text (see the log)")

# Loads a worker's extractor: ``nlp.loader.load_extractor``, or a picklable fake in tests.
ExtractorFactory = Callable[[LoadOptions], ExtractorLike]
HANG_GRACE_S = 60.0


@dataclass(frozen=True)
class WorkSpec:
    """What a worker needs to start: how to load the model, and how its texts are checked."""

    options: LoadOptions
    text_field: str = "text"
    record_timeout: float = 0.0  # seconds of model time per record; 0: no limit


class WorkerError(Exception):
    """Workers failed to start."""


def error_outcome(exc: SpoError) -> Outcome:
    return Failure.of(exc)


def _plan_one(extractor: ExtractorLike, text: str, spec: WorkSpec) -> Any:
    """The plan of one text, or its ``Failure`` (a bad text; an unexpected error, logged)."""
    try:
        return extractor.plan(
            [text], field=spec.text_field, max_text_chars=spec.options.max_text_chars
        )
    except SpoError as exc:
        return Failure.of(exc)
    except Exception:
        logger.exception("planning a text of %d characters failed", len(text))
        return INTERNAL_ERROR_OUTCOME


def run_chunk(extractor: ExtractorLike, texts: Sequence[str], spec: WorkSpec) -> list[Outcome]:
    """Outcomes for ``texts``: each is planned first, so one bad text never fails its neighbours;
    with ``spec.record_timeout`` no record runs longer than that (see the module docstring)."""
    out: list[Outcome | None] = [None] * len(texts)
    plans: dict[int, Any] = {}
    for i, text in enumerate(texts):
        planned = _plan_one(extractor, text, spec)
        if isinstance(planned, Failure):
            out[i] = planned
        else:
            plans[i] = planned
    timeout = spec.record_timeout
    if plans:
        deadline = time.monotonic() + timeout * len(plans) if timeout else None
        try:
            results = extractor.run(merge_plans(list(plans.values())), deadline=deadline)
            for i, result in zip(plans, results, strict=True):
                out[i] = result
        except DeadlineExceeded:
            logger.warning(
                "a chunk of %d texts passed --record-timeout (%gs a text); running them one by one",
                len(plans),
                timeout,
            )
            for i, plan in plans.items():
                out[i] = _run_one(extractor, plan, len(texts[i]), timeout)
        except Exception:
            logger.exception("batch of %d texts failed; retrying them one at a time", len(plans))
            for i, plan in plans.items():
                out[i] = _run_one(extractor, plan, len(texts[i]), timeout)
    return [o if o is not None else INTERNAL_ERROR_OUTCOME for o in out]


def _run_one(
    extractor: ExtractorLike, plan: Any, chars: int, record_timeout: float = 0.0
) -> Outcome:
    """The outcome of one text's ``plan`` (of ``chars`` characters), run alone."""
    deadline = time.monotonic() + record_timeout if record_timeout else None
    try:
        result: Outcome = extractor.run(plan, deadline=deadline)[0]
        return result
    except DeadlineExceeded as exc:
        message = f"the record took over --record-timeout {record_timeout:g}s ({exc.message})"
        return Failure(exc.code, message)
    except SpoError as exc:
        return Failure.of(exc)
    except Exception:
        logger.exception("text of %d characters failed", chars)
        return INTERNAL_ERROR_OUTCOME


class InlineExecutor:
    """Runs chunks in this process (``--workers 0``, tests, debugging)."""

    def __init__(self, factory: ExtractorFactory, spec: WorkSpec) -> None:
        self.factory, self.spec = factory, spec
        self.extractor: ExtractorLike | None = None

    def start(self) -> None:
        self.extractor = self.factory(self.spec.options)

    def map_unordered(self, chunks: Iterable[Chunk]) -> Iterator[tuple[int, list[Outcome]]]:
        assert self.extractor is not None, "start() first"
        for chunk_id, texts in chunks:
            yield chunk_id, run_chunk(self.extractor, texts, self.spec)

    def close(self, graceful: bool = True) -> None:
        if self.extractor is not None:
            self.extractor.close()
            self.extractor = None


def _worker_main(conn: Connection, factory: ExtractorFactory, spec: WorkSpec) -> None:
    """A worker process: load, say ready, then answer chunks until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    import psutil

    from app.core.logs import configure_logging

    configure_logging()  # a spawned process starts unconfigured: log as the parent does

    try:
        extractor = factory(spec.options)
    except SpoError as exc:  # told as itself: the run stops with the same line as --workers 0
        _tell(conn, ("load_error", exc.code, exc.message, exc.field))
        return
    except Exception:
        _tell(conn, ("failed", traceback.format_exc()))
        return
    me = psutil.Process()
    try:
        if not _tell(conn, ("ready", os.getpid())):
            return  # the parent went away while the model loaded
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break  # the parent is gone
            if message is None:
                break
            chunk_id, texts = message
            outcomes = run_chunk(extractor, texts, spec)
            if not _tell(conn, ("done", chunk_id, outcomes, me.memory_info().rss)):
                break
    finally:
        extractor.close()


def _tell(conn: Connection, message: tuple[Any, ...]) -> bool:
    """Send ``message`` to the parent; False when it is gone (killed: nobody is left to tell)."""
    try:
        conn.send(message)
    except OSError:  # BrokenPipeError, ConnectionResetError
        return False
    return True


class _Worker:
    def __init__(self, ctx: Any, factory: ExtractorFactory, spec: WorkSpec) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main, args=(child, factory, spec), name="spo-extract-worker", daemon=True
        )
        self.process.start()
        child.close()
        self.ready = False
        self.texts = 0
        self.chunk: Chunk | None = None
        self.sent_at = 0.0
        self.hung = False  # killed by _kill_hung, not dead on its own

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the worker to exit after its chunk; kill it after ``timeout`` seconds (0: now)."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        if timeout:
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _poison(worker: _Worker, chars: int) -> Outcome:
    """The error record of a text that killed its worker twice running alone."""
    if worker.hung:
        logger.error("a text of %d characters hung its worker twice: an error record", chars)
        return Failure(
            DEADLINE_EXCEEDED.code,
            "the worker did not answer on this record within twice its --record-timeout budget, "
            "twice (killed each time)",
        )
    logger.error(
        "a text of %d characters killed its worker twice (exit code %s): an error record",
        chars,
        worker.process.exitcode,
    )
    return Failure(
        INTERNAL_ERROR.code,
        f"the worker process died twice running this record alone (exit code "
        f"{worker.process.exitcode}); the rest of the run went on",
    )


class ProcessExecutor:
    """``workers`` spawned processes; see the module docstring."""

    def __init__(
        self,
        factory: ExtractorFactory,
        spec: WorkSpec,
        workers: int,
        *,
        recycle_after: int = 0,
        max_rss_mb: int = 0,
        start_timeout: float = 600.0,
    ) -> None:
        self.factory, self.spec, self.n = factory, spec, workers
        self.recycle_after, self.max_rss_mb = recycle_after, max_rss_mb
        self.start_timeout = start_timeout
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[_Worker] = []
        self.recycled = 0
        self.restarted = 0

    def start(self) -> None:
        """Start every worker and wait until each has loaded and warmed its model."""
        self.workers = [self._spawn() for _ in range(self.n)]
        deadline = time.monotonic() + self.start_timeout
        while not all(w.ready for w in self.workers):
            starting = [w for w in self.workers if not w.ready]
            if not wait(
                [w.conn for w in starting] + [w.process.sentinel for w in starting],
                max(0.0, deadline - time.monotonic()),
            ):
                raise WorkerError(f"workers not ready after {self.start_timeout:.0f} s")
            for w in starting:
                self._poll_ready(w)

    def _spawn(self) -> _Worker:
        return _Worker(self.ctx, self.factory, self.spec)

    def _poll_ready(self, worker: _Worker) -> None:
        if worker.conn.poll():
            try:
                message = worker.conn.recv()
            except EOFError:
                message = ("failed", "exited while loading")
            if message[0] == "ready":
                worker.ready = True
                return
            if message[0] == "load_error":  # the model's own, raised again as what it was
                _, code, text, field = message
                raise _LOAD_ERRORS.get(code, ModelLoadError)(text, field=field)
            raise ModelLoadError(f"worker could not load the model: {message[1]}")
        if not worker.process.is_alive():
            raise ModelLoadError(
                f"worker exited while loading the model (exit code {worker.process.exitcode})"
            )

    def map_unordered(self, chunks: Iterable[Chunk]) -> Iterator[tuple[int, list[Outcome]]]:
        source = iter(chunks)
        retry: deque[Chunk] = deque()
        deaths: dict[int, int] = {}  # chunk id -> workers that died running it
        parts: dict[int, tuple[int, int]] = {}  # a split chunk's text -> (its chunk id, index)
        gathered: dict[int, list[Outcome | None]] = {}  # a split chunk's outcomes so far
        part_ids = itertools.count(-1, -1)  # never a caller's id (those count up from 0)
        exhausted = False

        def finished(chunk_id: int, outcomes: list[Outcome]) -> Iterator[tuple[int, list[Outcome]]]:
            """A chunk's outcomes to yield: as they are, or a split chunk's once all are back."""
            if chunk_id not in parts:
                yield chunk_id, outcomes
                return
            parent, index = parts.pop(chunk_id)
            slots = gathered[parent]
            slots[index] = outcomes[0]
            if all(o is not None for o in slots):
                del gathered[parent]
                yield parent, [o for o in slots if o is not None]

        while True:
            for w in self.workers:
                if w.ready and w.chunk is None:
                    chunk = retry.popleft() if retry else None
                    if chunk is None and not exhausted:
                        chunk = next(source, None)
                        exhausted = chunk is None
                    if chunk is None:
                        break
                    w.chunk = chunk
                    w.sent_at = time.monotonic()
                    with contextlib.suppress(OSError):  # died while idle: found below, retried
                        w.conn.send(chunk)
            busy = [w for w in self.workers if w.chunk is not None or not w.ready]
            if not any(w.chunk is not None for w in busy) and exhausted and not retry:
                return
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy], self._hang_wait(busy))
            self._kill_hung(busy)
            for i, w in enumerate(list(self.workers)):
                if not w.ready:
                    if w.conn.poll() or not w.process.is_alive():
                        self._poll_ready(w)
                    continue
                if w.chunk is not None and w.conn.poll():
                    try:
                        _, chunk_id, outcomes, rss = w.conn.recv()
                    except EOFError:
                        pass  # died while sending: handled below as a death
                    else:
                        w.chunk = None
                        w.texts += len(outcomes)
                        yield from finished(chunk_id, outcomes)
                        if self._should_recycle(w, rss):
                            self.recycled += 1
                            w.stop()
                            self.workers[i] = self._spawn()
                        continue
                if not w.process.is_alive() and w.chunk is not None:
                    chunk_id, texts = w.chunk
                    deaths[chunk_id] = deaths.get(chunk_id, 0) + 1
                    if deaths[chunk_id] == 1:
                        logger.warning(
                            "worker %d died (exit code %s); restarting it and retrying its chunk",
                            w.process.pid,
                            w.process.exitcode,
                        )
                        retry.append((chunk_id, texts))
                    elif len(texts) > 1:
                        logger.warning(
                            "a worker died twice on a chunk of %d texts (exit code %s); running "
                            "them one at a time to find the one that kills it",
                            len(texts),
                            w.process.exitcode,
                        )
                        gathered[chunk_id] = [None] * len(texts)
                        for index, text in enumerate(texts):
                            part = next(part_ids)
                            parts[part] = (chunk_id, index)
                            retry.append((part, [text]))
                    else:
                        outcome = _poison(w, len(texts[0]))
                        yield from finished(chunk_id, [outcome])
                    self.restarted += 1
                    w.conn.close()
                    self.workers[i] = self._spawn()

    def _hang_bound(self, worker: _Worker) -> float | None:
        """When a worker busy with a chunk counts as hung (monotonic), or None without a timeout."""
        timeout = self.spec.record_timeout
        if not timeout or worker.chunk is None:
            return None
        return worker.sent_at + 2 * timeout * len(worker.chunk[1]) + HANG_GRACE_S

    def _hang_wait(self, busy: list[_Worker]) -> float | None:
        bounds = [b for w in busy if (b := self._hang_bound(w)) is not None]
        return max(0.0, min(bounds) - time.monotonic()) if bounds else None

    def _kill_hung(self, busy: list[_Worker]) -> None:
        """Kill workers past their hang bound; the loop then handles them as dead workers."""
        now = time.monotonic()
        for w in busy:
            bound = self._hang_bound(w)
            if bound is not None and now >= bound and w.process.is_alive():
                logger.error(
                    "worker %d has not answered a chunk of %d texts in %.0f s "
                    "(--record-timeout %gs a text): killing it",
                    w.process.pid,
                    len(w.chunk[1]) if w.chunk else 0,
                    now - w.sent_at,
                    self.spec.record_timeout,
                )
                w.hung = True
                w.process.kill()
                w.process.join(10)

    def _should_recycle(self, worker: _Worker, rss: int) -> bool:
        if self.recycle_after and worker.texts >= self.recycle_after:
            logger.info("recycling worker %d after %d texts", worker.process.pid, worker.texts)
            return True
        if self.max_rss_mb and rss > self.max_rss_mb * 2**20:
            logger.info("recycling worker %d at %d MiB RSS", worker.process.pid, rss >> 20)
            return True
        return False

    def close(self, graceful: bool = True) -> None:
        """Stop every worker: after its chunk, or at once (a run that failed or was interrupted)."""
        for w in self.workers:
            w.stop(30.0 if graceful else 0)
        self.workers = []
