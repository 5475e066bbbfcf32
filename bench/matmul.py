"""The measured matmul peak of this CPU per precision (fp32, bf16, int8), on the benchmark's threads.

The peer step reports every row as a share of these peaks, so "int8 runs at N% of what the machine
does" is a measurement, not a datasheet figure. Engine: OpenVINO's CPU plugin, one single-MatMul
model per shape with a constant weight (as the model's dense layers have):

- fp32: the model compiled with ``INFERENCE_PRECISION_HINT`` f32;
- bf16: the same model with the hint bf16 (AVX512_BF16 / AMX; only on a CPU that has it);
- int8: FakeQuantize on the activation (u8, 256 levels) and on the weight (s8, 255 levels, symmetric)
  before the MatMul, the pattern OpenVINO's low-precision transformations turn into one u8 x s8
  oneDNN matmul (VNNI); ``runtime_precisions`` records what the compiled graph really ran, so a
  fallback to fp32 shows.

Why OpenVINO rather than TensorFlow ops: TF's fp32 ``MatMul`` goes through oneDNN too, but its int8
kernels (``QuantizedMatMulWithBiasAndDequantize``) need quantize/dequantize ops around each call whose
cost would count against the peak, and a Session call costs more fixed time than an OpenVINO infer
request; the peak is the best the CPU reached on any engine, so the faster harness is the right one.

Shapes are the model's: M = batch x length from 16 to 1024 tokens, K x N = 768 x 768 (attention
projections), 768 x 3072 and 3072 x 768 (feed-forward). The peak is the best ops/s over the shapes
(2 ops per multiply-add, as ``bench.rbt6.flops_per_token`` counts them).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from bench.common import cpu_info, write_result

logger = logging.getLogger(__name__)

M_SIZES = (16, 128, 1024)
KN_SIZES = ((768, 768), (768, 3072), (3072, 768))
PRECISIONS = ("fp32", "bf16", "int8")
SECONDS = 1.0


def ops(m: int, k: int, n: int) -> float:
    """Ops of one (m x k) @ (k x n) matmul, 2 per multiply-add.

    >>> ops(2, 3, 4)
    48.0
    """
    return 2.0 * m * k * n


def peaks(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The best ops/s per precision over ``rows`` (each with ``precision`` and ``ops_per_s``).

    >>> peaks([{"precision": "fp32", "ops_per_s": 1.0}, {"precision": "fp32", "ops_per_s": 3.0}])
    {'fp32': 3.0}
    """
    out: dict[str, float] = {}
    for row in rows:
        out[row["precision"]] = max(out.get(row["precision"], 0.0), float(row["ops_per_s"]))
    return out


def _model(m: int, k: int, n: int, precision: str) -> Any:
    import openvino as ov
    import openvino.opset13 as ops_

    rng = np.random.default_rng(0)
    x = ops_.parameter([m, k], ov.Type.f32, name="x")
    w = ops_.constant(rng.standard_normal((k, n), dtype=np.float32) * 0.05)
    if precision == "int8":

        def fq(node: Any, lo: float, hi: float, levels: int) -> Any:
            low, high = ops_.constant(np.float32(lo)), ops_.constant(np.float32(hi))
            return ops_.fake_quantize(node, low, high, low, high, levels)

        x_in = fq(x, 0.0, 4.0, 256)  # a post-GELU or LayerNorm-shifted activation: u8
        w_in = fq(w, -0.2, 0.2, 255)  # symmetric s8 weights
        out = ops_.matmul(x_in, w_in, False, False)
    else:
        out = ops_.matmul(x, w, False, False)
    return ov.Model([ops_.result(out)], [x], f"matmul_{m}x{k}x{n}")


def _runtime_precisions(compiled: Any) -> list[str]:
    """What the compiled graph's matmul nodes ran: OpenVINO's ``runtimePrecision`` and kernel
    (``primitiveType``), e.g. ``u8 brgemm_avx512_I8`` for an int8 matmul."""
    found = set()
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        if info["layerType"].astype(str) in ("FullyConnected", "MatMul"):
            found.add(f"{info['runtimePrecision'].astype(str)} {info['primitiveType'].astype(str)}")
    return sorted(found)


def measure(
    precision: str, m: int, k: int, n: int, *, threads: int, seconds: float = SECONDS
) -> dict[str, Any]:
    """Best-of-runs ops/s of one matmul shape in ``precision`` on ``threads`` threads."""
    import openvino as ov

    core = ov.Core()
    hint = {"bf16": "bf16"}.get(precision, "f32")
    compiled = core.compile_model(
        _model(m, k, n, precision),
        "CPU",
        {
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": hint,
        },
    )
    request = compiled.create_infer_request()
    x = np.random.default_rng(1).uniform(0.0, 4.0, (m, k)).astype(np.float32)
    for _ in range(3):
        request.infer({0: x})
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 10_000):
        t = time.perf_counter()
        request.infer({0: x})
        times.append(time.perf_counter() - t)
    best = min(times)
    return {
        "precision": precision,
        "m": m,
        "k": k,
        "n": n,
        "runs": len(times),
        "best_us": round(best * 1e6, 1),
        "median_us": round(float(np.median(times)) * 1e6, 1),
        "ops_per_s": ops(m, k, n) / best,
        "runtime_precisions": _runtime_precisions(compiled),
    }


def run(*, threads: int = 2, seconds: float = SECONDS) -> dict[str, Any]:
    """Every precision this CPU has at every shape; ``bench/results/matmul.json``."""
    try:
        import openvino
    except ImportError:
        logger.warning("matmul step skipped: openvino is not installed (pip install openvino)")
        return {}
    bf16 = cpu_info()["bf16"]
    rows = []
    for precision in PRECISIONS:
        if precision == "bf16" and not bf16:
            logger.info("matmul: no bf16 on this CPU; bf16 left out")
            continue
        for m in M_SIZES:
            for k, n in KN_SIZES:
                row = measure(precision, m, k, n, threads=threads, seconds=seconds)
                logger.info(
                    "matmul %s %dx%dx%d: %.1f G ops/s (runs in %s)",
                    precision, m, k, n, row["ops_per_s"] / 1e9, ",".join(row["runtime_precisions"]),
                )  # fmt: skip
                rows.append(row)
    doc = {
        "engine": f"openvino {openvino.__version__}",
        "threads": threads,
        "seconds_per_shape": seconds,
        "rows": rows,
        "peak_ops_per_s": peaks(rows),
    }
    write_result("matmul", doc)
    for line in table(doc):
        logger.info("%s", line)
    return doc


def table(doc: dict[str, Any]) -> list[str]:
    """Markdown: G ops/s per shape and precision, and the peak row."""
    precisions = list(doc["peak_ops_per_s"])
    lines = [
        "| M x K x N | " + " | ".join(f"{p}, G ops/s" for p in precisions) + " |",
        "|---" * (len(precisions) + 1) + "|",
    ]
    shapes = sorted({(r["m"], r["k"], r["n"]) for r in doc["rows"]})
    for m, k, n in shapes:
        cells = []
        for p in precisions:
            row = next(
                (
                    r
                    for r in doc["rows"]
                    if (r["precision"], r["m"], r["k"], r["n"]) == (p, m, k, n)
                ),
                None,
            )
            cells.append("-" if row is None else f"{row['ops_per_s'] / 1e9:.0f}")
        lines.append(f"| {m} x {k} x {n} | " + " | ".join(cells) + " |")
    lines.append(
        "| **peak** | "
        + " | ".join(f"**{doc['peak_ops_per_s'][p] / 1e9:.0f}**" for p in precisions)
        + " |"
    )
    return lines
