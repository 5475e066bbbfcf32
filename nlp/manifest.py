"""``model.json``: the contract between a model directory and the runtime.

A model directory holds a SavedModel (``saved_model.pb``, ``variables/``) and ``model.json``::

    {
      "format_version": 1,
      "name": "demo", "version": "1",
      "task": "triples",                       # or "entities" (nlp.tasks.Task)
      "predicates": [{"predicate": "出生地", "subject_type": "人物", "object_type": "地点"},
                     {"predicate": "首都", "subject_type": "国家", "object_type": "城市",
                      "cardinality": "one_to_one"}],      # optional (nlp.decoding.CARDINALITIES)
      "entity_types": ["人物", "地点"],          # entities task only
      "vocab": {"path": "vocab.txt", "sha256": "..."},
      "do_lower_case": true,
      "max_length": 256,
      "inputs": {"token_ids": "Input-Token:0", "segment_ids": "Input-Segment:0"},   # optional
      "outputs": ["entity:0", "head:0", "tail:0"],                                 # optional
      "threshold": 0.0,
      "link_rule": "both",                     # triples only; or "mean" (nlp.decoding.LINK_RULES)
      "length_buckets": [16, 24, 32, 48, 64, 96, 128, 192, 256],
      "batch_buckets": [1, 2, 4, 8, 16, 32],
      "single_row_length_step": 8,               # optional; null = one-row batches use length_buckets
      "engine": {"name": "onnx", "file": "model.onnx", ...}   # optional; absent = the TF SavedModel
      "precision": "fp32",                       # optional; "int8": written by `spo quantize`
      "quantization": {...},                     # int8 only: tool, version, calibration set, parent
      "saved_model": {"sha256": "..."}           # of saved_model.pb; written by every spo command
    }

``outputs`` lists tensor names in role order: ``[entity, head, tail]`` for triples (GPLinker), and
``[entities]`` for the typed GlobalPointer NER. When ``inputs``/``outputs`` are absent the runtime takes
them from the SavedModel's ``serving_default`` signature. ``vocab.path`` is relative to the model directory
(``vocab.txt`` beside ``model.json``: every tool writes it so, and the directory is self-contained)
or absolute. Directories written before that name ``vocab/vocab.txt`` relative to the project
root: they still load, read-only, from a folder above the model directory or the vocab the package
ships (same sha256), with a one-line note to run ``spo copy-vocab DIR`` (``copy_vocab_in``).
Validation names the offending field in every error. A top-level field the format does not have is
refused, with the declared field it is closest to (``"treshold"``: did you mean ``threshold``?):
ignored, a misspelt field would have left the model running on the default it was meant to change.

``engine`` (absent for the TensorFlow SavedModel, the default) marks a directory written by
``spo export-onnx`` for the opt-in ``onnx`` engine: ``name`` ("onnx"), ``file`` (relative, no SavedModel
needed) and its ``sha256``, ``opset``, ``precision`` ("fp32" or "int8"), ``quantization`` (null, or how
int8 was made), ``tools`` (the converter versions) and ``source`` (the SavedModel it came from).
``spo export-openvino`` writes the same section for the opt-in ``openvino`` engine, with ``name``
"openvino", ``file`` the model's ``.xml`` and ``weights`` its ``.bin``, each with its sha256
(``sha256``, ``weights_sha256``), and no ``opset``; an int8 one is also ``precision: "int8"`` at the
top level, with the same ``quantization`` (NNCF's settings and the calibration set).

``saved_model`` holds the sha256 of ``saved_model.pb``, the graph: ``write_manifest`` records it for
every SavedModel directory a ``spo`` command writes, and loading refuses a graph that no longer
matches (one flipped bit in a constant loads and serves garbage; the variables carry TensorFlow's
own checksums). A directory without it (written before, or by hand) loads unchecked.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlp.config import DEMO_VOCAB
from nlp.decoding import CARDINALITIES, LINK_RULES
from nlp.errors import ManifestError, ModelLoadError, UnsupportedPrecision
from nlp.tasks import TASK_NAMES, PredicateSchema, Task, task_named
from nlp.vocab import read_vocab

__all__ = ["PredicateSchema", "Task"]  # re-exported: a manifest's labels and task

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Steps of about x1.5 rather than x2: half the padding of powers of two (15.5% vs 30.6% padded tokens
# on the benchmark workload) for 52 warm-up shapes instead of 29; see BENCHMARKS.md.
DEFAULT_LENGTH_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
# Rows in one batch at most: every bucket shape is warmed at start-up, and (100000, 128) would
# take all of a machine's memory before the first request.
MAX_BATCH_BUCKET = 1024
# One-row batches (single-text requests) pad to a multiple of 8 tokens instead of the next length
# bucket: 6.2% padded tokens instead of 15.5%, for 22 more (cheap, one-row) warm-up shapes, 74 in all
# (bench/results/padding.json, BENCHMARKS.md "Padding waste").
DEFAULT_SINGLE_ROW_LENGTH_STEP = 8
MANIFEST_NAME = "model.json"
# Where a self-contained model directory keeps its vocab (``vocab.path`` in ``model.json``).
VOCAB_NAME = "vocab.txt"
ENGINES = ("tf", "onnx", "openvino")


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """The ``engine`` section of a converted model directory (``file`` and ``weights`` absolute)."""

    name: str
    precision: str
    quantization: dict[str, Any] | None = None  # how an int8 one was made
    file: Path
    sha256: str
    opset: int | None = None  # onnx only
    weights: Path | None = None  # openvino only: the .bin beside the .xml
    weights_sha256: str | None = None
    tools: dict[str, str] = field(default_factory=dict)  # converter versions
    source: dict[str, Any] = field(default_factory=dict)  # the SavedModel it came from

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "precision": self.precision}
        if self.opset is not None:
            out["opset"] = self.opset
        return out


# What a model directory's weights (or its onnx or openvino engine's) are: fp32 (trained, exported),
# or int8 (``spo quantize``, ``spo export-onnx --precision int8``, ``spo export-openvino --precision
# int8``). bf16 is a way of running an fp32 model,
# not a kind of model directory.
MODEL_PRECISIONS = ("fp32", "int8")


@dataclass(frozen=True)
class Manifest:
    """A validated ``model.json``. ``directory`` and ``vocab_path`` are absolute."""

    directory: Path
    name: str
    version: str
    task: Task
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
    link_rule: str = "both"
    single_row_length_step: int | None = DEFAULT_SINGLE_ROW_LENGTH_STEP
    engine_spec: EngineSpec | None = None
    precision: str = "fp32"
    quantization: dict[str, Any] | None = None
    saved_model_sha256: str | None = None

    @property
    def engine(self) -> str:
        """``tf`` (the SavedModel in a Session, the default), ``onnx`` (``spo export-onnx``) or
        ``openvino`` (``spo export-openvino``)."""
        return self.engine_spec.name if self.engine_spec is not None else "tf"

    @property
    def labels(self) -> tuple[str, ...]:
        """Head labels in output order: predicates (triples) or entity types (entities)."""
        return self.task.label_names(self)

    @property
    def n_outputs(self) -> int:
        return self.task.n_outputs

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
            **({"link_rule": self.link_rule} if self.task is Task.TRIPLES else {}),
            "length_buckets": list(self.length_buckets),
            "batch_buckets": list(self.batch_buckets),
            "single_row_length_step": self.single_row_length_step,
        }
        if self.engine_spec is not None:
            out["engine"] = self.engine_spec.summary()
        out[self.task.labels_field] = self.task.labels_document(self.task.labels(self))
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
    task: str | Task,
    vocab_path: str,
    vocab_sha256: str,
    max_length: int,
    predicates: list[dict[str, str]] | None = None,
    entity_types: list[str] | None = None,
    do_lower_case: bool = True,
    inputs: dict[str, str] | None = None,
    outputs: list[str] | None = None,
    threshold: float = 0.0,
    link_rule: str = "both",
    length_buckets: list[int] | None = None,
    batch_buckets: list[int] | None = None,
) -> dict[str, Any]:
    """Build a ``model.json`` document (what ``spo export`` and training write); of ``predicates``
    and ``entity_types``, the one the task lists its labels in is written, and ``link_rule`` for
    a triples model only."""
    kind = task_named(task)
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "version": version,
        "task": kind.value,
    }
    labels = {"predicates": predicates, "entity_types": entity_types}[kind.labels_field]
    doc[kind.labels_field] = labels or []
    doc["vocab"] = {"path": vocab_path, "sha256": vocab_sha256}
    doc["do_lower_case"] = do_lower_case
    doc["max_length"] = max_length
    if inputs is not None:
        doc["inputs"] = inputs
    if outputs is not None:
        doc["outputs"] = outputs
    doc["threshold"] = threshold
    if kind is Task.TRIPLES:
        doc["link_rule"] = link_rule
    doc["length_buckets"] = length_buckets or [
        b for b in DEFAULT_LENGTH_BUCKETS if b < max_length
    ] + [max_length]
    doc["batch_buckets"] = batch_buckets or list(DEFAULT_BATCH_BUCKETS)
    return doc


def write_manifest(directory: Path, document: dict[str, Any]) -> Path:
    """Write ``document`` as ``directory``'s ``model.json``, with ``saved_model.sha256`` of the
    SavedModel graph the directory holds (replacing one ``document`` carried over from a parent;
    none for an onnx or openvino directory, whose engine files have their own). Written beside and
    renamed over it: a write that fails (a full disk) leaves the old ``model.json`` whole."""
    document = {k: v for k, v in document.items() if k != "saved_model"}
    graph = directory / "saved_model.pb"
    if "engine" not in document and graph.is_file():
        document["saved_model"] = {"sha256": sha256_file(graph)}
    path = directory / MANIFEST_NAME
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _fail(field: str, problem: str) -> ManifestError:
    return ManifestError(f"model.json: field '{field}': {problem}", field=field)


def _req(
    doc: dict[str, Any], key: str, kind: type | tuple[type, ...], field: str | None = None
) -> Any:
    if key not in doc:
        raise _fail(field or key, "missing")
    return _of_type(doc[key], kind, field or key)


def _of_type(value: Any, kind: type | tuple[type, ...], field: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise _fail(field, f"expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise _fail(field, f"expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if kinds == (int, float):
        return "a number"
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


def _buckets(raw: list[Any], key: str, cap: int | None) -> tuple[int, ...]:
    """``length_buckets`` (``cap``: ``max_length``) or ``batch_buckets`` (no cap)."""
    if not raw:
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
    # Written beside, then renamed over: a vocab.txt that is a link (to the vocab elsewhere, or to
    # any file) is replaced by the copy, never written through.
    staged = target.with_name(f".{VOCAB_NAME}.partial")
    try:
        staged.write_bytes(manifest.vocab_path.read_bytes())
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)
    doc["vocab"]["path"] = VOCAB_NAME
    write_manifest(manifest.directory, doc)
    return manifest.vocab_path


PREDICATE_KEYS = ("predicate", "subject_type", "object_type", "cardinality")


def _predicates(raw: list[Any]) -> tuple[PredicateSchema, ...]:
    """The ``predicates`` of a triples model: unique, each with its subject and object types."""
    if not raw:
        raise _fail("predicates", "must list at least one predicate")
    predicates = []
    for i, item in enumerate(raw):
        where = f"predicates[{i}]"
        if not isinstance(item, dict):
            raise _fail(where, "expected an object with predicate, subject_type, object_type")
        for key in item:  # a misspelt cardinality would silently leave the predicate unlimited
            if key not in PREDICATE_KEYS:
                close = difflib.get_close_matches(str(key), PREDICATE_KEYS, n=1)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else f"its keys: {', '.join(PREDICATE_KEYS)}"
                )
                raise _fail(f"{where}.{key}", f"unknown in format {FORMAT_VERSION} ({hint})")
        cardinality = item.get("cardinality", CARDINALITIES[0])
        if cardinality not in CARDINALITIES:
            raise _fail(
                f"{where}.cardinality",
                f"expected one of {', '.join(CARDINALITIES)}, got {cardinality!r}",
            )
        predicates.append(
            PredicateSchema(
                predicate=_nonempty_str(item.get("predicate"), f"{where}.predicate"),
                subject_type=_nonempty_str(item.get("subject_type"), f"{where}.subject_type"),
                object_type=_nonempty_str(item.get("object_type"), f"{where}.object_type"),
                cardinality=cardinality,
            )
        )
    names = [p.predicate for p in predicates]
    if len(set(names)) != len(names):
        raise _fail("predicates", "predicate names must be unique")
    return tuple(predicates)


def _entity_types(raw: list[Any]) -> tuple[str, ...]:
    """The ``entity_types`` of an entities model: unique non-empty names."""
    if not raw:
        raise _fail("entity_types", "must list at least one entity type")
    entity_types = [_nonempty_str(t, f"entity_types[{i}]") for i, t in enumerate(raw)]
    if len(set(entity_types)) != len(entity_types):
        raise _fail("entity_types", "entity types must be unique")
    return tuple(entity_types)


# -- the fields of model.json ----------------------------------------------------------------------
@dataclass
class _Reading:
    """What a field's check may use: the model directory, whether to check the files it names, and
    the values of the fields declared before it (by field name)."""

    directory: Path
    check_files: bool
    values: dict[str, Any]


@dataclass(frozen=True)
class ManifestField:
    """One top-level ``model.json`` field, declared once: README's model.json table is checked
    against these (tests/test_docs.py), and ``parse_manifest`` is a loop over them.

    A field whose ``when`` does not hold (on the values read before it) is not read and keeps its
    default. Otherwise an absent field (or a null one, with ``null="absent"``) is refused as missing
    if ``required``, else takes ``default`` (or ``default_of(values)``); a present one is checked to be
    of ``kind`` (``null="kept"``: null is a value, None) and then by ``check``, which returns what the
    ``Manifest`` keeps in ``attrs`` (a tuple of values when several; none for ``()``).
    """

    name: str
    kind: type | tuple[type, ...]
    doc: str
    check: Callable[[Any, _Reading], Any] | None = None
    required: bool = False
    default: Any = None
    default_of: Callable[[dict[str, Any]], Any] | None = None
    default_doc: str = ""
    when: Callable[[dict[str, Any]], bool] | None = None
    when_doc: str = ""
    null: str = ""  # "absent": null reads as no field; "kept": null is the value None
    attrs: tuple[str, ...] | None = None  # the Manifest attributes it fills (None: its name)

    @property
    def kind_doc(self) -> str:
        """Its type as README says it (``an integer or null``)."""
        return _kind_name(self.kind) + (" or null" if self.null == "kept" else "")

    @property
    def presence(self) -> str:
        """How README says whether it is needed: ``required``, ``required for ...`` or its default."""
        if self.required:
            return f"required {self.when_doc}".strip()
        default = self.default_doc or f"`{json.dumps(self.default, ensure_ascii=False)}`"
        return f"default {default} {self.when_doc}".strip()


def _format_version(raw: Any, reading: _Reading) -> int:
    if raw != FORMAT_VERSION:
        raise _fail(
            "format_version", f"unsupported version {raw!r} (this build reads {FORMAT_VERSION})"
        )
    return FORMAT_VERSION


def _task(raw: str, reading: _Reading) -> Task:
    if raw not in TASK_NAMES:
        raise _fail("task", f"expected one of {', '.join(TASK_NAMES)}, got {raw!r}")
    return task_named(raw)


def _vocab(raw: dict[str, Any], reading: _Reading) -> tuple[Path, str]:
    """The vocab's path and sha256; with ``check_files``, the file is there, has that sha256 and is
    a well-formed vocab (``nlp.vocab.read_vocab``: UTF-8, each token once, the special tokens)."""
    directory = reading.directory
    vocab_rel = _nonempty_str(raw.get("path"), "vocab.path")
    vocab_sha = _nonempty_str(raw.get("sha256"), "vocab.sha256").lower()
    vocab_path = resolve_vocab(directory, vocab_rel, vocab_sha)
    if not reading.check_files:
        return vocab_path, vocab_sha
    if not vocab_path.is_file():
        raise _fail(
            "vocab.path",
            f"file not found: {vocab_rel} (relative to {directory}; a model directory holds "
            f"its vocab, as {VOCAB_NAME} beside {MANIFEST_NAME})",
        )
    actual = _file_sha256(vocab_path, "vocab.path")
    if actual != vocab_sha:
        raise _fail(
            "vocab.sha256", f"mismatch for {vocab_path}: manifest {vocab_sha}, file {actual}"
        )
    try:
        read_vocab(vocab_path)  # UTF-8, each token once, the special tokens there
    except ModelLoadError as exc:
        raise _fail("vocab.path", exc.message) from None
    if not Path(vocab_rel).is_absolute() and not vocab_path.is_relative_to(directory.resolve()):
        how = (
            "missing from the directory: the package's vocab of the same sha256 is read"
            if len(Path(vocab_rel).parts) == 1
            else "found outside the directory (the old layout, read as it is)"
        )
        logger.warning(
            "%s: vocab.path %s %s, at %s; make it self-contained with `spo copy-vocab %s`",
            directory,
            vocab_rel,
            how,
            vocab_path,
            directory,
        )
    return vocab_path, vocab_sha


def _file_sha256(path: Path, field: str) -> str:
    """``sha256_file(path)``; a file that cannot be read (permissions, I/O) is an error of ``field``
    naming it."""
    try:
        return sha256_file(path)
    except OSError as exc:
        raise _fail(field, f"cannot read {path}: {exc.strerror or exc}") from None


# Past any BERT-family encoder's positions (512 for most, 8192 for the longest): a larger value is a
# typo, and the bucket shapes it would plan (one per single-row step) would not fit in memory before
# the load could compare it with the SavedModel's positions.
MAX_LENGTH_LIMIT = 8192


def _max_length(raw: int, reading: _Reading) -> int:
    if raw < 3:
        raise _fail("max_length", "must be at least 3 ([CLS], one token, [SEP])")
    if raw > MAX_LENGTH_LIMIT:
        raise _fail("max_length", f"must be at most {MAX_LENGTH_LIMIT}, got {raw}")
    return raw


def _inputs(raw: dict[str, Any], reading: _Reading) -> tuple[str, str]:
    return (
        _nonempty_str(raw.get("token_ids"), "inputs.token_ids"),
        _nonempty_str(raw.get("segment_ids"), "inputs.segment_ids"),
    )


def _outputs(raw: list[Any], reading: _Reading) -> tuple[str, ...]:
    task: Task = reading.values["task"]
    if len(raw) != task.n_outputs:
        raise _fail(
            "outputs", f"task {task} needs {task.n_outputs} output tensor names, got {len(raw)}"
        )
    return tuple(_nonempty_str(o, f"outputs[{i}]") for i, o in enumerate(raw))


def _threshold(raw: float, reading: _Reading) -> float:
    try:
        value = float(raw)
    except OverflowError:  # an integer of hundreds of digits
        raise _fail("threshold", "expected a finite number") from None
    if not math.isfinite(value):
        raise _fail("threshold", "expected a finite number")
    return value


def _link_rule(raw: str, reading: _Reading) -> str:
    if raw not in LINK_RULES:
        raise _fail("link_rule", f"expected one of {', '.join(LINK_RULES)}, got {raw!r}")
    return raw


def _length_buckets(raw: list[Any], reading: _Reading) -> tuple[int, ...]:
    return _buckets(raw, "length_buckets", reading.values["max_length"])


def _batch_buckets(raw: list[Any], reading: _Reading) -> tuple[int, ...]:
    buckets = _buckets(raw, "batch_buckets", None)
    if buckets[-1] > MAX_BATCH_BUCKET:
        raise _fail("batch_buckets", f"at most {MAX_BATCH_BUCKET} rows a batch, got {buckets[-1]}")
    return buckets


def _single_row_length_step(raw: int | None, reading: _Reading) -> int | None:
    max_length = reading.values["max_length"]
    if raw is not None and not 1 <= raw <= max_length:
        raise _fail(
            "single_row_length_step",
            f"expected an integer from 1 to max_length ({max_length}), or null, got {raw!r}",
        )
    return raw


def _precision(raw: str, reading: _Reading) -> str:
    if raw not in MODEL_PRECISIONS:
        raise _fail("precision", f"expected one of {', '.join(MODEL_PRECISIONS)}, got {raw!r}")
    return raw


def _saved_model(raw: dict[str, Any], reading: _Reading) -> str:
    """The graph's recorded sha256; with ``check_files``, ``saved_model.pb`` must still have it
    (a missing file is named by ``load_manifest``)."""
    expected = _nonempty_str(raw.get("sha256"), "saved_model.sha256").lower()
    graph = reading.directory / "saved_model.pb"
    if reading.check_files and graph.is_file():
        actual = _file_sha256(graph, "saved_model")
        if actual != expected:
            raise _fail(
                "saved_model.sha256",
                f"mismatch for {graph}: manifest {expected}, file {actual} (the graph is damaged, "
                "or was replaced without writing model.json again)",
            )
    return expected


def _labels_field(
    name: str, parse: Callable[[list[Any]], tuple[Any, ...]], doc: str
) -> ManifestField:
    """``predicates`` or ``entity_types``: required by the tasks that list their labels in it."""
    tasks = [task.value for task in Task if task.labels_field == name]
    return ManifestField(
        name,
        list,
        doc,
        lambda raw, reading: parse(raw),
        required=True,
        default=(),
        when=lambda values: values["task"].labels_field == name,
        when_doc="for task " + " or ".join(f"`{t}`" for t in tasks),
    )


def _default_length_buckets(values: dict[str, Any]) -> tuple[int, ...]:
    cap: int = values["max_length"]
    return (*(b for b in DEFAULT_LENGTH_BUCKETS if b < cap), cap)


# In the order they are read: a check may use the fields above it (``outputs`` the task, the
# buckets ``max_length``, ``quantization`` the precision).
MANIFEST_FIELDS: tuple[ManifestField, ...] = (
    ManifestField("format_version", int, "the format of this file; `1` is the only one", _format_version, default=FORMAT_VERSION, attrs=()),
    ManifestField("name", str, "the model's name, as `GET /v1/model` and every answer report it", lambda raw, reading: _nonempty_str(raw, "name"), required=True),
    ManifestField("version", (str, int), "the model's version, reported beside its name (an integer is read as its string)", lambda raw, reading: str(raw), default="1"),
    ManifestField("task", str, "`triples` (GPLinker: entity, head-head and tail-tail GlobalPointers) or `entities` (typed GlobalPointer NER)", _task, required=True),
    _labels_field("predicates", _predicates, '`[{"predicate", "subject_type", "object_type"}]`, unique, in the order of the head/tail outputs; each may add `"cardinality"`: `many_to_one` (a subject has at most one object in a text, or in each window of a long one), `one_to_many` (an object at most one subject), `one_to_one` (both) or `many_to_many` (no limit, the default); where more links clear the threshold, the best-scoring are kept (`nlp.decoding.CARDINALITIES`)'),
    _labels_field("entity_types", _entity_types, "the type names, unique, in output order"),
    ManifestField("vocab", dict, '`{"path", "sha256"}`; the path is relative to the model directory (`"vocab.txt"`, as every `spo` command writes it) or absolute', _vocab, required=True, attrs=("vocab_path", "vocab_sha256")),
    ManifestField("do_lower_case", bool, "as the model was trained", default=True),
    ManifestField("max_length", int, "the model's max tokens, `[CLS]` and `[SEP]` included (3 to 8192)", _max_length, required=True),
    ManifestField("inputs", dict, '`{"token_ids", "segment_ids"}` tensor names; when absent, from the `serving_default` signature', _inputs, null="absent", attrs=("input_names",)),
    ManifestField("outputs", list, "tensor names in role order (triples: entity, head, tail; entities: one); when absent, from the `serving_default` signature", _outputs, null="absent", attrs=("output_names",)),
    ManifestField("threshold", (int, float), "score threshold", _threshold, default=0.0, default_doc="`0`"),
    ManifestField("link_rule", str, "how a predicate links a subject and an object: `both` (bert4keras's GPLinker: the head-head and the tail-tail score each above the threshold) or `mean` (their mean above it)", _link_rule, default="both", when=lambda values: values["task"] is Task.TRIPLES, when_doc="for task `triples`"),
    ManifestField("length_buckets", list, "the fixed input lengths, strictly increasing, the first at least 3, the last `max_length` (chosen by measurement, see BENCHMARKS.md)", _length_buckets, default_of=_default_length_buckets, default_doc=f"`{list(DEFAULT_LENGTH_BUCKETS)}` capped by `max_length`, then `max_length`", null="absent"),
    ManifestField("batch_buckets", list, f"the fixed batch sizes (rows), strictly increasing, at most {MAX_BATCH_BUCKET}", _batch_buckets, default=DEFAULT_BATCH_BUCKETS, null="absent"),
    ManifestField("single_row_length_step", int, "one-row batches (a single short text) pad only to the next multiple of this many tokens (1 to `max_length`), each such shape warmed too; `null`: use `length_buckets`", _single_row_length_step, default=DEFAULT_SINGLE_ROW_LENGTH_STEP, null="kept"),
    ManifestField("engine", dict, "absent for a SavedModel (the TF session, the default); written by `spo export-onnx` for the opt-in onnx engine: `name`, `file` + `sha256`, `opset`, `precision` (`fp32`/`int8`), `quantization`, `tools` (converter versions), `source`; by `spo export-openvino` for the opt-in openvino engine: the same, `file` the `.xml`, `weights` + `weights_sha256` its `.bin`, no `opset`", lambda raw, reading: _engine(raw, reading.directory, check_files=reading.check_files), null="absent", attrs=("engine_spec",)),
    ManifestField("precision", str, "`fp32` or `int8`: an int8 directory written by `spo quantize` (or `spo export-openvino --precision int8`), served as int8 (the precision used when none is asked for; any other is refused)", _precision, default="fp32"),
    ManifestField("quantization", dict, "how an int8 model was made: the tool and version, the scheme, the calibration set (source, texts, sha256) and the parent model", required=True, when=lambda values: values["precision"] == "int8", when_doc="for precision `int8`"),
    ManifestField("saved_model", dict, '`{"sha256"}` of `saved_model.pb`, written by every `spo` command that writes a SavedModel directory; loading refuses a graph that no longer has it; when absent, not checked', _saved_model, null="absent", attrs=("saved_model_sha256",)),
)  # fmt: skip


def parse_manifest(doc: Any, directory: Path, *, check_files: bool = True) -> Manifest:
    """Validate a decoded ``model.json`` field by field (``MANIFEST_FIELDS``); every error names
    the field."""
    if not isinstance(doc, dict):
        raise _fail("<root>", "expected a JSON object")
    _no_lone_surrogates(doc)
    _no_unknown_fields(doc)
    reading = _Reading(directory, check_files, {})
    kept: dict[str, Any] = {}
    for declared in MANIFEST_FIELDS:
        value = _read_field(declared, doc, reading)
        reading.values[declared.name] = value
        attrs = (declared.name,) if declared.attrs is None else declared.attrs
        if attrs:
            kept.update(zip(attrs, value if len(attrs) > 1 else (value,), strict=True))
    return Manifest(directory=directory.resolve(), **kept)


def _no_unknown_fields(doc: dict[str, Any]) -> None:
    """Refuse a top-level field ``MANIFEST_FIELDS`` does not declare, naming the closest one.

    >>> _no_unknown_fields({"name": "m", "treshold": 0.5})
    Traceback (most recent call last):
    ...
    nlp.errors.ManifestError: model.json: field 'treshold': unknown in format 1 (did you mean 'threshold'?)
    """
    known = [declared.name for declared in MANIFEST_FIELDS]
    for key in doc:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"its fields: {', '.join(known)}"
            shown = str(key)[:80].encode("utf-8", "backslashreplace").decode()
            raise _fail(shown, f"unknown in format {FORMAT_VERSION} ({hint})")


def _no_lone_surrogates(doc: dict[str, Any]) -> None:
    """Refuse a string holding a lone surrogate (``"\\ud800"`` in the JSON), a key or a value at
    any depth: no UTF-8 can carry it, so a name or a label with one made every answer reporting
    it fail (a 500), and a path with one cannot be opened. A walk, not a recursion: any depth
    ``json`` decoded is fine."""
    pending: list[tuple[str, Any]] = [("", doc)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                pending += [
                    (f"{where}.{key}" if where else key, key),
                    (f"{where}.{key}" if where else key, item),
                ]
        elif isinstance(value, list):
            pending += [(f"{where}[{i}]", item) for i, item in enumerate(value)]
        elif isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
            raise _fail(
                (where or "<root>").encode("utf-8", "backslashreplace").decode(),
                "holds a lone surrogate (not valid Unicode text)",
            )


def _read_field(field: ManifestField, doc: dict[str, Any], reading: _Reading) -> Any:
    """One field's value (see ``ManifestField``)."""
    default = field.default_of(reading.values) if field.default_of else field.default
    if field.when is not None and not field.when(reading.values):
        return default
    if field.name not in doc or (field.null == "absent" and doc[field.name] is None):
        if field.required:
            raise _fail(field.name, "missing")
        return default
    raw = doc[field.name]
    if raw is None and field.null == "kept":
        return None
    raw = _of_type(raw, field.kind, field.name)
    if field.check is None:
        return raw
    try:
        return field.check(raw, reading)
    except (OSError, ValueError) as exc:  # a path the system refuses: a NUL, a name too long
        raise _fail(field.name, f"cannot be used as a path here: {exc}") from None


