"""Post-training int8 quantization of a model directory (``spo quantize``): an offline tool.

Needs the optional extra ``neural-compressor-tf`` (``pip install 'spo-service[quantize]'``; in a
checkout ``make extra-quantize``); the server never imports this module and serves the result with
TensorFlow alone.

What it does, in order:

1. Checks every input before any work: the parent is an fp32 SavedModel directory and the output
   directory is free (or ``force``), as every converter checks them (``training.conversion``), and
   the calibration texts are non-empty.
2. Loads the parent's SavedModel in a ``compat.v1`` session and freezes it exactly as
   ``nlp.runtime`` does for bf16 (variables become constants, Dense bias-adds move before their
   reshapes, so each MatMul + BiasAdd pair is one pattern the quantizer can fuse).
3. Calibrates on real text: the calibration sentences are tokenized, windowed at the model's
   ``max_length`` and padded to the served bucket lengths, exactly as the service feeds the model,
   and run one at a time through Intel Neural Compressor's default ``StaticQuantConfig`` (per-tensor
   min-max: int8 weights, symmetric; uint8 activations, asymmetric, TensorFlow's MIN_FIRST mode). Every Dense becomes ``QuantizeV2`` +
   ``QuantizedMatMulWithBiasAndDequantize``; attention and pointer Einsums stay fp32.
4. Writes a SavedModel with the parent's tensor names and ``serving_default`` signature, its large
   constants (int8 weights, embeddings) turned back into variables (``_save`` says why: memory),
   its vocab, and a ``model.json`` recording ``"precision": "int8"`` and how it was made (tool and
   version, scheme, calibration source, size and sha256, parent). The directory is built
   beside ``out_dir`` and renamed into place, so a failed run leaves nothing half-written.

The default calibration set is the demo corpus (``training.corpus``, training names, seed
``DEFAULT_CALIBRATION_SEED``): never random tokens, whose activation ranges have nothing to do with
what the model will see.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from nlp.manifest import MANIFEST_NAME, Manifest, load_manifest, write_manifest
from training.conversion import check_conversion

logger = logging.getLogger(__name__)

TOOL = "neural-compressor-tf"
TOOL_VERSION = "3.10"
EXTRA_HINT = (
    f"spo quantize needs the optional extra {TOOL}=={TOOL_VERSION}: "
    "pip install 'spo-service[quantize]' (in a checkout: make extra-quantize)"
)
SCHEME = (
    "static, per-tensor min-max: int8 symmetric weights, uint8 asymmetric activations (MIN_FIRST)"
)
DEFAULT_CALIBRATION_TEXTS = 200
DEFAULT_CALIBRATION_SEED = 3
MAX_CALIBRATION_TEXTS = 1000


class QuantizeError(ValueError):
    """An input ``spo quantize`` cannot work with; the message says which and why."""


@dataclass(frozen=True)
class Calibration:
    """The texts quantization ranges are measured on, and where they came from."""

    texts: tuple[str, ...]
    source: str
    sha256: str
    path: Path | None = None  # the file read (an input the output must not replace)

    def record(self) -> dict[str, Any]:
        return {"source": self.source, "texts": len(self.texts), "sha256": self.sha256}


# -- inputs --------------------------------------------------------------------------------------


def read_calibration(path: str | Path, *, max_texts: int = MAX_CALIBRATION_TEXTS) -> Calibration:
    """Calibration texts from a file: JSON lines with a ``"text"`` string each (a corpus or the
    batch command's input), or plain text, one sentence a line. Blank lines are skipped.

    The format is decided by the first non-blank line: a JSON object means JSON lines, and then every
    line must be one. ``sha256`` is the file's (what ``sha256sum`` prints); only its first
    ``max_texts`` texts are used, and ``source`` says so when the file has more.
    """
    path = Path(path)
    if not path.is_file():
        raise QuantizeError(f"calibration file not found: {path}")
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise QuantizeError(f"{path}: not UTF-8 text ({exc})") from None
    lines = [(n, line.strip()) for n, line in enumerate(content.splitlines(), 1) if line.strip()]
    if not lines:
        raise QuantizeError(f"{path}: no calibration texts (the file is empty or blank)")
    texts: list[str] = []
    if _json_object(lines[0][1]) is not None:
        for n, line in lines:
            doc = _json_object(line)
            if doc is None:
                raise QuantizeError(
                    f"{path}, line {n}: not a JSON object (the file's first line is one, so every "
                    "line must be: JSON lines with a 'text' field)"
                )
            text = doc.get("text")
            if not isinstance(text, str):
                raise QuantizeError(f"{path}, line {n}: no 'text' string in the JSON object")
            if text.strip():
                texts.append(text)
    else:
        texts = [line for _, line in lines]
    if not texts:
        raise QuantizeError(f"{path}: no calibration texts (every 'text' is empty)")
    source = path.name
    if len(texts) > max_texts:
        source = f"{path.name} (first {max_texts} of {len(texts)} texts)"
        texts = texts[:max_texts]
    return Calibration(tuple(texts), source, hashlib.sha256(raw).hexdigest(), path)


def _json_object(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, nested too deeply, an integer too long
        return None
    return doc if isinstance(doc, dict) else None


def demo_calibration(
    count: int = DEFAULT_CALIBRATION_TEXTS, seed: int = DEFAULT_CALIBRATION_SEED
) -> Calibration:
    """The default set: ``count`` sentences of the demo corpus (training names, ``seed``).

    ``sha256`` is that of the file ``spo make-corpus FILE --n COUNT --seed SEED`` writes, so anyone
    can regenerate and check it.
    """
    from training.corpus import write_corpus

    with tempfile.TemporaryDirectory(prefix="spo-calibration-") as tmp:
        path = Path(tmp) / "calibration.jsonl"
        write_corpus(path, count, seed, split="train")
        found = read_calibration(path, max_texts=count)
    return Calibration(
        found.texts,
        f"demo corpus (spo make-corpus FILE --n {count} --seed {seed})",
        found.sha256,
    )


def tool_version() -> str:
    """The installed quantizer's version, or ``QuantizeError`` with the install hint."""
    try:
        version = metadata.version(TOOL)
    except metadata.PackageNotFoundError:
        raise QuantizeError(EXTRA_HINT) from None
    if version != TOOL_VERSION:
        raise QuantizeError(f"{TOOL} {version} is installed; this tool is tested with {EXTRA_HINT}")
    return version


# -- calibration feed ----------------------------------------------------------------------------


def calibration_inputs(manifest: Manifest, texts: Sequence[str]) -> list[tuple[Any, Any]]:
    """One ``(token_ids, segment_ids)`` pair per model window, shaped as the service shapes them.

    Each text is windowed at ``max_length`` like ``nlp.pipeline`` does (long texts give several
    windows) and padded to its one-row bucket length.
    """
    from nlp.bucketing import BucketSpec, pad_batch
    from nlp.pipeline import plan_windows
    from nlp.tokenization import Tokenizer

    tokenizer = Tokenizer.from_file(manifest.vocab_path, do_lower_case=manifest.do_lower_case)
    spec = BucketSpec(
        manifest.length_buckets,
        manifest.batch_buckets,
        None,
        single_row_step=manifest.single_row_length_step,
    )
    max_tokens = manifest.max_length - 2
    out = []
    for i, text in enumerate(texts):
        encoding = tokenizer.encode(text)
        for window in plan_windows(text, encoding, i, max_tokens, max_tokens // 4):
            if window.stop <= window.start:
                continue
            ids = [tokenizer.cls_id, *encoding.token_ids[window.start : window.stop]]
            ids.append(tokenizer.sep_id)
            length = spec.single_row_length(len(ids))
            tokens = pad_batch([ids], (1, length), pad_id=tokenizer.pad_id)
            out.append((tokens, np.zeros_like(tokens)))
    return out


class _CalibrationLoader:
    """What Neural Compressor iterates: ``(inputs, label)`` pairs, ``batch_size`` rows each."""

    batch_size = 1

    def __init__(self, feeds: list[dict[str, Any]]) -> None:
        self._feeds = feeds

    def __iter__(self) -> Iterator[tuple[dict[str, Any], None]]:
        for feed in self._feeds:
            yield feed, None

    def __len__(self) -> int:
        return len(self._feeds)

    def batch(self, batch_size: int) -> None:
        """Neural Compressor asks for another batch size when its sample count is not a multiple;
        every batch here is one row, so any count is."""


# -- the graph -----------------------------------------------------------------------------------


def _load_frozen(manifest: Manifest) -> tuple[Any, list[str], list[str], dict[str, Any]]:
    """The parent's frozen, bias-folded GraphDef, its input and output tensor names, and dtypes."""
    import tensorflow as tf

    from nlp.engine import check_output_heads, first_line, signature_inputs
    from nlp.errors import ModelLoadError
    from nlp.runtime import SIGNATURE, tensor_heads
    from nlp.tf_graph import freeze_graph_def, max_length_problem

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        try:
            meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(manifest.directory))
        except (tf.errors.OpError, OSError, ValueError, RuntimeError) as exc:
            # A truncated variables file, a graph that does not parse: named as the input's.
            raise QuantizeError(
                f"{manifest.directory}: TensorFlow cannot load its SavedModel: {first_line(exc)}"
            ) from None
        # As loading checks it: calibration pads to the longest bucket, past the positions there.
        problem = max_length_problem(graph, max(manifest.length_buckets), manifest.directory)
        if problem is not None:
            raise QuantizeError(problem)
        signature = meta.signature_def.get(SIGNATURE)
        if manifest.input_names is not None:
            inputs = list(manifest.input_names)
        elif signature is not None:
            try:
                keys = signature_inputs(list(signature.inputs), str(manifest.directory))
            except ModelLoadError as exc:
                raise QuantizeError(exc.message) from None
            inputs = [signature.inputs[k].name for k in keys]
        else:
            raise QuantizeError(
                f"{manifest.directory}: model.json names no inputs and no signature"
            )
        if manifest.output_names is not None:
            outputs = list(manifest.output_names)
        elif signature is not None:
            outputs = [signature.outputs[k].name for k in sorted(signature.outputs)]
        else:
            raise QuantizeError(
                f"{manifest.directory}: model.json names no outputs and no signature"
            )
        try:
            dtypes = {name: graph.get_tensor_by_name(name).dtype for name in inputs}
            found = [graph.get_tensor_by_name(name) for name in outputs]
        except (KeyError, ValueError) as exc:  # "Input-Token" without ":0", a name not there
            raise QuantizeError(
                f"{manifest.directory}: model.json's inputs and outputs must be tensors of its "
                f"graph (NAME:0): {str(exc).splitlines()[0]}"
            ) from None
        try:  # as loading checks it: else an int8 copy is written that no loader takes
            check_output_heads(
                [(t.name, tensor_heads(t)) for t in found],
                manifest.task.output_heads(manifest),
                str(manifest.directory),
            )
        except ModelLoadError as exc:
            raise QuantizeError(exc.message) from None
        try:
            graph_def = freeze_graph_def(session, graph, outputs)
        except (ValueError, TypeError, tf.errors.OpError) as exc:
            raise QuantizeError(
                f"{manifest.directory}: the graph cannot be frozen ({str(exc).splitlines()[0]}); "
                f"{GRAPH_EXPORT_HINT}"
            ) from None
    calls = sorted({n.op for n in graph_def.node if n.op in _FUNCTION_CALLS})
    if calls:  # the quantizer sees one opaque call and fails deep inside, in a page of traceback
        raise QuantizeError(
            f"{manifest.directory}: its model runs inside a TF2 function ({', '.join(calls)}: "
            f"spo export --mode tf2), which the quantizer cannot see into; {GRAPH_EXPORT_HINT}"
        )
    return graph_def, inputs, outputs, dtypes


GRAPH_EXPORT_HINT = "quantize a graph export (spo export --mode graph)"
_FUNCTION_CALLS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})


