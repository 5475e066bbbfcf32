"""Batch extraction on Apache Spark: the batch command's code path, one model per Python worker.

Two entry points, both over ``mapInArrow`` (Arrow batches in and out):

- ``extract_dataframe(df, model, ...)``: a DataFrame with an id and a text column in; the id with
  ``entities``, ``triples`` and ``error`` (nested structs) out. For tables users already have.
- ``run_spark_extract(spark, options)`` (``spo spark-extract``): text or JSON lines files in; the rows
  ``spo extract`` writes out: JSON lines (each line byte-identical to ``spo extract``'s) or Parquet.

The code that runs in the Python workers is ``spo extract``'s: lines are parsed by
``app.batch.records.parse_line`` (a bad line becomes the same error record), and windows, length
sorting, chunking and per-text error isolation come from ``app.batch.stream.extract_windows`` over the
same ``Extractor`` (tokenization, buckets, decoding). Bad records are error rows, never a failed task.

**One model per Python worker process.** A worker loads one ``Extractor`` the first time a task needs
it and keeps it in a module global for every later task and partition (Spark reuses Python workers:
``spark.python.worker.reuse``, on by default). Nothing TensorFlow is pickled from the driver; a task
carries a plain ``_Job``. TensorFlow's intra-op threads are the task's CPUs (``spark.task.cpus``), so an
executor with C cores runs C / task.cpus models side by side without oversubscribing its cores.

**A record that crashes its worker** (a native crash, an out-of-memory kill) takes the Python worker
with it, and Spark retries the task (``spark.task.maxFailures``). A retried task (attempt 1 or later)
does not run inline: it runs its records through ``app.batch.workers.ProcessExecutor`` with one worker
process of its own, ``spo extract``'s isolation, so the record that crashed is an ``internal_error``
row the second time instead of failing every attempt and the job. That process loads its own model
and ends with the task; first attempts keep the process's one extractor.

**Line numbers without a shuffle.** A text line's id is its line number, which no Spark file source
reports. The driver first counts the lines of every input split (``_metadata.file_path`` and
``file_block_start``: one small row per split), then each task numbers its lines from its split's base,
as ``zipWithIndex`` does for one RDD, but per file. Lines are read as raw bytes (the text source cast
to binary; only ``\\n`` ends a line, as in ``spo extract``), so invalid UTF-8 is reported, not replaced.

**On a cluster** the executors need spo's Python: ``session(python=...)`` names one every node has,
``session(python_env=...)`` ships a packed environment; ``probe_executors`` runs one task that imports
spo (and finds the model) before the job, so that a wrong environment fails in seconds with a message
that names the fix, not as every task failing. ``ship_model`` packs a self-contained copy of a model
directory and adds it with ``addArchive`` (unpacked once per executor, checked by its tree sha256).

This module imports ``pyspark`` (the optional ``spark`` extra); nothing in the service imports it.
It is not a script: ``spark-submit`` runs ``deploy/spark_extract.py`` (docs/spark.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from pyspark import SparkFiles, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from app.batch.output import dumps_line
from app.batch.records import (
    FORMATS,
    WIDE_BOM_BYTES,
    Record,
    line_limit,
    parse_line,
    source_for,
    wide_text_problem,
)
from app.batch.stream import extract_windows
from app.batch.workers import ExtractorFactory, InlineExecutor, ProcessExecutor, WorkSpec
from app.core.settings import DEFAULT_MODEL_DIR
from nlp.config import (
    DEFAULT_MAX_TEXT_CHARS,
    PRECISIONS,
    LoadOptions,
)
from nlp.errors import InvalidInput, ManifestError, SpoError
from nlp.loader import load_extractor
from nlp.manifest import MANIFEST_NAME, load_manifest, sha256_file
from nlp.validation import check_text
from nlp.values import EXTRACTION, FAILURE, Extraction, Failure, Member, Outcome, Shape

logger = logging.getLogger(__name__)

OUTPUT_FORMATS = ("jsonl", "parquet")
INPUT_FORMATS = ("auto", *FORMATS)

_SCALARS: dict[str, T.DataType] = {"string": T.StringType(), "integer": T.IntegerType()}


def spark_type(member: Member) -> T.DataType:
    """The Spark type of one member of a wire shape (``nlp.values``): its scalar, or a struct of
    its shape's members; an array of it when ``many``."""
    kind = member.kind
    if isinstance(kind, Shape):
        inner: T.DataType = T.StructType([spark_field(m) for m in kind.members])
    else:
        inner = _SCALARS[kind]
    return T.ArrayType(inner) if member.many else inner


def spark_field(member: Member) -> T.StructField:
    return T.StructField(member.name, spark_type(member))


#: The columns ``extract_dataframe`` returns after ``id``, and the Parquet output holds: the members
#: of an ``Extraction`` and of a ``Failure``, derived from their one wire shape (``nlp.values``).
RESULT_FIELDS = tuple(spark_field(m) for m in (*EXTRACTION.members, *FAILURE.members))
_RESULT_SHAPES = {type_: shape for type_, shape in ((Extraction, EXTRACTION), (Failure, FAILURE))}
# Input lines once parsed: what flows from the parse stage to the extract stage.
_PARSED = T.StructType(
    [
        T.StructField("seq", T.LongType()),  # input order: file index << 40 | line number
        T.StructField("id", T.StringType()),  # the record's id as JSON text
        T.StructField("text", T.StringType()),
        T.StructField("error_code", T.StringType()),
        T.StructField("error_message", T.StringType()),
    ]
)
_SEQ_SHIFT = 40
_LINES = T.StructType([T.StructField("seq", T.LongType()), T.StructField("line", T.StringType())])


