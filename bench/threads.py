"""Thread settings per worker, measured: N concurrent spo processes x (intra, inter) op threads."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import PROJECT_ROOT, write_result
from bench.runner import worker_env

logger = logging.getLogger(__name__)

# (workers, intra-op, inter-op) per worker. On 2 cores: 1 worker with 1 or 2 threads, 2 workers
# with 1 thread each (the service default: cores / workers) or 2 (oversubscribed).
CONFIGS = ((1, 1, 1), (1, 2, 1), (1, 2, 2), (2, 1, 1), (2, 2, 1))


def _measure(workers: int, intra: int, inter: int, requests: int) -> dict[str, Any]:
    """Start ``workers`` processes, wait until all have loaded, release them together."""
    with tempfile.TemporaryDirectory(prefix="spo-threads-") as tmp:
        procs, outs = [], []
        for w in range(workers):
            out = Path(tmp) / f"{w}.json"
            cmd = [sys.executable, "-m", "bench.worker", "threads", "--intra", str(intra),
                   "--inter", str(inter), "--requests", str(requests), "--offset", str(w),
                   "--out", str(out)]  # fmt: skip
            procs.append(subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=worker_env(), text=True,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE))  # fmt: skip
            outs.append(out)
        for p in procs:
            assert p.stdout is not None
            while (line := p.stdout.readline()) and line.strip() != "READY":
                pass
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"threads worker failed with {p.returncode}")
        results = [json.loads(o.read_text()) for o in outs]
    wall = max(r["seconds"] for r in results)
    return {
        "workers": workers,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "requests_per_worker": requests,
        "texts_per_s": round(workers * requests / wall, 2),
        "p50_ms": round(sum(r["latency_ms"]["p50"] for r in results) / workers, 1),
        "p99_ms": round(max(r["latency_ms"]["p99"] for r in results), 1),
    }


def run(requests: int = 150) -> dict[str, Any]:
    rows = []
    for workers, intra, inter in CONFIGS:
        row = _measure(workers, intra, inter, requests)
        logger.info("threads %s", row)
        rows.append(row)
        write_result("threads", {"requests_per_worker": requests, "configs": rows})
    best = max(rows, key=lambda r: r["texts_per_s"])
    doc = {"requests_per_worker": requests, "configs": rows, "best": best}
    write_result("threads", doc)
    return doc
