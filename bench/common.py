"""Paths, machine facts and small statistics shared by the benchmarks (no TensorFlow import here)."""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nlp.config import DEMO_VOCAB

BENCH_DIR = Path(__file__).resolve().parent
# The benchmarks run in a checkout (the test data, results and BENCHMARKS.md live there).
PROJECT_ROOT = BENCH_DIR.parent
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
CACHE_DIR = BENCH_DIR / ".cache"
RESULTS_DIR = BENCH_DIR / "results"
RAW_DIR = CACHE_DIR / "raw"
VOCAB_PATH = DEMO_VOCAB
MIB = 1 << 20


def cpu_info() -> dict[str, Any]:
    """CPU model, core count and the flags that matter here, from /proc/cpuinfo."""
    text = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags_m = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    flags = flags_m.group(1).split() if flags_m else []
    family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
    number = re.search(r"^model\s*:\s*(\d+)$", text, re.M)
    wanted = ("avx2", "fma", "avx512")
    return {
        "model": model.group(1).strip() if model else platform.processor(),
        # the generation, which a model name such as "AMD EPYC" does not give
        "family": int(family.group(1)) if family else None,
        "model_number": int(number.group(1)) if number else None,
        "cpus": len(os.sched_getaffinity(0)),
        "logical_cpus_listed": text.count("processor\t:"),
        "flags_simd": sorted(f for f in flags if f.startswith(wanted) or f.startswith("amx")),
        "bf16": "avx512_bf16" in flags or "amx_bf16" in flags,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": sys.version.split()[0],
    }


def machine_label(machine: dict[str, Any]) -> str:
    """A short name for a ``cpu_info()`` record: the CPU model, its family and model numbers where
    recorded (two "AMD EPYC" generations differ about 2x per call), and whether it has AMX.

    >>> machine_label({"model": "AMD EPYC", "flags_simd": ["avx512_bf16"]})
    'AMD EPYC, no AMX'
    >>> machine_label({"model": "AMD EPYC", "family": 26, "model_number": 2, "flags_simd": []})
    'AMD EPYC (family 26, model 2), no AMX'
    """
    amx = any(f.startswith("amx") for f in machine.get("flags_simd", []))
    name = machine["model"]
    if machine.get("family") is not None:
        name += f" (family {machine['family']}, model {machine.get('model_number')})"
    return f"{name}, {'AMX' if amx else 'no AMX'}"


def same_machine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two ``cpu_info()`` records name the same kind of machine: CPU model, family and model
    numbers, CPUs and SIMD flags (a record without the family numbers matches none).

    >>> cpu = {"model": "AMD EPYC", "family": 26, "model_number": 2, "cpus": 2, "flags_simd": []}
    >>> same_machine(cpu, cpu | {"python": "3.13.5"}), same_machine(cpu, cpu | {"family": 25})
    (True, False)
    >>> same_machine({"model": "AMD EPYC", "cpus": 2, "flags_simd": []}, cpu)
    False
    """
    keys = ("model", "family", "model_number", "cpus", "flags_simd")
    return a.get("family") is not None and all(a.get(k) == b.get(k) for k in keys)


def write_result(name: str, doc: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` with the machine and time stamped in."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **doc}
    doc.setdefault("machine", cpu_info())
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_result(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def percentiles_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    a = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    if a.size == 0:
        return {}
    return {f"p{q}": round(float(np.percentile(a, q)), 2) for q in (50, 90, 95, 99)} | {
        "mean": round(float(a.mean()), 2),
        "max": round(float(a.max()), 2),
    }


def cdf_points(latencies_s: Sequence[float], n: int = 200) -> list[float]:
    """``n + 1`` latency quantiles (ms) from 0 to 1: enough to draw a CDF."""
    a = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    if a.size == 0:
        return []
    return [round(float(x), 3) for x in np.quantile(a, np.linspace(0.0, 1.0, n + 1))]


def slope_second_half(requests: Sequence[int], rss: Sequence[float]) -> float | None:
    """Least-squares slope (bytes/request) of RSS over the second half of the samples."""
    k = len(requests) // 2
    x = np.asarray(requests[k:], dtype=np.float64)
    y = np.asarray(rss[k:], dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        return None
    return float(np.polyfit(x, y, 1)[0])


def stop(process: subprocess.Popen[Any], wait_s: float = 60) -> None:
    """SIGTERM (a server's graceful shutdown), then SIGKILL if it is not gone within ``wait_s``."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