class SparkExtractError(Exception):
    """The job cannot start: bad options, no input, an output that exists, a model that cannot load."""


# --- worker side: one extractor per Python process ---------------------------------------------

_EXECUTORS: dict[WorkSpec, InlineExecutor] = {}


@dataclass(frozen=True)
class _Job:
    """What every task needs: plain values, pickled to the workers."""

    model: str  # an absolute path every node sees, or the file name of an archive shipped with addArchive
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    precision: str | None = None
    text_field: str = "text"
    window: int = 2048
    chunk_size: int = 64
    model_sha256: str | None = None  # a shipped model's tree_sha256, checked once per process

    def outcomes(self, records: list[Record], factory: ExtractorFactory) -> list[Outcome]:
        """The outcome of each record, in order: through this process's one extractor, or, in a
        retried task, through the task's own worker process (``_isolated_executor_for``)."""
        spec = self._spec()
        executor = (
            _isolated_executor_for(spec, factory) if _retried() else _executor_for(spec, factory)
        )
        return [
            outcome
            for pairs in extract_windows(
                records, executor, window=self.window, chunk_size=self.chunk_size
            )
            for _, outcome in pairs
        ]

    def _spec(self) -> WorkSpec:
        context = TaskContext.get()
        options = LoadOptions(
            model_dir=_resolve_model(self.model, self.model_sha256),
            precision=self.precision,
            intra_op_threads=max(1, context.cpus()) if context is not None else None,
            inter_op_threads=1,
            max_text_chars=self.max_text_chars,
        )
        return WorkSpec(options, text_field=self.text_field)


def _executor_for(spec: WorkSpec, factory: ExtractorFactory) -> InlineExecutor:
    executor = _EXECUTORS.get(spec)
    if executor is None:
        started = time.perf_counter()
        executor = InlineExecutor(factory, spec)
        executor.start()
        _EXECUTORS[spec] = executor
        logger.info(
            "pid %d: model %s loaded in %.1f s",
            os.getpid(),
            spec.options.model_dir,
            time.perf_counter() - started,
        )
    return executor


_ISOLATED: dict[WorkSpec, ProcessExecutor] = {}


def _retried() -> bool:
    """Whether this task is a retry: an earlier attempt failed, maybe on a record that crashed."""
    context = TaskContext.get()
    return context is not None and context.attemptNumber() > 0


def _isolated_executor_for(spec: WorkSpec, factory: ExtractorFactory) -> ProcessExecutor:
    """A retried task's executor: one worker process, started on its first batch, ended with the
    task (``_end_task``); a record that kills it twice alone becomes an error row."""
    executor = _ISOLATED.get(spec)
    if executor is None:
        context = TaskContext.get()
        logger.warning(
            "pid %d: task %s attempt %s runs its records in a worker process of its own (an "
            "earlier attempt failed: a record that crashes the worker becomes an error row)",
            os.getpid(),
            context.partitionId() if context is not None else "?",
            context.attemptNumber() if context is not None else "?",
        )
        executor = ProcessExecutor(factory, spec, workers=1)
        executor.start()
        _ISOLATED[spec] = executor
    return executor


def _end_task() -> None:
    """At the end of a task's batches: stop what a retried task started (its worker, its model)."""
    while _ISOLATED:
        _, executor = _ISOLATED.popitem()
        executor.close()


