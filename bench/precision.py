"""bf16 against fp32 on the demo model: the gate for keeping the bf16 mode (issue 6).

Each precision runs in a fresh process over the demo evaluation sets: the held-out corpus (generated
here exactly as ``make demo-model`` does, seed 2) and the hand-written everyday sentences. Reported:
F1 per set and precision, texts whose triples are identical between the two, single-text and batch
speed, RSS. The issue keeps bf16 only with identical triples or an F1 difference of at most 0.005.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import CACHE_DIR, PROJECT_ROOT, cpu_info, write_result
from bench.runner import run_worker
from nlp.config import DEMO_MODEL_DIR

logger = logging.getLogger(__name__)

MODEL = DEMO_MODEL_DIR
EVERYDAY = PROJECT_ROOT / "tests" / "training" / "data" / "everyday.jsonl"
HELDOUT = CACHE_DIR / "demo-heldout.jsonl"
F1_TOLERANCE = 0.005


def _heldout() -> str:
    if not HELDOUT.is_file():
        from training.corpus import write_corpus

        HELDOUT.parent.mkdir(parents=True, exist_ok=True)
        write_corpus(HELDOUT, 1000, 2, split="heldout")
    return str(HELDOUT)


def run(*, intra: int = 2, inter: int = 1, texts: int = 400) -> dict[str, Any]:
    if not cpu_info()["bf16"]:
        logger.warning("this CPU has no bf16 support: precision step skipped")
        return {}
    data = [_heldout(), str(EVERYDAY)]
    rows = {}
    for precision in ("fp32", "bf16"):
        args = ["--precision", precision, "--intra", str(intra), "--inter", str(inter)]
        args += ["--model", str(MODEL), "--texts", str(texts), "--data", *data]
        rows[precision] = run_worker("precision", *args)
    agreement = {}
    for name, ref in rows["fp32"]["sets"].items():
        got = rows["bf16"]["sets"][name]
        same = sum(a == b for a, b in zip(ref.pop("predicted"), got.pop("predicted"), strict=True))
        delta = got["scores"]["f1"] - ref["scores"]["f1"]
        agreement[name] = {
            "records": ref["records"],
            "identical_texts": same,
            "f1_fp32": ref["scores"]["f1"],
            "f1_bf16": got["scores"]["f1"],
            "f1_delta": round(delta, 4),
            "within_tolerance": same == ref["records"] or abs(delta) <= F1_TOLERANCE,
        }
    doc: dict[str, Any] = {
        "model": "models/demo",
        "f1_tolerance": F1_TOLERANCE,
        "runs": rows,
        "agreement": agreement,
        "keep_bf16": all(a["within_tolerance"] for a in agreement.values()),
        "single_text_speedup": round(
            rows["bf16"]["single_text"]["texts_per_s"] / rows["fp32"]["single_text"]["texts_per_s"],
            2,
        ),
    }
    logger.info("bf16 agreement: %s", agreement)
    write_result("precision", doc)
    return doc
