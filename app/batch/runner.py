"""``run_batch``: the streaming pipeline behind ``spo extract``, a plain function.

read lines -> select the shard -> skip what a resumed output holds -> parse (bad lines become error
records) -> ``app.batch.stream.extract_windows`` (windows of ``window`` records, sorted by length, cut
into chunks, run by the executor in this process or in worker processes, input order restored) ->
write and checkpoint each window.

Memory is bounded by the window size, whatever the input size: at most a few windows are in flight.
Windows are counted from the first selected record, so a resumed run cuts exactly the same windows
and chunks as an uninterrupted one and its output is byte-identical.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import itertools
import json
import logging
import os
import time
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any, BinaryIO

from tqdm import tqdm

from app.batch.output import (
    TMP_SUFFIX,
    FileOutput,
    Output,
    OutputError,
    StreamOutput,
    checkpoint_path,
    dumps_line,
    is_error,
)
from app.batch.records import (
    InputError,
    Record,
    Source,
    count_lines,
    fingerprint,
    is_same_file,
    iter_lines,
    line_limit,
    open_binary,
    parse_line,
    source_for,
)
from app.batch.stream import extract_windows
from app.batch.workers import (
    ExtractorFactory,
    InlineExecutor,
    ProcessExecutor,
    WorkSpec,
)
from app.core.settings import DEFAULT_MODEL_DIR, threads_per_worker
from app.core.sizing import Machine, estimate_worker_rss_mib, model_precision, plan
from nlp.config import DEFAULT_MAX_TEXT_CHARS, LoadOptions
from nlp.loader import load_extractor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchOptions:
    """Everything ``spo extract`` can be told (see its ``--help``)."""

    inputs: tuple[str, ...]
    output: str = "-"
    model_dir: Path = DEFAULT_MODEL_DIR
    input_format: str = "auto"
    text_field: str = "text"
    id_field: str = "id"
    workers: int = 1
    recycle_after: int = 0
    max_rss_mb: int = 0
    shard: tuple[int, int] = (1, 1)
    resume: bool = False
    force: bool = False
    window: int = 2048
    chunk_size: int = 64
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    precision: str | None = None  # None: the model's own (its model.json)
    short_call_threads: bool = False  # TF session only (nlp.config.LoadOptions)
    extra_rewrites: tuple[str, ...] = ()
    intra_op_threads: int | None = None
    record_timeout: float = 0.0

    def load_options(self) -> LoadOptions:
        """How each worker loads the model: cores / workers TensorFlow threads unless given (in
        this process, ``--workers 0``: TensorFlow's default, or all the cores for a thread plan,
        whose upper bound they are)."""
        threads = self.intra_op_threads or (
            threads_per_worker(max(1, self.workers))
            if self.workers or self.short_call_threads
            else None
        )
        return LoadOptions(
            Path(self.model_dir),
            precision=self.precision,
            intra_op_threads=threads,
            inter_op_threads=1,
            max_text_chars=self.max_text_chars,
            short_call_threads=self.short_call_threads,
            extra_rewrites=self.extra_rewrites,
        )

    def problems(self) -> list[str]:
        out = []
        if not self.inputs:
            out.append("at least one input is needed")
        if self.inputs.count("-") > 1:
            out.append("stdin (-) can be read only once")
        if "" in self.inputs:
            out.append("an input is an empty name: give a file, or - for stdin")
        out += _named_twice([i for i in self.inputs if i != "-"])
        k, n = self.shard
        if not 1 <= k <= n:
            out.append(f"--shard must be K/N with 1 <= K <= N, got {k}/{n}")
        if self.workers < 0:
            out.append("--workers must be 0 (in this process) or more")
        elif self.workers == 0:  # nothing to replace: the limits would silently not apply
            out += [
                f"{flag} replaces worker processes: it needs --workers 1 or more (--workers 0 "
                "runs the model in this process)"
                for flag, value in (
                    ("--recycle-after", self.recycle_after),
                    ("--max-worker-rss", self.max_rss_mb),
                )
                if value
            ]
        if self.window < 1 or self.chunk_size < 1:
            out.append("--window and the chunk size must be positive")
        if not self.text_field or not self.id_field:
            out.append("--text-field and --id-field must not be empty")
        for problem in self.load_options().problems():  # named as the command's flags
            name, rest = problem.split(" ", 1)
            out.append(f"--{name.replace('_', '-')} {rest}")
        if not 0 <= self.record_timeout <= 86_400:
            out.append("--record-timeout must be between 0 (none) and 86400 seconds")
        if self.resume and self.output == "-":
            out.append("--resume needs an output file (-o), not stdout")
        if self.resume and self.force:
            out.append("--resume and --force exclude each other")
        if not self.output:
            out.append("-o is an empty name: give a file, or - for stdout")
        elif self.output != "-":
            if self.output.lower().endswith(".gz"):
                out.append("the output is plain JSON lines; compress it after the run")
            out += [
                f"the output {self.output} is also an input"
                for i in self.inputs
                if i != "-" and is_same_file(i, self.output)
            ]
            sidecar = checkpoint_path(Path(self.output))
            out += [
                f"the input {i} is the output's checkpoint {side}, which the run replaces and "
                "removes: rename the input or choose another output"
                for i in self.inputs
                for side in (str(sidecar), str(sidecar) + TMP_SUFFIX)
                if i != "-" and is_same_file(i, side)
            ]
        return out


def _named_twice(files: list[str]) -> list[str]:
    """The first input that is an earlier one again (by device and inode: a link or ``./a.txt`` is
    the same file), whose records would be written twice under the same ids; one pass, as a shell
    glob may name thousands. A file that cannot be read is reported when it is opened."""
    seen: dict[tuple[int, int], str] = {}
    for name in files:
        try:
            stat = os.stat(name)
        except OSError:
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in seen:
            again = f"the input {name} is {seen[key]} again"
            return [f"{again}: its records would be written twice, under the same ids"]
        seen[key] = name
    return []


@dataclass
class BatchSummary:
    records: int = 0  # written by this run
    errors: int = 0  # error records among them
    skipped: int = 0  # already in the output when the run resumed
    earlier_errors: int = 0
    load_seconds: float = 0.0
    seconds: float = 0.0  # from the first record read to the last written
    output: str = "-"
    recycled: int = 0
    restarted: int = 0

    @property
    def total_errors(self) -> int:
        return self.errors + self.earlier_errors

    @property
    def texts_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        parts = [
            f"{self.records} records, {self.errors} errors in {self.seconds:.1f} s "
            f"({self.texts_per_second:.1f} texts/s; model loaded in {self.load_seconds:.1f} s)"
        ]
        if self.skipped:
            parts.append(
                f"resumed after {self.skipped} records ({self.total_errors} errors in all)"
            )
        if self.recycled or self.restarted:
            parts.append(f"workers recycled {self.recycled}, restarted {self.restarted}")
        return "spo extract: " + "; ".join(parts) + f" -> {self.output}"


class BatchError(Exception):
    """The run cannot start or go on (bad options, unreadable input, output refused, model)."""


def run_batch(
    options: BatchOptions,
    *,
    factory: ExtractorFactory = load_extractor,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    progress: bool = False,
) -> BatchSummary:
    """Extract from every record of ``options.inputs`` into ``options.output``; see the module doc.

    Raises ``BatchError`` (or ``OutputError``, ``InputError``, ``ModelLoadError``) for what stops a
    run; bad records never do: they become error records.
    """
    problems = options.problems() + _stream_problems(options, stdin, stdout)
    if problems:
        raise BatchError("; ".join(problems))
    try:
        sources = [source_for(name, options.input_format) for name in options.inputs]
    except ValueError as exc:  # a format not given and not told by the name: a usage error
        raise BatchError(str(exc)) from exc
    prints = []
    for source in sources:
        try:
            prints.append(fingerprint(source))
        except OSError as exc:
            raise InputError(f"cannot read input {source.name}: {exc.strerror or exc}") from exc
    for source in sources:  # a UTF-16 file, refused before the model loads (stdin: as it is read)
        if not (source.is_stdin or source.is_stream):
            # A cut or broken gzip: the run tells, as it reads it.
            with contextlib.suppress(OSError, EOFError, zlib.error):
                open_binary(source).close()
    run_print = _run_fingerprint(options, sources, prints)
    output = _output(options, run_print, stdout)
    output.claim()  # before the model loads: a refused run is refused at once, and stays refused
    try:
        return _extract(options, sources, output, factory, stdin, progress)
    except BaseException:
        output.abort()  # the output as it was found, or whole up to its last checkpoint
        raise


def _stream_problems(
    options: BatchOptions, stdin: BinaryIO | None, stdout: BinaryIO | None
) -> list[str]:
    """What the run's own streams rule out: stdin (``-``) named again as a path (``/dev/stdin``),
    stdout (``-o -``) redirected onto an input (``>> in.txt``, or ``- < in.txt >> in.txt``: each
    record written would be read back as input, and the file would grow until the disk is full), and
    an output file that stdin reads (``-o out.txt < out.txt``: claiming it would empty the input)."""
    out = []
    named = [i for i in options.inputs if i != "-"]
    stdin_file = _stream_file(stdin) if "-" in options.inputs else None
    if stdin_file is not None:
        out += [
            f"the input {name} is stdin (-) again: stdin can be read only once"
            for name in named
            if _same_file(stdin_file, name)
        ]
    if options.output == "-" and stdout is not None:
        stdout_file = _stream_file(stdout)
        out += [
            f"stdout is the input {name}: its records would be read back as input; use -o FILE"
            for name in named
            if stdout_file is not None and _same_file(stdout_file, name)
        ]
        # Both regular files: a terminal is stdin and stdout of any interactive run, and no loop.
        if (
            stdin_file is not None
            and stdout_file is not None
            and S_ISREG(stdin_file.st_mode)
            and _same(stdin_file, stdout_file)
        ):
            out.append(
                "stdout is the file stdin (-) reads: its records would be read back as input; "
                "use -o FILE"
            )
    elif options.output and stdin_file is not None and _same_file(stdin_file, options.output):
        out.append(
            f"the output {options.output} is the file stdin (-) reads: writing it would destroy the "
            "input; choose another output"
        )
    return out


def _stream_file(stream: BinaryIO | None) -> os.stat_result | None:
    """What ``stream`` is open on (a file, a pipe, a terminal), or None (a test's BytesIO)."""
    try:
        return os.fstat(stream.fileno()) if stream is not None else None
    except (OSError, ValueError, AttributeError):  # no file descriptor
        return None


def _same_file(stat: os.stat_result, name: str) -> bool:
    """Whether the file named ``name`` is the one of ``stat`` (by device and inode)."""
    try:
        return _same(stat, os.stat(name))
    except (OSError, ValueError):
        return False


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _output(options: BatchOptions, run_print: dict[str, Any], stdout: BinaryIO | None) -> Output:
    """Where the run writes: stdout (``-o -``) or a file with a checkpoint (checked, not claimed)."""
    if options.output == "-":
        return StreamOutput(stdout, run_print)
    return FileOutput(Path(options.output), run_print, resume=options.resume, force=options.force)


def _extract(
    options: BatchOptions,
    sources: list[Source],
    output: Output,
    factory: ExtractorFactory,
    stdin: BinaryIO | None,
    progress: bool,
) -> BatchSummary:
    """Load the model, then extract into the claimed ``output`` (``run_batch`` releases it)."""
    summary = BatchSummary(output=output.name)
    summary.skipped = output.checkpoint.done
    summary.earlier_errors = output.checkpoint.errors
    total = _total(sources, options) if progress else None

    spec = WorkSpec(
        options.load_options(), text_field=options.text_field, record_timeout=options.record_timeout
    )
    if options.workers and options.load_options().problems() == []:
        # The memory check of app.core.sizing: warn before spawning workers that cannot all fit.
        model_dir = Path(options.model_dir)
        sizing = plan(
            Machine.probe(),
            workers=options.workers,
            intra_op=spec.options.intra_op_threads,
            worker_rss_mib=estimate_worker_rss_mib(
                model_dir,
                options.precision,
                short_call_threads=options.short_call_threads,
                intra_op_threads=spec.options.intra_op_threads,
            )
            if (model_dir / "model.json").is_file()
            else None,
        )
        for warning in sizing.warnings:
            logger.warning("sizing: %s", warning)
    executor: InlineExecutor | ProcessExecutor
    if options.workers == 0:
        executor = InlineExecutor(factory, spec)
    else:
        executor = ProcessExecutor(
            factory,
            spec,
            options.workers,
            recycle_after=options.recycle_after,
            max_rss_mb=options.max_rss_mb,
        )
    started = time.perf_counter()
    with ExitStack() as stack:
        stack.push(lambda kind, *_: executor.close(graceful=kind is None))
        executor.start()
        summary.load_seconds = time.perf_counter() - started
        output.open()
        bar = stack.enter_context(
            tqdm(
                total=None if total is None else max(0, total - summary.skipped),
                disable=not progress,
                unit=" rec",
                desc="extract",
                dynamic_ncols=True,
                smoothing=0.1,
            )
        )
        started = time.perf_counter()
        _run(options, sources, stdin, executor, output, summary, bar)
        summary.seconds = time.perf_counter() - started
        output.finish()
        if isinstance(executor, ProcessExecutor):
            summary.recycled, summary.restarted = executor.recycled, executor.restarted
    return summary


def _run(
    options: BatchOptions,
    sources: list[Source],
    stdin: BinaryIO | None,
    executor: InlineExecutor | ProcessExecutor,
    output: Output,
    summary: BatchSummary,
    bar: tqdm[Any],
) -> None:
    done = output.checkpoint.done
    lines = _selected_lines(sources, options, stdin)
    if done:
        last = next(itertools.islice(lines, done - 1, done), None)
        if last is None or _parse(last, options).id != output.checkpoint.last_id:
            raise OutputError(
                f"cannot resume: record {done} of the input is not the last one written "
                f"({json.dumps(output.checkpoint.last_id)}); the input changed (use --force)"
            )

    records = (_parse(item, options) for item in lines)
    for pairs in extract_windows(
        records,
        executor,
        window=options.window,
        chunk_size=options.chunk_size,
        on_chunk=bar.update,
    ):
        data = b"".join(dumps_line(r.id, o) for r, o in pairs)
        errors = sum(is_error(o) for _, o in pairs)
        output.write_window(data, len(pairs), errors, pairs[-1][0].id)
        summary.records += len(pairs)
        summary.errors += errors
        bar.update(sum(r.error is not None for r, _ in pairs))


def _parse(item: tuple[Source, int, bytes | None], options: BatchOptions) -> Record:
    source, line_no, raw = item
    return parse_line(
        source,
        line_no,
        raw,
        text_field=options.text_field,
        id_field=options.id_field,
        prefix_ids=len(options.inputs) > 1,
    )


def _selected_lines(
    sources: list[Source], options: BatchOptions, stdin: BinaryIO | None
) -> Iterator[tuple[Source, int, bytes | None]]:
    """``(source, line number, bytes)`` of the records of this shard (index over all inputs)."""
    k, n = options.shard
    index = 0
    for source in sources:
        limit = line_limit(source.format, options.max_text_chars)
        line_no = 0
        try:
            stream = open_binary(source, stdin)
            try:
                for raw in iter_lines(stream, limit):
                    line_no += 1
                    if index % n == k - 1:
                        yield source, line_no, raw
                    index += 1
            finally:
                if not source.is_stdin:
                    stream.close()
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(
                f"{source.name}: cannot read past line {line_no}: {exc} ({_after_read_error(exc)})"
            ) from exc


def _after_read_error(exc: BaseException) -> str:
    """What the output holds when an input stops being readable, and what to do.

    A gzip stream that fails its CRC or does not inflate (``BadGzipFile``, ``zlib.error``) is corrupt,
    and the lines read before the error may be garbage: gzip checks a member's CRC only at its end.
    A cut stream (``EOFError``) or a read error gave good lines up to where it stopped.
    """
    if isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        return (
            "the input is corrupt: the records written before this point may have been read from "
            "its damaged data; replace it and run again with --force"
        )
    if isinstance(exc, EOFError):
        return (
            "the input is cut short: the output so far is complete; once the input is whole, run "
            "again with --force (--resume continues only the input it started on)"
        )
    return "the output so far is complete: when the input can be read, add --resume to continue"


def _total(sources: list[Source], options: BatchOptions) -> int | None:
    """Selected records in all inputs, for the progress bar's ETA (``None`` when one is a stream:
    stdin or a pipe, which can be read only once)."""
    if any(s.is_stream for s in sources):
        return None
    try:
        total = sum(count_lines(s) for s in sources)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return None
    k, n = options.shard
    return max(0, (total - (k - 1) + n - 1) // n)


def _run_fingerprint(
    options: BatchOptions, sources: list[Source], prints: list[dict[str, Any]]
) -> dict[str, Any]:
    """What must not change between a run and its ``--resume``."""
    return {
        "inputs": prints,
        "formats": [s.format for s in sources],
        "text_field": options.text_field,
        "id_field": options.id_field,
        "shard": f"{options.shard[0]}/{options.shard[1]}",
        "window": options.window,
        "chunk_size": options.chunk_size,
        "max_text_chars": options.max_text_chars,
        "precision": model_precision(Path(options.model_dir), options.precision),
        "model": _model_fingerprint(Path(options.model_dir)),
    }


def _model_fingerprint(model_dir: Path) -> str | None:
    """sha256 of ``model.json`` and ``saved_model.pb`` (``None`` when absent: fakes in tests)."""
    digest = hashlib.sha256()
    found = False
    for name in ("model.json", "saved_model.pb", "variables/variables.index"):
        path = model_dir / name
        if path.is_file():
            found = True
            try:
                digest.update(name.encode() + b"\0" + path.read_bytes())
            except OSError as exc:  # not readable by this user: the model could not load either
                raise BatchError(f"cannot read the model's {path}: {exc.strerror or exc}") from None
    return digest.hexdigest() if found else None
