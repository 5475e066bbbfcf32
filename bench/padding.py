"""Padding waste (padded tokens / real tokens) of bucket sets on the workload, and the warm-up trade.

Pure Python over the workload's token lengths (windowed as ``Extractor`` does), planned as single-text
requests (each text alone: what the memory run and most REST traffic do) and as batches of 32 texts.
FLOP waste weighs each token by the per-token cost at its bucket length. Warm-up cost is estimated by
scaling the measured default warm-up (``bench/results/memory.json``, spo) by total warm-up FLOPs.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import read_result, write_result
from bench.rbt6 import MAX_LENGTH, flops_per_token
from bench.workload import texts

logger = logging.getLogger(__name__)

X15 = (16, 24, 32, 48, 64, 96, 128, 192, 256)
# name -> (length buckets, single-row length step or None)
BUCKET_SETS: dict[str, tuple[tuple[int, ...], int | None]] = {
    "first default (16..256, x2)": ((16, 32, 64, 128, 256), None),
    "pre-project (32..256, x2)": ((32, 64, 128, 256), None),
    "x1.5 steps": (X15, None),
    "default: x1.5 steps, one-row step 8": (X15, 8),
    "x1.5 steps, one-row step 16": (X15, 16),
    "x1.5 steps, one-row step 4": (X15, 4),
    "multiples of 32": (tuple(range(32, MAX_LENGTH + 1, 32)), None),
    "multiples of 16": (tuple(range(16, MAX_LENGTH + 1, 16)), None),
}
DEFAULT_SET = "default: x1.5 steps, one-row step 8"


def window_lengths() -> list[list[int]]:
    """Per text, the token length ([CLS] and [SEP] included) of each window the Extractor runs."""
    from bench.common import VOCAB_PATH
    from nlp.pipeline import plan_windows
    from nlp.tokenization import Tokenizer

    tok = Tokenizer.from_file(VOCAB_PATH)
    out = []
    for i, text in enumerate(texts()):
        enc = tok.encode(text)
        windows = plan_windows(text, enc, i, MAX_LENGTH - 2, (MAX_LENGTH - 2) // 4)
        out.append([w.stop - w.start + 2 for w in windows if w.stop > w.start])
    return out


def _spec(buckets: tuple[int, ...], step: int | None) -> Any:
    from nlp.bucketing import BucketSpec
    from nlp.config import DEFAULT_MAX_BATCH_TOKENS
    from nlp.manifest import DEFAULT_BATCH_BUCKETS

    return BucketSpec(
        buckets, DEFAULT_BATCH_BUCKETS, DEFAULT_MAX_BATCH_TOKENS, single_row_step=step
    )


def _evaluate(lengths: list[list[int]], spec: Any, group: int) -> dict[str, float]:
    """Waste when ``group`` texts at a time go through ``plan_batches`` (1: single-text requests)."""
    from nlp.bucketing import plan_batches

    real = padded = flops_real = flops_run = 0.0
    for start in range(0, len(lengths), group):
        flat = [n for text in lengths[start : start + group] for n in text]
        for batch in plan_batches(flat, spec):
            rows, length = batch.shape
            padded += rows * length
            flops_run += rows * length * flops_per_token(length)
            for r in batch.rows:
                real += flat[r]
                flops_real += flat[r] * flops_per_token(flat[r])
    return {
        "padding_waste": round((padded - real) / real, 4),
        "flop_waste": round((flops_run - flops_real) / flops_real, 4),
    }


def run() -> dict[str, Any]:
    lengths = window_lengths()
    memory = read_result("memory") or {}
    spo = next((r for r in memory.get("runtimes", []) if r["runtime"] == "spo"), None)
    default_buckets, default_step = BUCKET_SETS[DEFAULT_SET]
    default_warm_flops = sum(
        b * n * flops_per_token(n) for b, n in _spec(default_buckets, default_step).shapes()
    )
    rows = []
    for name, (buckets, step) in BUCKET_SETS.items():
        spec = _spec(buckets, step)
        shapes = spec.shapes()
        warm_flops = sum(b * n * flops_per_token(n) for b, n in shapes)
        single = _evaluate(lengths, spec, 1)
        batched = _evaluate(lengths, spec, 32)
        row: dict[str, Any] = {
            "name": name,
            "length_buckets": list(buckets),
            "single_row_step": step,
            "warm_shapes": len(shapes),
            "warm_tflop": round(warm_flops / 1e12, 2),
            "padding_waste": single["padding_waste"],
            "flop_waste": single["flop_waste"],
            "padding_waste_batch32": batched["padding_waste"],
            "flop_waste_batch32": batched["flop_waste"],
        }
        if spo is not None:
            # Scales the measured warm-up of the spo row (which ran with the default set).
            row["warm_s_estimated"] = round(spo["warm_s"] * warm_flops / default_warm_flops, 1)
        rows.append(row)
        logger.info("padding %s", row)
    flat = sorted(n for text in lengths for n in text)
    doc = {
        "texts": len(lengths),
        "windows": len(flat),
        "tokens_p50": flat[len(flat) // 2],
        "tokens_p95": flat[int(len(flat) * 0.95)],
        "tokens_max": flat[-1],
        "default_warm_s_measured": spo["warm_s"] if spo else None,
        "sets": rows,
    }
    write_result("padding", doc)
    return doc
