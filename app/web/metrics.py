"""Prometheus metrics: ``GET /metrics`` for the service, a textfile for the batch command.

Every metric is declared once, in ``Metrics`` (the table in docs/rest.md lists them). The service
records into it from Flask hooks (requests, latency, refusals), from the extractor's batch observer
(model calls by bucket shape, padding, model time, tokens) and from the micro-batcher (combined call
sizes); per-worker gauges (RSS, graph op count) are refreshed at most once a second and on every scrape.

**Several gunicorn workers.** Each worker is its own process with its own counters, so the service uses
``prometheus_client``'s multiprocess mode: ``deploy/gunicorn.conf.py`` creates a fresh, empty directory
at start (``PROMETHEUS_MULTIPROC_DIR``; one it is given is emptied) before any worker forks, every
worker writes its values to memory-mapped files there, ``/metrics`` (answered by whichever worker gets
the scrape) sums the files of all workers, dead ones included for counters, and gunicorn's
``child_exit`` hook marks a dead worker so its per-worker gauges disappear. Without that variable (tests,
``flask run``) the app's own registry is served.

**Recycled workers' files.** ``prometheus_client`` keeps a counter and a histogram file for every process
that ever wrote one, so a worker recycled every ``SPO_MAX_REQUESTS`` would leave two files behind each
time: the directory (a memory-backed volume in Kubernetes, counted in the pod's memory and evicted at
its size limit) and every scrape's work would grow for as long as the server runs. ``child_exit`` folds
the values of every worker that is gone into one ``<type>_merged.db`` per type and removes their files
(``fold_dead_workers``), so the directory holds the live workers' files and one per type. The sums are
unchanged, so counters never go backwards. The fold and the scrapes take turns on ``merge.lock`` in
the directory (a scrape shares it; the fold, in the master, takes it alone or waits for the next worker
exit): a scrape never reads a worker's values both in its own file and in the merged one, nor in
neither.

``prometheus_client`` decides between the two modes when it is first imported, so this module imports
it only inside functions: the gunicorn master imports ``app`` before its config sets the directory.

``/metrics`` is open unless ``SPO_METRICS_TOKEN`` is set (then it needs ``Authorization: Bearer``
with that token); the API tokens (``SPO_AUTH_TOKENS``) never guard it, nor open it.
"""

from __future__ import annotations

import fcntl
import hmac
import logging
import os
import threading
import time
import weakref
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psutil
from flask import Blueprint, Flask, Response, current_app, g, has_request_context, request

from app.core.settings import MULTIPROC_ENV, Settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from app.web.model_slot import ModelSlot
    from nlp.pipeline import BatchReport

logger = logging.getLogger(__name__)

WORKER_REFRESH_S = 1.0

# Histogram buckets: powers of two for counts, a latency ladder from 5 ms to 2 minutes.
COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
MODEL_CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
PROBLEM_MIMETYPE = "application/problem+json"
# The methods a request's label may name; any other (a client may send any token) is "other", so no
# client can add series without end (every one lives in each worker's file and in Prometheus).
HTTP_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT")
)


def multiprocess_dir() -> str | None:
    """The multiprocess directory when the service runs under gunicorn (``None`` otherwise)."""
    return os.environ.get(MULTIPROC_ENV) or None


def prepare_multiprocess_dir(path: str | Path) -> Path:
    """Create ``path`` empty (removing the files a previous run left there) and return it.

    Called by the gunicorn master before it forks: stale files would add an earlier run's counts.
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    return directory


def mark_worker_dead(pid: int, *, live: Collection[int]) -> None:
    """gunicorn ``child_exit``: drop the dead worker's per-worker gauges and fold its counters (and
    those of any other process not in ``live``) into the merged files (see the module docstring).
    ``live`` is required: a running worker's file folded away would lose what it counts after."""
    path = multiprocess_dir()
    if path is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
    fold_dead_workers(Path(path), {*live, os.getpid()})


MERGE_LOCK = "merge.lock"  # not *.db: prometheus_client never reads it
_FOLD_WAIT_S = 0.5


@contextmanager
def _merge_lock(directory: Path, *, exclusive: bool) -> Iterator[bool]:
    """The directory's ``merge.lock``, shared (a scrape: waits) or exclusive (the fold: waits at most
    ``_FOLD_WAIT_S`` for the scrapes in progress); True when held. A directory where it cannot be
    made yields False to the fold, and True to a scrape (nothing is folded there either)."""
    try:
        fd = os.open(directory / MERGE_LOCK, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        yield not exclusive
        return
    try:
        if not exclusive:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield True
            return
        deadline = time.monotonic() + _FOLD_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.005)
        yield True
    finally:
        os.close(fd)


