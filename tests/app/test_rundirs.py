"""``app.core.rundirs``: a process's own temporary directories, and what killed ones left."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.core.rundirs import OWNER_FILE, make_run_dir, owner_line, remove_stale_run_dirs


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # a pid no process has now
    return gone.pid


def test_rundirs_remove_only_the_directories_of_killed_processes(tmp_path: Path) -> None:
    gone = dead_pid()
    dirs = {}
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for name, owner in (("killed", gone), ("running", running.pid), ("being-made", None)):
        run_dir = tmp_path / f"spo-serve-{name}"
        (run_dir / "nginx" / "client_body_temp").mkdir(parents=True)
        if owner is not None:
            (run_dir / OWNER_FILE).write_text(f"{owner}\n", encoding="ascii")
        dirs[name] = run_dir
    for other in ("not-ours", "spo-metrics-killed"):  # another prefix, or none
        (tmp_path / other).mkdir()
        (tmp_path / other / OWNER_FILE).write_text(f"{gone}\n", encoding="ascii")
    assert remove_stale_run_dirs("spo-serve-", tmp_path) == [dirs["killed"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "not-ours",
        "spo-metrics-killed",
        "spo-serve-being-made",
        "spo-serve-running",
    ]
    assert remove_stale_run_dirs("spo-metrics-", tmp_path) == [tmp_path / "spo-metrics-killed"]
    running.kill()
    running.wait()
    # A container restarted in its pod (its /tmp kept): the killed process had this one's pid,
    # and another start time. This process's own directory stays.
    restart, mine = tmp_path / "spo-serve-restart", tmp_path / "spo-serve-mine"
    restart.mkdir()
    mine.mkdir()
    pid, started = owner_line(os.getpid()).split()
    (restart / OWNER_FILE).write_text(f"{pid} {float(started) - 60:.2f}\n", encoding="ascii")
    (mine / OWNER_FILE).write_text(owner_line(os.getpid()), encoding="ascii")
    assert remove_stale_run_dirs("spo-serve-", tmp_path) == [restart, dirs["running"]]
    assert mine.is_dir()


def test_rundirs_make_a_private_directory_named_after_its_owner(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    run_dir = make_run_dir("spo-x-", mode=0o711)
    assert run_dir.parent == tmp_path and run_dir.name.startswith("spo-x-")
    assert run_dir.stat().st_mode & 0o777 == 0o711
    assert (run_dir / OWNER_FILE).read_text(encoding="ascii") == owner_line(os.getpid())
    assert remove_stale_run_dirs("spo-x-") == []  # its owner runs
