"""The benchmark model: an RBT6-size GPLinker with seeded random weights, exported both ways.

Built once and cached in ``bench/.cache/rbt6-<key>/{graph,tf2}``: ``graph`` (``simple_save``, what the
spo runtime serves) and ``tf2`` (``tf.saved_model.save``, what the naive TF2 runtimes load). Both hold
the same weights and the same ``model.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from bench.common import CACHE_DIR, VOCAB_PATH

logger = logging.getLogger(__name__)

N_PREDICATES = 50
HEAD_SIZE = 64
MAX_LENGTH = 256
SEED = 20240601
# Shares of upper-triangle positions left above threshold 0 on sample input, per pointer layer:
# a few entities and triples per sentence (random weights would otherwise give none or thousands).
POINTER_QUANTILES = {"entity": 0.995, "head": 0.998, "tail": 0.998}


def rbt6_config(vocab_size: int) -> dict[str, Any]:
    """RBT6 (Chinese RoBERTa-wwm-ext, 6 layers): BERT-base width, half the depth."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
    }


def vocab_size() -> int:
    with VOCAB_PATH.open(encoding="utf-8") as fh:
        return sum(1 for _ in fh)


def flops_per_token(
    length: int,
    *,
    hidden: int = 768,
    layers: int = 6,
    intermediate: int = 3072,
    n_predicates: int = N_PREDICATES,
    head_size: int = HEAD_SIZE,
) -> float:
    """Forward FLOPs per token at sequence length ``length`` (2 FLOPs per multiply-add).

    Per layer: Q, K, V and output projections (4 h^2), the feed-forward block (2 h i), attention
    scores and the weighted sum (2 L h). Heads: three EfficientGlobalPointers, each a dense h -> 2d,
    a dense 2d -> 2 x heads, and the L x d pair scores. Embedding look-ups, softmax, LayerNorm and
    GELU are not counted (a few percent).
    """
    per_layer = 4 * hidden * hidden + 2 * hidden * intermediate + 2 * length * hidden
    pointer_heads = (2, n_predicates, n_predicates)
    heads = sum(
        hidden * 2 * head_size + 2 * head_size * 2 * h + length * head_size for h in pointer_heads
    )
    return 2.0 * (layers * per_layer + heads)


def predicates() -> list[dict[str, str]]:
    return [
        {"predicate": f"关系{i:02d}", "subject_type": "实体", "object_type": "实体"}
        for i in range(N_PREDICATES)
    ]


def cache_key() -> str:
    from nlp.manifest import sha256_file

    doc = {
        "config": rbt6_config(vocab_size()),
        "vocab": sha256_file(VOCAB_PATH),
        "seed": SEED,
        "quantiles": POINTER_QUANTILES,
        "max_length": MAX_LENGTH,
        "format": 2,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def model_dirs() -> dict[str, Path]:
    base = CACHE_DIR / f"rbt6-{cache_key()}"
    return {"graph": base / "graph", "tf2": base / "tf2"}


def _randomize(model: Any, seed: int) -> None:
    """BERT-style N(0, 0.02) weights drawn with numpy (seeded); tensors initialised to a constant
    (biases, LayerNorm gains and offsets) get N(0, 0.02) added to it, as training leaves them.
    Then each pointer head's bias is shifted so that the share of positions in
    ``POINTER_QUANTILES`` scores above 0 on sample input.

    Exactly-zero biases and unit gains would be unlike any trained model, and grappler drops an
    addition of zeros or a product with ones, so the graph served would not be the one a real model
    gets (no bias-add left to fuse into a matmul, no LayerNorm pattern to fuse).
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        layer.set_weights(
            [
                rng.normal(0.0, 0.02, w.shape).astype(np.float32)
                if w.size and not np.all(w == w.flat[0])
                else (w + rng.normal(0.0, 0.02, w.shape)).astype(np.float32)
                for w in layer.get_weights()
            ]
        )
    ids = rng.integers(672, 20000, size=(8, 48)).astype(np.float32)
    ids[:, 0], ids[:, -1] = 101, 102
    scores = model.predict([ids, np.zeros_like(ids)], verbose=0)
    pointers = [layer for layer in model.layers if layer.name in POINTER_QUANTILES]
    for layer, out in zip(pointers, scores, strict=True):
        weights = layer.get_weights()
        upper = np.triu_indices(out.shape[-1] - 2)
        for h in range(out.shape[1]):
            block = out[:, h, 1:-1, 1:-1][:, upper[0], upper[1]]
            shift = float(np.quantile(block[np.isfinite(block)], POINTER_QUANTILES[layer.name]))
            weights[-1][2 * h] -= shift
            weights[-1][2 * h + 1] -= shift
        layer.set_weights(weights)


def build_model(force: bool = False) -> dict[str, Path]:
    """Build and export the RBT6 model (both kinds) unless the cache has it; returns the dirs."""
    dirs = model_dirs()
    if not force and all((d / "model.json").is_file() for d in dirs.values()):
        return dirs
    logger.info("building the RBT6 benchmark model in %s (once; cached)", dirs["graph"].parent)
    import nlp  # noqa: F401  (sets TF_KERAS before TensorFlow is imported)
    from nlp.manifest import manifest_document, sha256_file
    from training.export import export_model_dir
    from training.gplinker import build_gplinker

    started = time.perf_counter()
    config = rbt6_config(vocab_size())

    def build() -> Any:
        return build_gplinker(config, N_PREDICATES, head_size=HEAD_SIZE)

    model = build()
    _randomize(model, SEED)
    weights = model.get_weights()
    doc = manifest_document(
        name="rbt6-bench",
        version=cache_key(),
        task="triples",
        predicates=predicates(),
        vocab_path=str(VOCAB_PATH),
        vocab_sha256=sha256_file(VOCAB_PATH),
        max_length=MAX_LENGTH,
    )
    for mode, out in dirs.items():
        export_model_dir(build, weights, out, doc, mode=mode, force=True)
    params = int(sum(w.size for w in weights))
    (dirs["graph"].parent / "info.json").write_text(
        json.dumps(
            {"parameters": params, "config": config, "seconds": time.perf_counter() - started}
        )
    )
    logger.info(
        "built RBT6 GPLinker (%d parameters) in %.0fs", params, time.perf_counter() - started
    )
    return dirs


def int8_dir() -> Path:
    """Where the int8 copy of the graph export lives (``build_int8``)."""
    return CACHE_DIR / f"rbt6-{cache_key()}" / "int8"


INT8_CALIBRATION_TEXTS = 100


def build_int8(force: bool = False) -> Path | None:
    """``spo quantize`` of the graph export (demo-corpus calibration, as the tool's default), unless
    cached; ``None`` where it cannot be made (no quantize extra, or no oneDNN int8 here)."""
    out = int8_dir()
    if not force and (out / "model.json").is_file():
        return out
    import nlp  # noqa: F401  (sets TF_KERAS before TensorFlow is imported)
    from training.quantize import QuantizeError, demo_calibration, quantize

    try:
        started = time.perf_counter()
        quantize(
            model_dirs()["graph"],
            out,
            calibration=demo_calibration(INT8_CALIBRATION_TEXTS),
            force=True,
        )
    except QuantizeError as exc:
        logger.warning("no int8 model: %s", exc)
        return None
    logger.info("quantized the RBT6 model in %.0fs", time.perf_counter() - started)
    return out
