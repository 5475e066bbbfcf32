"""int8 against fp32: the issue-11 targets for ``precision: int8`` in one step.

- Speed (RBT6, random weights): spo fp32 and spo int8 in one process, interleaved rounds: model calls
  at the shapes of the issue's table (one row of 16..256 tokens, 8 x 128), then single-text requests
  of the workload in alternating blocks. Targets: >= 2x fp32 texts/s on single texts, >= 2.9x at
  8 x 128.
- Memory (RBT6): each in a fresh process through the memory worker (every bucket shape warmed, then
  ``requests`` single-text requests). Target: RSS after warm-up <= fp32's.
- Quality (the trained demo model): ``spo quantize models/demo`` with its default calibration, then
  ``training.evaluate.compare`` on the held-out set (as ``make demo-model`` generates it) and the
  everyday sentences. Targets: F1 within 0.01, identical triples on >= 97% of held-out texts.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import CACHE_DIR, PROJECT_ROOT, read_result, write_result
from bench.runner import run_worker

logger = logging.getLogger(__name__)

DEMO = PROJECT_ROOT / "models" / "demo"
DEMO_INT8 = CACHE_DIR / "demo-int8"
EVERYDAY = PROJECT_ROOT / "tests" / "training" / "data" / "everyday.jsonl"
TARGETS = {
    "single_text_speedup": 2.0,
    "batch_8x128_speedup": 2.9,
    "f1_delta": 0.01,
    "identical_share_heldout": 0.97,
}


def _demo_int8() -> Any:
    from nlp.manifest import load_manifest, sha256_file
    from training.quantize import quantize

    if (DEMO_INT8 / "model.json").is_file():
        parent = load_manifest(DEMO_INT8).quantization or {}
        if parent.get("parent", {}).get("saved_model_sha256") == sha256_file(
            DEMO / "saved_model.pb"
        ):
            return DEMO_INT8
    return quantize(DEMO, DEMO_INT8, force=True)


def quality() -> dict[str, Any]:
    from bench.precision import _heldout
    from training.evaluate import compare

    model = _demo_int8()
    sets = {}
    for path in (_heldout(), str(EVERYDAY)):
        result = compare(model, DEMO, path).to_dict()
        sets[path.rsplit("/", 1)[-1]] = result
        logger.info("int8 vs fp32 on %s: %s", path, result)
    return sets


def run(
    *, intra: int = 2, inter: int = 1, requests: int = 1000, steps: tuple[str, ...] = ()
) -> dict[str, Any]:
    from bench.rbt6 import build_int8

    steps = steps or ("speed", "memory", "quality")
    if build_int8() is None:
        logger.warning("no int8 model can be built here: int8 step skipped")
        return {}
    threads = ["--intra", str(intra), "--inter", str(inter)]
    # Sections not run now are kept from the last run (each is one measurement).
    previous = read_result("int8") or {}
    doc: dict[str, Any] = {k: previous[k] for k in ("speed", "memory", "quality") if k in previous}
    doc |= {"intra_op_threads": intra, "inter_op_threads": inter}
    doc["targets"] = TARGETS
    if "speed" in steps:
        doc["speed"] = run_worker("int8", *threads, "--requests", str(requests))
        logger.info("speed: %s", doc["speed"]["speedup"])
    if "memory" in steps:
        doc["memory"] = {}
        for name in ("spo", "spo-int8"):
            row = run_worker(
                "memory", "--runtime", name, "--requests", str(requests), "--rss-every", "250",
                *threads,
            )  # fmt: skip
            doc["memory"][name] = {
                k: row[k]
                for k in (
                    "rss_before_load_mib",
                    "rss_after_load_mib",
                    "rss_end_mib",
                    "growth_after_warm_mib",
                    "cold_start_s",
                    "load_s",
                    "warm_s",
                    "shapes_warmed",
                    "texts_per_s",
                    "latency_ms",
                )
            }
            logger.info("memory %s: %s", name, doc["memory"][name])
    if "quality" in steps:
        doc["quality"] = quality()
    write_result("int8", doc)
    return doc
