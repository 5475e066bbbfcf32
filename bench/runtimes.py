"""The runtimes compared, each behind the same ``run(token_ids, segment_ids) -> [entity, head, tail]``.

Every runtime sits under the same ``nlp.pipeline.Extractor`` (same tokenization, windowing and
decoding), so only the model call differs:

- ``tf2-call``: ``tf.saved_model.load`` of the TF2 export, the object called directly with
  ``tf.constant`` inputs at each text's exact length (the common TF2 serving code);
- ``tf2-signature``: the same object through its ``serving_default`` signature;
- ``tf2-function``: a ``tf.function`` with an ``input_signature`` of ``None`` dims around the call;
- ``spo`` / ``spo-jemalloc``: ``Extractor.load`` of the graph export (Session, bucketed shapes, warmed),
  the latter in a process started with jemalloc in ``LD_PRELOAD``;
- ``spo-bf16``: ``spo`` with ``precision="bf16"`` (opt-in mode; not one of the fp32 comparisons);
- ``ort-fp32`` / ``ort-int8``: ``Extractor.load`` of the ONNX conversions of the graph export
  (``bench.peer.onnx_dirs``): the opt-in ``onnx`` engine, ONNX Runtime behind the same buckets.
- ``spo-int8``: ``spo`` over the int8 copy of the graph export (``spo quantize``, ``precision="int8"``).
- ``ov-fp32`` / ``ov-int8``: ``Extractor.load`` of the OpenVINO conversions of the graph export
  (``bench.peer.openvino_dirs``; int8 by NNCF): the opt-in ``openvino`` engine behind the same buckets.

Each naive runtime implements ``nlp.protocols.Runtime``, the interface ``Extractor`` runs its model
through. TensorFlow is imported inside the functions: a process picks one runtime.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nlp.config import LoadOptions

if TYPE_CHECKING:
    from nlp.pipeline import Extractor

RUNTIMES = (
    "tf2-call",
    "tf2-signature",
    "tf2-function",
    "spo",
    "spo-jemalloc",
    "spo-bf16",
    "ort-fp32",
    "ort-int8",
    "spo-int8",
    "ov-fp32",
    "ov-int8",
)
NAIVE = ("tf2-call", "tf2-signature", "tf2-function")
ORT = ("ort-fp32", "ort-int8")
OV = ("ov-fp32", "ov-int8")


class NaiveRuntime:
    """A TF2 eager runtime fed exact-length inputs (any shape, none warmed); records the shapes seen."""

    def __init__(self, model_dir: str, kind: str) -> None:
        import tensorflow as tf

        self.kind = kind
        self.shapes: frozenset[tuple[int, int]] = frozenset()
        self.shapes_fed: set[tuple[int, int]] = set()
        started = time.perf_counter()
        self.model = tf.saved_model.load(model_dir)
        signature = self.model.signatures["serving_default"]
        specs = signature.structured_input_signature[1]
        self.input_keys = sorted(specs)
        token_key = next((k for k in self.input_keys if "token" in k.lower()), self.input_keys[0])
        self.input_keys = [token_key, *(k for k in self.input_keys if k != token_key)]
        self.dtype = specs[token_key].dtype
        self.signature = signature
        if kind == "tf2-function":
            spec = tf.TensorSpec([None, None], self.dtype)
            model = self.model

            def call(token_ids: Any, segment_ids: Any) -> Any:
                return model([token_ids, segment_ids])

            self.function = tf.function(call, input_signature=[spec, spec])
        self.load_seconds = time.perf_counter() - started
        self.warm_seconds = 0.0
        self._tf = tf

    def run(self, token_ids: np.ndarray, segment_ids: np.ndarray) -> list[np.ndarray]:
        self.shapes_fed.add((int(token_ids.shape[0]), int(token_ids.shape[1])))
        tf = self._tf
        tokens = tf.constant(token_ids, dtype=self.dtype)
        segments = tf.constant(segment_ids, dtype=self.dtype)
        if self.kind == "tf2-call":
            out = self.model([tokens, segments])
        elif self.kind == "tf2-function":
            out = self.function(tokens, segments)
        else:
            result = self.signature(**dict(zip(self.input_keys, (tokens, segments), strict=True)))
            out = [result[k] for k in sorted(result)]
        return [o.numpy() for o in out]

    def close(self) -> None:
        pass


def extractor_for(
    kind: str, dirs: dict[str, str], intra: int, inter: int, precision: str = "fp32"
) -> Extractor:
    """An ``Extractor`` over runtime ``kind``, with ``intra`` / ``inter`` TensorFlow threads."""
    from nlp.loader import load_extractor

    if kind in ORT:
        from bench.peer import onnx_dirs

        return load_extractor(
            LoadOptions(Path(onnx_dirs()[kind]), intra_op_threads=intra, inter_op_threads=inter)
        )
    if kind in OV:
        from bench.peer import openvino_dirs

        return load_extractor(
            LoadOptions(
                Path(openvino_dirs()[kind.split("-")[1]]),
                intra_op_threads=intra,
                inter_op_threads=inter,
            )
        )
    if kind == "spo-int8":
        precision = "int8"
    options = LoadOptions(
        Path(dirs["int8" if precision == "int8" else "graph"]),
        precision="bf16" if kind == "spo-bf16" else precision,
        intra_op_threads=intra,
        inter_op_threads=inter,
    )
    if kind not in NAIVE:
        return load_extractor(options)
    import tensorflow as tf

    from nlp.bucketing import BucketSpec
    from nlp.manifest import load_manifest
    from nlp.pipeline import Extractor
    from nlp.tokenization import Tokenizer

    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    manifest = load_manifest(dirs["tf2"])
    tokenizer = Tokenizer.from_file(manifest.vocab_path, do_lower_case=manifest.do_lower_case)
    # One "bucket" per length and batches of one: every input runs at its exact shape, as naive
    # TF2 serving code does.
    exact = BucketSpec(tuple(range(3, manifest.max_length + 1)), (1,), None)
    runtime = NaiveRuntime(str(dirs["tf2"]), kind)
    return Extractor(
        manifest, tokenizer, runtime, max_text_chars=options.max_text_chars, buckets=exact
    )
