"""The thread plan's data: per precision, the longest one-row call a one-thread session runs faster.

``python -m bench threadplan``: one fresh process per precision (fp32 frozen, bf16 where the CPU has
it, int8 where ``bench.rbt6`` made its directory) loads the RBT6 graph with ``--intra`` threads, then
a one-thread session of the same frozen graph (``SessionRuntime``'s thread plan) and reports:

- ``median_ms``: per length of ``LENGTHS``, both sessions interleaved (``ROUNDS`` rounds of
  ``CALLS`` calls each, median over all), and ``crossover``: the longest length up to which the one
  thread was faster at every length (what ``nlp.config.SHORT_CALL_PLANS`` is set from);
- ``extra_session_rss_mib``: what the second session costs, RSS after it has run every length minus
  RSS before it was made (its own copy of the frozen constants and its kernels' weight caches).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import PROJECT_ROOT, cpu_info, write_result
from bench.runner import worker_env

logger = logging.getLogger(__name__)

LENGTHS = (16, 24, 32, 40, 64, 96, 128)
ROUNDS = 5
CALLS = 8


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(precision: str, intra: int) -> dict[str, Any]:
    """In this process: the two sessions' per-call medians and the extra session's RSS."""
    import numpy as np

    from bench.rbt6 import build_model, int8_dir, vocab_size
    from nlp.manifest import load_manifest
    from nlp.runtime import SessionRuntime

    model_dir = int8_dir() if precision == "int8" else build_model()["graph"]
    m = load_manifest(model_dir)
    shapes = [(1, n) for n in LENGTHS]
    rt = SessionRuntime(model_dir, shapes=shapes, input_names=m.input_names,
                        output_names=m.output_names, n_outputs=m.n_outputs,
                        vocab_size=vocab_size(), intra_op_threads=intra, inter_op_threads=1,
                        precision=precision, freeze=True)  # fmt: skip
    from nlp.engine import release_free_heap

    release_free_heap()
    before = _rss_mib()
    rt._plan_sessions(((max(LENGTHS), 1),), 1, precision)
    sessions = {intra: rt._session, 1: rt._by_threads[1]}
    rng = np.random.default_rng(3)
    inputs = {n: rng.integers(672, 21000, size=(1, n)).astype(np.int32) for n in LENGTHS}

    def call(session: Any, n: int) -> None:
        ids = inputs[n]
        feed = {rt._inputs[0]: ids.astype(rt.input_dtypes[0]),
                rt._inputs[1]: np.zeros_like(ids).astype(rt.input_dtypes[1])}  # fmt: skip
        session.run(rt._outputs, feed_dict=feed)

    for n in LENGTHS:  # warm the new session on every length (and check both agree)
        call(sessions[1], n)
    release_free_heap()
    extra_rss = _rss_mib() - before
    times: dict[int, dict[int, list[float]]] = {t: {n: [] for n in LENGTHS} for t in sessions}
    for _ in range(ROUNDS):
        for n in LENGTHS:
            for threads, session in sessions.items():
                call(session, n)
                for _ in range(CALLS):
                    started = time.perf_counter()
                    call(session, n)
                    times[threads][n].append(time.perf_counter() - started)
    median = {t: {n: round(float(np.median(v)) * 1000, 2) for n, v in by.items()}
              for t, by in times.items()}  # fmt: skip
    crossover = 0
    for n in LENGTHS:
        if median[1][n] >= median[intra][n]:
            break
        crossover = n
    rt.close()
    return {
        "precision": precision,
        "intra_op_threads": intra,
        "median_ms": {str(t): {str(n): ms for n, ms in by.items()} for t, by in median.items()},
        "crossover": crossover,
        "rss_before_mib": round(before, 1),
        "extra_session_rss_mib": round(extra_rss, 1),
    }


def run(*, intra: int = 2) -> dict[str, Any]:
    from bench.rbt6 import build_int8, build_model

    build_model()
    precisions = ["fp32"]
    if cpu_info()["bf16"]:
        precisions.append("bf16")
    if build_int8() is not None:
        precisions.append("int8")
    results = []
    for precision in precisions:
        cmd = [sys.executable, "-m", "bench.threadplan", precision, "--intra", str(intra)]
        out = subprocess.run(cmd, cwd=PROJECT_ROOT, env=worker_env(), check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
        results.append(json.loads(out.strip().splitlines()[-1]))
        logger.info("threadplan %s", results[-1])
    doc = {"lengths": list(LENGTHS), "rounds": ROUNDS, "calls_per_round": CALLS, "runs": results}
    write_result("threadplan", doc)
    return doc


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.threadplan")
    parser.add_argument("precision")
    parser.add_argument("--intra", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(measure(args.precision, args.intra)))