def quantize_graph(
    graph_def: Any,
    inputs: list[str],
    outputs: list[str],
    feeds: list[tuple[Any, Any]],
    dtypes: dict[str, Any],
) -> Any:
    """The int8 GraphDef Neural Compressor makes of ``graph_def``, calibrated on ``feeds``."""
    StaticQuantConfig, quantize_model, Model = _quantizer()
    # Its INFO log is a page per pass and its warnings are about the names it guesses for inputs
    # we name ourselves; errors still show. ``quantize`` logs the outcome.
    logging.getLogger("neural_compressor").setLevel(logging.ERROR)
    names = [name.split(":")[0] for name in inputs]
    loader = _CalibrationLoader(
        [
            {
                names[0]: tokens.astype(dtypes[inputs[0]].as_numpy_dtype),
                names[1]: segments.astype(dtypes[inputs[1]].as_numpy_dtype),
            }
            for tokens, segments in feeds
        ]
    )
    # Neural Compressor writes a workspace (under the working directory by default) and min/max
    # dumps (in the temp directory, never removed): both go to a private folder removed after.
    saved_tempdir = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="spo-quantize-") as work:
        tempfile.tempdir = work
        try:
            model = Model(graph_def, conf={"workspace_path": f"{work}/workspace/"})
            model.workspace_path = f"{work}/workspace/"
            model.input_tensor_names = inputs
            model.output_tensor_names = outputs
            quantized = quantize_model(
                model, StaticQuantConfig(), loader, calib_iteration=len(feeds)
            )
        finally:
            tempfile.tempdir = saved_tempdir
    if quantized is None:
        raise QuantizeError("the quantizer returned no model (see its log above)")
    return quantized.graph_def


