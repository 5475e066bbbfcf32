"""Convert a model directory's SavedModel to ONNX for the opt-in ``onnx`` engine (offline tool).

``export_onnx(MODEL_DIR, OUT)`` writes a new model directory: ``model.onnx``, ``model.json`` (the
source manifest plus an ``engine`` section: engine, file and hash, opset, tool versions and, for
int8, the quantization) and ``vocab.txt``. ``spo export-onnx`` is the command over it.

The graph is the one ``nlp.runtime`` serves: the SavedModel loaded into a ``compat.v1`` session, its
variables frozen into constants, then converted by tf2onnx 1.17 with four corrections, each needed
by this model family (bert4keras GPLinker / GlobalPointer):

- ``BroadcastArgs`` (from ``tf.broadcast_to`` in the pointer heads' masking) has no tf2onnx handler:
  here it is ``Where(a == 1, b, a)`` over the two shapes, left-padded with ones to equal length.
- ``Select``/``SelectV2`` become ONNX ``Where``. tf2onnx lowers them to ``x*c + y*(1-c)`` unless it
  sees a NaN/inf constant; the heads' ``-inf`` mask arrives through ``BroadcastTo``, so the lowering
  computes ``-inf * 0 = NaN`` and every output turns NaN.
- tf2onnx's back-to-back ``Reshape`` merge drops the first reshape even when the second shape holds a
  ``0`` (ONNX: copy that dim from the input), which then copies from the wrong tensor: merging is kept
  only when the second shape is a constant without zeros.
- tf2onnx's duplicate-node merge is turned off: it also merges constants, and in a model whose
  kernels happen to be identical (random or re-initialised heads) the merged graph is wrong.

``int8`` is ONNX Runtime's dynamic quantization of the fp32 graph (int8 weights, activations
quantized per call): no calibration set is needed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from training import missing_modules
from training.conversion import check_conversion

logger = logging.getLogger(__name__)

OPSET = 17
QUANTIZATIONS = ("fp32", "int8")
ONNX_FILE = "model.onnx"
EXTRA_HINT = "pip install 'spo-service[onnx]' (in a checkout: make extra-onnx)"
TOOLS = ("tensorflow", "tf2onnx", "onnx", "onnxruntime")


class OnnxExportError(RuntimeError):
    """The model directory cannot be converted; the message says why."""


def _require_tools() -> None:
    missing = missing_modules(("tf2onnx", "onnx", "onnxruntime"))
    if missing:
        raise OnnxExportError(
            f"ONNX export needs {', '.join(missing)}, which are optional: {EXTRA_HINT}"
        )


def tool_versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in TOOLS}


# -- the TF side: the served graph, frozen --------------------------------------------------------


def frozen_graph(model_dir: Path) -> tuple[Any, list[str], list[str]]:
    """``(graph_def, input_names, output_names)`` of the model directory, variables as constants."""
    import tensorflow as tf

    from nlp.manifest import load_manifest

    manifest = load_manifest(model_dir)  # export_onnx checked it is an fp32 SavedModel directory
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(model_dir))
        signature = meta.signature_def.get("serving_default")
        inputs = list(manifest.input_names or ())
        outputs = list(manifest.output_names or ())
        if not inputs or not outputs:
            if signature is None:
                raise OnnxExportError(f"{model_dir}: model.json names no tensors and no signature")
            keys = sorted(signature.inputs)
            if len(keys) != 2:
                raise OnnxExportError(f"{model_dir}: the signature has inputs {keys}, expected 2")
            token = next((k for k in keys if "token" in k.lower()), keys[0])
            segment = next(k for k in keys if k != token)
            inputs = inputs or [signature.inputs[token].name, signature.inputs[segment].name]
            outputs = outputs or [signature.outputs[k].name for k in sorted(signature.outputs)]
        try:
            graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), sorted({n.split(":")[0] for n in outputs})
            )
        except (ValueError, TypeError, tf.errors.OpError) as exc:
            raise OnnxExportError(
                f"{model_dir}: the graph cannot be frozen ({str(exc).splitlines()[0]}); "
                "export the model with `spo export --mode graph`"
            ) from exc
    return graph_def, inputs, outputs


# -- tf2onnx corrections ---------------------------------------------------------------------------


def _broadcast_args(ctx: Any, node: Any, name: str, args: Any) -> None:
    """TF ``BroadcastArgs(s0, s1)``: the broadcast shape of two shape vectors."""
    from tf2onnx import utils

    lengths = [ctx.get_shape(i) for i in node.input]
    if any(s is None or len(s) != 1 or s[0] < 0 for s in lengths):
        raise OnnxExportError(f"{name}: BroadcastArgs needs shape vectors of static length")
    n = max(s[0] for s in lengths)
    dtype = ctx.get_dtype(node.output[0])
    np_dtype = utils.map_onnx_to_numpy_type(dtype)
    padded = []
    for inp, (k,) in zip(node.input, lengths, strict=True):
        if k < n:
            ones = ctx.make_const(utils.make_name(f"{name}_ones"), np.ones(n - k, dtype=np_dtype))
            inp = ctx.make_node("Concat", [ones.output[0], inp], attr={"axis": 0}).output[0]
        padded.append(inp)
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=np_dtype))
    is_one = ctx.make_node("Equal", [padded[0], one.output[0]]).output[0]
    outputs = node.output
    ctx.remove_node(node.name)
    ctx.make_node(
        "Where", [is_one, padded[1], padded[0]], outputs=outputs, name=name,
        shapes=[[n]], dtypes=[dtype],
    )  # fmt: skip


def _select_as_where(ctx: Any, node: Any, name: str, args: Any) -> None:
    """TF ``Select``/``SelectV2`` as ONNX ``Where`` (exact with infinities, unlike ``x*c + y*(1-c)``)."""
    from tf2onnx import utils

    cond_shape = ctx.get_shape(node.input[0])
    value_shape = ctx.get_shape(node.input[1]) or ctx.get_shape(node.input[2])
    if node.type == "Select" and cond_shape is not None and len(cond_shape) == 1:
        # TF's Select with a vector condition picks whole rows; ONNX broadcasts from the right.
        if value_shape is None:
            raise OnnxExportError(f"{name}: Select with a vector condition needs a known rank")
        if len(value_shape) != 1:
            shape = np.array([-1] + [1] * (len(value_shape) - 1), dtype=np.int64)
            const = ctx.make_const(utils.make_name(f"{name}_rows"), shape)
            reshape = ctx.make_node("Reshape", [node.input[0], const.output[0]])
            ctx.replace_input(node, node.input[0], reshape.output[0], 0)
    node.type = "Where"


@contextlib.contextmanager
def _reshape_merge_guarded() -> Iterator[None]:
    """Keep tf2onnx from merging ``Reshape -> Reshape`` when the second shape may copy a dim (0)."""
    from tf2onnx.optimizer import back_to_back_optimizer as b2b

    key = ("Reshape",)
    original = b2b._func_map[key]

    def guarded(g: Any, node: Any, consumer_nodes: list[Any]) -> Any:
        if node.type == "Reshape" and len(consumer_nodes) == 1:
            second = consumer_nodes[0]
            if second.type == "Reshape":
                shape = second.inputs[1]
                if not shape.is_const() or 0 in shape.get_tensor_value(as_list=True):
                    logger.debug(
                        "kept %s -> %s (second shape may copy a dim)", node.name, second.name
                    )
                    return []
        return original(g, node, consumer_nodes)

    b2b._func_map[key] = guarded
    try:
        yield
    finally:
        b2b._func_map[key] = original


def convert_graph(graph_def: Any, inputs: Sequence[str], outputs: Sequence[str], opset: int) -> Any:
    """An ONNX ``ModelProto`` of a frozen graph (dynamic batch and length)."""
    import tensorflow as tf
    from tf2onnx import convert, optimizer, tf_loader

    with tf.Graph().as_default():  # grappler's meta-graph export needs a graph context
        optimized = tf_loader.tf_optimize(list(inputs), list(outputs), graph_def)
    optimizers = {k: v for k, v in optimizer._get_optimizers().items() if k != "merge_duplication"}
    handlers: dict[str, tuple[Any, list[Any]]] = {
        "BroadcastArgs": (_broadcast_args, []),
        "Select": (_select_as_where, []),
        "SelectV2": (_select_as_where, []),
    }
    with _reshape_merge_guarded():
        model, _ = convert._convert_common(
            optimized,
            name="spo",
            opset=opset,
            input_names=list(inputs),
            output_names=list(outputs),
            custom_op_handlers=handlers,
            optimizers=optimizers,
        )
    unconverted = sorted({n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")})
    if unconverted:
        raise OnnxExportError(f"tf2onnx left ops it could not convert: {', '.join(unconverted)}")
    return model


def quantize_int8(fp32_path: Path, out_path: Path) -> dict[str, Any]:
    """ONNX Runtime dynamic quantization; returns what the manifest records of it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = {"per_channel": False, "reduce_range": False}
    quantize_dynamic(fp32_path, out_path, weight_type=QuantType.QInt8, **settings)
    return {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weights": "int8",
        "activations": "uint8, scale per call",
        **settings,
    }


