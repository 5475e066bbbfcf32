"""Bounded memory of ``spo extract``: a generated input of N lines (200k by default) through a real
``spo extract`` subprocess, sampling the RSS of the command and of its workers as it runs.

``python -m bench.extract_rss [--lines 200000] [--model-dir models/demo] [--workers 1]``
Prints one JSON document: peak RSS of the parent and of the largest child (workers; the
small one is multiprocessing's resource tracker), and the RSS at each tenth of
the run (flat when memory is bounded), with throughput. Takes minutes.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
CHARS = "张三出生于北京市李四的妻子是王五《红楼梦》作者曹雪芹，。上海公司成立于年月日"


def make_input(path: Path, lines: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(lines):
            fh.write("".join(rng.choices(CHARS, k=rng.randint(4, 40))) + "\n")


def run(lines: int, model_dir: Path, workers: int, window: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.txt", Path(tmp) / "out.jsonl"
        make_input(src, lines)
        cmd = [sys.executable, "-c", "from app.cli import main; main()", "extract", str(src)]
        cmd += ["-o", str(out), "--model-dir", str(model_dir), "--workers", str(workers)]
        cmd += ["--window", str(window), "-q"]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE)
        parent = psutil.Process(proc.pid)
        peak_parent, peak_workers, trace = 0, 0, []
        sidecar = out.with_name(out.name + ".checkpoint.json")
        next_tenth = 1
        while proc.poll() is None:
            try:
                rss_parent = parent.memory_info().rss
                rss_workers = [c.memory_info().rss for c in parent.children()]
            except psutil.Error:
                break
            peak_parent = max(peak_parent, rss_parent)
            peak_workers = max([peak_workers, *rss_workers])
            try:
                done = json.loads(sidecar.read_text())["done"]
            except (OSError, ValueError):
                done = 0
            if done >= next_tenth * lines // 10:
                trace.append(
                    {"records": done, "parent_mib": rss_parent >> 20,
                     "worker_mib": [r >> 20 for r in rss_workers]}
                )  # fmt: skip
                while done >= next_tenth * lines // 10:
                    next_tenth += 1
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        _, err = proc.communicate()
        written = sum(1 for _ in out.open("rb")) if out.exists() else 0
    return {
        "lines": lines,
        "written": written,
        "returncode": proc.returncode,
        "workers": workers,
        "window": window,
        "seconds": round(elapsed, 1),
        "texts_per_s_incl_load": round(lines / elapsed, 1),
        "peak_parent_rss_mib": peak_parent >> 20,
        "peak_worker_rss_mib": peak_workers >> 20,
        "rss_by_tenth": trace,
        "summary": err.decode(errors="replace").strip().splitlines()[-1:]
        if proc.returncode
        else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--model-dir", type=Path, default=ROOT / "models" / "demo")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--window", type=int, default=2048)
    args = parser.parse_args()
    print(json.dumps(run(args.lines, args.model_dir, args.workers, args.window), indent=2))


if __name__ == "__main__":
    main()
