"""Request micro-batching at concurrency 8: ``spo serve`` on the RBT6 model with and without it.

Each configuration (``SPO_MICROBATCH_WAIT_MS`` = 0, i.e. off, then each wait asked for) gets a fresh
server with the same layout: ``workers`` gunicorn workers (default 2) x cores / workers TensorFlow
intra-op threads x 8 gthread threads. Two workers of one intra-op thread each is the service's default on
2 cores and the best throughput of the thread-settings table, so it is the baseline micro-batching has
to beat; 8 threads let one worker hold every connection wrk opens, however gunicorn spreads them.

wrk drives single-text workload requests (``bench.http_load``'s script) at concurrency 8: ``warmup`` seconds
not counted, then ``seconds`` (or ``requests``, whichever ends first) measured. The mean batch size is
each worker's ``app.web.microbatch`` counters, which it logs when it exits (warm-up included).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from app.core.settings import threads_per_worker
from bench.common import CACHE_DIR, write_result
from bench.http_load import require_wrk, run_wrk, spo_server, write_wrk_script, wrk_errors
from bench.rbt6 import model_dirs

logger = logging.getLogger(__name__)

THREADS = 8
MAX_TEXTS = 32
_COUNTERS = re.compile(
    r"micro-batching: (?P<requests>\d+) requests \((?P<texts>\d+) texts\) in (?P<batches>\d+) "
    r"model calls, [\d.]+ requests per call \(largest (?P<largest>\d+)\)"
)


def batch_counters(log_text: str) -> dict[str, Any] | None:
    """Every worker's exit counters from a server log, summed; None when none logged (off)."""
    found = [m.groupdict() for m in _COUNTERS.finditer(log_text)]
    if not found:
        return None
    total = {k: sum(int(f[k]) for f in found) for k in ("requests", "texts", "batches")}
    return {
        **total,
        "workers_reporting": len(found),
        "largest_batch_requests": max(int(f["largest"]) for f in found),
        "mean_requests_per_batch": round(total["requests"] / max(1, total["batches"]), 2),
        "mean_texts_per_batch": round(total["texts"] / max(1, total["batches"]), 2),
        "per_worker": [{k: int(v) for k, v in f.items()} for f in found],
    }


def run(
    seconds: int = 150,
    requests: int = 20_000,
    *,
    waits_ms: tuple[int, ...] = (0, 5),
    concurrency: int = 8,
    workers: int = 2,
    warmup: int = 10,
) -> dict[str, Any]:
    require_wrk()
    model_dirs()  # build or reuse the RBT6 model before any server starts
    work = CACHE_DIR / "microbatch"
    wrk_threads = min(2, concurrency)
    script, done_dir = write_wrk_script(work, requests, wrk_threads)
    configs = []
    for wait_ms in waits_ms:
        log_path = work / f"gunicorn-wait{wait_ms}.log"
        env = {
            "SPO_THREADS": str(THREADS),
            "SPO_MICROBATCH_WAIT_MS": str(wait_ms),
            "SPO_MICROBATCH_MAX_TEXTS": str(MAX_TEXTS),
        }
        started = time.perf_counter()
        with spo_server(workers, log_path, env) as (_master, port, ready_s):
            logger.info("wait %d ms: warm-up %d s", wait_ms, warmup)
            run_wrk(port, script, done_dir, wrk_threads=wrk_threads, concurrency=concurrency,
                    max_seconds=warmup)  # fmt: skip
            logger.info("wait %d ms: measuring for %d s", wait_ms, seconds)
            stats, _ = run_wrk(port, script, done_dir, wrk_threads=wrk_threads,
                               concurrency=concurrency, max_seconds=seconds)  # fmt: skip
        counters = batch_counters(log_path.read_text(errors="replace"))
        errors = wrk_errors(stats)
        config = {
            "wait_ms": wait_ms,
            "requests": stats["requests"],
            "seconds": round(stats["duration_us"] / 1e6, 1),
            "requests_per_s": round(stats["requests"] / (stats["duration_us"] / 1e6), 2),
            "errors": errors,
            "latency_ms": {k: round(v / 1000, 1) for k, v in stats["latency_us"].items()},
            "startup_s": round(ready_s - started, 1),
            "batches": counters,
            "wrk": stats,
        }
        logger.info(
            "wait %d ms: %.2f requests/s, p50 %.0f ms, p99 %.0f ms, %d errors, batches %s",
            wait_ms,
            config["requests_per_s"],
            config["latency_ms"]["p50"],
            config["latency_ms"]["p99"],
            errors,
            counters,
        )
        configs.append(config)
    doc = {
        "concurrency": concurrency,
        "workers": workers,
        "threads": THREADS,
        "intra_op_threads": threads_per_worker(workers),
        "max_texts": MAX_TEXTS,
        "warmup_s": warmup,
        "seconds_asked": seconds,
        "requests_asked": requests,
        "configs": configs,
    }
    write_result("microbatch", doc)
    return doc