def export_onnx(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    precision: str = "fp32",
    opset: int = OPSET,
    force: bool = False,
) -> Path:
    """Convert ``model_dir`` into the ONNX model directory ``out_dir`` (written atomically)."""
    from nlp.manifest import MANIFEST_NAME, sha256_file, write_manifest

    if precision not in QUANTIZATIONS:
        raise OnnxExportError(f"precision must be one of {', '.join(QUANTIZATIONS)}")
    source, out = Path(model_dir), Path(out_dir)
    check_conversion(source, out, force=force, action="export", error=OnnxExportError)
    _require_tools()
    import onnx

    from training.export import staged_model_dir

    graph_def, inputs, outputs = frozen_graph(source)
    model = convert_graph(graph_def, inputs, outputs, opset)
    document = json.loads((source / MANIFEST_NAME).read_text(encoding="utf-8"))
    with staged_model_dir(out, force=force, inputs=(source,)) as staging:
        staging.mkdir()
        onnx_path = staging / ONNX_FILE
        quantization = None
        if precision == "int8":
            fp32_path = staging / "fp32.onnx"
            onnx.save(model, str(fp32_path))
            quantization = quantize_int8(fp32_path, onnx_path)
            fp32_path.unlink()
        else:
            onnx.save(model, str(onnx_path))
        from nlp.manifest import resolve_vocab

        vocab = resolve_vocab(source, document["vocab"]["path"], document["vocab"]["sha256"])
        shutil.copyfile(vocab, staging / "vocab.txt")
        document["vocab"]["path"] = "vocab.txt"
        # ONNX keeps the TF tensor names for graph inputs and outputs.
        document["inputs"] = {"token_ids": inputs[0], "segment_ids": inputs[1]}
        document["outputs"] = list(outputs)
        document["engine"] = {
            "name": "onnx",
            "file": ONNX_FILE,
            "sha256": sha256_file(onnx_path),
            "opset": opset,
            "precision": precision,
            "quantization": quantization,
            "tools": tool_versions(),
            "source": {
                "name": document.get("name"),
                "version": str(document.get("version", "1")),
                "saved_model_sha256": sha256_file(source / "saved_model.pb"),
            },
        }
        write_manifest(staging, document)
    logger.info("wrote %s (%s, opset %d)", out, precision, opset)
    return out
