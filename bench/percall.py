"""Model-call latency at equal one-row shapes: spo's Session against the TF2 signature call.

Separates what the runtime itself costs per call from what padding costs: the memory run compares
whole requests, where spo pads to a warmed shape and the naive runtimes run each text's exact length.
"""

from __future__ import annotations

import logging
from typing import Any

from bench.common import write_result
from bench.runner import run_worker
from bench.worker import PERCALL_LENGTHS

logger = logging.getLogger(__name__)

RUNS = (("tf2-signature", "fp32"), ("spo", "fp32"), ("spo", "bf16"), ("spo", "int8"))


def run(*, intra: int = 2, inter: int = 1, repeats: int = 15) -> dict[str, Any]:
    from bench.common import cpu_info
    from bench.rbt6 import build_int8

    results = []
    for runtime, precision in RUNS:
        if precision == "bf16" and not cpu_info()["bf16"]:
            continue
        if precision == "int8" and build_int8() is None:
            continue
        args = ["--runtime", runtime, "--precision", precision, "--repeats", str(repeats)]
        args += ["--intra", str(intra), "--inter", str(inter)]
        results.append(run_worker("percall", *args))
        logger.info("%s %s: %s", runtime, precision, results[-1]["rows"])
    doc = {"lengths": list(PERCALL_LENGTHS), "intra_op_threads": intra, "runs": results}
    write_result("percall", doc)
    return doc
