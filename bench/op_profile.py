"""Where a model call's time goes, and what the graph rewrites of ``nlp._graph_rewrites`` gain.

One worker process loads the RBT6 graph export in ``SessionRuntime`` twice per precision (fp32, and
int8 where ``bench.rbt6`` made its directory), both frozen: rewritten (as int8 and bf16 are served;
fp32 is served from its variables, see ``nlp.runtime.FROZEN_PRECISIONS``) and without the rewrites
(``graph_rewrites=False``, the graph as bert4keras wrote it). Then:

- latency: for each of ``ROUNDS`` rounds and each shape of ``SHAPES``, every runtime in turn runs 3
  warm-ups and ``CALLS`` timed calls; the median is reported;
- time per op type: ``TRACED_CALLS`` calls per runtime and shape under TensorFlow's full trace
  (``op_time_by_type``), median milliseconds per op type. Tracing adds its own cost
  to every op, so the shares, not the sums, are what to read.

``matmul`` below means every op whose type names a matrix product (``MatMul``, ``_FusedMatMul``,
``BatchMatMulV2``, ``Einsum``, the quantized matmuls); ``quantize`` the int8 conversions around them.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import write_result
from bench.runner import run_worker

logger = logging.getLogger(__name__)

SHAPES = ((1, 16), (1, 64), (1, 128), (8, 128))
ROUNDS = 3
CALLS = 15
TRACED_CALLS = 5
TOP_TYPES = 8


def op_time_by_type(runtime: Any, token_ids: Any, segment_ids: Any) -> dict[str, float]:
    """Milliseconds per op type in one traced call of ``runtime`` (an ``nlp.runtime.SessionRuntime``)
    at a warmed shape, from TensorFlow's step stats.

    Never on the request path: tracing slows the call it measures. Op types are those the runtime
    ran after grappler's rewrites (``_FusedMatMul``, ``_MklLayerNorm``...), which may differ from
    the graph's own. Not counted as a request (``runtime.runs`` is unchanged).
    """
    import tensorflow as tf

    runtime.check_shape(token_ids, segment_ids)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    runtime._run(token_ids, segment_ids, options=options, run_metadata=metadata)
    spent: dict[str, float] = {}
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            # timeline_label reads "name = OpType(inputs)"; _SOURCE and friends have none.
            label = node.timeline_label.partition(" = ")[2]
            op_type = label.partition("(")[0] or node.node_name.partition(":")[0]
            micros = node.all_end_rel_micros or (node.op_end_rel_micros - node.op_start_rel_micros)
            spent[op_type] = spent.get(op_type, 0.0) + micros / 1000.0
    return spent


def op_class(op_type: str) -> str:
    """``matmul``, ``quantize`` or ``other``.

    >>> [op_class(t) for t in ("_FusedMatMul", "Einsum", "QuantizeV2", "_MklLayerNorm")]
    ['matmul', 'matmul', 'quantize', 'other']
    """
    if "MatMul" in op_type or "Einsum" in op_type:
        return "matmul"
    if "Quantize" in op_type:
        return "quantize"
    return "other"


def run(*, intra: int = 2, inter: int = 1) -> dict[str, Any]:
    from bench.rbt6 import build_int8, build_model

    build_model()
    build_int8()  # None where it cannot be made here: fp32 alone is profiled then
    args = ["--intra", str(intra), "--inter", str(inter)]
    args += ["--rounds", str(ROUNDS), "--repeats", str(CALLS)]
    result = run_worker("profile", *args)
    doc = {
        "shapes": [f"{b}x{n}" for b, n in SHAPES],
        "rounds": ROUNDS,
        "calls_per_round": CALLS,
        "traced_calls": TRACED_CALLS,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        **result,
    }
    write_result("profile", doc)
    for line in table(doc):
        logger.info("%s", line)
    return doc


def _shares(ms_by_type: dict[str, float]) -> tuple[float, dict[str, float]]:
    total = sum(ms_by_type.values()) or 1.0
    classes: dict[str, float] = {}
    for op_type, ms in ms_by_type.items():
        classes[op_class(op_type)] = classes.get(op_class(op_type), 0.0) + ms
    return total, {k: v / total for k, v in classes.items()}


def table(doc: dict[str, Any]) -> list[str]:
    """The latency table (rewrites' speed-up in brackets) and the op-type breakdown, as Markdown."""
    runtimes = doc["runtimes"]
    names = list(runtimes)
    out = [
        "| batch x length | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for shape in doc["shapes"]:
        cells = []
        for name in names:
            ms = runtimes[name]["median_ms"][shape]
            base = runtimes.get(f"{name} unrewritten")
            gain = f" ({base['median_ms'][shape] / ms:.2f}x)" if base else ""
            cells.append(f"{ms:.1f}{gain}")
        out.append(f"| {shape} | " + " | ".join(cells) + " |")
    out.append(
        "| ops in the graph | " + " | ".join(f"{runtimes[n]['op_count']:,}" for n in names) + " |"
    )
    out += [
        "",
        "Traced time by op class and the largest op types (share of the traced call):",
        "",
        "| runtime | shape | matmul | quantize | other | largest op types |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        for shape in (doc["shapes"][0], doc["shapes"][-1]):
            by_type = runtimes[name]["ms_by_op_type"][shape]
            total, shares = _shares(by_type)
            top = sorted(by_type.items(), key=lambda kv: -kv[1])[:TOP_TYPES]
            tops = ", ".join(f"{t} {ms / total:.0%}" for t, ms in top)
            out.append(
                f"| {name} | {shape} | {shares.get('matmul', 0):.0%} | "
                f"{shares.get('quantize', 0):.0%} | {shares.get('other', 0):.0%} | {tops} |"
            )
    return out
