"""Service-level peers: the same HTTP workload through nginx against the service on each engine.

For each engine (``ENGINES``: the TF session in fp32 and int8, the onnx engine, the openvino engine in
int8 and in its default CPU precision) and each workers x intra-op threads sizing (``1x2`` and ``2x1``
on 2 cores: every core busy either way), ``spo serve --nginx`` is started on the RBT6 benchmark model
(recycling and the RSS watchdog off, access log off), and wrk posts single-text ``/v1/extract``
requests of the benchmark workload for ``seconds`` at each concurrency (1, 4, 16): requests/s, p50,
p99 and errors per configuration, to ``bench/results/http_peers.json``.

The service's own default sizing (``app.core.sizing.plan``: one worker per usable CPU, intra-op =
CPUs // workers) is recorded beside the measurement, and ``choose_sizing`` says which sizing the
measurement favours, so the default can follow it.

Duration: about (start-up + len(concurrency) x seconds) per engine and sizing: with the defaults (5
engines, 2 sizings, 15 s, 3 concurrencies; start-up 35-65 s each) about 15 minutes on 2 cores.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import CACHE_DIR, PROJECT_ROOT, cpu_info, read_result, stop, write_result
from bench.http_load import _free_port, run_wrk, write_wrk_script, wrk_errors

logger = logging.getLogger(__name__)

ENGINES = ("tf-fp32", "tf-int8", "onnx", "ov-int8", "ov-default")
SIZINGS = ("1x2", "2x1")
CONCURRENCY = (1, 4, 16)
SECONDS = 15
# wrk stops on time (-d), never on a count: a count no run reaches.
UNBOUNDED = 10**9


def parse_sizing(text: str) -> tuple[int, int]:
    """``"WxT"`` -> (workers, intra-op threads per worker); ``ValueError`` for anything else.

    >>> parse_sizing("2x1")
    (2, 1)
    """
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"sizing {text!r}: WORKERSxTHREADS, two positive integers (e.g. 2x1)")
    return int(parts[0]), int(parts[1])


def engine_dirs(engines: Sequence[str], bf16_cpu: bool) -> dict[str, tuple[str, str | None]]:
    """``{name: (model_dir, SPO_PRECISION or None)}`` for the engines that can run here, converting
    what is not cached yet; an engine whose extra is missing is left out, with a warning.

    ``onnx`` is the faster of the two ONNX conversions in the last peer step's workload (int8 when
    none ran); ``ov-default`` is OpenVINO's own CPU precision, named by what it is: ``ov-bf16`` (the
    fp32 conversion served in bf16) on a CPU with bf16, else ``ov-fp32``.
    """
    from bench.rbt6 import build_int8, build_model

    out: dict[str, tuple[str, str | None]] = {}
    graph = str(build_model()["graph"])
    for name in engines:
        if name == "tf-fp32":
            out[name] = (graph, None)
        elif name == "tf-int8":
            int8 = build_int8()
            if int8 is None:
                logger.warning("tf-int8 left out: no int8 model here")
            else:
                out[name] = (str(int8), None)
        elif name == "onnx":
            from training.onnx_export import OnnxExportError, _require_tools

            try:
                _require_tools()
            except OnnxExportError as exc:
                logger.warning("onnx left out: %s", exc)
                continue
            from bench.peer import onnx_dirs

            runtime = faster_onnx(read_result("peer"))
            out[f"onnx-{runtime.split('-')[1]}"] = (onnx_dirs()[runtime], None)
        elif name in ("ov-int8", "ov-default"):
            from bench.peer import openvino_dirs, openvino_missing

            missing = openvino_missing()
            if missing is not None:
                logger.warning("%s left out: %s", name, missing)
                continue
            dirs = openvino_dirs()
            if name == "ov-int8":
                out[name] = (dirs["int8"], None)
            elif bf16_cpu:
                out["ov-bf16"] = (dirs["fp32"], "bf16")
            else:
                out["ov-fp32"] = (dirs["fp32"], None)
        else:
            raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINES)}")
    return out


def faster_onnx(peer: dict[str, Any] | None) -> str:
    """``ort-fp32`` or ``ort-int8``: the one with more workload texts/s in a peer result (int8 when
    the result has neither).

    >>> faster_onnx({"workload": {"ort-fp32": {"texts_per_s": 9.0}, "ort-int8": {"texts_per_s": 7.0}}})
    'ort-fp32'
    >>> faster_onnx(None)
    'ort-int8'
    """
    workload = (peer or {}).get("workload", {})
    speeds = {r: workload[r]["texts_per_s"] for r in ("ort-fp32", "ort-int8") if r in workload}
    return max(speeds, key=lambda r: speeds[r]) if len(speeds) == 2 else "ort-int8"


# The openvino engine's workers crash at load (SIGSEGV, SIGBUS, "free(): invalid size") when spo serve
# preloads jemalloc (its default where libjemalloc2 is installed); without it they serve. Until the
# engine says so itself, its runs here go without jemalloc, and the result records that.
NO_JEMALLOC_PREFIX = "ov-"
# A configuration whose workers died this many times before serving is given up, not waited for.
CRASHES = 3


def _serve(
    model_dir: str,
    precision: str | None,
    workers: int,
    intra: int,
    log_path: Path,
    port: int,
    jemalloc: bool = True,
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPO_")}
    env.update({
        "SPO_MODEL_DIR": model_dir,
        "SPO_WORKERS": str(workers),
        "SPO_INTRA_OP_THREADS": str(intra),
        "SPO_MAX_REQUESTS": "0",
        "SPO_MAX_WORKER_RSS_MB": "0",
        "SPO_ACCESS_LOG": "0",
        "SPO_TIMEOUT": "600",
    })  # fmt: skip
    if precision:
        env["SPO_PRECISION"] = precision
    if not jemalloc:
        env["SPO_JEMALLOC"] = "0"
    spo = str(Path(sys.executable).with_name("spo"))
    with log_path.open("w") as log:
        return subprocess.Popen(
            [spo, "serve", "--nginx", f"127.0.0.1:{port}"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def crashed_workers(log: str) -> int:
    """Worker deaths by signal in a gunicorn log (``Worker (pid:N) was sent SIGSEGV!``).

    >>> crashed_workers("Worker (pid:1) was sent SIGBUS!\\nWorker (pid:2) was sent SIGSEGV!")
    2
    """
    return len(re.findall(r"Worker \(pid:\d+\) was sent SIG[A-Z]+", log))


def _wait_serving(
    server: subprocess.Popen[bytes], log_path: Path, workers: int, timeout: float = 600
) -> None:
    """Until every worker logged it is ready; ``RuntimeError`` once ``CRASHES`` workers died first."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"spo serve exited ({server.returncode}); see {log_path}")
        log = log_path.read_text(errors="replace")
        if log.count("ready: model loaded") >= workers:
            return
        if crashed_workers(log) >= CRASHES:
            raise RuntimeError(
                f"{crashed_workers(log)} workers crashed while loading; see {log_path}"
            )
        time.sleep(1.0)
    raise TimeoutError(f"workers not ready after {timeout}s; see {log_path}")


