"""``spo extract --metrics-file``: the run's ``BatchSummary`` as Prometheus gauges in the
textfile-collector format (node exporter's ``--collector.textfile.directory``; any ``*.prom`` file there
is scraped). Written atomically (a temporary file renamed over the path), so a collector never reads
half a file.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

# Gauge name -> (help, the BatchSummary attribute it reports).
GAUGES: dict[str, tuple[str, str]] = {
    "spo_batch_records": ("Records written by the run (error records included).", "records"),
    "spo_batch_errors": ("Error records written by the run.", "errors"),
    "spo_batch_skipped_records": ("Records already in the output when it resumed.", "skipped"),
    "spo_batch_duration_seconds": ("From the first record read to the last written.", "seconds"),
    "spo_batch_texts_per_second": ("Records per second.", "texts_per_second"),
    "spo_batch_model_load_seconds": ("Time to load the model.", "load_seconds"),
    "spo_batch_worker_recycles": ("Worker processes replaced (--recycle-after, RSS).", "recycled"),
    "spo_batch_worker_restarts": ("Worker processes restarted after a crash.", "restarted"),
}


def write_batch_textfile(path: str | Path, summary: Any) -> None:
    """Write ``summary`` (a ``BatchSummary``) to ``path``, plus when the run ended."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    for name, (doc, attribute) in GAUGES.items():
        Gauge(name, doc, registry=registry).set(getattr(summary, attribute))
    Gauge(
        "spo_batch_last_run_timestamp_seconds", "When the run ended (Unix time).", registry=registry
    ).set(time.time())
    write_to_textfile(str(path), registry)
