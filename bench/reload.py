"""Reload timeline: ``python -m bench.reload [--model DIR] [--clients 4] [--workers 2]``.

``spo serve`` (gunicorn alone) on a copy of the model behind a symlink, ``clients`` threads posting one
text each in a loop. After ``--before`` seconds the link is switched to a copy with another version and
``spo reload`` sent; the run records when the master logs ``reload done``, then switches to a copy with
a broken ``model.json`` and one with a corrupt SavedModel (each reloaded, each refused or undone) and
stops ``--after`` seconds later. Prints, and writes to ``bench/results/reload.json``: seconds from HUP
to ``reload done``, requests answered meanwhile (and by which version), failed requests per phase, and
latency percentiles before and during the reload.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import PROJECT_ROOT
from nlp.manifest import resolve_vocab

RESULTS = PROJECT_ROOT / "bench" / "results" / "reload.json"
TEXT = "《霸王别姬》是陈凯歌执导的电影，张国荣、巩俐主演。"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _copy(source: Path, target: Path, version: str) -> Path:
    shutil.copytree(source, target)
    doc = json.loads((target / "model.json").read_text(encoding="utf-8"))
    doc["version"] = version
    # A relative vocab path may be found beside the source or in the project root: pin where it is.
    doc["vocab"]["path"] = str(resolve_vocab(source, doc["vocab"]["path"]))
    (target / "model.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return target


def _point(link: Path, target: Path) -> None:
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(link)


def _post(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        body = json.dumps({"text": TEXT}).encode()
        conn.request("POST", "/v1/extract", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        doc = json.loads(response.read())
        if response.status == 200:
            return 200, str(doc["model"]["version"])
        return response.status, str(doc.get("code"))
    finally:
        conn.close()


def _wait_log(log: Path, needle: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.05)
    raise RuntimeError(f"no {needle!r} in {log} after {timeout}s")


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": round(pick(0.5) * 1000, 1), "p99_ms": round(pick(0.99) * 1000, 1)}


def run(model: Path, clients: int, workers: int, before: float, after: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="spo-bench-reload-"))
    spo = Path(sys.executable).with_name("spo")
    try:
        a = _copy(model, tmp / "A", "1")
        b = _copy(model, tmp / "B", "2")
        broken = _copy(model, tmp / "broken", "3")
        (broken / "model.json").write_text('{"name": ', encoding="utf-8")
        corrupt = _copy(model, tmp / "corrupt", "4")
        (corrupt / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 10)
        # Without model.json's record of the graph only TensorFlow can tell, in the new workers:
        # the path this benchmark times (with it, the master refuses the reload at once).
        doc = json.loads((corrupt / "model.json").read_text(encoding="utf-8"))
        doc.pop("saved_model", None)
        (corrupt / "model.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
        link = tmp / "current"
        _point(link, a)
        port, log, pid_file = _free_port(), tmp / "serve.log", tmp / "spo.pid"
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SPO_")},
            "SPO_MODEL_DIR": str(link),
            "SPO_WORKERS": str(workers),
            "SPO_ACCESS_LOG": "0",
            "SPO_PID_FILE": str(pid_file),
            "SPO_TIMEOUT": "600",
        }
        with log.open("wb") as out:
            server = subprocess.Popen(
                [str(spo), "serve", "--bind", f"127.0.0.1:{port}"], env=env, stdout=out, stderr=out
            )
        try:
            deadline = time.monotonic() + 600
            while log.read_text(errors="replace").count("ready: model loaded") < workers:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(log.read_text()[-3000:])
                time.sleep(0.2)
            answers: list[tuple[float, float, int, str]] = []
            stop = threading.Event()

            def client() -> None:
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        status, what = _post(port)
                    except Exception as exc:
                        status, what = 0, type(exc).__name__
                    answers.append((started, time.monotonic() - started, status, what))

            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            time.sleep(before)

            def reload(target: Path) -> float:
                _point(link, target)
                hup = time.monotonic()
                subprocess.run([str(spo), "reload", "--pid-file", str(pid_file)], check=True)
                return hup

            hup = reload(b)
            done = _wait_log(log, "reload done", 600)
            time.sleep(after)
            hup_broken = reload(broken)
            _wait_log(log, "reload refused", 60)
            time.sleep(after)
            hup_corrupt = reload(corrupt)
            undone = _wait_log(log, "reload failed", 600)
            time.sleep(after)
            stop.set()
            for t in threads:
                t.join()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(120)

        def phase(start: float, end: float) -> dict[str, Any]:
            rows = [a for a in answers if start <= a[0] < end]
            return {
                "requests": len(rows),
                "failed": sum(1 for a in rows if a[2] != 200),
                "answers": dict(Counter(f"{a[2]} {a[3]}" for a in rows)),
                **_percentiles([a[1] for a in rows]),
            }

        first = answers[0][0]
        result = {
            "model": str(model),
            "clients": clients,
            "workers": workers,
            "hup_to_done_s": round(done - hup, 2),
            "master_log": [
                line
                for line in log.read_text(errors="replace").splitlines()
                if "reload" in line and "gunicorn.error" in line
            ],
            "before_reload": phase(first, hup),
            "during_reload": phase(hup, done),
            "after_reload": phase(done, hup_broken),
            "broken_model_json": phase(hup_broken, hup_corrupt),
            "corrupt_saved_model": phase(hup_corrupt, undone + after),
            "corrupt_reload_undone_after_s": round(undone - hup_corrupt, 2),
            "failed_total": sum(1 for a in answers if a[2] != 200),
            "requests_total": len(answers),
        }
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reload", description=__doc__)
    parser.add_argument("--model", type=Path, default=PROJECT_ROOT / "models" / "demo")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the HUP")
    parser.add_argument("--after", type=float, default=10.0, help="seconds of load after each step")
    args = parser.parse_args(argv)
    result = run(args.model.resolve(), args.clients, args.workers, args.before, args.after)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, ensure_ascii=False, indent=2))


if __name__ == "__main__":
    main()
