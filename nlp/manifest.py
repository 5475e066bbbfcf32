"""``model.json``: the contract between a model directory and the runtime.

A model directory holds a SavedModel (``saved_model.pb``, ``variables/``) and ``model.json``::

    {
      "format_version": 1,
      "name": "demo", "version": "1",
      "task": "triples",                       # or "entities"
      "predicates": [{"predicate": "出生地", "subject_type": "人物", "object_type": "地点"}],
      "entity_types": ["人物", "地点"],          # entities task only
      "vocab": {"path": "vocab.txt", "sha256": "..."},
      "do_lower_case": true,
      "max_length": 256,
      "inputs": {"token_ids": "Input-Token:0", "segment_ids": "Input-Segment:0"},   # optional
      "outputs": ["entity:0", "head:0", "tail:0"],                                 # optional
      "threshold": 0.0,
      "length_buckets": [16, 24, 32, 48, 64, 96, 128, 192, 256],
      "batch_buckets": [1, 2, 4, 8, 16, 32],
      "single_row_length_step": 8,               # optional; null = one-row batches use length_buckets
      "engine": {"name": "onnx", "file": "model.onnx", ...}   # optional; absent = the TF SavedModel
      "precision": "fp32",                       # optional; "int8": written by `spo quantize`
      "quantization": {...}                      # int8 only: tool, version, calibration set, parent
    }

``outputs`` lists tensor names in role order: ``[entity, head, tail]`` for triples (GPLinker), and
``[entities]`` for the typed GlobalPointer NER. When ``inputs``/``outputs`` are absent the runtime takes
them from the SavedModel's ``serving_default`` signature. ``vocab.path`` is relative to the model directory
(``vocab.txt`` beside ``model.json``: every tool writes it so, and the directory is self-contained)
or absolute. Directories written before that name ``vocab/vocab.txt`` relative to the project
root: they still load, read-only, from a folder above the model directory or the vocab the package
ships (same sha256), with a one-line note to run ``spo copy-vocab DIR`` (``copy_vocab_in``).
Validation names the offending field in every error.

``engine`` (absent for the TensorFlow SavedModel, the default) marks a directory written by
``spo export-onnx`` for the opt-in ``onnx`` engine: ``name`` ("onnx"), ``file`` (relative, no SavedModel
needed) and its ``sha256``, ``opset``, ``precision`` ("fp32" or "int8"), ``quantization`` (null, or how
int8 was made), ``tools`` (the converter versions) and ``source`` (the SavedModel it came from).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nlp.config import DEMO_VOCAB
from nlp.errors import ManifestError, UnsupportedPrecision

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
TASKS = ("triples", "entities")
# Steps of about x1.5 rather than x2: half the padding of powers of two (15.5% vs 30.6% padded tokens
# on the benchmark workload) for 52 warm-up shapes instead of 29; see BENCHMARKS.md.
DEFAULT_LENGTH_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
# One-row batches (single-text requests) pad to a multiple of 8 tokens instead of the next length
# bucket: about 3% padding instead of 15%, for 24 more (cheap, one-row) warm-up shapes; BENCHMARKS.md.
DEFAULT_SINGLE_ROW_LENGTH_STEP = 8
MANIFEST_NAME = "model.json"
# Where a self-contained model directory keeps its vocab (``vocab.path`` in ``model.json``).
VOCAB_NAME = "vocab.txt"
ENGINES = ("tf", "onnx")


@dataclass(frozen=True)
class EngineSpec:
    """The ``engine`` section of a converted model directory (``file`` is absolute)."""

    name: str
    file: Path
    sha256: str
    opset: int
    precision: str
    quantization: dict[str, Any] | None
    tools: dict[str, str]
    source: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "precision": self.precision, "opset": self.opset}


# What a model directory's weights (or its onnx engine's) are: fp32 (trained, exported), or int8
# (``spo quantize``, ``spo export-onnx --precision int8``). bf16 is a way of running an fp32 model,
# not a kind of model directory.
MODEL_PRECISIONS = ("fp32", "int8")


@dataclass(frozen=True)
class PredicateSchema:
    predicate: str
    subject_type: str
    object_type: str

    def to_dict(self) -> dict[str, str]:
        return {
            "predicate": self.predicate,
            "subject_type": self.subject_type,
            "object_type": self.object_type,
        }


@dataclass(frozen=True)
class Manifest:
    """A validated ``model.json``. ``directory`` and ``vocab_path`` are absolute."""

    directory: Path
    name: str
    version: str
    task: str
    predicates: tuple[PredicateSchema, ...]
    entity_types: tuple[str, ...]
    vocab_path: Path
    vocab_sha256: str
    do_lower_case: bool
    max_length: int
    input_names: tuple[str, str] | None
    output_names: tuple[str, ...] | None
    threshold: float
    length_buckets: tuple[int, ...]
    batch_buckets: tuple[int, ...]
    single_row_length_step: int | None = DEFAULT_SINGLE_ROW_LENGTH_STEP
    engine_spec: EngineSpec | None = None
    precision: str = "fp32"
    quantization: dict[str, Any] | None = None

    @property
    def engine(self) -> str:
        """``tf`` (the SavedModel in a Session, the default) or ``onnx`` (``spo export-onnx``)."""
        return self.engine_spec.name if self.engine_spec is not None else "tf"

    @property
    def labels(self) -> tuple[str, ...]:
        """Head labels in output order: predicates (triples) or entity types (entities)."""
        if self.task == "triples":
            return tuple(p.predicate for p in self.predicates)
        return self.entity_types

    @property
    def n_outputs(self) -> int:
        return 3 if self.task == "triples" else 1

    def check_precision(self, precision: str) -> None:
        """Raise ``UnsupportedPrecision`` unless this directory can run in ``precision``: an int8
        directory (``spo quantize``) only as int8, an fp32 one as anything but int8."""
        if self.precision == "int8" and precision != "int8":
            raise UnsupportedPrecision(
                f"{self.directory} is an int8 model (spo quantize); it runs only with precision "
                f"int8, not {precision}"
            )
        if self.precision != "int8" and precision == "int8":
            raise UnsupportedPrecision(
                f"precision int8 needs an int8 model directory; {self.directory} is "
                f"{self.precision}: make one with `spo quantize {self.directory} OUT_DIR`"
            )

    def summary(self) -> dict[str, Any]:
        """What a client may know of the model (``GET /v1/model``); no file paths."""
        out: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "max_length": self.max_length,
            "threshold": self.threshold,
            "length_buckets": list(self.length_buckets),
            "batch_buckets": list(self.batch_buckets),
            "single_row_length_step": self.single_row_length_step,
        }
        if self.engine_spec is not None:
            out["engine"] = self.engine_spec.summary()
        if self.task == "triples":
            out["predicates"] = [p.to_dict() for p in self.predicates]
        else:
            out["entity_types"] = list(self.entity_types)
        return out


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_document(
    *,
    name: str,
    version: str,
    task: str,
    vocab_path: str,
    vocab_sha256: str,
    max_length: int,
    predicates: list[dict[str, str]] | None = None,
    entity_types: list[str] | None = None,
    do_lower_case: bool = True,
    inputs: dict[str, str] | None = None,
    outputs: list[str] | None = None,
    threshold: float = 0.0,
    length_buckets: list[int] | None = None,
    batch_buckets: list[int] | None = None,
) -> dict[str, Any]:
    """Build a ``model.json`` document (what ``spo export`` and training write)."""
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": version,
        "task": task,
    }
    if task == "triples":
        doc["predicates"] = predicates or []
    else:
        doc["entity_types"] = entity_types or []
    doc["vocab"] = {"path": vocab_path, "sha256": vocab_sha256}
    doc["do_lower_case"] = do_lower_case
    doc["max_length"] = max_length
    if inputs is not None:
        doc["inputs"] = inputs
    if outputs is not None:
        doc["outputs"] = outputs
    doc["threshold"] = threshold
    doc["length_buckets"] = length_buckets or [
        b for b in DEFAULT_LENGTH_BUCKETS if b < max_length
    ] + [max_length]
    doc["batch_buckets"] = batch_buckets or list(DEFAULT_BATCH_BUCKETS)
    return doc


def write_manifest(directory: Path, document: dict[str, Any]) -> Path:
    path = directory / MANIFEST_NAME
    path.write_text(json.dumps(document, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def _fail(field: str, problem: str) -> ManifestError:
    return ManifestError(f"model.json: field '{field}': {problem}", field=field)


def _req(
    doc: dict[str, Any], key: str, kind: type | tuple[type, ...], field: str | None = None
) -> Any:
    name = field or key
    if key not in doc:
        raise _fail(name, "missing")
    value = doc[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _fail(name, f"expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise _fail(name, f"expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _nonempty_str(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(field, "expected a non-empty string")
    return value


def _buckets(
    doc: dict[str, Any], key: str, default: tuple[int, ...], cap: int | None
) -> tuple[int, ...]:
    raw = doc.get(key)
    if raw is None:
        values = [b for b in default if cap is None or b < cap]
        if cap is not None:
            values.append(cap)
        return tuple(values)
    if not isinstance(raw, list) or not raw:
        raise _fail(key, "expected a non-empty list of positive integers")
    for b in raw:
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise _fail(key, f"expected positive integers, got {b!r}")
    if list(raw) != sorted(set(raw)):
        raise _fail(key, "must be strictly increasing")
    if cap is not None:
        if raw[0] < 3:
            raise _fail(
                key, "the smallest length bucket must hold [CLS], one token and [SEP] (>= 3)"
            )
        if raw[-1] != cap:
            raise _fail(
                key, f"the largest length bucket must equal max_length ({cap}), got {raw[-1]}"
            )
    return tuple(raw)


def resolve_vocab(directory: Path, relative: str, sha256: str | None = None) -> Path:
    """The vocab file: absolute, or relative to the model directory.

    For a directory written the old way (its vocab relative to the project root it was made in),
    the first folder above it holding ``relative``, then the vocab the package ships when its
    sha256 is ``sha256``; the caller checks the sha256 of what it gets either way.
    """
    candidate = Path(relative)
    if candidate.is_absolute():
        return candidate
    own = (directory / candidate).resolve()
    if own.is_file():
        return own
    for base in directory.resolve().parents if len(candidate.parts) > 1 else ():
        path = base / candidate
        if path.is_file():
            return path
    if sha256 is not None and DEMO_VOCAB.is_file() and sha256_file(DEMO_VOCAB) == sha256:
        return DEMO_VOCAB.resolve()
    return own


def copy_vocab_in(directory: Path) -> Path | None:
    """Make an old-style model directory self-contained: copy its vocab in as ``vocab.txt`` and
    point ``model.json`` at it (same sha256). Returns the vocab's old place, or None if the
    directory was self-contained already. The manifest is validated first and written last."""
    manifest = load_manifest(directory)
    target = manifest.directory / VOCAB_NAME
    if manifest.vocab_path == target:
        return None
    path = manifest.directory / MANIFEST_NAME
    doc = json.loads(path.read_text(encoding="utf-8"))
    target.write_bytes(manifest.vocab_path.read_bytes())
    doc["vocab"]["path"] = VOCAB_NAME
    write_manifest(manifest.directory, doc)
    return manifest.vocab_path


def parse_manifest(doc: Any, directory: Path, *, check_files: bool = True) -> Manifest:
    """Validate a decoded ``model.json``; every error names the field."""
    if not isinstance(doc, dict):
        raise _fail("<root>", "expected a JSON object")
    version = doc.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise _fail(
            "format_version", f"unsupported version {version!r} (this build reads {FORMAT_VERSION})"
        )
    name = _nonempty_str(_req(doc, "name", str), "name")
    model_version = doc.get("version", "1")
    if not isinstance(model_version, str | int) or isinstance(model_version, bool):
        raise _fail("version", "expected a string")
    task = _req(doc, "task", str)
    if task not in TASKS:
        raise _fail("task", f"expected one of {', '.join(TASKS)}, got {task!r}")

    predicates: list[PredicateSchema] = []
    entity_types: list[str] = []
    if task == "triples":
        raw_predicates = _req(doc, "predicates", list)
        if not raw_predicates:
            raise _fail("predicates", "must list at least one predicate")
        for i, item in enumerate(raw_predicates):
            where = f"predicates[{i}]"
            if not isinstance(item, dict):
                raise _fail(where, "expected an object with predicate, subject_type, object_type")
            predicates.append(
                PredicateSchema(
                    predicate=_nonempty_str(item.get("predicate"), f"{where}.predicate"),
                    subject_type=_nonempty_str(item.get("subject_type"), f"{where}.subject_type"),
                    object_type=_nonempty_str(item.get("object_type"), f"{where}.object_type"),
                )
            )
        names = [p.predicate for p in predicates]
        if len(set(names)) != len(names):
            raise _fail("predicates", "predicate names must be unique")
    else:
        raw_types = _req(doc, "entity_types", list)
        if not raw_types:
            raise _fail("entity_types", "must list at least one entity type")
        entity_types = [_nonempty_str(t, f"entity_types[{i}]") for i, t in enumerate(raw_types)]
        if len(set(entity_types)) != len(entity_types):
            raise _fail("entity_types", "entity types must be unique")

    vocab = _req(doc, "vocab", dict)
    vocab_rel = _nonempty_str(vocab.get("path"), "vocab.path")
    vocab_sha = _nonempty_str(vocab.get("sha256"), "vocab.sha256").lower()
    vocab_path = resolve_vocab(directory, vocab_rel, vocab_sha)
    if check_files:
        if not vocab_path.is_file():
            raise _fail(
                "vocab.path",
                f"file not found: {vocab_rel} (relative to {directory}; a model directory holds "
                f"its vocab, as {VOCAB_NAME} beside {MANIFEST_NAME})",
            )
        actual = sha256_file(vocab_path)
        if actual != vocab_sha:
            raise _fail(
                "vocab.sha256", f"mismatch for {vocab_path}: manifest {vocab_sha}, file {actual}"
            )
        if not Path(vocab_rel).is_absolute() and not vocab_path.is_relative_to(directory.resolve()):
            logger.warning(
                "%s: vocab.path %s found outside the directory, at %s (the old layout, read "
                "as it is); make it self-contained with `spo copy-vocab %s`",
                directory,
                vocab_rel,
                vocab_path,
                directory,
            )

    do_lower_case = doc.get("do_lower_case", True)
    if not isinstance(do_lower_case, bool):
        raise _fail("do_lower_case", "expected a boolean")
    max_length = _req(doc, "max_length", int)
    if max_length < 3:
        raise _fail("max_length", "must be at least 3 ([CLS], one token, [SEP])")

    input_names: tuple[str, str] | None = None
    if doc.get("inputs") is not None:
        inputs = _req(doc, "inputs", dict)
        input_names = (
            _nonempty_str(inputs.get("token_ids"), "inputs.token_ids"),
            _nonempty_str(inputs.get("segment_ids"), "inputs.segment_ids"),
        )
    output_names: tuple[str, ...] | None = None
    if doc.get("outputs") is not None:
        outputs = _req(doc, "outputs", list)
        expected = 3 if task == "triples" else 1
        if len(outputs) != expected:
            raise _fail(
                "outputs", f"task {task} needs {expected} output tensor names, got {len(outputs)}"
            )
        output_names = tuple(_nonempty_str(o, f"outputs[{i}]") for i, o in enumerate(outputs))

    threshold = doc.get("threshold", 0.0)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, int | float)
        or not math.isfinite(threshold)
    ):
        raise _fail("threshold", "expected a finite number")

    length_buckets = _buckets(doc, "length_buckets", DEFAULT_LENGTH_BUCKETS, max_length)
    batch_buckets = _buckets(doc, "batch_buckets", DEFAULT_BATCH_BUCKETS, None)
    step = doc.get("single_row_length_step", DEFAULT_SINGLE_ROW_LENGTH_STEP)
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= max_length
    ):
        raise _fail(
            "single_row_length_step",
            f"expected an integer from 1 to max_length ({max_length}), or null, got {step!r}",
        )
    engine = _engine(doc, directory, check_files=check_files)
    precision = doc.get("precision", "fp32")
    if precision not in MODEL_PRECISIONS:
        raise _fail(
            "precision", f"expected one of {', '.join(MODEL_PRECISIONS)}, got {precision!r}"
        )
    quantization = doc.get("quantization")
    if precision == "int8" and not isinstance(quantization, dict):
        raise _fail("quantization", "an int8 model must record how it was quantized (an object)")
    return Manifest(
        directory=directory.resolve(),
        name=name,
        version=str(model_version),
        task=task,
        predicates=tuple(predicates),
        entity_types=tuple(entity_types),
        vocab_path=vocab_path,
        vocab_sha256=vocab_sha,
        do_lower_case=do_lower_case,
        max_length=max_length,
        input_names=input_names,
        output_names=output_names,
        threshold=float(threshold),
        length_buckets=length_buckets,
        batch_buckets=batch_buckets,
        single_row_length_step=step,
        precision=precision,
        quantization=quantization if precision == "int8" else None,
        engine_spec=engine,
    )


def _engine(doc: dict[str, Any], directory: Path, *, check_files: bool) -> EngineSpec | None:
    raw = doc.get("engine")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail("engine", "expected an object (or no field: the TensorFlow SavedModel)")
    name = raw.get("name")
    if name not in ENGINES:
        raise _fail("engine.name", f"expected one of {', '.join(ENGINES)}, got {name!r}")
    if name == "tf":
        return None
    file = _nonempty_str(raw.get("file"), "engine.file")
    if Path(file).is_absolute() or ".." in Path(file).parts:
        raise _fail("engine.file", f"must be a path inside the model directory, got {file!r}")
    path = (directory / file).resolve()
    sha = _nonempty_str(raw.get("sha256"), "engine.sha256").lower()
    opset = _req(raw, "opset", int, "engine.opset")
    if opset < 1:
        raise _fail("engine.opset", f"expected a positive integer, got {opset}")
    precision = raw.get("precision")
    if precision not in MODEL_PRECISIONS:
        raise _fail(
            "engine.precision", f"expected one of {', '.join(MODEL_PRECISIONS)}, got {precision!r}"
        )
    quantization = raw.get("quantization")
    if precision == "int8" and not isinstance(quantization, dict):
        raise _fail("engine.quantization", "an int8 model must record how it was quantized")
    if precision == "fp32" and quantization is not None:
        raise _fail("engine.quantization", "must be null for an fp32 model")
    tools = _req(raw, "tools", dict, "engine.tools")
    for key, value in tools.items():
        if not isinstance(value, str) or not value:
            raise _fail(f"engine.tools.{key}", "expected a version string")
    source = raw.get("source", {})
    if not isinstance(source, dict):
        raise _fail("engine.source", "expected an object")
    if check_files:
        if not path.is_file():
            raise _fail("engine.file", f"file not found: {path}")
        actual = sha256_file(path)
        if actual != sha:
            raise _fail("engine.sha256", f"mismatch for {path}: manifest {sha}, file {actual}")
    return EngineSpec(
        name=name,
        file=path,
        sha256=sha,
        opset=opset,
        precision=precision,
        quantization=quantization,
        tools=dict(tools),
        source=dict(source),
    )


def load_manifest(directory: str | Path, *, check_files: bool = True) -> Manifest:
    """Read and validate ``<directory>/model.json`` (and, with ``check_files``, the SavedModel files)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ManifestError(f"model directory not found: {directory}", field="model_dir")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path}: file not found (every model directory needs {MANIFEST_NAME})",
            field=MANIFEST_NAME,
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}", field=MANIFEST_NAME) from exc
    manifest = parse_manifest(doc, directory, check_files=check_files)
    if check_files and manifest.engine == "tf":
        for required in ("saved_model.pb", "variables"):
            if not (directory / required).exists():
                raise ManifestError(
                    f"{directory}: SavedModel file missing: {required}", field=required
                )
    return manifest
