"""gunicorn configuration for spo-service; every value comes from ``app.core.settings.Settings``.

Started by ``spo serve`` (which resolves the settings and checks the model first, sets ``LD_PRELOAD`` for
jemalloc and execs ``python -m app.serving.master -c deploy/gunicorn.conf.py``: gunicorn's master with the
model-aware start and reload of ``app.serving.master``); command-line flags override this file. The settings
are the value ``spo serve`` resolved, handed over once (``app.serving.master.handed_settings``: never parsed
again here); each worker builds its app from its generation's value (``app.serving.master.worker_app``).

- ``preload_app = False``: the master never imports TensorFlow; each worker creates the app after the fork
  and loads and warms its own session before it accepts (``app.web.model_slot``). ``timeout`` covers that.
- gthread workers: requests overlap (health checks, validation) while model calls are serialized;
  a worker's heartbeat counts from one second into the oldest model call still running, so
  ``timeout`` also replaces a worker whose model call never returns
  (``hold_heartbeat_during_model_calls``).
- ``SPO_MICROBATCH_WAIT_MS`` > 0: each worker combines concurrent requests into one model call
  (``app.web.microbatch``); ``worker_exit`` drains and stops its batcher.
- Memory stays flat: ``max_requests`` + jitter recycle workers, and the ``post_request`` RSS watchdog
  retires a worker gracefully once it passes ``SPO_MAX_WORKER_RSS_MB``; both are logged and counted
  (``spo_worker_recycles_total``).
- Metrics (``app.web.metrics``): the master gives ``prometheus_client`` a fresh, empty multiprocess
  directory before any worker forks (``PROMETHEUS_MULTIPROC_DIR`` if set, emptied in ``when_ready``:
  once this master holds its pid file and sockets, so a ``--check-config`` run or a second start that
  is refused never empties a running server's; else a new temporary one, removed when the process
  that made it exits, a ``--check-config`` run included, or by the next start if it was killed:
  ``app.core.rundirs``);
  ``child_exit`` marks each dead worker so its per-worker gauges go, and folds its counters into
  one merged file per type (``app.web.metrics.fold_dead_workers``), so the directory does not grow
  with every recycled worker.
"""

from __future__ import annotations

import atexit
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from app.core.logs import AccessLogger, logging_config
from app.core.rundirs import METRICS_DIR_PREFIX, make_run_dir, remove_stale_run_dirs
from app.core.sizing import Machine, memory_warning
from app.serving.master import handed_settings, watch_worker
from app.web.metrics import MULTIPROC_ENV, mark_worker_dead, prepare_multiprocess_dir

settings = handed_settings()
sizing = settings.sizing()

_given_metrics_dir = os.environ.get(MULTIPROC_ENV)
# A given directory may be a running server's (an operator's --check-config, a second start that will
# be refused): emptied only once this master is sure to run (when_ready).
if _given_metrics_dir:
    metrics_dir = Path(_given_metrics_dir)
    metrics_dir.mkdir(parents=True, exist_ok=True)
else:
    # Those of masters that were killed (SIGKILL, OOM) go first: nothing else would remove them.
    remove_stale_run_dirs(METRICS_DIR_PREFIX)
    metrics_dir = prepare_multiprocess_dir(make_run_dir(METRICS_DIR_PREFIX))
os.environ[MULTIPROC_ENV] = str(metrics_dir)
_loaded_by = os.getpid()


def _remove_metrics_dir() -> None:
    # At the exit of the process that loaded this file: the master, or a `--check-config` or
    # `--print-config` run (gunicorn runs no hook there); not a worker, which inherits the handler.
    if os.getpid() == _loaded_by:
        shutil.rmtree(metrics_dir, ignore_errors=True)


if not _given_metrics_dir:
    atexit.register(_remove_metrics_dir)

wsgi_app = "app.serving.master:worker_app()"  # app.create_app(the generation's Settings)
bind = [settings.bind]
workers = settings.workers
worker_class = (
    "app.serving.gunicorn_worker.ThreadWorker"  # gthread + clean close over an unread body
)
threads = settings.threads
preload_app = False
timeout = settings.timeout
graceful_timeout = settings.graceful_timeout
keepalive = 5
max_requests = settings.max_requests
max_requests_jitter = settings.max_requests_jitter
# Requests over the limit are refused by nginx and the app; these only bound the HTTP head.
limit_request_line = 8190
limit_request_fields = 100
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
logconfig_dict = logging_config(settings)
accesslog = "-" if settings.access_log else None
# One line per request in the service's log format, with texts, tokens and buckets (app.core.logs).
logger_class = AccessLogger
proc_name = "spo-service"
# gunicorn 27 opens a control socket in ~/.gunicorn by default; several instances would share it.
control_socket_disable = True

_MIB = 1 << 20


def _rss_mib() -> float:
    return float(psutil.Process().memory_info().rss) / _MIB


def when_ready(server: Any) -> None:
    """The master holds its pid file and its sockets (a second master was refused before this): a
    given metrics directory is emptied of an earlier run's files, before any worker forks. Not by a
    master that USR2 started beside a running one (``master_pid``): the old one's workers count on."""
    if _given_metrics_dir and not server.master_pid:
        prepare_multiprocess_dir(metrics_dir)