def _quantizer() -> tuple[Any, Any, Any]:
    """Neural Compressor's ``StaticQuantConfig``, ``quantize_model`` and ``Model``.

    Its TensorFlow package imports Keras 3 (``from keras import ops``), while bert4keras (through
    ``nlp.tokenization``) has put ``tf.keras`` under the name ``keras``: the alias is lifted while
    the quantizer imports, then put back.
    """
    import sys

    alias = sys.modules.get("keras")
    lifted = alias is not None and "tf_keras" in getattr(alias, "__name__", "")
    if lifted:
        del sys.modules["keras"]
    # Its calibration reads the min/max that TensorFlow prints to file descriptor 2, through the
    # ``sys.stderr`` of its import time: that must be the process's own, not a test's or a
    # click runner's stand-in.
    stderr, sys.stderr = sys.stderr, sys.__stderr__
    try:
        from neural_compressor.tensorflow import StaticQuantConfig, quantize_model
        from neural_compressor.tensorflow.utils import Model
    finally:
        sys.stderr = stderr
        if alias is not None and lifted:
            sys.modules["keras"] = alias
    return StaticQuantConfig, quantize_model, Model


def count_ops(graph_def: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in graph_def.node:
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


# Constants of at least this many bytes become variables in the saved model (``_save``).
VARIABLE_BYTES = 4096


def _split_weights(graph_def: Any) -> tuple[Any, dict[str, Any]]:
    """``graph_def`` without its large ``Const`` nodes, and their values by node name."""
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    kept = tf.compat.v1.GraphDef()
    kept.versions.CopyFrom(graph_def.versions)
    kept.library.CopyFrom(graph_def.library)
    weights = {}
    for node in graph_def.node:
        if node.op == "Const" and len(node.attr["value"].tensor.tensor_content) >= VARIABLE_BYTES:
            weights[node.name] = tensor_util.MakeNdarray(node.attr["value"].tensor)
        else:
            kept.node.append(node)
    return kept, weights


def _save(graph_def: Any, inputs: list[str], outputs: list[str], path: Path) -> None:
    """A SavedModel of ``graph_def`` with a ``serving_default`` signature, its weights as variables.

    Neural Compressor returns a frozen graph: every weight a ``Const``. Saved that way (all weights
    inside ``saved_model.pb``), a served worker holds each weight about three times over (the
    imported graph, the session's copy, the kernels' tensors): +290 MiB RSS on RBT6 against fp32.
    As variables, restored from ``variables/`` like the fp32 export's, each is held once, and
    warm-up is faster (grappler has no large constants to fold). Tensor names are unchanged.
    """
    import tensorflow as tf

    from nlp.runtime import SIGNATURE

    kept, weights = _split_weights(graph_def)
    graph = tf.Graph()
    with graph.as_default():
        variables = {
            name: tf.compat.v1.get_variable(
                f"weights/{name}",
                shape=value.shape,
                dtype=tf.as_dtype(value.dtype),
                initializer=tf.compat.v1.zeros_initializer(),
                trainable=False,
                use_resource=False,
            )
            for name, value in weights.items()
        }
        tf.import_graph_def(
            kept, input_map={f"{name}:0": v.value() for name, v in variables.items()}, name=""
        )
    with tf.compat.v1.Session(graph=graph) as session:
        for name, variable in variables.items():
            session.run(variable.initializer, {variable.initial_value: weights[name]})
        builder = tf.compat.v1.saved_model.Builder(str(path))
        signature = tf.compat.v1.saved_model.build_signature_def(
            inputs={
                name.split(":")[0]: tf.compat.v1.saved_model.build_tensor_info(
                    graph.get_tensor_by_name(name)
                )
                for name in inputs
            },
            outputs={
                f"output_{i}": tf.compat.v1.saved_model.build_tensor_info(
                    graph.get_tensor_by_name(name)
                )
                for i, name in enumerate(outputs)
            },
            method_name=tf.compat.v1.saved_model.PREDICT_METHOD_NAME,
        )
        builder.add_meta_graph_and_variables(session, ["serve"], {SIGNATURE: signature})
        builder.save()


# -- the tool ------------------------------------------------------------------------------------


def quantize(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    calibration: Calibration | None = None,
    force: bool = False,
) -> Path:
    """Write the int8 model of fp32 ``model_dir`` to ``out_dir`` (see the module docstring)."""
    given = () if calibration is None or calibration.path is None else (calibration.path,)
    parent = check_conversion(
        model_dir, out_dir, force=force, action="quantize", error=QuantizeError, inputs=given
    )
    out = Path(out_dir)
    version = tool_version()
    from nlp.engine import int8_support

    reason = int8_support()
    if reason is not None:
        raise QuantizeError(f"this machine cannot run int8 models: {reason}")
    if calibration is None:
        calibration = demo_calibration()
    started = time.perf_counter()
    graph_def, inputs, outputs, dtypes = _load_frozen(parent)
    feeds = calibration_inputs(parent, calibration.texts)
    if not feeds:  # zero-width spaces and the like: the quantizer failed deep inside on nothing
        raise QuantizeError(
            f"{calibration.source}: none of its {len(calibration.texts)} texts gives the model a "
            "token to calibrate on: give texts of the kind the model will read"
        )
    logger.info(
        "calibrating on %d texts (%d windows) from %s",
        len(calibration.texts),
        len(feeds),
        calibration.source,
    )
    quantized = quantize_graph(graph_def, inputs, outputs, feeds, dtypes)
    del graph_def
    ops = count_ops(quantized)
    quantized_matmuls = sum(n for op, n in ops.items() if op.startswith("Quantized"))
    if not quantized_matmuls:
        raise QuantizeError(f"{TOOL} quantized no operation of {parent.directory}")
    from training.export import staged_model_dir

    # Staged beside ``out`` and renamed over it: a failure or a kill never leaves a half-written
    # directory, nor loses the one it replaces.
    with staged_model_dir(out, force=force, inputs=(model_dir, *given)) as saved:
        _save(quantized, inputs, outputs, saved)
        shutil.copyfile(parent.vocab_path, saved / "vocab.txt")
        document = json.loads((parent.directory / MANIFEST_NAME).read_text(encoding="utf-8"))
        document["vocab"] = {"path": "vocab.txt", "sha256": parent.vocab_sha256}
        document["inputs"] = {"token_ids": inputs[0], "segment_ids": inputs[1]}
        document["outputs"] = outputs
        document["precision"] = "int8"
        document["quantization"] = {
            "tool": TOOL,
            "tool_version": version,
            "scheme": SCHEME,
            "calibration": calibration.record(),
            "parent": {
                "name": parent.name,
                "version": parent.version,
                "saved_model_sha256": _sha256(parent.directory / "saved_model.pb"),
            },
            "quantized_ops": quantized_matmuls,
            "seconds": round(time.perf_counter() - started, 1),
        }
        write_manifest(saved, document)
        load_manifest(saved)  # what the service will check, before the directory is in place
    logger.info("int8 model written to %s (%d quantized ops)", out, quantized_matmuls)
    return out


def _sha256(path: Path) -> str:
    from nlp.manifest import sha256_file

    return sha256_file(path)