Batches = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _one_task(run: Batches) -> Batches:
    """``run`` (a ``mapInArrow`` function: one task's batches), ending with ``_end_task``."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        try:
            yield from run(batches)
        finally:
            _end_task()

    return task


_UNPACKED: dict[str, Path] = {}


def _resolve_model(model: str, sha256: str | None = None) -> Path:
    """The model directory a task loads: ``model`` itself, or where Spark unpacked its archive.

    A shipped archive is unpacked once per executor by Spark (``addArchive``) and checked here once
    per Python process: its files must hash to the ``tree_sha256`` the driver recorded when packing.
    """
    path = Path(model)
    if path.is_absolute():
        return path
    if model in _UNPACKED:
        return _UNPACKED[model]
    unpacked = Path(SparkFiles.get(model))
    if not (unpacked / MANIFEST_NAME).is_file():
        raise ManifestError(
            f"the shipped model {model} is not unpacked on this executor ({unpacked})",
            field="model_dir",
        )
    if sha256 is not None:
        found = tree_sha256(unpacked)
        if found != sha256:
            raise ManifestError(
                f"the shipped model {model} unpacked at {unpacked} has tree sha256 {found}, "
                f"the driver packed {sha256}",
                field="model_dir",
            )
    _UNPACKED[model] = unpacked
    return unpacked


def _results(outcomes: list[Outcome]) -> dict[str, list[Any]]:
    """The ``entities``, ``triples`` and ``error`` columns of ``outcomes``, straight from the typed
    values (null where a member is not the outcome's: an error row's results, a result's error)."""
    columns: dict[str, list[Any]] = {f.name: [None] * len(outcomes) for f in RESULT_FIELDS}
    for row, outcome in enumerate(outcomes):
        for member in _RESULT_SHAPES[type(outcome)].members:
            columns[member.name][row] = member.encode(outcome)
    return columns


def _result_arrays(outcomes: list[Outcome], schema: pa.Schema) -> list[pa.Array]:
    columns = _results(outcomes)
    return [pa.array(columns[f.name], f.type) for f in schema if f.name in columns]


# --- a DataFrame of texts ----------------------------------------------------------------------


def extract_dataframe(
    df: DataFrame,
    model: str | Path | ShippedModel,
    *,
    id_col: str = "id",
    text_col: str = "text",
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    precision: str | None = None,
    factory: ExtractorFactory = load_extractor,
) -> DataFrame:
    """``df``'s ``id_col`` (as ``id``, any type, passed through) with ``entities``, ``triples``, ``error``.

    ``model`` is a model directory every executor sees (shared storage), or what ``ship_model``
    returned. A null text is an ``invalid_input`` error row, as a missing text in
    ``spo extract``. Each Arrow batch is one run of ``extract_windows``.
    """
    missing = [c for c in (id_col, text_col) if c not in df.columns]
    if missing:
        raise SparkExtractError(f"the DataFrame has no column {', '.join(missing)} ({df.columns})")
    job = _job(model, max_text_chars, precision, text_col)
    fields = T.StructType([T.StructField("id", df.schema[id_col].dataType), *RESULT_FIELDS])
    schema = to_arrow_schema(fields)

    @_one_task
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            records = [
                Record(i, t)
                if t is not None
                else Record(i, None, InvalidInput(f"{text_col} is null", field=text_col))
                for i, t in enumerate(batch.column(1).to_pylist())
            ]
            arrays = _result_arrays(job.outcomes(records, factory), schema)
            yield pa.RecordBatch.from_arrays([batch.column(0), *arrays], schema=schema)

    selected = df.select(F.col(id_col).alias("id"), F.col(text_col).cast("string").alias("text"))
    return selected.mapInArrow(run, fields)


def _job(
    model: str | Path | ShippedModel, max_text_chars: int, precision: str | None, text_field: str
) -> _Job:
    if precision is not None and precision not in PRECISIONS:
        raise SparkExtractError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
        )
    if max_text_chars < 1:
        raise SparkExtractError("max_text_chars must be positive")
    if isinstance(model, ShippedModel):
        return _Job(
            model.name, max_text_chars, precision, text_field, model_sha256=model.tree_sha256
        )
    path = Path(model)
    model = str(path.resolve()) if path.is_dir() else str(model)
    return _Job(model, max_text_chars, precision, text_field)


@dataclass(frozen=True)
class ShippedModel:
    """A model directory packed and added to the job with ``SparkContext.addArchive``."""

    name: str  # the archive's file name: ``SparkFiles.get(name)`` is the unpacked directory
    tree_sha256: str  # of the self-contained directory's files (``tree_sha256``)
    archive: Path  # the archive on the driver
    archive_sha256: str


#: Where ``ship_model`` keeps its archives; they are named by content, so a rerun reuses its archive.
ARCHIVE_DIR = Path(tempfile.gettempdir()) / "spo-spark-models"
_ADDED: dict[tuple[str, str], ShippedModel] = {}  # (application id, archive name)