def on_starting(server: Any) -> None:
    """Log the resolved sizing (app.core.sizing) once, in the master; its warnings as warnings."""
    for line in sizing.lines():
        if line.startswith("WARNING: "):
            server.log.warning("sizing: %s", line.removeprefix("WARNING: "))
        else:
            server.log.info("sizing: %s", line.strip())


def post_fork(server: Any, worker: Any) -> None:
    # The worker's settings (its generation's, app.serving.master) count the workers gunicorn really runs (a
    # -w flag wins), so TensorFlow threads are split by the right number: usable CPUs / workers.
    intra = handed_settings().tf_intra_op_threads
    server.log.info(
        "worker %s forked; loading the model (%d TF intra-op threads)", worker.pid, intra
    )


def post_worker_init(worker: Any) -> None:
    # Tell the master (app.serving.master) whether the model loaded, now and whenever that changes.
    watch_worker(worker)
    rss = _rss_mib()
    models = worker.wsgi.extensions["spo.models"]
    hold_heartbeat_during_model_calls(worker, models)
    if not models.ready:
        worker.log.warning(
            "worker %s up without all its models (%s): answering 503 and retrying",
            worker.pid,
            ", ".join(f"{m.name} {m.slot.state}" for m in models),
        )
        return
    worker.log.info("worker %s ready: model loaded and warmed, RSS %.0f MiB", worker.pid, rss)
    # The start-up estimate, checked again with the measured RSS against the memory limit.
    warning = memory_warning(worker.cfg.workers, rss, Machine.probe())
    if warning:
        worker.log.warning("worker %s: %s", worker.pid, warning)
    limit = settings.max_worker_rss_mb
    if limit and rss >= 0.9 * limit:
        worker.log.warning(
            "worker %s starts at %.0f MiB, near SPO_MAX_WORKER_RSS_MB=%d: it will be recycled often",
            worker.pid,
            rss,
            limit,
        )


# How far into the oldest model call still running a worker's heartbeat may count.
HEARTBEAT_CALL_GRACE_S = 1.0


def hold_heartbeat_during_model_calls(
    worker: Any, models: Any, clock: Callable[[], float] = time.monotonic
) -> None:
    """gthread's main loop tells the master it is alive about once a second, whatever its request
    threads do, so gunicorn's ``timeout`` never caught a model call that does not return. Each beat
    is now dated no later than ``HEARTBEAT_CALL_GRACE_S`` into the oldest model call still running
    (one bucket-shaped batch: seconds at most at the default limits; with several models, calls of
    each run at once): gunicorn's timeout counts from there, so a call still running ``SPO_TIMEOUT``
    after its first second gets the worker killed and replaced (SIGABRT, SIGKILL a second later),
    while calls that end, however many and however they overlap, keep it alive."""
    beat = worker.notify

    def notify() -> None:
        beat()
        started = models.call_started()
        late = clock() - started - HEARTBEAT_CALL_GRACE_S if started is not None else 0.0
        if late > 0:  # gunicorn's own clock, whatever it is, moved back by as much
            dated = worker.tmp.last_update() - late
            os.utime(worker.tmp.fileno(), (dated, dated))

    worker.notify = notify


def post_request(worker: Any, req: Any, environ: Any, resp: Any) -> None:
    """RSS watchdog: retire this worker after the current request once it is over the limit."""
    limit = settings.max_worker_rss_mb
    if not limit or not worker.alive:
        return
    rss = _rss_mib()
    if rss > limit:
        worker.log.warning(
            "worker %s RSS %.0f MiB is over SPO_MAX_WORKER_RSS_MB=%d: retiring it gracefully",
            worker.pid,
            rss,
            limit,
        )
        worker.spo_retire_reason = "rss"
        worker.alive = False


def _app_extension(worker: Any, name: str) -> Any:
    return getattr(getattr(worker, "wsgi", None), "extensions", {}).get(name)


def worker_exit(server: Any, worker: Any) -> None:
    # In the worker, after gthread has waited (up to graceful_timeout) for its connections: the
    # micro-batcher, when on, serves what is still pending, logs its counters and stops.
    models = _app_extension(worker, "spo.models")
    if models is not None:
        models.close_batchers(timeout=settings.graceful_timeout)
    reason = getattr(worker, "spo_retire_reason", None)
    if reason is None and getattr(worker, "nr", 0) >= getattr(worker, "max_requests", 1 << 62):
        reason = "max_requests"
    metrics = _app_extension(worker, "spo.metrics")
    if reason is not None and metrics is not None:
        metrics.count_recycle(reason)
    server.log.info(
        "worker %s exiting after %s requests%s",
        worker.pid,
        getattr(worker, "nr", "?"),
        f" (recycled: {reason})" if reason else "",
    )


def child_exit(server: Any, worker: Any) -> None:
    # In the master: the dead worker's live gauges (RSS, op count, model info) leave /metrics, and
    # its counters are folded into the merged files (every worker still running keeps its own).
    mark_worker_dead(worker.pid, live=set(server.WORKERS))
