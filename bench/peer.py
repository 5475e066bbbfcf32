"""spo's precisions against ONNX Runtime, the peer users would reach for, in the same interleaved runs.

One worker process loads every runtime on the RBT6 benchmark model: spo (the TF session) in each
precision it has (``nlp.config.PRECISIONS``, bf16 only on a CPU with bf16; a precision that needs its
own model directory, such as int8, when ``bench.rbt6`` provides one) and ``ort-fp32`` / ``ort-int8``
(ONNX Runtime over ``training.onnx_export``'s conversion of the same graph export, int8 by dynamic
quantization). Then, with intra-op 2 / inter-op 1 threads:

- per call: for each shape of ``SHAPES`` and each of ``ROUNDS`` rounds, every runtime in turn runs 3
  warm-ups and ``CALLS`` timed calls; the median over the rounds is reported;
- workload: single-text requests of the benchmark workload through the whole pipeline
  (``Extractor.extract``; one-row batches padded to the length buckets), the runtimes taking turns
  on blocks of texts; texts/s per runtime, and texts whose triples equal spo-fp32's.

Interleaving shares the machine's slow drifts (other load, frequency) fairly between the runtimes, so
the ratios hold even on a machine whose absolute times move. ONNX Runtime is an optional extra: without
it (or without the converter) the step says so and stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from bench.common import cpu_info, write_result
from bench.runner import run_worker

logger = logging.getLogger(__name__)

SHAPES = ((1, 16), (1, 32), (1, 64), (1, 128), (1, 256), (8, 128))
ROUNDS = 2
CALLS = 20
WORKLOAD_TEXTS = 600
WORKLOAD_BLOCK = 50
ORT_RUNTIMES = ("ort-fp32", "ort-int8")


def onnx_dirs(force: bool = False) -> dict[str, str]:
    """The ONNX conversions of the RBT6 graph export, converted once and cached beside it."""
    from bench.rbt6 import model_dirs
    from training.onnx_export import export_onnx

    graph = model_dirs()["graph"]
    out = {}
    for runtime in ORT_RUNTIMES:
        precision = runtime.split("-")[1]
        target = graph.parent / f"onnx-{precision}"
        if force or not (target / "model.json").is_file():
            logger.info("converting %s to ONNX (%s)", graph, precision)
            export_onnx(graph, target, precision=precision, force=True)
        out[runtime] = str(target)
    return out


def precision_dirs() -> dict[str, str]:
    """Model directories of spo's precisions that need their own (int8: ``spo quantize``'s copy),
    made by ``bench.rbt6.build_<precision>()`` where that exists and can make one here."""
    import bench.rbt6
    from nlp.config import PRECISIONS

    out = {}
    for precision in PRECISIONS:
        build = getattr(bench.rbt6, f"build_{precision}", None)
        if precision in ("fp32", "bf16") or build is None:
            continue
        model_dir = build()
        if model_dir is not None:
            out[precision] = str(model_dir)
    return out


def run(
    *, intra: int = 2, inter: int = 1, rounds: int = ROUNDS, texts: int = WORKLOAD_TEXTS
) -> dict[str, Any]:
    from training.onnx_export import OnnxExportError, _require_tools

    try:
        _require_tools()
    except OnnxExportError as exc:
        logger.warning("peer step skipped: %s", exc)
        return {}
    from bench.rbt6 import build_model

    # On a fresh checkout nothing is cached yet: build the RBT6 model first (what `python -m bench
    # model` does; a no-op once cached), so that the conversions below have a graph to convert.
    build_model()
    onnx_dirs()
    args = ["--intra", str(intra), "--inter", str(inter), "--repeats", str(rounds)]
    args += ["--texts", str(texts)]
    for precision, model_dir in precision_dirs().items():
        args += ["--mode-dir", f"{precision}={model_dir}"]
    result = run_worker("peer", *args)
    doc = {
        "shapes": [list(s) for s in SHAPES],
        "rounds": rounds,
        "calls_per_round": CALLS,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "bf16_cpu": cpu_info()["bf16"],
        **result,
    }
    doc["targets"] = targets(doc)
    write_result("peer", doc)
    for line in table(doc):
        logger.info("%s", line)
    return doc


def _ms(doc: dict[str, Any], runtime: str, shape: tuple[int, int]) -> float | None:
    row = doc["percall"].get(runtime, {})
    value = row.get(f"{shape[0]}x{shape[1]}")
    return None if value is None else float(value)


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    """Issue 11's latency targets that this step measures, each with its verdict."""
    singles = [s for s in SHAPES if s[0] == 1]
    up_to_128 = [s for s in singles if s[1] <= 128]
    spo = [r for r in doc["percall"] if r.startswith("spo-")]
    out: dict[str, Any] = {}

    def at_or_below(runtime: str, peer: str, shapes: list[tuple[int, int]]) -> dict[str, Any]:
        ratios = {}
        for s in shapes:
            mine, theirs = _ms(doc, runtime, s), _ms(doc, peer, s)
            if mine is not None and theirs:
                ratios[f"{s[0]}x{s[1]}"] = round(mine / theirs, 2)
        return {"ratios": ratios, "met": bool(ratios) and all(r <= 1.0 for r in ratios.values())}

    if "spo-fp32" in spo:
        out["fp32 <= ort-fp32 up to 128 tokens"] = at_or_below("spo-fp32", "ort-fp32", up_to_128)
    if spo:
        # One mode serves a worker, so the target asks of one mode at every bucket: each is held
        # to it, and the verdict is that of the mode whose worst bucket is closest to the peer.
        modes = {r: at_or_below(r, "ort-int8", singles) for r in spo}
        best = min(modes, key=lambda r: max(modes[r]["ratios"].values(), default=float("inf")))
        out["fastest spo mode <= ort-int8 at every single-text bucket"] = {
            "mode": best,
            **modes[best],
            "others": {r: v["ratios"] for r, v in modes.items() if r != best},
        }
    return out


def table(doc: dict[str, Any]) -> list[str]:
    """Markdown: median ms per call, and each runtime's ratio to spo fp32 (higher is faster)."""
    runtimes = list(doc["percall"])
    head = "| batch x length | " + " | ".join(runtimes) + " |"
    lines = [head, "|---" * (len(runtimes) + 1) + "|"]
    for s in SHAPES:
        row = {r: _ms(doc, r, s) for r in runtimes}
        lines.append(f"| {s[0]} x {s[1]} | " + _cells(row, lambda ms, base: base / ms) + " |")
    workload = doc.get("workload", {})
    if workload:
        row = {r: workload.get(r, {}).get("texts_per_s") for r in runtimes}
        cells = _cells(row, lambda tps, base: tps / base)
        lines.append("| workload, texts/s (single-text requests) | " + cells + " |")
    return lines


def _cells(row: dict[str, float | None], speedup: Callable[[float, float], float]) -> str:
    """One table row's cells: each runtime's value, with its ``speedup`` over spo-fp32's."""
    base = row.get("spo-fp32")
    cells = []
    for runtime, value in row.items():
        if value is None:
            cells.append("-")
        elif base and runtime != "spo-fp32":
            cells.append(f"{value:.1f} ({speedup(value, base):.2f}x)")
        else:
            cells.append(f"{value:.1f}")
    return " | ".join(cells)
