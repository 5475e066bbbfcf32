"""Private temporary directories that belong to one running process, and the leftovers of killed ones.

``spo serve --nginx`` keeps nginx's files and gunicorn's socket in one (``spo-serve-*``), and the
gunicorn master its metrics files (``spo-metrics-*``, when ``PROMETHEUS_MULTIPROC_DIR`` is not
given). Each is removed when its process exits; a process killed with SIGKILL cannot, so each
holds an owner file with its maker's pid, and the next start of the same kind removes those whose
maker no longer runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

OWNER_FILE = "owner.pid"  # in each run directory: the pid of the process that made it
# The gunicorn master's metrics directory, when PROMETHEUS_MULTIPROC_DIR is not given.
METRICS_DIR_PREFIX = "spo-metrics-"


def make_run_dir(prefix: str, *, mode: int = 0o700) -> Path:
    """A new directory ``PREFIX*`` in the temporary directory, owned by this process."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        run_dir.chmod(mode)
        (run_dir / OWNER_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir


def remove_stale_run_dirs(prefix: str, parent: Path | None = None) -> list[Path]:
    """Remove the ``PREFIX*`` directories in ``parent`` (default: the temporary directory) left by
    processes that were killed: those of this user whose owner file names no running process, or
    this one (a container restarted in its pod starts the same programs in the same order, and this
    process's pid was often the killed one's; it makes its own directory after this). One without
    that file (being made right now) or whose owner runs is left alone (a pid taken again by
    another process counts as running). Returns the removed."""
    removed = []
    for run_dir in sorted((parent or Path(tempfile.gettempdir())).glob(f"{prefix}*")):
        try:
            if run_dir.stat().st_uid != os.getuid():
                continue
            pid = int((run_dir / OWNER_FILE).read_text(encoding="ascii"))
        except (OSError, ValueError):
            continue
        if pid != os.getpid():  # this process makes its own after: one naming it is a restart's
            try:
                os.kill(pid, 0)
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(run_dir)
    return removed
