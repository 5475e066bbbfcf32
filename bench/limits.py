"""Bounded work per request on the benchmark model: per-token cost and the worst-case request.

``python -m bench limits`` loads the RBT6 graph export in this process (one worker's view: every usable
CPU as intra-op threads, from ``app.core.sizing``) and measures:

- the model's cost per request token at full 256-token windows (the worst case per token: attention
  grows with the window) for requests of a few sizes, so the cost is seen to be linear;
- the worst request the body limit lets through without a token limit (as many 10,000-character texts
  as fit in ``SPO_MAX_BODY_BYTES``): its token count and how long it runs (``--worst-texts`` caps the
  texts actually run; the rest is extrapolated from the measured per-token cost and said so);
- the same request through the app with the default settings (413 ``request_too_large``: tokenizing
  and counting only), and the largest request the default limit accepts (its run time).

The default ``SPO_MAX_REQUEST_TOKENS`` is sized from the per-token cost: docs/rest.md gives the arithmetic.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from typing import Any

from bench.common import write_result
from nlp.config import DEFAULT_MAX_TEXT_CHARS

logger = logging.getLogger(__name__)

TEXT_CHARS = DEFAULT_MAX_TEXT_CHARS  # the worst request: every text at the default limit


def _long_text(chars: int, offset: int = 0) -> str:
    from bench.workload import texts

    pool = texts()
    out: list[str] = []
    size = 0
    i = offset
    while size < chars:
        out.append(pool[i % len(pool)])
        size += len(out[-1])
        i += 1
    return "".join(out)[:chars]


def run(*, repeats: int = 3, worst_texts: int | None = None) -> dict[str, Any]:
    import nlp  # noqa: F401  (TF_KERAS before TensorFlow)
    from app import create_app
    from app.core.settings import Settings
    from app.core.sizing import Machine, plan
    from bench.rbt6 import model_dirs
    from nlp.pipeline import Extractor

    machine = Machine.probe()
    sizing = plan(machine, workers=1)
    model_dir = model_dirs()["graph"]
    started = time.perf_counter()
    extractor = Extractor.load(
        model_dir, intra_op_threads=sizing.intra_op_threads, inter_op_threads=1
    )
    logger.info("loaded %s in %.1fs", model_dir, time.perf_counter() - started)

    # Per-token cost at full windows: texts of ~2,000 characters are ~10 full windows each.
    per_token: list[dict[str, Any]] = []
    for n_texts in (1, 4, 8):
        texts = [_long_text(2_000, offset=97 * i) for i in range(n_texts)]
        p = extractor.plan(texts)
        extractor.run(p)  # warm this mix once
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            extractor.run(p)
            times.append(time.perf_counter() - t)
        seconds = statistics.median(times)
        per_token.append(
            {
                "texts": n_texts,
                "tokens": p.tokens,
                "windows": len(p.windows),
                "seconds": round(seconds, 3),
                "ms_per_token": round(1000 * seconds / p.tokens, 4),
            }
        )
        logger.info("per-token: %s", per_token[-1])
    ms_per_token = max(r["ms_per_token"] for r in per_token)

    # The worst request the body limit lets through.
    settings = Settings(model_dir=model_dir, workers=1)
    text = _long_text(TEXT_CHARS)
    per_text_bytes = len(json.dumps(text, ensure_ascii=False).encode()) + 1
    n_worst = min(settings.max_texts, (settings.max_body_bytes - 16) // per_text_bytes)
    worst = [_long_text(TEXT_CHARS, offset=31 * i) for i in range(n_worst)]
    body = json.dumps({"texts": worst}, ensure_ascii=False).encode()
    assert len(body) <= settings.max_body_bytes, len(body)
    t = time.perf_counter()
    worst_plan = extractor.plan(worst)
    plan_seconds = time.perf_counter() - t
    run_n = n_worst if worst_texts is None else min(worst_texts, n_worst)
    part = extractor.plan(worst[:run_n])
    t = time.perf_counter()
    extractor.run(part)
    part_seconds = time.perf_counter() - t
    before = {
        "texts": n_worst,
        "chars_per_text": TEXT_CHARS,
        "body_bytes": len(body),
        "tokens": worst_plan.tokens,
        "windows": len(worst_plan.windows),
        "texts_run": run_n,
        "seconds_run": round(part_seconds, 2),
        "seconds_whole_request": round(part_seconds * worst_plan.tokens / part.tokens, 1),
        "extrapolated": run_n < n_worst,
        "tokenize_seconds": round(plan_seconds, 3),
    }
    logger.info("worst case before: %s", before)

    # After: the same body through the app with the default settings, and the largest accepted one.
    app = create_app(settings, loader=lambda s: extractor)
    client = app.test_client()
    t = time.perf_counter()
    response = client.post("/v1/extract", data=body, content_type="application/json")
    refused_seconds = time.perf_counter() - t
    problem = response.get_json()
    limit = settings.max_request_tokens
    accepted = [_long_text(2_000, offset=7 * i) for i in range(64)]
    while extractor.plan(accepted).tokens > limit:
        accepted.pop()
    accepted_tokens = extractor.plan(accepted).tokens
    t = time.perf_counter()
    ok = client.post("/v1/extract", json={"texts": accepted})
    accepted_seconds = time.perf_counter() - t
    after = {
        "status": response.status_code,
        "code": problem.get("code"),
        "tokens": problem.get("tokens"),
        "limit": problem.get("limit"),
        "seconds": round(refused_seconds, 3),
        "largest_accepted": {
            "status": ok.status_code,
            "texts": len(accepted),
            "tokens": accepted_tokens,
            "seconds": round(accepted_seconds, 2),
        },
    }
    logger.info("after: %s", after)
    extractor.close()
    doc = {
        "model": str(model_dir),
        "sizing": sizing.lines(),
        "per_token": per_token,
        "ms_per_token_worst": ms_per_token,
        "default_max_request_tokens": limit,
        "seconds_at_default_limit": round(limit * ms_per_token / 1000, 2),
        "worst_before": before,
        "worst_after": after,
    }
    write_result("limits", doc)
    return doc