def fold_dead_workers(directory: Path, live: Collection[int]) -> int:
    """Fold the counter and histogram files of processes not in ``live`` into ``<type>_merged.db``
    (values summed per sample) and remove them; the number of files folded. Live gauges are
    ``mark_process_dead``'s; every gauge of this service is live, so only counters and histograms
    stay behind a dead process. Skipped (0) when a scrape holds the lock for longer than
    ``_FOLD_WAIT_S``: the next worker exit folds what is left."""
    from prometheus_client.mmap_dict import MmapedDict

    dead: dict[str, list[Path]] = {}
    for path in sorted(directory.glob("*.db")):
        kind, _, pid = path.stem.partition("_")
        if kind != "gauge" and pid.isdigit() and int(pid) not in live:
            dead.setdefault(kind, []).append(path)
    if not dead:
        return 0
    with _merge_lock(directory, exclusive=True) as held:
        if not held:
            logger.info("metrics: a scrape holds %s; the dead workers' files wait", MERGE_LOCK)
            return 0
        for kind, paths in dead.items():
            merged = directory / f"{kind}_merged.db"
            totals: dict[str, float] = {}
            for source in [merged, *paths] if merged.exists() else paths:
                for key, value, _, _ in MmapedDict.read_all_values_from_file(str(source)):  # type: ignore[no-untyped-call]
                    totals[key] = totals.get(key, 0.0) + value
            staged = directory / f"{kind}_merged.db.new"  # not *.db until it is whole
            staged.unlink(missing_ok=True)
            out = MmapedDict(str(staged))  # type: ignore[no-untyped-call]
            try:
                for key, value in totals.items():
                    out.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                out.close()  # type: ignore[no-untyped-call]
            os.replace(staged, merged)
            for path in paths:
                path.unlink()
    return sum(len(paths) for paths in dead.values())


M = TypeVar("M")


class _Declared(Generic[M]):
    """One metric of ``Metrics``, declared once as a class attribute; each ``Metrics`` makes its own
    in its registry, and the attribute reads it there (``Metrics.__init__`` is the builder)."""

    def __init__(self, kind: str, name: str, doc: str, labels: tuple[str, ...], **options: Any):
        self.kind, self.name, self.doc, self.labels, self.options = kind, name, doc, labels, options
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, metrics: Metrics, owner: type | None = None) -> M:
        made: M = metrics._made[self.attr]
        return made

    def make(self, registry: CollectorRegistry) -> Any:
        import prometheus_client

        kind = getattr(prometheus_client, self.kind)
        return kind(self.name, self.doc, list(self.labels), registry=registry, **self.options)


def _counter(name: str, doc: str, *labels: str) -> _Declared[Counter]:
    return _Declared("Counter", name, doc, labels)


def _histogram(
    name: str, doc: str, *labels: str, buckets: tuple[float, ...]
) -> _Declared[Histogram]:
    return _Declared("Histogram", name, doc, labels, buckets=buckets)


def _gauge(name: str, doc: str, *labels: str, mode: str) -> _Declared[Gauge]:
    """A gauge per worker process: ``mode`` is how ``/metrics`` sums the live workers' values."""
    return _Declared("Gauge", name, doc, labels, multiprocess_mode=mode)


