"""Per-worker memory of one model against several: ``spo serve`` with one worker for each model table,
its RSS once ready (every model loaded and warmed) and after requests to every model: first one
request at a time, then (``concurrent``) one client thread per model at once, so that every model's
working memory is live together (each model has its own lock: calls to two models overlap).

``python -m bench.models_rss [--table demo=models/demo --table demo=models/demo,ner=models/ner]
[--requests 200]`` prints one JSON document, a row per table. Takes a few minutes (each table starts
a fresh gunicorn and TensorFlow).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import stop

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("demo=models/demo", "ner=models/ner", "demo=models/demo,ner=models/ner")
TEXTS = (
    "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。",
    "李白出生于碎叶城，祖籍陇西成纪。",
    "华为技术有限公司成立于1987年，总部位于深圳，创始人是任正非。",
    "我外婆是1936年在湖南湘潭出生的，一辈子没离开过老家。",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _call(port: int, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        body = None if doc is None else json.dumps(doc).encode()
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def _worker_rss_mib(master: psutil.Process) -> list[float]:
    return [round(c.memory_info().rss / 2**20, 1) for c in master.children()]


def measure(table: str, requests: int, boot_timeout: float = 600) -> dict[str, Any]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPO_")}
    env.update(
        SPO_MODELS=table,
        SPO_WORKERS="1",
        SPO_BIND=f"127.0.0.1:{port}",
        SPO_ACCESS_LOG="0",
        SPO_TIMEOUT=str(int(boot_timeout)),
        SPO_MAX_REQUESTS="0",
        SPO_MAX_REQUESTS_JITTER="0",
    )
    cmd = [sys.executable, "-c", "from app.cli import main; main()", "serve"]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"spo serve exited with {proc.returncode} for {table}")
            if time.monotonic() - started > boot_timeout:
                raise RuntimeError(f"not ready after {boot_timeout}s: {table}")
            try:
                if _call(port, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        ready_s = time.monotonic() - started
        master = psutil.Process(proc.pid)
        time.sleep(2)
        at_ready = _worker_rss_mib(master)
        names = [m["name"] for m in _call(port, "GET", "/v1/models")[1]["models"]]
        failed = 0
        for i in range(requests):
            for name in names:
                status, _ = _call(
                    port, "POST", f"/v1/models/{name}/extract", {"text": TEXTS[i % len(TEXTS)]}
                )
                failed += status != 200
        after = _worker_rss_mib(master)
        texts = [{"texts": [TEXTS[k % len(TEXTS)] * (1 + k % 3) for k in range(32)]}]
        errors: list[int] = []

        def client(name: str) -> None:
            for _ in range(max(1, requests // 10)):
                status, _ = _call(port, "POST", f"/v1/models/{name}/extract", texts[0])
                errors.extend([status] if status != 200 else [])

        threads = [threading.Thread(target=client, args=(n,)) for n in names]
        for t in threads:
            t.start()
        peak: list[float] = []
        while any(t.is_alive() for t in threads):
            peak = [max(a, b) for a, b in zip(peak, _worker_rss_mib(master), strict=False)] or (
                _worker_rss_mib(master)
            )
            time.sleep(0.1)
        for t in threads:
            t.join()
        concurrent = _worker_rss_mib(master)
    finally:
        stop(proc)
    return {
        "models": table,
        "ready_s": round(ready_s, 1),
        "worker_rss_mib_ready": at_ready,
        "requests_per_model": requests,
        "failed": failed,
        "worker_rss_mib_after": after,
        "concurrent_batches_of_32_per_model": max(1, requests // 10),
        "concurrent_failed": len(errors),
        "worker_rss_mib_peak_concurrent": peak,
        "worker_rss_mib_after_concurrent": concurrent,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.models_rss", description=__doc__)
    parser.add_argument("--table", action="append", help="an SPO_MODELS value (repeatable)")
    parser.add_argument("--requests", type=int, default=200, help="requests per model")
    args = parser.parse_args(argv)
    rows = [measure(t, args.requests) for t in (args.table or TABLES)]
    print(json.dumps(rows, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
