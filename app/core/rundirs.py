"""Private temporary directories that belong to one running process, and the leftovers of killed ones.

``spo serve --nginx`` keeps nginx's files and gunicorn's socket in one (``spo-serve-*``), and the
gunicorn master its metrics files (``spo-metrics-*``, when ``PROMETHEUS_MULTIPROC_DIR`` is not
given). Each is removed when its process exits; a process killed with SIGKILL cannot, so each
holds an owner file with its maker's pid and start time, and the next start of the same kind removes
those whose maker no longer runs. The start time tells a pid taken again from its first owner: a
container restarted in its pod (its ``/tmp`` kept) starts the same programs in the same order, and
the killed process's pid is often the new one's own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psutil

OWNER_FILE = "owner.pid"  # in each run directory: "PID START" of the process that made it
# The gunicorn master's metrics directory, when PROMETHEUS_MULTIPROC_DIR is not given.
METRICS_DIR_PREFIX = "spo-metrics-"


def owner_line(pid: int) -> str:
    """What ``OWNER_FILE`` says of process ``pid``: its pid and start time."""
    return f"{pid} {psutil.Process(pid).create_time():.2f}\n"


def make_run_dir(prefix: str, *, mode: int = 0o700) -> Path:
    """A new directory ``PREFIX*`` in the temporary directory, owned by this process."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        run_dir.chmod(mode)
        (run_dir / OWNER_FILE).write_text(owner_line(os.getpid()), encoding="ascii")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir


def _owner_runs(pid: int, started: float | None) -> bool:
    """Whether the process that wrote ``pid`` (and ``started``) runs: one whose pid another process
    has taken since does not; one of another user counts as running (nothing of it is touched)."""
    try:
        now = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True
    return started is None or f"{now:.2f}" == f"{started:.2f}"


def remove_stale_run_dirs(prefix: str, parent: Path | None = None) -> list[Path]:
    """Remove the ``PREFIX*`` directories in ``parent`` (default: the temporary directory) left by
    processes that were killed: those of this user whose owner file names a process that no longer
    runs (``_owner_runs``). One without that file (being made right now) is left alone. Returns the
    removed."""
    removed = []
    for run_dir in sorted((parent or Path(tempfile.gettempdir())).glob(f"{prefix}*")):
        try:
            if run_dir.stat().st_uid != os.getuid():
                continue
            fields = (run_dir / OWNER_FILE).read_text(encoding="ascii").split()
            pid, started = int(fields[0]), float(fields[1]) if len(fields) > 1 else None
        except (OSError, ValueError, IndexError):
            continue
        if _owner_runs(pid, started):
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(run_dir)
    return removed
