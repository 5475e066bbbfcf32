"""Batch throughput at batch 1, 8, 32: texts/s and achieved GFLOP/s against the measured matmul peak,
fp32 and (where the CPU has it) the oneDNN bf16 rewrite; bf16 triples compared with fp32's."""

from __future__ import annotations

import json
import logging
from typing import Any

from bench.common import RAW_DIR, cpu_info, write_result
from bench.runner import run_worker

logger = logging.getLogger(__name__)


def _agreement() -> dict[str, Any] | None:
    """fp32 vs bf16 triples on the same texts: identical texts and micro F1 (fp32 as reference)."""
    try:
        ref = json.loads((RAW_DIR / "triples-fp32.json").read_text(encoding="utf-8"))
        got = json.loads((RAW_DIR / "triples-bf16.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    same = sum(a == b for a, b in zip(ref, got, strict=True))
    tp = sum(
        len({tuple(t) for t in a} & {tuple(t) for t in b}) for a, b in zip(ref, got, strict=True)
    )
    n_ref, n_got = sum(map(len, ref)), sum(map(len, got))
    f1 = 2 * tp / (n_ref + n_got) if n_ref + n_got else 1.0
    return {
        "texts": len(ref),
        "identical_texts": same,
        "triples_fp32": n_ref,
        "triples_bf16": n_got,
        "f1_vs_fp32": round(f1, 4),
    }


def run(
    *, intra: int = 2, inter: int = 1, seconds: float = 5.0, texts: int = 256
) -> dict[str, Any]:
    from bench.rbt6 import build_int8

    precisions = ["fp32", "bf16"] if cpu_info()["bf16"] else ["fp32"]
    if build_int8() is not None:
        precisions.append("int8")
    rows = {}
    for i, precision in enumerate(precisions):
        args = ["--precision", precision, "--intra", str(intra), "--inter", str(inter)]
        args += ["--seconds", str(seconds), "--texts", str(texts)]
        rows[precision] = run_worker("batch", *args, *(["--peaks"] if i == 0 else []))
    peaks = rows["fp32"].pop("peak_gflops")
    for precision, row in rows.items():
        peak = peaks.get(precision)
        for r in row["model"]:
            r["pct_of_peak"] = round(100 * r["gflops"] / peak, 1) if peak else None
        logger.info("%s: %s", precision, row["model"])
    doc: dict[str, Any] = {"peak_gflops": peaks, "runs": rows, "bf16_agreement": _agreement()}
    if "bf16" in rows:
        doc["bf16_speedup"] = {
            str(a["batch"]): round(b["texts_per_s"] / a["texts_per_s"], 2)
            for a, b in zip(rows["fp32"]["model"], rows["bf16"]["model"], strict=True)
        }
    write_result("batch", doc)
    return doc
