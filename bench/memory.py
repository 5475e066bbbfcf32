"""Memory and latency: every runtime in its own process on the same request stream and threads."""

from __future__ import annotations

import logging
from typing import Any

from bench.common import cpu_info, read_result, write_result
from bench.runner import run_worker
from bench.runtimes import ORT, OV, RUNTIMES

logger = logging.getLogger(__name__)


def run(
    requests: int,
    *,
    runtimes: tuple[str, ...] = RUNTIMES,
    intra: int = 2,
    inter: int = 1,
    rss_every: int = 500,
    max_seconds: float = 3600.0,
) -> dict[str, Any]:
    # Rows of runtimes not run now are kept from the last run (each row carries its own counts).
    previous = read_result("memory") or {}
    kept = [r for r in previous.get("runtimes", []) if r["runtime"] not in runtimes]
    results: list[Any] = []
    if any(r in ORT for r in runtimes):
        from training.onnx_export import OnnxExportError, _require_tools

        try:
            _require_tools()
            from bench.peer import onnx_dirs

            onnx_dirs()  # converted here, so the workers' RSS is the engine's alone
        except OnnxExportError as exc:
            logger.warning("%s skipped: %s", ", ".join(r for r in runtimes if r in ORT), exc)
            runtimes = tuple(r for r in runtimes if r not in ORT)
    if any(r in OV for r in runtimes):
        from bench.peer import openvino_dirs, openvino_missing

        missing = openvino_missing()
        if missing is None:
            openvino_dirs()  # converted here, so the workers' RSS is the engine's alone
        else:
            logger.warning("%s skipped: %s", ", ".join(r for r in runtimes if r in OV), missing)
            runtimes = tuple(r for r in runtimes if r not in OV)
    for name in runtimes:
        if name == "spo-int8":
            from bench.rbt6 import build_int8

            if build_int8() is None:
                continue
        result = run_worker(
            "memory",
            "--runtime", name,
            "--requests", str(requests),
            "--rss-every", str(rss_every),
            "--max-seconds", str(max_seconds),
            "--intra", str(intra),
            "--inter", str(inter),
            jemalloc=name == "spo-jemalloc",
        )  # fmt: skip
        logger.info(
            "%s: %d requests, RSS %.0f -> %.0f MiB, %.1f texts/s, p99 %.0f ms",
            name,
            result["requests"],
            result["rss_after_load_mib"],
            result["rss_end_mib"],
            result["texts_per_s"],
            result["latency_ms"]["p99"],
        )
        result["machine"] = cpu_info()  # rows kept from earlier runs may come from another machine
        results.append(result)
        write_result("memory", _doc(requests, intra, inter, rss_every, kept + results))
    return _doc(requests, intra, inter, rss_every, kept + results)


def _doc(
    requests: int, intra: int, inter: int, rss_every: int, results: list[Any]
) -> dict[str, Any]:
    results = sorted(results, key=lambda r: RUNTIMES.index(r["runtime"]))
    return {
        "requests": requests,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "rss_every": rss_every,
        "runtimes": results,
    }