class Metrics:
    """The service's metrics, in their own registry (so each app in a test process has its own)."""

    # fmt: off
    requests = _counter("spo_http_requests", "HTTP requests answered, by endpoint (route pattern), method and status.", "endpoint", "method", "status")
    latency = _histogram("spo_http_request_duration_seconds", "Time from the start of the app's handling to its answer, by endpoint.", "endpoint", buckets=LATENCY_BUCKETS)
    refusals = _counter("spo_http_refusals", "Problem (application/problem+json) answers, by code and status: limits, deadlines, authentication, bad input, unready model.", "code", "status")
    request_texts = _histogram("spo_request_texts", "Texts per extract request.", buckets=COUNT_BUCKETS)
    request_tokens = _histogram("spo_request_tokens", "Tokens per extract request (all its texts; without [CLS]/[SEP]).", buckets=TOKEN_BUCKETS)
    model_calls = _counter("spo_model_calls", "Model (Session.run) calls, by model and bucket shape (batch rows, length).", "model", "batch", "length")
    model_call_seconds = _histogram("spo_model_call_seconds", "Time of one model call.", "model", buckets=MODEL_CALL_BUCKETS)
    model_tokens = _counter("spo_model_tokens", "Real tokens fed to the model ([CLS]/[SEP] included).", "model")
    model_padding = _counter("spo_model_padding_tokens", "Pad positions fed to the model; padding waste = rate(this) / rate(spo_model_tokens).", "model")
    batch_texts = _histogram("spo_extract_batch_texts", "Texts per extract_batch call (with micro-batching on: per combined call).", "model", buckets=COUNT_BUCKETS)
    microbatch_requests = _histogram("spo_microbatch_requests", "Requests per micro-batch (SPO_MICROBATCH_WAIT_MS > 0).", buckets=COUNT_BUCKETS)
    recycles = _counter("spo_worker_recycles", "Workers retired to keep memory flat, by reason (max_requests, rss).", "reason")
    rss = _gauge("spo_worker_rss_bytes", "Resident memory of each worker process.", mode="liveall")
    load_seconds = _gauge("spo_model_load_seconds", "Seconds this worker took to load its model (phase=load) and warm every shape (warmup).", "model", "phase", mode="liveall")
    graph_ops = _gauge("spo_model_graph_ops", "Ops in the worker's finalized session graph: constant after warm-up (nothing leaks nodes).", "model", mode="liveall")
    model_info = _gauge("spo_model_info", "The served model: 1 with its name, version, task and precision as labels.", "model", "version", "task", "precision", mode="livemax")
    # fmt: on

    @classmethod
    def declared(cls) -> list[_Declared[Any]]:
        """Every metric, in declaration order."""
        return [v for v in vars(cls).values() if isinstance(v, _Declared)]

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True)
        self._made = {d.attr: d.make(self.registry) for d in self.declared()}
        # Weak: a model that was reloaded away is not kept alive by its metrics.
        self._extractors: weakref.WeakSet[Any] = weakref.WeakSet()
        # Request threads call watch_extractor at once on a fresh worker: one observer per model.
        self._watching = threading.Lock()
        self._refreshed = 0.0
        self._info: dict[str, tuple[str, str, str, str]] = {}  # per model name

    # -- model -----------------------------------------------------------------------------------
    def watch_extractor(self, extractor: Any) -> None:
        """Record this extractor's model calls and describe its model (once per extractor)."""
        if extractor in self._extractors:  # every request asks: no lock once it is watched
            return
        with self._watching:
            if extractor in self._extractors:
                return
            self._extractors.add(extractor)
        summary = extractor.manifest.summary()
        name = str(summary.get("name", "?"))
        runtime = getattr(extractor, "runtime", None)
        precision = str(getattr(runtime, "precision", "fp32"))
        # A reloaded model replaces the worker's earlier one of that name: that one's info goes to 0.
        info = (name, str(summary.get("version", "?")), str(summary.get("task", "?")), precision)
        earlier = self._info.get(name)
        if earlier is not None and earlier != info:
            self.model_info.labels(*earlier).set(0)
        self.model_info.labels(*info).set(1)
        self._info[name] = info
        if runtime is not None:
            self.load_seconds.labels(name, "load").set(getattr(runtime, "load_seconds", 0.0))
            self.load_seconds.labels(name, "warmup").set(getattr(runtime, "warm_seconds", 0.0))
        observers = getattr(extractor, "observers", None)
        if observers is not None:
            observers.append(lambda report: self.observe_batch(name, report))
        self.refresh_worker(force=True)

    def observe_batch(self, model: str, report: BatchReport) -> None:
        """One ``extract_batch``: model calls, tokens and padding; the request's tokens and buckets."""
        self.batch_texts.labels(model).observe(report.texts)
        for call in report.calls:
            self.model_calls.labels(model, str(call.shape[0]), str(call.shape[1])).inc()
            self.model_call_seconds.labels(model).observe(call.seconds)
            self.model_tokens.labels(model).inc(call.tokens)
            self.model_padding.labels(model).inc(call.padded_tokens)
        # In the request's own thread (micro-batching off), the request's numbers go to its log line
        # (once: an extractor shared by several apps, as in tests, has one observer per app).
        if has_request_context() and current_app.extensions.get("spo.metrics") is self:
            reports: list[BatchReport] = g.setdefault("spo_reports", [])
            reports.append(report)

    def observe_microbatch(self, requests: int, texts: int) -> None:
        self.microbatch_requests.observe(requests)

    # -- worker ----------------------------------------------------------------------------------
    def refresh_worker(self, *, force: bool = False) -> None:
        """RSS and graph op count of this worker (at most once a second unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._refreshed < WORKER_REFRESH_S:
            return
        self._refreshed = now
        self.rss.set(psutil.Process().memory_info().rss)
        for extractor in list(self._extractors):
            runtime = getattr(extractor, "runtime", None)
            count = getattr(runtime, "graph_op_count", None)
            if count is not None:
                self.graph_ops.labels(extractor.manifest.name).set(count)

    def count_recycle(self, reason: str) -> None:
        self.recycles.labels(reason).inc()

    # -- exposition ------------------------------------------------------------------------------
    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every worker (multiprocess) or of this app's registry."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        path = multiprocess_dir()
        registry = self.registry
        if path is not None:
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
            with _merge_lock(Path(path), exclusive=False):  # files are read here, not above
                return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(registry), CONTENT_TYPE_LATEST


# -- Flask wiring ----------------------------------------------------------------------------------
bp = Blueprint("metrics", __name__)


def metrics() -> Metrics:
    value: Metrics = current_app.extensions["spo.metrics"]
    return value


def _endpoint() -> str:
    rule = request.url_rule
    return rule.rule if rule is not None else "unmatched"


def _start_timer() -> None:
    g.spo_started = time.perf_counter()
    for model in current_app.extensions["spo.models"]:
        extractor = model.slot.extractor
        if extractor is not None:
            metrics().watch_extractor(extractor)


def request_summary() -> dict[str, Any]:
    """What the request did, for its access-log line: texts, tokens, bucket shapes."""
    summary: dict[str, Any] = {}
    texts = g.get("spo_texts")
    if texts is not None:
        summary["texts"] = texts
    reports: list[BatchReport] = g.get("spo_reports", [])
    if reports:
        summary["tokens"] = sum(r.tokens for r in reports)
        summary["buckets"] = [f"{c.shape[0]}x{c.shape[1]}" for r in reports for c in r.calls]
    if "spo_input" in g:
        summary["input"] = g.spo_input
    return summary


def _record(response: Response) -> Response:
    m = metrics()
    endpoint = _endpoint()
    started = g.get("spo_started")
    if started is not None:
        m.latency.labels(endpoint).observe(time.perf_counter() - started)
    method = request.method if request.method in HTTP_METHODS else "other"
    m.requests.labels(endpoint, method, str(response.status_code)).inc()
    if response.mimetype == PROBLEM_MIMETYPE:
        code = g.get("spo_problem_code", "unknown")  # set by app.web.errors.problem
        m.refusals.labels(str(code), str(response.status_code)).inc()
    summary = request_summary()
    if "texts" in summary and response.status_code < 400:
        m.request_texts.observe(summary["texts"])
        if "tokens" in summary:
            m.request_tokens.observe(summary["tokens"])
    # gunicorn's access log reads it from the WSGI environ (app.core.logs.AccessLogger).
    request.environ["spo.request"] = summary
    m.refresh_worker()
    return response


def _authorized(token: str | None) -> bool:
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


@bp.get("/metrics")
def scrape() -> Response:
    settings: Settings = current_app.extensions["spo.settings"]
    if not _authorized(settings.metrics_token):
        from app.web.errors import ApiError

        raise ApiError(
            "unauthorized",
            "/metrics needs its own bearer token (SPO_METRICS_TOKEN).",
            headers={"WWW-Authenticate": 'Bearer realm="spo-metrics"'},
        )
    m = metrics()
    m.refresh_worker(force=True)
    body, content_type = m.exposition()
    return Response(body, content_type=content_type)


def init_app(app: Flask) -> Metrics:
    """Create the app's ``Metrics`` (``app.extensions["spo.metrics"]``), its hooks and ``/metrics``."""
    m = Metrics()
    app.extensions["spo.metrics"] = m
    app.before_request(_start_timer)
    app.after_request(_record)
    app.register_blueprint(bp)
    for model in app.extensions["spo.models"]:
        if model.batcher is not None:
            model.batcher.on_batch = m.observe_microbatch
        # Described from the moment its model is ready, not from the worker's first request: a
        # worker that has not served yet still shows its RSS and model to the scrape another answers.
        model.slot.on_change(lambda slot: _watch_ready(m, slot))
        _watch_ready(m, model.slot)
    return m


def _watch_ready(m: Metrics, slot: ModelSlot) -> None:
    extractor = slot.extractor
    if slot.ready and extractor is not None:
        m.watch_extractor(extractor)