def _wait_answering(port: int, server: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until nginx answers ``/readyz`` with 200 (gunicorn behind it ready)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"spo serve exited ({server.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"nginx on port {port} not answering /readyz after {timeout}s")


def measure(
    name: str,
    model_dir: str,
    precision: str | None,
    sizing: str,
    concurrency: Sequence[int],
    seconds: int,
) -> list[dict[str, Any]]:
    """One engine and sizing: the service started once, then wrk at each concurrency in turn."""
    workers, intra = parse_sizing(sizing)
    work = CACHE_DIR / "http_peers"
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / f"serve-{name}-{sizing}.log"
    port = _free_port()
    started = time.perf_counter()
    jemalloc = not name.startswith(NO_JEMALLOC_PREFIX)
    server = _serve(model_dir, precision, workers, intra, log_path, port, jemalloc)
    rows = []
    try:
        _wait_serving(server, log_path, workers)
        _wait_answering(port, server)
        startup = round(time.perf_counter() - started, 1)
        logger.info("%s %s: serving after %.0f s", name, sizing, startup)
        for c in concurrency:
            wrk_threads = min(2, c)
            script, done_dir = write_wrk_script(work / f"wrk-c{c}", UNBOUNDED, wrk_threads)
            stats, _ = run_wrk(port, script, done_dir, wrk_threads=wrk_threads, concurrency=c,
                               max_seconds=seconds)  # fmt: skip
            row = summarize(stats)
            row |= {"engine": name, "sizing": sizing, "workers": workers, "jemalloc": jemalloc,
                    "intra_op_threads": intra, "concurrency": c, "startup_s": startup}  # fmt: skip
            logger.info(
                "%s %s c=%d: %.1f requests/s, p50 %.0f ms, p99 %.0f ms, %d errors",
                name, sizing, c, row["requests_per_s"], row["latency_ms"]["p50"],
                row["latency_ms"]["p99"], row["errors"],
            )  # fmt: skip
            rows.append(row)
    finally:
        stop(server)
    return rows


def summarize(stats: dict[str, Any]) -> dict[str, Any]:
    """One wrk run (the ``WRKJSON`` summary) as requests, requests/s, latency in ms and errors.

    >>> row = summarize({"requests": 50, "duration_us": 10_000_000, "connect_errors": 0,
    ...     "read_errors": 0, "write_errors": 0, "status_errors": 0, "timeouts": 1, "non_200": 2,
    ...     "latency_us": {"p50": 15_000, "p99": 80_500}})
    >>> row["requests_per_s"], row["latency_ms"], row["errors"]
    (5.0, {'p50': 15.0, 'p99': 80.5}, 3)
    """
    seconds = stats["duration_us"] / 1e6
    return {
        "requests": stats["requests"],
        "seconds": round(seconds, 1),
        "requests_per_s": round(stats["requests"] / seconds, 2) if seconds else 0.0,
        "latency_ms": {k: round(stats["latency_us"][k] / 1000, 1) for k in ("p50", "p99")},
        "errors": wrk_errors(stats),
    }


def choose_sizing(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The sizing the measurement favours: the one with the most (engine, concurrency) pairs where
    its requests/s are the highest; ties go to the higher total of requests/s over every pair.

    >>> runs = [
    ...     {"engine": "e", "sizing": "1x2", "concurrency": 1, "requests_per_s": 10.0},
    ...     {"engine": "e", "sizing": "2x1", "concurrency": 1, "requests_per_s": 8.0},
    ...     {"engine": "e", "sizing": "1x2", "concurrency": 4, "requests_per_s": 12.0},
    ...     {"engine": "e", "sizing": "2x1", "concurrency": 4, "requests_per_s": 15.0},
    ...     {"engine": "e", "sizing": "1x2", "concurrency": 16, "requests_per_s": 12.0},
    ...     {"engine": "e", "sizing": "2x1", "concurrency": 16, "requests_per_s": 16.0},
    ... ]
    >>> choose_sizing(runs)
    {'sizing': '2x1', 'wins': {'1x2': 1, '2x1': 2}}
    """
    best: dict[tuple[str, int], dict[str, Any]] = {}
    totals: dict[str, float] = {}
    wins: dict[str, int] = {}
    for run in runs:
        key = (run["engine"], run["concurrency"])
        totals[run["sizing"]] = totals.get(run["sizing"], 0.0) + run["requests_per_s"]
        wins.setdefault(run["sizing"], 0)
        if key not in best or run["requests_per_s"] > best[key]["requests_per_s"]:
            best[key] = run
    for run in best.values():
        wins[run["sizing"]] += 1
    if not wins:
        return {"sizing": None, "wins": {}}
    chosen = max(wins, key=lambda s: (wins[s], totals[s]))
    return {"sizing": chosen, "wins": dict(sorted(wins.items()))}


def default_sizing() -> str:
    """What the service sizes itself to here when nothing is set (``app.core.sizing.plan``)."""
    from app.core.sizing import Machine, plan

    sizing = plan(Machine.probe())
    return f"{sizing.workers}x{sizing.intra_op_threads}"


def run(
    *,
    engines: Sequence[str] = ENGINES,
    sizings: Sequence[str] = SIZINGS,
    concurrency: Sequence[int] = CONCURRENCY,
    seconds: int = SECONDS,
) -> dict[str, Any]:
    from app.serving.supervisor import find_nginx
    from bench.http_load import require_wrk

    require_wrk()
    if find_nginx() is None:
        raise SystemExit("nginx is not installed: run `bash bench/setup.sh`")
    for s in sizings:
        parse_sizing(s)
    dirs = engine_dirs(engines, cpu_info()["bf16"])
    runs: list[dict[str, Any]] = []
    doc: dict[str, Any] = {
        "engines": {name: {"model_dir": d, "precision": p} for name, (d, p) in dirs.items()},
        "sizings": list(sizings),
        "default_sizing": default_sizing(),
        "concurrency": list(concurrency),
        "seconds_per_run": seconds,
        "runs": runs,
        "failed": [],
    }
    for sizing in sizings:
        for name, (model_dir, precision) in dirs.items():
            try:
                runs += measure(name, model_dir, precision, sizing, concurrency, seconds)
            except (RuntimeError, TimeoutError) as exc:
                logger.warning("%s %s: not measured: %s", name, sizing, exc)
                doc["failed"].append({"engine": name, "sizing": sizing, "error": str(exc)})
            doc["chosen"] = choose_sizing(runs)
            write_result(
                "http_peers", doc
            )  # after each configuration: a stopped run keeps its rows
    for line in table(doc):
        logger.info("%s", line)
    return doc


def table(doc: dict[str, Any]) -> list[str]:
    """Markdown: one row per engine and sizing; per concurrency requests/s, p50 / p99 ms, errors."""
    conc = doc["concurrency"]
    lines = [
        "| engine | workers x threads | "
        + " | ".join(f"c={c}: req/s, p50 / p99 ms" for c in conc)
        + " | errors |",
        "|---|---|" + "---|" * len(conc) + "---|",
    ]
    keys = list(dict.fromkeys((r["engine"], r["sizing"]) for r in doc["runs"]))
    for engine, sizing in keys:
        rows = {
            r["concurrency"]: r
            for r in doc["runs"]
            if (r["engine"], r["sizing"]) == (engine, sizing)
        }
        cells = []
        for c in conc:
            r = rows.get(c)
            cells.append(
                "-"
                if r is None
                else f"{r['requests_per_s']:.1f}, {r['latency_ms']['p50']:.0f} / {r['latency_ms']['p99']:.0f}"
            )
        errors = sum(r["errors"] for r in rows.values())
        lines.append(f"| {engine} | {sizing} | " + " | ".join(cells) + f" | {errors} |")
    return lines
