"""``spo extract --metrics-file``: the run's ``BatchSummary`` as Prometheus gauges in the
textfile-collector format (node exporter's ``--collector.textfile.directory``; any ``*.prom`` file there
is scraped). Written atomically (a temporary file renamed over the path), so a collector never reads
half a file.
"""

from __future__ import annotations

import os
import stat
import tempfile
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


def textfile_problem(path: Path) -> str | None:
    """Why the metrics could not be written to ``path`` at the end of a run (None: they can), asked
    before it: a name (not a directory's ``.``), one the file system takes, not something other than
    a regular file (a device or a FIFO would be replaced by the file), in a directory that can be
    written (made if missing)."""
    if path.name in ("", ".", ".."):
        return f"{path} is not a file name"
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return f"{path} is not a regular file (the metrics are a file that would replace it)"
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if len(os.fsencode(path.name)) > os.pathconf(path.parent, "PC_NAME_MAX"):
            return f"cannot write {path}: its name is longer than the file system takes"
        fd, probe = tempfile.mkstemp(prefix=".spo-metrics-", dir=path.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    return None


def write_batch_textfile(path: str | Path, summary: Any) -> None:
    """Write ``summary`` (a ``BatchSummary``) to ``path``, plus when the run ended: through a
    temporary file in the same directory (the one ``textfile_problem`` probed for), renamed over it."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    for name, (doc, attribute) in GAUGES.items():
        Gauge(name, doc, registry=registry).set(getattr(summary, attribute))
    Gauge(
        "spo_batch_last_run_timestamp_seconds", "When the run ended (Unix time).", registry=registry
    ).set(time.time())
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".spo-metrics-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(generate_latest(registry))
        os.chmod(tmp, 0o644)  # as a collector running as another user reads it
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
