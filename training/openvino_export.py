"""Convert a model directory's SavedModel for the opt-in ``openvino`` engine (offline tool).

``export_openvino(MODEL_DIR, OUT)`` writes a new model directory: ``model.xml`` + ``model.bin`` (the
OpenVINO IR), ``model.json`` (the source manifest, its tensor names replaced by the IR's, plus an
``engine`` section: engine, both files and their sha256, precision, quantization, tool versions and
source) and ``vocab.txt``. ``spo export-openvino`` is the command over it.

The SavedModel is read by ``openvino.convert_model`` directly, not the served graph's frozen
GraphDef: it converts without TensorFlow in the loop (1.9 s for models/demo, 2.2 s for RBT6), keeps
the signature's input and output names, and the IR's fp32 outputs equal the TF session's within
1e-4 (tests/nlp/test_openvino_runtime.py). Inputs stay dynamic ``[-1, -1]``: one compiled model
serves every bucket shape (``nlp.openvino_runtime`` gives the measurement that chose it).

``int8`` is NNCF post-training quantization (``nncf.quantize``, ``ModelType.TRANSFORMER``, the
``MIXED`` preset: symmetric weights, asymmetric activations) calibrated on real sentences: the
``calibration`` file (text lines, or JSON lines with a ``"text"`` field, read as ``spo quantize``
reads it), else ``samples`` sentences of the synthetic generator (training split, seed 3, needs the
training extra). Each is tokenized with the model's own vocab, windowed and padded to its bucket
length exactly as the service feeds the model (``training.quantize.calibration_inputs``).

The preset, measured on models/demo (500 held-out texts, 300 generator sentences): ``MIXED`` gave the
TF session's triples on 496 texts (F1 0.9723, as fp32), ``PERFORMANCE`` (symmetric activations) on 497
(F1 0.9726), and their times per call were within the noise of 2 shared cores; ``MIXED`` is kept, NNCF's
advice for transformers, whose activations (after GELU, softmax) are not centred on zero.
"""

from __future__ import annotations

import json
import logging
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from training import missing_modules
from training.conversion import check_conversion

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "int8")
XML_FILE = "model.xml"
BIN_FILE = "model.bin"
EXTRA_HINT = "pip install 'spo-service[openvino]' (in a checkout: make extra-openvino)"
TOOLS = ("openvino", "nncf")
DEFAULT_SAMPLES = 300
PRESET = "mixed"


class OpenVinoExportError(RuntimeError):
    """The model directory cannot be converted; the message says why."""


def _require_tools() -> None:
    """``OpenVinoExportError`` naming the install command unless openvino and nncf import."""
    missing = missing_modules(TOOLS)
    if missing:
        raise OpenVinoExportError(
            f"OpenVINO export needs {', '.join(missing)}, which are optional: {EXTRA_HINT}"
        )


def tool_versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in TOOLS}


def _tensorflow_environment() -> None:
    """TensorFlow's process environment, set by the project's one door before TF's first import."""
    import nlp.tokenization  # noqa: F401


