"""Session-wide fixtures: a vocabulary and tiny random-weight models built with bert4keras.

Nothing is downloaded. Each model is built and exported once per test session (a few seconds each);
tests get the directory path and load what they need. ``make_model_dir`` builds extra variants.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TINY_PREDICATES = [
    {"predicate": "出生地", "subject_type": "人物", "object_type": "地点"},
    {"predicate": "妻子", "subject_type": "人物", "object_type": "人物"},
    {"predicate": "作者", "subject_type": "图书作品", "object_type": "人物"},
]
TINY_ENTITY_TYPES = ["人物", "地点", "机构"]
TINY_LENGTH_BUCKETS = [16, 32, 64]
TINY_BATCH_BUCKETS = [1, 2, 4, 8]


def _vocab_tokens() -> list[str]:
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(1, 10)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += list(string.ascii_lowercase + string.digits + "，。！？；：、《》（）“”")
    tokens += ["##" + c for c in string.ascii_lowercase + string.digits]
    tokens += ["the", "##ing", "bert"]
    tokens += [chr(c) for c in range(0x4E00, 0x9FA6)]
    seen: set[str] = set()
    return [t for t in tokens if not (t in seen or seen.add(t))]  # type: ignore[func-returns-value]


@pytest.fixture(autouse=True)
def no_exec_in_the_test_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``spo serve`` invoked in-process (``CliRunner``) that got past the checks a test expects to
    refuse would exec gunicorn in place of the test run, which then ends with status 0 and no
    output: the test fails instead. (Subprocesses exec through ``_posixsubprocess``, untouched.)"""
    import os

    def no_exec(path: str, *args: Any) -> None:
        raise AssertionError(f"the test process would exec {path}")

    monkeypatch.setattr(os, "execve", no_exec)


@pytest.fixture(scope="session")
def vocab_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(_vocab_tokens()) + "\n", encoding="utf-8")
    return path


ModelFactory = Callable[..., Path]


POINTER_LAYERS = {"entity": 0.975, "head": 0.85, "tail": 0.85, "entities": 0.98}