def _engine(raw: dict[str, Any], directory: Path, *, check_files: bool) -> EngineSpec | None:
    """The ``engine`` section (``None``: the TensorFlow SavedModel)."""
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
    opset = None
    files = [("engine.file", "engine.sha256", path, sha)]
    if name == "onnx":
        opset = _req(raw, "opset", int, "engine.opset")
        if opset < 1:
            raise _fail("engine.opset", f"expected a positive integer, got {opset}")
    weights = weights_sha = None
    if name == "openvino":
        if Path(file).suffix != ".xml":
            raise _fail("engine.file", f"expected the model's .xml, got {file!r}")
        bin_name = _nonempty_str(raw.get("weights"), "engine.weights")
        if Path(bin_name).is_absolute() or ".." in Path(bin_name).parts:
            raise _fail(
                "engine.weights", f"must be a path inside the model directory, got {bin_name!r}"
            )
        weights = (directory / bin_name).resolve()
        if weights.parent != path.parent:
            raise _fail("engine.weights", f"must lie beside {file}, got {bin_name!r}")
        weights_sha = _nonempty_str(raw.get("weights_sha256"), "engine.weights_sha256").lower()
        files.append(("engine.weights", "engine.weights_sha256", weights, weights_sha))
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
        for file_field, sha_field, checked, expected in files:
            if not checked.is_file():
                raise _fail(file_field, f"file not found: {checked}")
            actual = _file_sha256(checked, file_field)
            if actual != expected:
                raise _fail(
                    sha_field, f"mismatch for {checked}: manifest {expected}, file {actual}"
                )
    return EngineSpec(
        name=name,
        file=path,
        sha256=sha,
        opset=opset,
        weights=weights,
        weights_sha256=weights_sha,
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
    if path.exists() and not path.is_file():
        raise ManifestError(f"{path}: not a regular file", field=MANIFEST_NAME)
    if not path.is_file():
        raise ManifestError(
            f"{path}: file not found (every model directory needs {MANIFEST_NAME})",
            field=MANIFEST_NAME,
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_once_each)
    except OSError as exc:  # no permission, an I/O error
        raise ManifestError(
            f"{path}: cannot read: {exc.strerror or exc}", field=MANIFEST_NAME
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON: {exc}", field=MANIFEST_NAME) from exc
    except _Repeated as exc:  # "threshold": 0.5, then "threshold": 0.0: the last one won, unsaid
        raise ManifestError(
            f"{path}: the field '{exc.args[0]}' is given twice in one object: keep one",
            field=str(exc.args[0]),
        ) from None
    except (ValueError, RecursionError):  # an integer over Python's digit limit, absurd nesting
        raise ManifestError(
            f"{path}: not acceptable JSON (nested too deeply or a number too long)",
            field=MANIFEST_NAME,
        ) from None
    manifest = parse_manifest(doc, directory, check_files=check_files)
    if check_files and manifest.engine == "tf":
        _check_saved_model_files(directory)
    return manifest


class _Repeated(Exception):
    """A key given twice in one JSON object of a model.json (its name in ``args[0]``)."""


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Repeated(key)
        seen[key] = value
    return seen


def _check_saved_model_files(directory: Path) -> None:
    """``saved_model.pb`` and ``variables/`` there, and every file a regular one: TensorFlow opens
    what it finds, and a FIFO in their place blocked loading for good."""
    graph, variables = directory / "saved_model.pb", directory / "variables"
    for required in (graph, variables):
        if not required.exists():
            raise ManifestError(
                f"{directory}: SavedModel file missing: {required.name}", field=required.name
            )
    if not variables.is_dir():
        raise ManifestError(f"{variables}: not a directory", field="variables")
    for path in (graph, *sorted(variables.iterdir())):
        if not path.is_file():
            raise ManifestError(
                f"{path}: not a regular file (a SavedModel's files must be)", field=path.name
            )