def _signature(model_dir: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``serving_default``'s inputs and outputs: key -> tensor name (the IR names ports by key)."""
    _tensorflow_environment()
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((model_dir / "saved_model.pb").read_bytes())
    for meta in proto.meta_graphs:
        signature = meta.signature_def.get("serving_default")
        if signature is not None:
            return (
                {k: v.name for k, v in signature.inputs.items()},
                {k: v.name for k, v in signature.outputs.items()},
            )
    raise OpenVinoExportError(f"{model_dir}: the SavedModel has no serving_default signature")


def _port_names(manifest: Any, model: Any, model_dir: Path) -> tuple[list[str], list[str]]:
    """The IR's input and output names in role order (token ids, segment ids; the task's outputs),
    from the tensor names of ``model.json`` or, when absent, the signature as ``nlp.engine`` reads
    it."""
    from nlp import engine
    from nlp.errors import ModelLoadError

    inputs_by_key, outputs_by_key = _signature(model_dir)
    key_of = {name: key for key, name in {**inputs_by_key, **outputs_by_key}.items()}
    ports = {p.get_any_name(): p for p in [*model.inputs, *model.outputs]}

    def port_name(tensor: str, field: str) -> str:
        key = key_of.get(tensor, tensor.split(":")[0])
        if key not in ports:
            raise ModelLoadError(f"{field}: {tensor!r} is not in the converted model", field=field)
        return key

    try:
        inputs, outputs = engine.resolve_tensors(
            manifest.input_names,
            manifest.output_names,
            manifest.n_outputs,
            signature=(inputs_by_key, outputs_by_key),
            where=str(model_dir),
            lookup=port_name,
            rank=lambda name: None,
        )
    except ModelLoadError as exc:
        raise OpenVinoExportError(str(exc)) from None
    return inputs, outputs


def calibration_texts(calibration: Path | None, samples: int) -> tuple[tuple[str, ...], str, str]:
    """``(texts, source, sha256)``: the first ``samples`` texts of ``calibration``, else ``samples``
    sentences of the synthetic generator (the training extra)."""
    from training.quantize import QuantizeError, demo_calibration, read_calibration

    try:
        if calibration is not None:
            found = read_calibration(calibration, max_texts=samples)
        else:
            try:
                import faker  # noqa: F401
            except ImportError:
                raise OpenVinoExportError(
                    "int8 needs calibration sentences: pass --calibration FILE (text lines, or "
                    "JSON lines with a 'text' field), or install the training extra (pip install "
                    "'spo-service[training]'; in a checkout: make extra-training) for the "
                    "synthetic generator's"
                ) from None
            found = demo_calibration(samples)
    except QuantizeError as exc:
        raise OpenVinoExportError(str(exc)) from None
    return found.texts, found.source, found.sha256


def sliced_matmuls(model: Any) -> list[str]:
    """MatMuls whose output goes straight into a ``StridedSlice`` (a pointer head's Dense without
    bias); they stay fp32. OpenVINO 2026.4.1's CPU plugin cannot compile them quantized: its
    low-precision ``StridedSliceTransformation`` moves the per-channel dequantization through the
    slice with the unsliced scale shape ("Argument shapes are inconsistent")."""
    names = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        consumers = [t.get_node().get_type_name() for t in op.output(0).get_target_inputs()]
        if "StridedSlice" in consumers:
            names.append(op.get_friendly_name())
    return names


def quantize_int8(
    model: Any, manifest: Any, input_order: list[int], texts: tuple[str, ...]
) -> tuple[Any, dict[str, Any]]:
    """NNCF post-training quantization of ``model`` on ``texts``; the quantized model and what
    the manifest records of it (without the calibration source)."""
    import nncf

    from training.quantize import calibration_inputs

    feeds = calibration_inputs(manifest, texts)
    items = []
    for tokens, segments in feeds:
        item: list[Any] = [None, None]
        item[input_order[0]] = tokens
        item[input_order[1]] = segments
        items.append(
            [a.astype(model.inputs[i].get_element_type().to_dtype()) for i, a in enumerate(item)]
        )
    ignored = sliced_matmuls(model)
    settings = {
        "model_type": "transformer",
        "preset": PRESET,
        "subset_size": len(items),
        "fast_bias_correction": True,
        "ignored": ignored,
    }
    quantized = nncf.quantize(
        model,
        nncf.Dataset(items),
        model_type=nncf.ModelType.TRANSFORMER,
        preset=nncf.QuantizationPreset.MIXED,
        subset_size=len(items),
        fast_bias_correction=True,
        ignored_scope=nncf.IgnoredScope(names=ignored) if ignored else None,
    )
    return quantized, {
        "method": "nncf.quantize (post-training)",
        "weights": "int8, symmetric, per channel",
        "activations": "int8, asymmetric, per tensor (ranges from calibration)",
        **settings,
        "windows": len(items),
    }


def export_openvino(
    model_dir: Path,
    out: Path,
    *,
    precision: str = "fp32",
    calibration: Path | None = None,
    samples: int = DEFAULT_SAMPLES,
    force: bool = False,
) -> Path:
    """Convert ``model_dir`` into the OpenVINO model directory ``out`` (written atomically);
    returns ``out``."""
    from nlp.manifest import MANIFEST_NAME, resolve_vocab, sha256_file, write_manifest
    from training.export import staged_model_dir

    if precision not in PRECISIONS:
        raise OpenVinoExportError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    if samples < 1:
        raise OpenVinoExportError(f"samples must be positive, got {samples}")
    if precision == "fp32" and calibration is not None:
        raise OpenVinoExportError("--calibration is for --precision int8 only")
    source, out = Path(model_dir), Path(out)
    given = (calibration,) if calibration is not None and Path(calibration).is_file() else ()
    manifest = check_conversion(
        source, out, force=force, action="export", error=OpenVinoExportError, inputs=given
    )
    _require_tools()
    texts: tuple[str, ...] = ()
    if precision == "int8":  # before the conversion: a bad calibration file fails fast
        texts, calibration_source, calibration_sha = calibration_texts(calibration, samples)
    import openvino as ov

    try:
        model = ov.convert_model(str(source))
    except Exception as exc:  # the converter's own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OpenVinoExportError(
            f"{source}: OpenVINO cannot convert the SavedModel: {first}"
        ) from exc
    inputs, outputs = _port_names(manifest, model, source)
    model.reshape({name: ov.PartialShape([-1, -1]) for name in inputs})
    core = ov.Core()
    quantization = None
    if precision == "int8":
        order = [[p.get_any_name() for p in model.inputs].index(n) for n in inputs]
        model, quantization = quantize_int8(model, manifest, order, texts)
        quantization["calibration"] = {
            "source": calibration_source,
            "texts": len(texts),
            "sha256": calibration_sha,
        }
    try:  # what the engine will do at load, so that a model it cannot run is never written
        core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1})
    except Exception as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise OpenVinoExportError(
            f"{source}: OpenVINO cannot compile the {precision} model: {first}"
        ) from exc
    document = json.loads((source / MANIFEST_NAME).read_text(encoding="utf-8"))
    with staged_model_dir(out, force=force, inputs=(source, *given)) as staging:
        staging.mkdir()
        ov.save_model(model, str(staging / XML_FILE), compress_to_fp16=False)
        vocab = resolve_vocab(source, document["vocab"]["path"], document["vocab"]["sha256"])
        shutil.copyfile(vocab, staging / "vocab.txt")
        document["vocab"]["path"] = "vocab.txt"
        document["inputs"] = {"token_ids": inputs[0], "segment_ids": inputs[1]}
        document["outputs"] = list(outputs)
        document["precision"] = precision
        if quantization is not None:
            document["quantization"] = quantization
        else:
            document.pop("quantization", None)
        document["engine"] = {
            "name": "openvino",
            "file": XML_FILE,
            "sha256": sha256_file(staging / XML_FILE),
            "weights": BIN_FILE,
            "weights_sha256": sha256_file(staging / BIN_FILE),
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
    logger.info("wrote %s (openvino, %s)", out, precision)
    return out
