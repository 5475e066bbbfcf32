"""Start ``bench.worker`` in a fresh process and read its JSON."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.core.settings import JEMALLOC_PATH as JEMALLOC
from bench.common import PROJECT_ROOT

logger = logging.getLogger(__name__)


def worker_env(jemalloc: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and "jemalloc" not in p]
    if jemalloc:
        if not JEMALLOC.is_file():
            raise SystemExit(f"{JEMALLOC} is missing: run `bash bench/setup.sh` (libjemalloc2)")
        preload.insert(0, str(JEMALLOC))
    env["LD_PRELOAD"] = ":".join(preload)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_worker(mode: str, *args: str, jemalloc: bool = False, timeout: float | None = None) -> Any:
    """``python -m bench.worker MODE ARGS --out TMP`` in a fresh process; its JSON result."""
    with tempfile.TemporaryDirectory(prefix="spo-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.worker", mode, *args, "--out", str(out)]
        logger.info("running %s%s", " ".join(cmd[2:]), " (jemalloc)" if jemalloc else "")
        subprocess.run(cmd, cwd=PROJECT_ROOT, env=worker_env(jemalloc), check=True, timeout=timeout)
        return json.loads(out.read_text(encoding="utf-8"))