def tree_sha256(directory: Path) -> str:
    """One sha256 over every file under ``directory``: its relative path and its own sha256."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(directory).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def self_contained_copy(source: Path, target: Path) -> None:
    """Copy the model directory ``source`` to ``target``, its vocab inside.

    A vocab that the manifest finds outside the directory (a path relative to the project root, or an
    absolute one: the old layout) is copied in as ``vocab.txt`` and ``model.json`` names it so; a
    directory that already holds its vocab is copied as it is. Either way the copy loads on a node
    that has nothing else, and its manifest still checks the vocab's sha256.
    """
    # The vocab as the manifest resolves it (the one packaged with spo included).
    vocab = load_manifest(source, check_files=False).vocab_path
    shutil.copytree(source, target)
    manifest_path = target / MANIFEST_NAME
    doc = json.loads(manifest_path.read_text(encoding="utf-8"))
    if not vocab.is_relative_to(source.resolve()):
        name = "vocab.txt"
        if (target / name).exists():
            name = f"vocab-{doc['vocab']['sha256'][:12]}.txt"
        shutil.copy2(vocab, target / name)
        doc["vocab"]["path"] = name
        manifest_path.write_text(
            json.dumps(doc, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
        )


def pack_model(model_dir: str | Path, archive_dir: Path = ARCHIVE_DIR) -> ShippedModel:
    """A ``.tar.gz`` of a self-contained copy of ``model_dir``, named by its content.

    Refuses a model that does not load (``SparkExtractError``), here rather than in every task.
    """
    source = Path(model_dir).resolve()
    try:
        manifest = load_manifest(source)
    except SpoError as exc:
        raise SparkExtractError(f"cannot load the model: {exc.message}") from None
    archive_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="spo-model-", dir=archive_dir) as tmp:
        copy = Path(tmp) / "model"
        self_contained_copy(source, copy)
        load_manifest(copy)  # the copy loads on its own: vocab found, sha256 right
        tree = tree_sha256(copy)
        name = f"spo-model-{_safe(manifest.name)}-{_safe(manifest.version)}-{tree[:12]}.tar.gz"
        archive = archive_dir / name
        if not archive.is_file():
            partial = Path(tmp) / name
            with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
                for path in sorted(copy.iterdir()):
                    tar.add(path, arcname=path.name)
            partial.replace(archive)
    return ShippedModel(name, tree, archive, sha256_file(archive))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text) or "_"


def ship_model(spark: SparkSession, model_dir: str | Path) -> ShippedModel:
    """Pack ``model_dir`` (``pack_model``) and add it to the job with ``SparkContext.addArchive``.

    Spark copies the archive to every executor and unpacks it once there (local, standalone, YARN and
    Kubernetes masters alike); tasks find it with ``SparkFiles.get(name)`` and check its tree sha256
    once per Python process. Pass the result as ``model`` to ``extract_records``/``extract_dataframe``.
    """
    shipped = pack_model(model_dir)
    key = (spark.sparkContext.applicationId, shipped.name)
    if key not in _ADDED:
        spark.sparkContext.addArchive(str(shipped.archive))
        _ADDED[key] = shipped
        logger.info(
            "model %s shipped as %s (%.1f MiB, sha256 %s)",
            model_dir,
            shipped.name,
            shipped.archive.stat().st_size / (1 << 20),
            shipped.archive_sha256,
        )
    return shipped


# --- executors' Python -------------------------------------------------------------------------

#: The name a packed environment (``--python-env``) is unpacked under in each executor's directory.
ENV_ALIAS = "spo-env"
FIX_HINT = (
    "ship spo's environment with --python-env spo-env.tar.gz (venv-pack, see docs/spark.md), or "
    "name a Python that has spo installed on every node with --python PATH"
)


def probe_executors(spark: SparkSession, job: _Job | None = None) -> dict[str, Any]:
    """Run one task that imports spo (and resolves ``job``'s model) on an executor.

    Raises ``SparkExtractError`` naming the executor's Python, the error and the fix when the task
    cannot import this package, its dependencies, or the model; returns what the executor reported.
    The task's function is pickled by value and imports nothing at unpickling, so a Python without
    spo still runs it and says so, instead of failing every task of the job.
    """
    fields = None if job is None else dict(job.__dict__)

    def probe(_: Iterable[int]) -> Iterator[dict[str, Any]]:
        import importlib
        import importlib.util
        import platform
        import socket
        import sys

        info: dict[str, Any] = {
            "host": socket.gethostname(),
            "python": sys.executable,
            "version": platform.python_version(),
            "stage": "import",
            "error": None,
        }
        try:
            module = importlib.import_module("app.spark.job")
            for name in ("tensorflow", "bert4keras"):
                if importlib.util.find_spec(name) is None:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            if fields is not None:
                info["stage"] = "model"
                job = module._Job(**fields)
                info["model_dir"] = str(module._resolve_model(job.model, job.model_sha256))
                module.load_manifest(info["model_dir"])
        except Exception as exc:
            info["error"] = f"{type(exc).__name__}: {exc}"
        yield info

    try:
        reports: list[dict[str, Any]] = (
            spark.sparkContext.parallelize([0], 1).mapPartitions(probe).collect()
        )
        [info] = reports
    except Exception as exc:  # the executor's Python did not start, or is another version
        raise SparkExtractError(
            f"executors cannot run spo's Python: {_cause(exc)}; {FIX_HINT}"
        ) from None
    if info["error"]:
        where = f"Python {info['version']} ({info['python']}) on {info['host']}"
        if info["stage"] == "model":
            raise SparkExtractError(
                f"the model does not load on executors: {where}: {info['error']}"
            )
        raise SparkExtractError(
            f"executors cannot import spo: {where}: {info['error']}; {FIX_HINT}"
        )
    return info


_CAUSES = re.compile(
    r"(Cannot run program[^\n]*|Python in worker has different version[^\n]*|"
    r"\w+Error: [^\n]*|\[[A-Z_.]+\][^\n]*)"
)


def _cause(exc: BaseException) -> str:
    """The line of a failed Spark job's (long, Java) message that says why: a known cause, else
    the innermost Java exception (``java.io.IOException: Mkdirs failed to create ...``)."""
    found = _CAUSES.search(str(exc))
    if found:
        return found.group(1).strip()
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    if java is None:
        return _first_line(exc)
    while java.getCause() is not None:
        java = java.getCause()
    return str(java.toString()).strip().splitlines()[0]


# --- text and JSON lines files -----------------------------------------------------------------


@dataclass(frozen=True)
class SparkExtractOptions:
    """Everything ``spo spark-extract`` can be told (see its ``--help``)."""

    inputs: tuple[str, ...]
    output: str
    model_dir: Path = DEFAULT_MODEL_DIR
    input_format: str = "auto"
    output_format: str = "jsonl"
    text_field: str = "text"
    id_field: str = "id"
    partitions: int | None = None
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    precision: str | None = None
    ship_model: bool = False
    force: bool = False

    def problems(self) -> list[str]:
        out = []
        if not self.inputs:
            out.append("at least one input is needed")
        if self.input_format not in INPUT_FORMATS:
            out.append(f"--input-format must be one of {', '.join(INPUT_FORMATS)}")
        if self.output_format not in OUTPUT_FORMATS:
            out.append(f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}")
        if self.partitions is not None and self.partitions < 1:
            out.append("--partitions must be positive")
        if self.precision is not None and self.precision not in PRECISIONS:
            out.append(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.max_text_chars < 1:
            out.append("--max-text-chars must be positive")
        if not self.text_field or not self.id_field:
            out.append("--text-field and --id-field must not be empty")
        return out


@dataclass
class SparkSummary:
    records: int = 0
    errors: int = 0
    seconds: float = 0.0
    output: str = ""

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds > 0 else 0.0
        return (
            f"spo spark-extract: {self.records} records, {self.errors} errors in "
            f"{self.seconds:.1f} s ({rate:.1f} texts/s) -> {self.output}"
        )


class _ParseError(SpoError):
    """A parse error carried from the parse stage to the extract stage, code and message intact.

    The parse stage only produces catalogued input codes (``invalid_json``, ``invalid_input``...);
    the class default is the general one."""

    code = "invalid_input"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def read_records(
    spark: SparkSession,
    inputs: tuple[str, ...] | list[str],
    *,
    input_format: str = "auto",
    text_field: str = "text",
    id_field: str = "id",
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> DataFrame:
    """Every line of ``inputs`` (files, directories or globs) as a parsed record, in input order.

    Columns: ``seq`` (input order), ``id`` (JSON text), ``text``, ``error_code``, ``error_message``.
    Ids are those ``spo extract`` gives: the line number (text files, or JSON lines without an id),
    prefixed ``"FILE:"`` when the inputs hold several files.
    """
    # Directories are read to their depth (a file in a subfolder was skipped without a word);
    # Spark still skips names starting with "_" or "." (its own output's _SUCCESS, .crc files).
    reader = spark.read.option("lineSep", "\n").option("recursiveFileLookup", "true")
    try:  # sorted by the paths they name (listed, a space is %20: it sorted after "!")
        files = sorted(reader.text(list(inputs)).inputFiles(), key=_display)
    except Exception as exc:  # AnalysisException: path does not exist, ...
        raise SparkExtractError(f"cannot read the input: {_first_line(exc)}") from None
    if not files:
        raise SparkExtractError(f"no input files in {', '.join(inputs)}")
    _refuse_wide_text(spark, files)
    try:
        sources = [source_for(_display(f), input_format) for f in files]
    except ValueError:
        unknown = next(f for f in files if _guess_fails(f))
        raise SparkExtractError(
            f"{_display(unknown)}: cannot tell the format from the name; "
            "use --input-format txt or jsonl"
        ) from None
    # inputFiles() gives URIs (a space as %20): read back as the paths they name, glob characters
    # escaped (a file named a[1].txt is that file, not a pattern).
    lines = reader.text([_literal(f) for f in files]).select(
        F.col("_metadata.file_path").alias("path"),
        F.col("_metadata.file_block_start").alias("start"),
        F.col("value").cast("binary").alias("raw"),
    )
    try:
        bases = _split_bases(lines)
    except Exception as exc:  # a file Spark cannot decode (a cut gzip): one line, as the job's
        raise SparkExtractError(f"the Spark job failed: {_cause(exc)}") from None
    file_index = {_display(f): i for i, f in enumerate(files)}
    prefix_ids = len(files) > 1

    def parse(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        seen: dict[tuple[str, int], int] = {}
        for batch in batches:
            out: dict[str, list[Any]] = {f.name: [] for f in _PARSED.fields}
            for path, start, raw in zip(
                *(batch.column(i).to_pylist() for i in range(3)), strict=True
            ):
                key = (_display(path), start)
                line_no = bases[key] + seen.get(key, 0) + 1
                seen[key] = seen.get(key, 0) + 1
                index = file_index[key[0]]
                source = sources[index]
                limit = line_limit(source.format, max_text_chars)
                if line_no == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")
                record = _checked(
                    parse_line(
                        source,
                        line_no,
                        None if len(raw) > limit else raw + b"\n",
                        text_field=text_field,
                        id_field=id_field,
                        prefix_ids=prefix_ids,
                    ),
                    max_text_chars,
                    text_field,
                )
                out["seq"].append(index << _SEQ_SHIFT | line_no)
                out["id"].append(json.dumps(record.id))  # ASCII: a lone surrogate survives Arrow
                out["text"].append(record.text)
                out["error_code"].append(record.error.code if record.error else None)
                out["error_message"].append(record.error.message if record.error else None)
            yield pa.RecordBatch.from_pydict(out, schema=to_arrow_schema(_PARSED))

    return lines.mapInArrow(parse, _PARSED)


def _checked(record: Record, max_text_chars: int, field: str) -> Record:
    """``record``, or its error record if its text fails the extractor's own check.

    The check ``spo extract`` runs before the model, run here so that a text Arrow cannot carry (a
    lone surrogate from a JSON escape) never leaves this stage; the error is the same.
    """
    if record.error is not None:
        return record
    try:
        check_text(record.text, max_text_chars, field)
    except SpoError as exc:
        return Record(record.id, None, exc)
    return record


WIDE_TEXT_REMOTE_FILES = 1000  # files on HDFS, S3... looked at before the job (the rest are not)


def _refuse_wide_text(spark: SparkSession, files: list[str]) -> None:
    """A UTF-16 or UTF-32 file (``wide_text_problem``; a .gz file's text) is refused before the
    job, as ``spo extract`` refuses it: read line by line, every line was an error row, and its
    last NUL one more. Each file's first bytes are read through Hadoop (local, HDFS, S3...)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    codecs = jvm.org.apache.hadoop.io.compress.CompressionCodecFactory(conf)
    remote = [uri for uri in files if not uri.startswith("file:")]
    if len(remote) > WIDE_TEXT_REMOTE_FILES:  # a look costs a few round trips each, on the driver
        logger.info(
            "%d files not on this machine: the first %d are looked at for UTF-16 text",
            len(remote),
            WIDE_TEXT_REMOTE_FILES,
        )
        files = [uri for uri in files if uri.startswith("file:")] + remote[:WIDE_TEXT_REMOTE_FILES]
    for uri in files:
        try:
            path = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
            stream = path.getFileSystem(conf).open(path)
            try:
                codec = codecs.getCodec(path)
                if codec is not None:
                    stream = codec.createInputStream(stream)
                read = (stream.read() for _ in range(WIDE_BOM_BYTES))
                head = bytes(b for b in read if b >= 0)
            finally:
                stream.close()
        except Exception as exc:  # py4j's Py4JJavaError: unreadable, a cut gzip (the job says)
            logger.debug("could not look at the start of %s: %s", uri, _first_line(exc))
            continue
        problem = wide_text_problem(_display(uri), head)
        if problem is not None:
            raise SparkExtractError(problem)


def _split_bases(lines: DataFrame) -> dict[tuple[str, int], int]:
    """For each (file, split start): how many lines of that file come before the split."""
    counts = lines.groupBy("path", "start").count().collect()
    bases: dict[tuple[str, int], int] = {}
    running: dict[str, int] = {}
    for row in sorted(counts, key=lambda r: (r["path"], r["start"])):
        path = _display(row["path"])
        bases[(path, row["start"])] = running.get(path, 0)
        running[path] = running.get(path, 0) + row["count"]
    return bases


def _guess_fails(path: str) -> bool:
    try:
        source_for(_display(path))
    except ValueError:
        return True
    return False


def _display(path: str) -> str:
    """A file's name as ids show it: a local path without its ``file:`` scheme, else the URI; its
    percent escapes decoded (Spark lists ``a b.txt`` as ``a%20b.txt``).

    >>> _display("file:///data/a%20b.txt"), _display("hdfs://nn/c%25d.txt")
    ('/data/a b.txt', 'hdfs://nn/c%d.txt')
    """
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif path.startswith("file:"):
        path = path[len("file:") :]
    return unquote(path)


def _literal(uri: str) -> str:
    """A listed file's URI as a path Spark reads as that one file: percent escapes decoded, glob
    characters escaped.

    >>> _literal("file:/data/a%20b%5B1%5D.txt")
    'file:/data/a b\\\\[1\\\\].txt'
    """
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", unquote(uri))


def _id_text(value: Any) -> str:
    """A Parquet ``id``: a string id as is, any other id as its JSON (ASCII if it holds a surrogate)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


# What a Spark (Hadoop) write leaves in its output directory; --force replaces a directory holding
# nothing else (a previous output, finished or not), never a folder of other files or a file.
_OUTPUT_ENTRY = re.compile(r"^(part-.*|_SUCCESS|_temporary|_started_.*|_committed_.*|\..*\.crc)$")
_GLOB = re.compile(r"[*?\[{]")


def output_problem(
    spark: SparkSession, output: str, inputs: Iterable[str], force: bool
) -> str | None:
    """Why ``output`` may not be written (None: it may), asked through Hadoop (local, HDFS, S3...).

    ``--force`` replaces the whole output path (``_put_in_place``): an output that is an input, or
    a directory holding one, would delete the input; one that holds anything but a previous output's
    files would delete those."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()

    def qualified(path: str) -> tuple[Any, Any, str]:
        """The file system, the qualified path, and that path as scheme://authority/path (Hadoop
        writes a local one as file:/x or file:///x)."""
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        fs = hadoop_path.getFileSystem(conf)
        full = fs.makeQualified(hadoop_path)
        uri = full.toUri()
        where = str(uri.getPath())
        if uri.getScheme() == "file":  # a link to an input (or through one) is that input
            where = os.path.realpath(where)
        return fs, full, f"{uri.getScheme()}://{uri.getAuthority() or ''}{where}".rstrip("/")

    fs, out, out_uri = qualified(output)
    for given in inputs:
        # What the input names: a glob's matches (it may match OUTPUT itself), else the path.
        matched = [given]
        if _GLOB.search(given):
            pattern = jvm.org.apache.hadoop.fs.Path(given)
            statuses = pattern.getFileSystem(conf).globStatus(pattern) or []
            matched = [str(st.getPath().toString()) for st in statuses]
        for path in matched:
            in_uri = qualified(path)[2]
            if in_uri == out_uri or in_uri.startswith(out_uri + "/"):
                return f"the output {output} is (or holds) the input {given}: choose another OUTPUT"
            # Directories are read to their depth: an output inside one is read back by the next
            # run and deleted under it by --force.
            if out_uri.startswith(in_uri + "/"):
                return (
                    f"the output {output} is inside the input {given}, which is read to its depth:"
                    " choose another OUTPUT"
                )
    if not fs.exists(out):
        # Asked now by making (and removing) a directory beside it, not by the job's first task.
        probe = jvm.org.apache.hadoop.fs.Path(out.getParent(), f".spo-probe-{uuid.uuid4().hex}")
        try:
            made = fs.mkdirs(probe)
            fs.delete(probe, True)
        except Exception as exc:  # py4j's Py4JJavaError: the file system said no
            return f"cannot write {output}: {_cause(exc)}"
        return None if made else f"cannot write {output}: cannot make a directory beside it"
    if not fs.getFileStatus(out).isDirectory():
        return f"{output} is a file, not a spark-extract output: choose another OUTPUT"
    names = (str(s.getPath().getName()) for s in fs.listStatus(out))
    others = [name for name in names if not _OUTPUT_ENTRY.match(name)]
    if others:
        return (
            f"{output} exists and is not a spark-extract output ({', '.join(sorted(others)[:3])}"
            f"{', ...' if len(others) > 3 else ''}): choose another OUTPUT; --force only replaces an "
            "earlier output"
        )
    return None if force else f"{output} exists; use --force to overwrite it"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def extract_records(
    records: DataFrame,
    model: str | Path | ShippedModel,
    *,
    output_format: str = "jsonl",
    text_field: str = "text",
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    precision: str | None = None,
    factory: ExtractorFactory = load_extractor,
) -> DataFrame:
    """The output rows of ``read_records``' records: ``(seq, line)`` for JSON lines, else
    ``(seq, id, entities, triples, error)`` with ``id`` a string (JSON text when not one)."""
    job = _job(model, max_text_chars, precision, text_field)
    if output_format == "jsonl":
        fields = _LINES
    else:
        fields = T.StructType(
            [
                T.StructField("seq", T.LongType()),
                T.StructField("id", T.StringType()),
                *RESULT_FIELDS,
            ]
        )
    schema = to_arrow_schema(fields)

    @_one_task
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = batch.to_pydict()
            ids = [json.loads(i) for i in rows["id"]]
            records = [
                Record(i, t, None if code is None else _ParseError(code, message))
                for i, t, code, message in zip(
                    ids, rows["text"], rows["error_code"], rows["error_message"], strict=True
                )
            ]
            outcomes = job.outcomes(records, factory)
            seq = batch.column("seq")
            if output_format == "jsonl":
                lines = [
                    dumps_line(i, o)[:-1].decode("utf-8")
                    for i, o in zip(ids, outcomes, strict=True)
                ]
                yield pa.RecordBatch.from_arrays([seq, pa.array(lines, pa.string())], schema=schema)
            else:
                id_text = [_id_text(i) for i in ids]
                arrays = _result_arrays(outcomes, schema)
                yield pa.RecordBatch.from_arrays(
                    [seq, pa.array(id_text, pa.string()), *arrays], schema=schema
                )

    return records.mapInArrow(run, fields)


def run_spark_extract(
    spark: SparkSession,
    options: SparkExtractOptions,
    *,
    factory: ExtractorFactory = load_extractor,
) -> SparkSummary:
    """Extract from every line of ``options.inputs`` into ``options.output``; see the module doc."""
    problems = options.problems()
    if problems:
        raise SparkExtractError("; ".join(problems))
    try:
        manifest = load_manifest(options.model_dir)
        if options.precision is not None:  # an fp32 directory asked for int8, or the reverse
            manifest.check_precision(options.precision)
    except SpoError as exc:
        raise SparkExtractError(f"cannot load the model: {exc.message}") from None
    problem = output_problem(spark, options.output, options.inputs, options.force)
    if problem:
        raise SparkExtractError(problem)
    model = ship_model(spark, options.model_dir) if options.ship_model else options.model_dir
    started = time.perf_counter()
    probe_executors(
        spark, _job(model, options.max_text_chars, options.precision, options.text_field)
    )
    records = read_records(
        spark,
        options.inputs,
        input_format=options.input_format,
        text_field=options.text_field,
        id_field=options.id_field,
        max_text_chars=options.max_text_chars,
    )
    # Input order, whatever the partitions: Spark packs the input's splits into tasks by size, the
    # biggest first, so several files came out in that order (range partitioning on the position).
    tasks = options.partitions or records.rdd.getNumPartitions()
    records = records.repartitionByRange(tasks, "seq").sortWithinPartitions("seq")
    rows = extract_records(
        records,
        model,
        output_format=options.output_format,
        text_field=options.text_field,
        max_text_chars=options.max_text_chars,
        precision=options.precision,
        factory=factory,
    )
    # Written beside OUTPUT, then renamed into its place: an earlier output that --force replaces
    # is there until the job has succeeded (Spark's own overwrite deleted it before the first task).
    staging = _beside(spark, options.output, "spo-new")
    try:
        if options.output_format == "jsonl":
            rows.select("line").write.mode("errorifexists").text(staging)
        else:
            rows.drop("seq").write.mode("errorifexists").parquet(staging)
    except Exception as exc:
        _delete(spark, staging)
        raise SparkExtractError(f"the Spark job failed: {_cause(exc)}") from None
    _put_in_place(spark, staging, options.output, force=options.force)
    summary = SparkSummary(seconds=time.perf_counter() - started, output=options.output)
    if options.output_format == "jsonl":
        written = spark.read.text(options.output)
        is_err = F.get_json_object("value", "$.error.code").isNotNull()
    else:
        written = spark.read.parquet(options.output)
        is_err = F.col("error").isNotNull()
    counts = written.agg(F.count(F.lit(1)), F.sum(is_err.cast("long"))).first()
    assert counts is not None  # an aggregate has one row
    summary.records, summary.errors = int(counts[0]), int(counts[1] or 0)
    return summary


def _hadoop(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def _beside(spark: SparkSession, output: str, what: str) -> str:
    """A hidden name in OUTPUT's directory (Spark's readers skip a name starting with ".")."""
    fs, path = _hadoop(spark, output)
    full = fs.makeQualified(path)
    parent = full.getParent()
    if parent is None:
        raise SparkExtractError(f"{output} is a file system's root: name a directory inside it")
    return str(parent.toString()) + f"/.{full.getName()}.{what}-{uuid.uuid4().hex[:12]}"


def _delete(spark: SparkSession, path: str) -> None:
    try:
        fs, hadoop_path = _hadoop(spark, path)
        fs.delete(hadoop_path, True)
    except Exception as exc:  # what the job failed of may fail this too: its error is the one told
        logger.warning("could not remove %s: %s", path, _first_line(exc))


def _put_in_place(spark: SparkSession, staging: str, output: str, *, force: bool) -> None:
    """Rename the written ``staging`` to ``output``; an earlier output (``force``) is moved aside
    first and deleted once the new one is in place, or put back if the rename fails. A file system
    refuses by returning False (local) or by raising (HDFS permissions, S3A): both are one line."""
    fs, out = _hadoop(spark, output)
    _, new = _hadoop(spark, staging)
    old = None
    try:
        if fs.exists(out):
            if not force:  # made meanwhile (output_problem found it free)
                raise SparkExtractError(f"{output} exists; use --force to overwrite it")
            _, old = _hadoop(spark, _beside(spark, output, "spo-old"))
            if not fs.rename(out, old):
                old = None
                raise SparkExtractError(f"cannot replace {output}: it could not be moved aside")
        if not fs.rename(new, out):
            raise SparkExtractError(f"cannot write {output}: the new output could not be put there")
    except BaseException as exc:
        if old is not None:
            try:
                fs.rename(old, out)
            except Exception:  # said below, with where the earlier output is
                logger.error("the earlier output of %s is at %s", output, old.toString())
        _delete(spark, staging)
        if isinstance(exc, SparkExtractError) or not isinstance(exc, Exception):
            raise
        raise SparkExtractError(f"cannot write {output}: {_cause(exc)}") from None
    if old is not None:
        _delete(spark, str(old.toString()))


# Attempts of a task on a local master: Spark's local mode fails the job at a task's first failure
# unless the master names more (``local[N,F]``); two let a retried task isolate a crashing record.
LOCAL_TASK_ATTEMPTS = 2


def with_local_retry(master: str) -> str:
    """``master``, with ``LOCAL_TASK_ATTEMPTS`` attempts per task when it is a local master that names
    none (``local``, ``local[N]``, ``local[*]``); any other master is left as it is.

    >>> [with_local_retry(m) for m in ("local", "local[2]", "local[*]", "local[2,4]", "yarn")]
    ['local[1,2]', 'local[2,2]', 'local[*,2]', 'local[2,4]', 'yarn']
    """
    local = re.fullmatch(r"local(?:\[(\d+|\*)\])?", master)
    if local is None:
        return master
    return f"local[{local.group(1) or 1},{LOCAL_TASK_ATTEMPTS}]"


def session(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "spo-spark-extract",
    *,
    python: str | None = None,
    python_env: str | None = None,
) -> SparkSession:
    """A SparkSession: ``master`` overrides what ``spark-submit`` set (else ``local[*]``). A local
    master given here, or the ``local[*]`` default, retries a failed task once (``with_local_retry``),
    as a cluster does (4 attempts by default), so that a record that crashes the model is an error
    row there too; a master ``spark-submit`` set is left as it is.

    Executors' Python: on a local master outside ``spark-submit``, this interpreter. On a cluster,
    ``python`` names an interpreter every node has (with spo installed), or ``python_env`` a packed
    environment (``venv-pack``: a ``.tar.gz``, ``.tgz``, ``.zip`` or ``.tar``, a local path or any URI
    Spark reads) that Spark ships with the job (``spark.archives``) and unpacks on every executor as
    ``spo-env``. Neither is needed under ``spark-submit`` when it was told (docs/spark.md).
    """
    if python and python_env:
        raise SparkExtractError("--python and --python-env exclude each other")
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    local = master.startswith("local") if master else not submitted
    if python_env and local:
        raise SparkExtractError(
            "--python-env is for a cluster master: a local master runs this Python"
        )
    if python_env and not python_env.endswith((".tar.gz", ".tgz", ".zip", ".tar")):
        raise SparkExtractError(
            f"--python-env must be a .tar.gz, .tgz, .zip or .tar archive, got {python_env}"
        )
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    # spark-submit's master is its own (a local one there keeps Spark's attempts: say --master).
    chosen = master or (None if submitted else "local[*]")
    if chosen:
        builder = builder.master(with_local_retry(chosen))
    settings = dict(conf or {})
    # PYSPARK_PYTHON is read by SparkContext when it starts (the executors' Python); the conf key
    # spark.pyspark.python is spark-submit's, which has already run or is not running.
    if python:
        os.environ["PYSPARK_PYTHON"] = python
    elif python_env:
        path = Path(python_env)
        uri = str(path.resolve()) if "://" not in python_env and path.exists() else python_env
        archives = [a for a in settings.get("spark.archives", "").split(",") if a]
        settings["spark.archives"] = ",".join([*archives, f"{uri}#{ENV_ALIAS}"])
        os.environ["PYSPARK_PYTHON"] = f"./{ENV_ALIAS}/bin/python"
    elif local and not submitted:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:  # a master URL Spark does not take, no JVM; Spark printed its reason
        raise SparkExtractError(
            f"cannot start Spark{f' with master {master!r}' if master else ''}: {_first_line(exc)} "
            "(Spark's own reason is logged above)"
        ) from None