def _randomize(model: Any, seed: int, jitter_constants: bool = False) -> None:
    """Seeded random weights that make a useful test model.

    Keras initializers depend on how many models the process has built, so weights are drawn with
    numpy: constant tensors (LayerNorm gains, biases) keep their init (with ``jitter_constants``,
    plus N(0, 0.1) noise, as in a trained model), the rest get scale 1/sqrt(fan-in). Each pointer head is then shifted (through its per-head bias, the last weight of
    an EfficientGlobalPointer) so that a fixed share of positions score above 0 on sample input:
    a few spans and a few triples per sentence at threshold 0, rather than none or all.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        weights = [
            rng.normal(0.0, 1.0 / np.sqrt(w.shape[0]), w.shape).astype(np.float32) * 4.0
            if layer.name in POINTER_LAYERS and w.size and not np.all(w == w.flat[0])
            else rng.normal(0.0, 1.0 / np.sqrt(w.shape[0]), w.shape).astype(np.float32)
            if w.size and not np.all(w == w.flat[0])
            else (w + rng.normal(0.0, 0.1, w.shape)).astype(np.float32)
            if jitter_constants
            else w
            for w in layer.get_weights()
        ]
        layer.set_weights(weights)
    ids = rng.integers(104, 20000, size=(8, 24)).astype(np.float32)
    ids[:, 0], ids[:, -1] = 2, 3
    scores = model.predict([ids, np.zeros_like(ids)], verbose=0)
    scores = scores if isinstance(scores, list) else [scores]
    pointers = [layer for layer in model.layers if layer.name in POINTER_LAYERS]
    for layer, out in zip(pointers, scores, strict=True):
        weights = layer.get_weights()
        upper = np.triu_indices(out.shape[-1] - 2)
        for h in range(out.shape[1]):
            block = out[:, h, 1:-1, 1:-1][:, upper[0], upper[1]]
            shift = float(np.quantile(block[np.isfinite(block)], POINTER_LAYERS[layer.name]))
            weights[-1][2 * h] -= shift
            weights[-1][2 * h + 1] -= shift
        layer.set_weights(weights)


@pytest.fixture(scope="session")
def make_model_dir(
    tmp_path_factory: pytest.TempPathFactory, vocab_path: Path
) -> Iterator[ModelFactory]:
    """Build and export a tiny random model; returns its directory. Seeded: same weights every run."""
    import nlp  # noqa: F401
    from nlp.manifest import manifest_document, sha256_file
    from training.export import export_model_dir
    from training.gplinker import TINY_BERT_CONFIG, build_gplinker, build_ner

    def make(
        task: str = "triples",
        *,
        mode: str = "graph",
        seed: int = 7,
        threshold: float = 0.0,
        jitter_constants: bool = False,
        **manifest_overrides: Any,
    ) -> Path:
        config = {**TINY_BERT_CONFIG, "vocab_size": len(_vocab_tokens())}
        if task == "triples":

            def build() -> Any:
                return build_gplinker(config, len(TINY_PREDICATES), head_size=16)
        else:

            def build() -> Any:
                return build_ner(config, len(TINY_ENTITY_TYPES), head_size=16)

        model = build()
        _randomize(model, seed, jitter_constants)
        weights = model.get_weights()
        doc = manifest_document(
            name=f"tiny-{task}",
            version=f"{seed}",
            task=task,
            predicates=TINY_PREDICATES if task == "triples" else None,
            entity_types=TINY_ENTITY_TYPES if task == "entities" else None,
            vocab_path=str(vocab_path),
            vocab_sha256=sha256_file(vocab_path),
            max_length=TINY_LENGTH_BUCKETS[-1],
            threshold=threshold,
            length_buckets=TINY_LENGTH_BUCKETS,
            batch_buckets=TINY_BATCH_BUCKETS,
        )
        doc.update(manifest_overrides)
        out = tmp_path_factory.mktemp(f"model-{task}-{mode}") / "model"
        return export_model_dir(build, weights, out, doc, mode=mode)

    yield make


@pytest.fixture(scope="session")
def triples_model_dir(make_model_dir: ModelFactory) -> Path:
    """Tiny GPLinker, graph-mode export (tensor names in model.json)."""
    return make_model_dir("triples", threshold=0.0)


@pytest.fixture(scope="session")
def entities_model_dir(make_model_dir: ModelFactory) -> Path:
    """Tiny typed GlobalPointer NER, graph-mode export."""
    return make_model_dir("entities", threshold=0.0)


@pytest.fixture(scope="session")
def onnx_model_dirs(
    triples_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The tiny GPLinker converted by ``spo export-onnx``: ``{"fp32": dir, "int8": dir}``.

    Needs the optional ``onnx`` extra (``make test`` installs it).
    """
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: make extra-onnx")
    pytest.importorskip("tf2onnx", reason="the onnx extra is not installed: make extra-onnx")
    from training.onnx_export import export_onnx

    base = tmp_path_factory.mktemp("onnx")
    return {p: export_onnx(triples_model_dir, base / p, precision=p) for p in ("fp32", "int8")}


@pytest.fixture(scope="session")
def openvino_model_dirs(
    triples_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The tiny GPLinker converted by ``spo export-openvino``: ``{"fp32": dir, "int8": dir}`` (int8
    calibrated on 60 sentences of the synthetic generator).

    Needs the optional ``openvino`` extra (``make test`` installs it).
    """
    pytest.importorskip(
        "openvino", reason="the openvino extra is not installed: make extra-openvino"
    )
    pytest.importorskip("nncf", reason="the openvino extra is not installed: make extra-openvino")
    from training.openvino_export import export_openvino

    base = tmp_path_factory.mktemp("openvino")
    return {
        p: export_openvino(triples_model_dir, base / p, precision=p, samples=60)
        for p in ("fp32", "int8")
    }
